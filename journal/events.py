"""Every journaled event type, declared once with its payload shape.
See docs/architecture.md §3.

`validate(type, payload)` runs on every append; a test checks each type here.
`storable()` cleans what PostgreSQL cannot store out of provider text, and no
event's payload is larger than `MAX_EVENT_BYTES` (the writer splits text).
Live-only messages (`metering`, heartbeats) are not declared: they are never
journaled.
"""

import re
from dataclasses import dataclass


class InvalidEvent(ValueError):
    """An event whose type is unknown or whose payload does not match its shape."""


@dataclass(frozen=True)
class EventType:
    name: str
    required: dict[str, type | tuple[type, ...]]
    optional: dict[str, type | tuple[type, ...]]


_STR = str
_NUM = (int, float)
_OPT_STR = (str, type(None))

EVENT_TYPES: dict[str, EventType] = {
    t.name: t
    for t in (
        EventType("start", {}, {"model": _STR, "provider": _STR, "subject": _STR}),
        EventType("token", {"text": _STR}, {}),
        EventType("reasoning", {"text": _STR}, {}),
        EventType("tool", {"tool_call_id": _STR, "name": _STR, "args": _STR}, {}),
        EventType(
            "tool_complete",
            {
                "tool_call_id": _STR,
                "name": _STR,
                "result": _STR,
                "is_error": bool,
                "duration_ms": _NUM,
            },
            {},
        ),
        # A tool call waits for a person's decision (chat.approvals).
        EventType(
            "approval_request",
            {"tool_call_id": _STR, "name": _STR, "args": _STR},
            {"expires_at": _STR},
        ),
        EventType(
            "approval",
            {"tool_call_id": _STR, "name": _STR, "decision": _STR},
            {"note": _STR, "always": bool},
        ),
        # A person's message injected into the running turn at a model-call
        # boundary (chat.pending): the model's next request ends with it.
        EventType(
            "steer",
            {"text": _STR},
            {"message_id": (int, type(None)), "pending_id": int},
        ),
        EventType("status", {"message": _STR}, {}),
        # Where the run's model stream stands in a response its provider keeps
        # upstream (docs/architecture.md, "Two cursors"): another worker
        # re-attaches there after this one is lost (journal.leases).
        EventType(
            "upstream",
            {
                "response_id": _STR,
                "sequence_number": int,
                "content_chars": int,
                "reasoning_chars": int,
            },
            {},
        ),
        EventType(
            "usage",
            {},
            {"input_tokens": int, "output_tokens": int, "total_tokens": int},
        ),
        EventType(
            "error",
            {"category": _STR, "message": _STR, "retryable": bool},
            {},
        ),
        EventType(
            "end",
            {"status": _STR, "terminal_state": _STR},
            {"message_id": (int, type(None)), "error": (dict, type(None))},
        ),
    )
}

TERMINAL = "end"
# Statuses that begin so say a stream is being re-attached, not regenerated
# (the turn engine's re-attach, and journal.leases queueing a lost run again).
REATTACH_STATUS = "Retry attempt: re-attach"
# Statuses that begin so say the answer was cut and asked for again, carrying
# what was shown: what follows may continue it or start over, so readers mark
# the place (`journal.fold`'s `resume` part).
RESUME_STATUS = "Retry attempt: stream-resume"
END_STATUSES = frozenset({"completed", "failed", "cancelled", "interrupted"})
DECISIONS = frozenset({"approve", "deny"})


def validate(event_type: str, payload: dict) -> None:
    """Raise `InvalidEvent` unless `payload` has the declared shape of `event_type`."""
    spec = EVENT_TYPES.get(event_type)
    if spec is None:
        raise InvalidEvent(f"unknown event type {event_type!r}")
    if not isinstance(payload, dict):
        raise InvalidEvent(f"{event_type}: payload must be an object")
    for key, kind in spec.required.items():
        if key not in payload:
            raise InvalidEvent(f"{event_type}: missing {key!r}")
        if not isinstance(payload[key], kind) or (
            kind is _NUM and isinstance(payload[key], bool)
        ):
            raise InvalidEvent(f"{event_type}: {key!r} has the wrong type")
    for key, kind in spec.optional.items():
        if key in payload and not isinstance(payload[key], kind):
            raise InvalidEvent(f"{event_type}: {key!r} has the wrong type")
    if event_type == TERMINAL and payload["status"] not in END_STATUSES:
        raise InvalidEvent(f"end: unknown status {payload['status']!r}")
    if event_type == "approval" and payload["decision"] not in DECISIONS:
        raise InvalidEvent(f"approval: unknown decision {payload['decision']!r}")


# A journaled event's JSON payload stays under this size; the writer splits
# text deltas into events of at most `TEXT_EVENT_CHARS` characters, which fits
# even if every character took the 6 bytes of a JSON escape (\uXXXX).
MAX_EVENT_BYTES = 64 * 1024
TEXT_EVENT_CHARS = 10_000

# What PostgreSQL text and jsonb cannot hold: NUL, and UTF-16 surrogates that
# are not part of a pair (a Python str can carry them; UTF-8 cannot encode them).
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


def storable(value):
    """`value` with every NUL and lone surrogate in its strings replaced by U+FFFD.

    Applied to whatever a provider hands over before it is journaled or kept,
    on every backend alike, so the journal and the session hold the same text.
    Dicts and lists are cleaned recursively (keys too); other values pass as is.
    """
    if isinstance(value, str):
        return _UNSTORABLE.sub("\ufffd", value) if _UNSTORABLE.search(value) else value
    if isinstance(value, dict):
        return {storable(k): storable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [storable(v) for v in value]
    return value
