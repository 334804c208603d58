import pytest

from journal.events import EVENT_TYPES, InvalidEvent, validate

VALID: dict[str, dict] = {
    "start": {"model": "m", "provider": "p"},
    "token": {"text": "hi"},
    "reasoning": {"text": "hm"},
    "tool": {"tool_call_id": "c1", "name": "calculator", "args": "{}"},
    "tool_complete": {
        "tool_call_id": "c1",
        "name": "calculator",
        "result": "2",
        "is_error": False,
        "duration_ms": 3,
    },
    "approval_request": {"tool_call_id": "c1", "name": "calculator", "args": "{}"},
    "approval": {"tool_call_id": "c1", "name": "calculator", "decision": "deny"},
    "steer": {"text": "In French, please.", "message_id": 7, "pending_id": 2},
    "status": {"message": "Retry attempt: stream-resume 1/3; body cut"},
    "upstream": {
        "response_id": "resp_1",
        "sequence_number": 7,
        "content_chars": 12,
        "reasoning_chars": 0,
    },
    "usage": {"input_tokens": 3, "output_tokens": 5},
    "error": {"category": "network", "message": "cut", "retryable": True},
    "end": {"status": "failed", "terminal_state": "provider-error", "message_id": None},
}


def test_every_declared_type_has_a_valid_example():
    assert set(VALID) == set(EVENT_TYPES)
    for event_type, payload in VALID.items():
        validate(event_type, payload)


@pytest.mark.parametrize(
    "event_type,payload",
    [
        ("token", {}),
        ("token", {"text": 3}),
        ("tool_complete", {**VALID["tool_complete"], "duration_ms": True}),
        ("end", {"status": "done", "terminal_state": "x"}),
        ("approval", {**VALID["approval"], "decision": "maybe"}),
        ("steer", {"message_id": 7}),
        ("steer", {"text": "x", "pending_id": "2"}),
        ("metering", {"tokens_per_s": 3}),
        ("status", "not an object"),
    ],
)
def test_bad_payloads_are_rejected(event_type, payload):
    with pytest.raises(InvalidEvent):
        validate(event_type, payload)
