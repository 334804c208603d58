"""Moving a session between installs: export to and import from JSON Lines.

The file is a header line with the session, then one line per message in
session order. A round trip keeps, exactly, each message's role, content,
reasoning, tool calls, tool call id, complete flag and order. Runs and their
journals stay behind (a message's `run_id` is informative only), and so do
owners: the importer names the new owner.
"""

import json
from collections.abc import Iterable, Iterator
from typing import IO

from django.db import transaction

from .models import ChatSession, Message
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
    fields = ("role", "content", "reasoning", "tool_calls", "tool_call_id", "complete")
    rows = session.messages.order_by("id").values(*fields, "run_id", "created_at")
    for row in rows.iterator(chunk_size=CHUNK):
        yield _dump(
            {
                "type": "message",
                **{name: row[name] for name in fields},
                "run_id": row["run_id"],
                "created_at": row["created_at"].isoformat(),
            }
        )


_MESSAGE_FIELDS = {
    "role": str,
    "content": str,
    "reasoning": str,
    "tool_calls": list,
    "tool_call_id": str,
    "complete": bool,
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


def _messages(lines: Iterator[tuple[int, str]], session_id: int) -> Iterator[Message]:
    roles = set(Message.Role.values)
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
        yield Message(session_id=session_id, **fields)


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
    count = 0
    with transaction.atomic():
        session = session_create(owner=owner, **fields)
        batch: list[Message] = []
        for message in _messages(numbered, session.pk):
            batch.append(message)
            if len(batch) == CHUNK:
                count += len(Message.objects.bulk_create(batch))
                batch = []
        count += len(Message.objects.bulk_create(batch))
    return session, count


def write_export(*, session: ChatSession, out: IO[str]) -> int:
    """Write the export to `out`; return the number of messages written."""
    written = -1  # the header is not a message
    for line in session_export(session=session):
        out.write(line)
        written += 1
    return written
