"""Moving a session between installs: export to and import from JSON Lines.

The file is a header line with the session, then one line per message in
session order. A round trip keeps, exactly, each message's role, content,
reasoning, tool calls, tool call id, complete flag, steer flag (a message
sent into a running turn, `chat.pending`) and order, and the tree
of branches (`chat.tree`): `parent` is the position (0-based, among the
message lines) of an earlier message, or null, and `selected_at` orders
which version is active. A file without `parent` fields (written before
branches) imports as one chain. A user message's files (`chat.attachments`)
are in its `attachments`: name, kind, mime, size and the bytes in base64
`data`; they are checked again on import as an upload is (a file without
the field has none). Runs and their
journals stay behind (a message's `run_id` is informative only), and so do
owners: the importer names the new owner.

An import costs others what any request does (docs/security.md, "Import and
export"): the file is read line by line, twice, never held whole. The first
pass checks every line through the API's own validators (`chat.api`) and
writes nothing; a bad line anywhere refuses the file. The second writes
CHUNK messages per transaction into a session that stays hidden
(`ChatSession.importing`) until its last chunk commits, and is removed if a
chunk fails. At most `HERMES_IMPORT_MAX_MESSAGES` messages per file. An
export reads CHUNK messages per query, each query on its own.
"""

import base64
import binascii
import io
import json
import logging
import re
import tempfile
from array import array
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import IO, Any

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone
from django.utils.dateparse import parse_datetime
from rest_framework.exceptions import ValidationError

from .attachments import (
    AttachmentRefused,
    Checked,
    check_file,
    check_storage,
    fenced,
    file_bytes,
    max_files,
    store_bytes,
)
from .models import Attachment, ChatSession, Message

log = logging.getLogger(__name__)

FORMAT = "hermes-session"
VERSION = 1
CHUNK = 500  # messages per query (export) and per transaction (import)
SPOOL_BYTES = 1024 * 1024  # an import's copy stays in memory up to this, then disk
# An import whose process died leaves its hidden session; the owner's next
# import removes those older than this.
STALE_IMPORT = timedelta(hours=1)
TOOL_CALLS_MAX = 64  # per message
TOOL_NAME_MAX = 200


class TransferError(Exception):
    """A file that cannot be imported; `line` is 1-based (0: the file as a whole).

    `status` is the HTTP answer (400, or 413 past a bound) and `limit` names
    the bound, if one does."""

    def __init__(self, line: int, message: str, *, status: int = 400, limit: str = ""):
        super().__init__(f"line {line}: {message}" if line else message)
        self.line = line
        self.status = status
        self.limit = limit


def max_messages() -> int:
    return settings.HERMES["IMPORT_MAX_MESSAGES"]


# Characters `str.splitlines()` breaks on that JSON leaves raw: escaped, so that any
# line reader sees one line per record (they only occur inside JSON strings).
_LINE_BREAKS = str.maketrans(
    {"\u2028": "\\u2028", "\u2029": "\\u2029", "\x85": "\\u0085"}
)


def _dump(obj: dict) -> str:
    return (
        json.dumps(obj, ensure_ascii=False, separators=(",", ":")).translate(
            _LINE_BREAKS
        )
        + "\n"
    )


_EXPORTED = (
    "role",
    "content",
    "reasoning",
    "tool_calls",
    "tool_call_id",
    "complete",
    "steer",
)


def _pages(session: ChatSession, *fields: str) -> Iterator[list[dict]]:
    """The session's messages in id order, CHUNK per query: each page is a
    statement of its own (no cursor held open between them)."""
    after = 0
    while True:
        page = list(
            session.messages.filter(id__gt=after)
            .order_by("id")
            .values("id", *fields)[:CHUNK]
        )
        if not page:
            return
        yield page
        after = page[-1]["id"]


def _with_files(session: ChatSession, page: list[dict]) -> set[int]:
    """Which messages of a page have files (one query, no bytes read)."""
    return set(
        Attachment.objects.filter(
            message__session_id=session.pk,
            message_id__gte=page[0]["id"],
            message_id__lte=page[-1]["id"],
        ).values_list("message_id", flat=True)
    )


