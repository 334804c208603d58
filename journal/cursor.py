"""Reader cursors and what a reader gets (docs/architecture.md §5, the cursor
and outcome tables).

A cursor is where a reader resumes. Query parameters win over the
`Last-Event-ID` header by their mere presence, even when they do not parse. A
cursor that asks to resume but cannot be used (another run, malformed,
negative, beyond the journal) replays from the start: never skip.

`decide` turns the run's state and the cursor into an `Outcome`, once for
every reader; each transport only maps it to its own status or close code.
"""

import enum
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .models import Run

# ASCII digits only (`str.isdigit` accepts '²' and '①', which `int` refuses),
# and short enough to stay far below Python's 4,300-digit conversion limit: a
# seq is a PositiveIntegerField, so ten digits hold every real one.
SEQ_PATTERN = re.compile(r"[0-9]{1,10}")


@dataclass(frozen=True)
class Cursor:
    after_seq: int
    # Why a cursor that asked to resume was not usable; empty when it was.
    unusable_reason: str = ""


def _parse_seq(raw: str) -> int | None:
    raw = raw.strip()
    if not SEQ_PATTERN.fullmatch(raw):
        return None
    return int(raw)


def parse_event_id(raw: str, *, run_id: str) -> tuple[int | None, str]:
    """`<run>:<seq>` -> (seq, "") or (None, reason)."""
    run_part, sep, seq_part = raw.strip().rpartition(":")
    if not sep:
        return None, "malformed event id"
    if run_part != run_id:
        return None, "event id of another run"
    seq = _parse_seq(seq_part)
    if seq is None:
        return None, "malformed event id"
    return seq, ""


def cursor_from_request(
    *, query: dict[str, str], last_event_id: str | None, run_id: str, last_seq: int
) -> Cursor:
    """Resolve the cursor from query parameters, then the `Last-Event-ID` header."""
    if "after_event_id" in query:
        seq, reason = parse_event_id(query["after_event_id"], run_id=run_id)
    elif "after_seq" in query:
        seq = _parse_seq(query["after_seq"])
        reason = "" if seq is not None else "malformed after_seq"
    elif last_event_id:
        seq, reason = parse_event_id(last_event_id, run_id=run_id)
    else:
        return Cursor(0)
    if seq is None:
        return Cursor(0, reason)
    if seq > last_seq:
        return Cursor(0, "cursor beyond the journal")
    return Cursor(seq)


class Verdict(enum.Enum):
    GONE = "gone"  # the events were pruned: SSE 410, WebSocket close 4410
    DONE = "done"  # a finished run, read to its end: SSE 204, WebSocket close 1000
    STREAM = "stream"  # replay after `after_seq`, then follow live


@dataclass(frozen=True)
class Outcome:
    verdict: Verdict
    after_seq: int = 0
    # For STREAM: why the reader's cursor was not used (told to the reader).
    note: str = ""


def decide(*, pruned: bool, terminal: bool, last_seq: int, cursor: Cursor) -> Outcome:
    """The outcome table: the run's state and the reader's cursor -> `Outcome`."""
    if pruned:
        return Outcome(Verdict.GONE)
    if terminal and cursor.after_seq >= last_seq:
        return Outcome(Verdict.DONE, cursor.after_seq)
    return Outcome(Verdict.STREAM, cursor.after_seq, cursor.unusable_reason)


def decide_for_run(run: "Run", cursor: Cursor) -> Outcome:
    """`decide` for a `Run` row, as the transports hold one."""
    return decide(
        pruned=run.pruned_at is not None,
        terminal=run.is_terminal,
        last_seq=run.last_seq,
        cursor=cursor,
    )
