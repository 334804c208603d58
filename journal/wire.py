"""The wire format of a run's events: every transport's bytes come from here.
See docs/architecture.md §5.

- SSE (`GET /api/runs/<id>/events/`, `replay_run --format sse`): one frame per
  record, `id: <run>:<seq>` / `event: <type>` / `data: <payload>`, plus the
  `retry:` head, comments (keepalives, notes) and unjournaled notifications.
- JSON frames (the WebSocket, `replay_run --format jsonl`): one object per
  record, `{"id", "seq", "event", "data"}`, the payload embedded as journaled.
- The `events.json` page (the API and the admin): its query parameters, parsed
  strictly (bad input is an error naming the parameter, never clamped), and the
  page document.

A payload is JSON text from `journal.store.encode`: one line (JSON escapes
every line break in its strings), never re-encoded on the way out. An event
type is a name from `journal.events.EVENT_TYPES`; it is still JSON-escaped in
a JSON frame, so no journaled value can break out of its field.
"""

import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from .store import Record

EVENTS_PAGE_DEFAULT = 1000  # events per events.json page when `limit` is absent
EVENTS_PAGE_MAX = 5000  # the largest `limit` an events.json page accepts
AFTER_SEQ_MAX = 2**31  # far beyond any seq (a PositiveIntegerField)
_INTEGER = re.compile(r"-?[0-9]{1,18}")  # ASCII digits; `int` cannot overflow

KEEPALIVE = ": keepalive\n\n"


def event_id(run_id: str, seq: int) -> str:
    """`<run>:<seq>`: what `journal.cursor.parse_event_id` reads back."""
    return f"{run_id}:{seq}"


# --- SSE ---------------------------------------------------------------------


# One SSE frame: run, seq, type, payload. The database fills in the same
# template for a replay's journal pages (`journal.store.read_frames`).
SSE_TEMPLATE = "id: %s:%s\nevent: %s\ndata: %s\n\n"


def sse_frame(run_id: str, record: Record) -> str:
    return SSE_TEMPLATE % (run_id, *record)


def sse_frames(run_id: str, records: Iterable[Record]) -> str:
    """`sse_frame` of each record, joined: what a page of them is on the wire."""
    return "".join([sse_frame(run_id, record) for record in records])


def sse_retry(retry_ms: int) -> str:
    """How long an `EventSource` waits before reconnecting."""
    return f"retry: {int(retry_ms)}\n\n"


def sse_comment(text: str) -> str:
    """A comment line: clients ignore it; one line whatever `text` holds."""
    return ": " + " ".join(text.splitlines()) + "\n\n"


def unusable_cursor_note(reason: str) -> str:
    """The comment an SSE stream opens with when its cursor was not usable."""
    return sse_comment(f"cursor unusable ({reason}); replaying from the start")


def sse_message(event: str, data: object) -> str:
    """An unjournaled message (the user's notifications): no id, data as JSON."""
    return f"event: {event}\ndata: {json.dumps(data)}\n\n"


# --- JSON frames ---------------------------------------------------------------


def json_frame(run_id: str, record: Record) -> str:
    """`{"id","seq","event","data"}`: the payload is embedded as journaled."""
    return (
        f'{{"id":"{run_id}:{record.seq}","seq":{record.seq},'
        f'"event":{json.dumps(record.type)},"data":{record.payload}}}'
    )


def json_event(run_id: str, record: Record) -> dict:
    """The same object as `json_frame`, decoded: an element of an events page."""
    return {
        "id": event_id(run_id, record.seq),
        "seq": record.seq,
        "event": record.type,
        "data": json.loads(record.payload),
    }


# --- formats: what a live transport writes per record ------------------------


@dataclass(frozen=True)
class Format:
    """A transport's encoding of records: one frame each, and how they are written.

    `journal.subscribe.subscribe_frames` encodes each live record once per hub
    and format and hands the same objects to every reader of that hub, so a
    frame must depend on the run and the record only. `joined`: the frames of
    a batch are one write (UTF-8 bytes); else one write (a text message) each.
    `template` (joined formats): `frame` as four `%s` (run, seq, type,
    payload) for the database to fill in, so that a reader's journal page
    comes made by the database (`journal.store.read_frames`). What follows
    its last field ends a frame and must appear nowhere else in one (SSE:
    the blank line; a payload is one line): pages are cut into writes there.
    """

    name: str
    frame: Callable[[str, Record], str]
    joined: bool
    template: str | None = None

    def writes(self, frames: Sequence[str]) -> list:
        """`frames` as this format's writes, in order."""
        return ["".join(frames).encode()] if self.joined else list(frames)

    def encode(self, run_id: str, records: Sequence[Record]) -> list:
        """`records`' writes, encoded here and now."""
        return self.writes([self.frame(run_id, r) for r in records])


# SSE: a batch's frames as one write. JSON frames: one WebSocket message each.
SSE = Format("sse", sse_frame, joined=True, template=SSE_TEMPLATE)
JSON_FRAMES = Format("json", json_frame, joined=False)


# --- the events.json page --------------------------------------------------------


@dataclass(frozen=True)
class PageParams:
    after_seq: int
    limit: int


class BadPageParam(ValueError):
    """A query parameter of an events page that cannot be used."""

    def __init__(self, name: str, problem: str):
        super().__init__(f"{name} {problem}")
        self.name = name
        self.problem = problem

    def body(self) -> dict:
        """The 400 document: the API's error shape (`chat.api_errors`)."""
        return {"error": str(self), "fields": {self.name: [self.problem]}}


def _integer(query: Mapping[str, str], name: str, default: int, lo: int, hi: int):
    raw = query.get(name)
    if raw is None:
        return default
    if not _INTEGER.fullmatch(raw.strip()):
        raise BadPageParam(name, f"must be an integer, got {raw[:40]!r}")
    value = int(raw)
    if not lo <= value <= hi:
        raise BadPageParam(name, f"must be between {lo} and {hi}")
    return value


def parse_page_params(query: Mapping[str, str]) -> PageParams:
    """`?after_seq=&limit=` of an events page; `BadPageParam` names a bad one.

    Strict where a stream's cursor is forgiving: a page is asked for by code
    that pages on, and a page silently different from the one asked for would
    make it skip or repeat events.
    """
    return PageParams(
        after_seq=_integer(query, "after_seq", 0, 0, AFTER_SEQ_MAX),
        limit=_integer(query, "limit", EVENTS_PAGE_DEFAULT, 1, EVENTS_PAGE_MAX),
    )


def page(
    *, run_id: str, status: str, last_seq: int, records: list[Record], limit: int
) -> dict:
    """The events.json document; `next_after_seq` is null on the last page."""
    return {
        "run_id": run_id,
        "status": status,
        "last_seq": last_seq,
        "events": [json_event(run_id, r) for r in records],
        "next_after_seq": records[-1].seq if len(records) == limit else None,
    }