def session_export(*, session: ChatSession) -> Iterator[str]:
    """The session as JSON Lines, one line at a time, CHUNK messages a query."""
    yield _dump(
        {
            "type": "session",
            "format": FORMAT,
            "version": VERSION,
            "id": session.pk,
            "title": session.title,
            "model": session.model,
            "system_prompt": session.system_prompt,
            "archived": session.archived,
            "created_at": session.created_at.isoformat(),
            "updated_at": session.updated_at.isoformat(),
        }
    )
    position: dict[int, int] = {}  # message id -> its line among the messages
    for page in _pages(
        session, *_EXPORTED, "parent_id", "selected_at", "run_id", "created_at"
    ):
        with_files = _with_files(session, page)
        for row in page:
            position[row["id"]] = len(position)
            line = {
                "type": "message",
                **{name: row[name] for name in _EXPORTED},
                "parent": position.get(row["parent_id"]),
                "selected_at": row["selected_at"].isoformat(),
                "run_id": row["run_id"],
                "created_at": row["created_at"].isoformat(),
            }
            if row["id"] in with_files:
                line["attachments"] = [
                    {
                        "name": a.name,
                        "kind": a.kind,
                        "mime": a.mime,
                        "size": a.size,
                        "data": base64.b64encode(file_bytes(a)).decode("ascii"),
                    }
                    for a in Attachment.objects.filter(
                        message_id=row["id"]
                    ).select_related("stored")
                ]
            yield _dump(line)


# --- import: checking --------------------------------------------------------------

_SESSION_FIELDS = {"title": str, "model": str, "system_prompt": str, "archived": bool}
_ROLES = (Message.Role.USER, Message.Role.ASSISTANT, Message.Role.TOOL)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _parse(number: int, line: str) -> dict:
    try:
        obj = json.loads(line, parse_constant=_no_constant)
    except json.JSONDecodeError as exc:
        raise TransferError(number, f"invalid JSON ({exc.msg})") from None
    except RecursionError:
        raise TransferError(number, "invalid JSON (nested too deeply)") from None
    except ValueError as exc:  # NaN, Infinity; integers past Python's 4300 digits
        problem = "a number too long" if "digits" in str(exc) else str(exc)
        raise TransferError(number, f"invalid JSON ({problem})") from None
    if not isinstance(obj, dict):
        raise TransferError(number, "expected a JSON object")
    return obj


def _text(number: int, name: str, value: Any, limit: int | None = None) -> str:
    """A string field the database can store: no NUL (PostgreSQL refuses it),
    no lone surrogate (no encoding holds one), at most `limit` characters."""
    if not isinstance(value, str):
        raise TransferError(number, f"{name!r} must be str")
    if "\x00" in value:
        raise TransferError(number, f"{name!r} holds a NUL character")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise TransferError(
            number, f"{name!r} holds a lone surrogate (\\u{ord(value[exc.start]):04x})"
        ) from None
    if limit is not None and len(value) > limit:
        raise TransferError(number, f"{name!r} is longer than {limit} characters")
    return value


def _api_error(number: int, exc: ValidationError, name: str = "") -> TransferError:
    """The API's refusal as an import's: the field and the API's words."""
    detail: Any = exc.detail
    if isinstance(detail, dict):
        name, detail = next(iter(detail.items()))
    problem = detail[0] if isinstance(detail, list) else detail
    return TransferError(number, f"{name!r}: {problem}" if name else str(problem))


def _session_fields(number: int, head: dict) -> dict:
    """The header's session fields, checked as `POST /api/sessions/` checks
    them (its serializer: title's length, a known model, the system prompt's
    bound)."""
    from .api import SessionSerializer  # the API's own checks; it imports much

    if head.get("type") != "session" or head.get("format") != FORMAT:
        raise TransferError(
            number, f"not a {FORMAT} export (the first line is not its header)"
        )
    if head.get("version") != VERSION:
        version = head.get("version")
        shown = repr(version) if isinstance(version, int | str) else "of another kind"
        raise TransferError(number, f"unsupported version {shown[:40]}")
    if "title" not in head:
        raise TransferError(number, "missing 'title'")
    fields = {}
    for name, kind in _SESSION_FIELDS.items():
        if name not in head:
            continue
        if kind is str:
            fields[name] = _text(number, name, head[name])
        elif not isinstance(head[name], kind):
            raise TransferError(number, f"{name!r} must be {kind.__name__}")
        else:
            fields[name] = head[name]
    serializer = SessionSerializer(data=fields)
    try:
        serializer.is_valid(raise_exception=True)
    except ValidationError as exc:
        raise _api_error(number, exc) from None
    return {name: serializer.validated_data[name] for name in fields}


