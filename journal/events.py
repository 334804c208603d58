"""Every journaled event type, declared once with its payload shape (DESIGN §3).

`validate(type, payload)` runs on every append; a test checks each type here.
Live-only messages (`metering`, heartbeats) are not declared: they are never
journaled.
"""

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
        EventType("start", {}, {"model": _STR, "provider": _STR, "session_id": int}),
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
        EventType("status", {"message": _STR}, {}),
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
END_STATUSES = frozenset({"completed", "failed", "cancelled", "interrupted"})


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
