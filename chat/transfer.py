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
"""

import base64
import binascii
import json
import re
from collections.abc import Iterable, Iterator
from datetime import datetime
from typing import IO

from django.db import transaction
from django.utils.dateparse import parse_datetime

from .attachments import AttachmentRefused, Checked, check_file, fenced, max_files
from .models import Attachment, ChatSession, Message
from .services import session_create

FORMAT = "hermes-session"
VERSION = 1
CHUNK = 1000  # messages read or created per query: bounded memory for long sessions


class TransferError(Exception):
    """A file that cannot be imported; `line` is 1-based (0: the file as a whole)."""

    def __init__(self, line: int, message: str):
        super().__init__(f"line {line}: {message}" if line else message)
        self.line = line


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


def session_export(*, session: ChatSession) -> Iterator[str]:
    """The session as JSON Lines, one line at a time."""
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
    fields = (
        "role",
        "content",
        "reasoning",
        "tool_calls",
        "tool_call_id",
        "complete",
        "steer",
    )
    rows = session.messages.order_by("id").values(
        *fields, "id", "parent_id", "selected_at", "run_id", "created_at"
    )
    position: dict[int, int] = {}  # message id -> its line among the messages
    with_files = set(
        Attachment.objects.filter(message__session=session).values_list(
            "message_id", flat=True
        )
    )
    for row in rows.iterator(chunk_size=CHUNK):
        position[row["id"]] = len(position)
        line = {
            "type": "message",
            **{name: row[name] for name in fields},
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
                    "data": base64.b64encode(bytes(a.data)).decode("ascii"),
                }
                for a in Attachment.objects.filter(message_id=row["id"])
            ]
        yield _dump(line)


_MESSAGE_FIELDS = {
    "role": str,
    "content": str,
    "reasoning": str,
    "tool_calls": list,
    "tool_call_id": str,
    "complete": bool,
    "steer": bool,  # a message injected into its run mid-turn (chat.pending)
}
_SESSION_FIELDS = {"title": str, "model": str, "system_prompt": str, "archived": bool}


def _parse(number: int, line: str) -> dict:
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as exc:
        raise TransferError(number, f"invalid JSON ({exc.msg})") from None
    if not isinstance(obj, dict):
        raise TransferError(number, "expected a JSON object")
    return obj


def _checked(
    number: int, obj: dict, model, shapes: dict, required: tuple[str, ...]
) -> dict:
    for name in required:
        if name not in obj:
            raise TransferError(number, f"missing {name!r}")
    for name, kind in shapes.items():
        if name not in obj:
            continue
        if not isinstance(obj[name], kind):
            raise TransferError(number, f"{name!r} must be {kind.__name__}")
        limit = getattr(model._meta.get_field(name), "max_length", None)
        if limit and len(obj[name]) > limit:
            raise TransferError(number, f"{name!r} is longer than {limit} characters")
    return {name: obj[name] for name in shapes if name in obj}


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
    if selected is None:
        return parent, None
    when = parse_datetime(selected) if isinstance(selected, str) else None
    if when is None:
        raise TransferError(number, "'selected_at' must be an ISO date and time")
    return parent, when


def _files(number: int, obj: dict) -> list[Checked]:
    """A message line's attachments, checked as uploads are."""
    files = obj.get("attachments", [])
    if not isinstance(files, list):
        raise TransferError(number, "'attachments' must be a list")
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
        try:
            checked.append(
                check_file(
                    name=str(file.get("name") or "file"),
                    declared=str(file.get("mime") or ""),
                    data=data,
                )
            )
        except AttachmentRefused as exc:
            raise TransferError(number, f"attachment {exc}") from None
    if len(checked) > max_files():
        raise TransferError(number, f"more than {max_files()} attachments")
    return checked