def _tool_calls(number: int, calls: Any) -> list:
    """Tool calls in the one shape Hermes stores (`chat.runner._clean_calls`)."""
    shape = "each tool call must be {id, type: 'function', function: {name, arguments}}"
    if not isinstance(calls, list):
        raise TransferError(number, "'tool_calls' must be a list")
    if len(calls) > TOOL_CALLS_MAX:
        raise TransferError(number, f"more than {TOOL_CALLS_MAX} tool calls")
    for call in calls:
        if (
            not isinstance(call, dict)
            or set(call) != {"id", "type", "function"}
            or call["type"] != "function"
            or not isinstance(call["function"], dict)
            or set(call["function"]) != {"name", "arguments"}
        ):
            raise TransferError(number, shape)
        _text(number, "tool_calls.id", call["id"], 120)
        _text(number, "tool_calls.function.name", call["function"]["name"], 200)
        _text(number, "tool_calls.function.arguments", call["function"]["arguments"])
    return calls


def _when(number: int, value: Any) -> datetime:
    problem = f"'selected_at' must be an ISO date and time, not {str(value)[:40]!r}"
    try:
        when = parse_datetime(value) if isinstance(value, str) else None
    except ValueError:  # well formed, impossible: 2024-02-30
        when = None
    if when is None:
        raise TransferError(number, problem)
    if timezone.is_naive(when):
        when = when.replace(tzinfo=UTC)
    try:
        when.astimezone(UTC)
    except OverflowError:  # 0001-01-01T00:00+01:00 is before the year 1 in UTC
        raise TransferError(number, problem) from None
    return when


def _place(number: int, obj: dict, index: int) -> tuple[int | None, datetime | None]:
    """A message line's parent position (the previous line if not given) and
    its `selected_at`, checked."""
    parent = obj.get("parent", index - 1 if index else None)
    if parent is not None and (
        not isinstance(parent, int) or isinstance(parent, bool) or parent < 0
    ):
        raise TransferError(number, "'parent' must be null or a message position")
    if parent is not None and parent >= index:
        raise TransferError(number, "'parent' must be an earlier message")
    selected = obj.get("selected_at")
    return parent, (None if selected is None else _when(number, selected))


def _files(number: int, obj: dict, role: str) -> list[Checked]:
    """A message line's attachments, checked as uploads are."""
    files = obj.get("attachments", [])
    if not isinstance(files, list):
        raise TransferError(number, "'attachments' must be a list")
    if files and role != Message.Role.USER:
        raise TransferError(number, "only a user message has attachments")
    if len(files) > max_files():
        raise TransferError(
            number,
            f"more than {max_files()} attachments",
            limit="HERMES_ATTACHMENT_MAX_FILES",
        )
    checked = []
    for file in files:
        if not isinstance(file, dict) or not isinstance(file.get("data"), str):
            raise TransferError(number, "an attachment needs its base64 'data'")
        try:
            data = base64.b64decode(file["data"], validate=True)
        except (binascii.Error, ValueError):
            raise TransferError(
                number, "an attachment's 'data' is not base64"
            ) from None
        name, mime = file.get("name"), file.get("mime")
        try:
            checked.append(
                check_file(
                    name=_text(number, "name", name) if name else "file",
                    declared=_text(number, "mime", mime, 100) if mime else "",
                    data=data,
                )
            )
        except AttachmentRefused as exc:
            raise TransferError(
                number, f"attachment {exc}", status=exc.status, limit=exc.limit
            ) from None
    return checked


@dataclass
class _Line:
    """A message line, checked: its fields, its parent's position, its files."""

    fields: dict
    parent: int | None
    files: list[Checked]


