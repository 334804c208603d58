"""Reader cursors (DESIGN §5, cursor table).

A cursor is where a reader resumes. Query parameters win over the
`Last-Event-ID` header by their mere presence, even when they do not parse. A
cursor that asks to resume but cannot be used (another run, malformed,
negative, beyond the journal) replays from the start: never skip.
"""

from dataclasses import dataclass


@dataclass(frozen=True)
class Cursor:
    after_seq: int
    # Why a cursor that asked to resume was not usable; empty when it was.
    unusable_reason: str = ""


def _parse_seq(raw: str) -> int | None:
    raw = raw.strip()
    if not raw.isdigit():
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