def _messages(
    lines: Iterator[tuple[int, str]], session_id: int
) -> Iterator[tuple[Message, int | None, list[Checked]]]:
    """Each message line as an unsaved message, its parent's position and
    its files."""
    roles = set(Message.Role.values)
    index = 0
    for number, line in lines:
        if not line.strip():
            continue
        obj = _parse(number, line)
        if obj.get("type") != "message":
            raise TransferError(
                number, f"expected a message line, got type {obj.get('type')!r}"
            )
        fields = _checked(number, obj, Message, _MESSAGE_FIELDS, ("role", "content"))
        if fields["role"] not in roles:
            raise TransferError(number, f"unknown role {fields['role']!r}")
        parent, selected = _place(number, obj, index)
        if selected is not None:
            fields["selected_at"] = selected
        yield Message(session_id=session_id, **fields), parent, _files(number, obj)
        index += 1


def session_import(*, owner, lines: Iterable[str]) -> tuple[ChatSession, int]:
    """Create a session of `owner` from an export; (session, messages imported).

    All or nothing: a bad line raises `TransferError` and nothing is kept.
    """
    numbered = enumerate(lines, start=1)
    header = next(((n, line) for n, line in numbered if line.strip()), None)
    if header is None:
        raise TransferError(0, "empty file")
    number, line = header
    head = _parse(number, line)
    if head.get("type") != "session" or head.get("format") != FORMAT:
        raise TransferError(
            number, f"not a {FORMAT} export (the first line is not its header)"
        )
    if head.get("version") != VERSION:
        raise TransferError(number, f"unsupported version {head.get('version')!r}")
    fields = _checked(number, head, ChatSession, _SESSION_FIELDS, ("title",))
    with transaction.atomic():
        session = session_create(owner=owner, **fields)
        ids: list[int] = []  # the new id of each message line
        parents: list[int | None] = []
        batch: list[Message] = []
        files: list[tuple[Message, Checked]] = []
        for message, parent, checked in _messages(numbered, session.pk):
            batch.append(message)
            parents.append(parent)
            files += [(message, file) for file in checked]
            if len(batch) == CHUNK:
                ids.extend(m.pk for m in Message.objects.bulk_create(batch))
                batch = []
                _store_files(owner, files)
                files = []
        ids.extend(m.pk for m in Message.objects.bulk_create(batch))
        _store_files(owner, files)
        _link(ids, parents)
    return session, len(ids)


def _store_files(owner, files: list[tuple[Message, Checked]]) -> None:
    """The imported files of messages just created (their ids are known)."""
    Attachment.objects.bulk_create(
        Attachment(
            owner=owner,
            message_id=message.pk,
            name=file.name,
            kind=file.kind,
            mime=file.mime,
            size=len(file.data),
            data=file.data,
        )
        for message, file in files
    )


def _link(ids: list[int], parents: list[int | None]) -> None:
    """Point the created messages at their parents, CHUNK rows per query."""
    linked = [
        Message(pk=pk, parent_id=ids[parent])
        for pk, parent in zip(ids, parents, strict=True)
        if parent is not None
    ]
    Message.objects.bulk_update(linked, ["parent"], batch_size=CHUNK)


def session_markdown(*, session: ChatSession) -> Iterator[str]:
    """The session for people to read: its title, then each message under its
    role, tool calls and results in fenced blocks. Not read back (the JSON
    Lines export is the one that is)."""
    yield f"# {session.title}\n\n"
    if session.model:
        yield f"Model: `{session.model}`\n\n"
    if session.system_prompt:
        yield f"## System prompt\n\n{_fenced(session.system_prompt)}\n"
    headings = {"user": "User", "assistant": "Assistant", "tool": "Tool result"}
    rows = session.messages.order_by("id").values(
        "id", "role", "content", "tool_calls", "tool_call_id", "complete", "steer"
    )
    with_files = set(
        Attachment.objects.filter(message__session=session).values_list(
            "message_id", flat=True
        )
    )
    for row in rows.iterator(chunk_size=CHUNK):
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
        for call in row["tool_calls"] or []:
            function = call.get("function") or {}
            name = function.get("name") or call.get("name") or "tool"
            yield f"\nTool call `{name}`:\n\n{_fenced(function.get('arguments', ''))}"
        yield "\n"


def _markdown_files(message_id: int) -> Iterator[str]:
    """A message's files: text ones in full, images by name and size."""
    for a in Attachment.objects.filter(message_id=message_id):
        if a.kind == Attachment.Kind.TEXT:
            text = bytes(a.data).decode("utf-8-sig", errors="replace")
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