def _message(number: int, obj: dict, index: int) -> _Line:
    """A message line checked as the API checks what it stores: a user
    message's content as `POST .../runs/` does (its serializer), roles the
    API makes (no `system`: the header's `system_prompt` is the one), tool
    calls in the shape Hermes stores, strings the database can hold."""
    from .api import RunCreateSerializer

    if obj.get("type") != "message":
        kind = obj.get("type")
        shown = repr(kind)[:40] if isinstance(kind, str | None) else "of another kind"
        raise TransferError(number, f"expected a message line, got type {shown}")
    for name in ("role", "content"):
        if name not in obj:
            raise TransferError(number, f"missing {name!r}")
    role = _text(number, "role", obj["role"], 16)
    if role == Message.Role.SYSTEM:
        raise TransferError(
            number,
            "a 'system' message is not imported (the header's 'system_prompt' "
            "is the session's)",
        )
    if role not in _ROLES:
        raise TransferError(number, f"unknown role {role!r}")
    content = _text(number, "content", obj["content"])
    if role == Message.Role.USER:
        try:
            RunCreateSerializer().validate_content(content)
        except ValidationError as exc:
            raise _api_error(number, exc, "content") from None
    fields: dict[str, Any] = {"role": role, "content": content}
    if "reasoning" in obj:
        fields["reasoning"] = _text(number, "reasoning", obj["reasoning"])
    if obj.get("tool_calls"):
        if role != Message.Role.ASSISTANT:
            raise TransferError(number, "only an assistant message has tool calls")
        fields["tool_calls"] = _tool_calls(number, obj["tool_calls"])
    elif "tool_calls" in obj and obj["tool_calls"] != []:
        raise TransferError(number, "'tool_calls' must be a list")
    if "tool_call_id" in obj:
        fields["tool_call_id"] = _text(number, "tool_call_id", obj["tool_call_id"], 120)
    for name in ("complete", "steer"):
        if name in obj:
            if not isinstance(obj[name], bool):
                raise TransferError(number, f"{name!r} must be bool")
            fields[name] = obj[name]
    parent, selected = _place(number, obj, index)
    if selected is not None:
        fields["selected_at"] = selected
    return _Line(fields, parent, _files(number, obj, role))


def _lines(source: IO[str]) -> Iterator[tuple[int, str]]:
    """The file's non-blank lines and their numbers, read from the start."""
    source.seek(0)
    number = 0
    try:
        for number, line in enumerate(source, start=1):  # noqa: B007
            if line.strip():
                yield number, line
    except UnicodeDecodeError:  # decoded ahead in blocks: the line is a bound
        raise TransferError(
            0, f"the file is not UTF-8 text (after line {number})"
        ) from None


def _header(lines: Iterator[tuple[int, str]]) -> dict:
    first = next(lines, None)
    if first is None:
        raise TransferError(0, "empty file")
    number, line = first
    return _session_fields(number, _parse(number, line))


def _checked_messages(lines: Iterator[tuple[int, str]]) -> Iterator[_Line]:
    """Each message line, checked; refused past `HERMES_IMPORT_MAX_MESSAGES`
    or `HERMES_SESSION_MAX_MESSAGES`, whichever is lower."""
    bounds = [
        (max_messages(), "import_messages", "one import"),
        (settings.HERMES["SESSION_MAX_MESSAGES"], "session_messages", "one chat"),
    ]
    limit, name, holder = min(bounds)
    for index, (number, line) in enumerate(lines):
        if index >= limit:
            raise TransferError(
                number,
                f"more than {limit} messages, the most {holder} may hold",
                status=413,
                limit=name,
            )
        yield _message(number, _parse(number, line), index)


def check_file_whole(source: IO[str]) -> tuple[dict, int, int]:
    """The first pass: every line checked, nothing written, one line in memory
    at a time; (the session's fields, how many messages, their files' bytes)."""
    lines = _lines(source)
    fields = _header(lines)
    count = files = 0
    for line in _checked_messages(lines):
        count += 1
        files += sum(len(file.data) for file in line.files)
    return fields, count, files


def _rereadable(lines: Iterable[str] | IO[str]) -> tuple[IO[str], bool]:
    """`lines` as a text file read twice: itself if it can seek, else a copy
    (in memory up to SPOOL_BYTES, then on disk); (file, whether a copy)."""
    seekable = getattr(lines, "seekable", None)
    if callable(seekable) and seekable():
        return lines, False  # type: ignore[return-value]
    copy = tempfile.SpooledTemporaryFile(
        max_size=SPOOL_BYTES, mode="w+", encoding="utf-8", newline=""
    )
    for line in lines:
        copy.write(line if line.endswith("\n") else line + "\n")
    return copy, True


# --- import: writing ------------------------------------------------------------


def session_import(*, owner, lines: Iterable[str] | IO[str]) -> tuple[ChatSession, int]:
    """Create a session of `owner` from an export; (session, messages imported).

    All or nothing: a bad line raises `TransferError` before anything is
    written; a chunk that fails to be written removes what was.
    """
    source, copied = _rereadable(lines)
    try:
        fields, count, files_size = check_file_whole(source)
        try:  # every file counted, as if none were stored already
            check_storage(owner=owner, adding=files_size)
        except AttachmentRefused as exc:
            raise TransferError(
                0, str(exc), status=exc.status, limit=exc.limit
            ) from None
        _remove_stale_imports(owner)
        session = ChatSession.all_objects.create(
            owner=owner, importing=True, title_by_user=True, **fields
        )
        try:
            written = _write_messages(owner, session, source)
            _reveal(session)
        except BaseException:
            remove_import(session_id=session.pk)
            raise
    finally:
        if copied:
            source.close()
    if written != count:  # the file changed between the two passes
        log.warning("import of session %s wrote %d of %d", session.pk, written, count)
    return session, written


def _write_messages(owner, session: ChatSession, source: IO[str]) -> int:
    """The second pass: CHUNK messages per transaction, parents linked."""
    lines = _lines(source)
    next(lines)  # the header, checked already
    ids = array("q")  # the new id of each message line, by position
    chunk: list[_Line] = []
    for line in _checked_messages(lines):
        chunk.append(line)
        if len(chunk) == CHUNK:
            _write_chunk(owner, session.pk, chunk, ids)
            chunk = []
    if chunk:
        _write_chunk(owner, session.pk, chunk, ids)
    return len(ids)


def _write_chunk(owner, session_id: int, chunk: list[_Line], ids: array) -> None:
    """One short transaction: the chunk's messages with their parents (their
    ids are reserved first, so every parent is known at insert: one INSERT,
    no UPDATE), then their files."""
    with transaction.atomic():
        reserved = _reserve_ids(len(chunk))
        ids.extend(reserved)
        messages = [
            Message(
                pk=pk,
                session_id=session_id,
                parent_id=None if line.parent is None else ids[line.parent],
                **line.fields,
            )
            for pk, line in zip(reserved, chunk, strict=True)
        ]
        Message.objects.bulk_create(messages)
        Attachment.objects.bulk_create(
            Attachment(
                owner=owner,
                message_id=m.pk,
                name=file.name,
                kind=file.kind,
                mime=file.mime,
                size=len(file.data),
                stored=store_bytes(owner=owner, data=file.data, checked=True),
            )
            for m, line in zip(messages, chunk, strict=True)
            for file in line.files
        )


def _reserve_ids(count: int) -> list[int]:
    """Ids for `count` new messages, ascending, inside the chunk's transaction.

    PostgreSQL: taken from the table's sequence. SQLite: past the highest id
    ever given (the table is AUTOINCREMENT); the chunk's IMMEDIATE transaction
    holds the write lock, so no other insert takes them meanwhile."""
    table = Message._meta.db_table
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(
                "SELECT nextval(pg_get_serial_sequence(%s, 'id'))"
                " FROM generate_series(1, %s)",
                [table, count],
            )
            return sorted(row[0] for row in cursor.fetchall())
        cursor.execute(
            f"SELECT MAX(top) FROM (SELECT MAX(id) AS top FROM {table}"
            " UNION ALL SELECT seq FROM sqlite_sequence WHERE name = %s)",
            [table],
        )
        top = cursor.fetchone()[0] or 0
        return list(range(top + 1, top + 1 + count))


def _reveal(session: ChatSession) -> None:
    """The last step: the session shows in lists, search and the API."""
    from .services import _announce_on_commit

    with transaction.atomic():
        ChatSession.all_objects.filter(pk=session.pk).update(
            importing=False, updated_at=timezone.now()
        )
        _announce_on_commit(
            session.owner_id, "session", {"action": "created", "session_id": session.pk}
        )
    session.importing = False


def remove_import(*, session_id: int) -> None:
    """Remove a hidden import, CHUNK messages per transaction (children
    first), then the session."""
    messages = Message.objects.filter(session_id=session_id)
    while True:
        page = list(messages.order_by("-id").values_list("id", flat=True)[:CHUNK])
        if not page:
            break
        with transaction.atomic():
            Message.objects.filter(pk__in=page).delete()
    ChatSession.all_objects.filter(pk=session_id, importing=True).delete()


def _remove_stale_imports(owner) -> None:
    """Hidden imports of `owner` left by a process that died mid-import."""
    stale = ChatSession.all_objects.filter(
        owner=owner, importing=True, created_at__lt=timezone.now() - STALE_IMPORT
    ).values_list("pk", flat=True)
    for pk in list(stale):
        remove_import(session_id=pk)


def text_source(data: IO[bytes]) -> IO[str]:
    """An uploaded file (bytes) as the text lines `session_import` reads."""
    return io.TextIOWrapper(data, encoding="utf-8", newline="")


def session_markdown(*, session: ChatSession) -> Iterator[str]:
    """The session for people to read: its title, then each message under its
    role, tool calls and results in fenced blocks. Not read back (the JSON
    Lines export is the one that is). CHUNK messages a query; tool calls of
    any shape (rows stored before imports were checked) are shown, never a 500.
    """
    yield f"# {session.title}\n\n"
    if session.model:
        yield f"Model: `{session.model}`\n\n"
    if session.system_prompt:
        yield f"## System prompt\n\n{_fenced(session.system_prompt)}\n"
    headings = {"user": "User", "assistant": "Assistant", "tool": "Tool result"}
    fields = ("role", "content", "tool_calls", "tool_call_id", "complete", "steer")
    for page in _pages(session, *fields):
        with_files = _with_files(session, page)
        for row in page:
            role = row["role"]
            if role == Message.Role.SYSTEM:
                continue
            note = "" if row["complete"] else " (incomplete)"
            note += " (steered into the answer)" if row["steer"] else ""
            yield f"## {headings.get(role, role)}{note}\n\n"
            if role == Message.Role.TOOL:
                yield _fenced(row["content"])
            elif row["content"]:
                yield row["content"].rstrip("\n") + "\n"
            if row["id"] in with_files:
                yield from _markdown_files(row["id"])
            calls = row["tool_calls"] if isinstance(row["tool_calls"], list) else []
            for call in calls:
                name, arguments = _call_parts(call)
                yield f"\nTool call `{name}`:\n\n{_fenced(arguments)}"
            yield "\n"


def _call_parts(call: Any) -> tuple[str, str]:
    """A stored tool call's name and arguments as text, whatever its shape."""
    call = call if isinstance(call, dict) else {}
    function = call.get("function")
    function = function if isinstance(function, dict) else {}
    name = function.get("name") or call.get("name") or "tool"
    arguments = function.get("arguments", "")
    if not isinstance(name, str):
        name = json.dumps(name, ensure_ascii=False)
    if not isinstance(arguments, str):
        arguments = json.dumps(arguments, ensure_ascii=False)
    return name.replace("`", "'")[:TOOL_NAME_MAX], arguments


def _markdown_files(message_id: int) -> Iterator[str]:
    """A message's files: text ones in full, images by name and size."""
    for a in Attachment.objects.filter(message_id=message_id).select_related("stored"):
        if a.kind == Attachment.Kind.TEXT:
            text = file_bytes(a).decode("utf-8-sig", errors="replace")
            yield f"\n{fenced(a.name, text)}\n"
        else:
            yield f"\nImage attached: `{a.name}` ({a.size} bytes)\n"


def _fenced(text: str) -> str:
    """`text` in a code fence longer than any backtick run inside it."""
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}\n{text.rstrip(chr(10))}\n{fence}\n"


def write_export(*, session: ChatSession, out: IO[str]) -> int:
    """Write the export to `out`; return the number of messages written."""
    written = -1  # the header is not a message
    for line in session_export(session=session):
        out.write(line)
        written += 1
    return written
