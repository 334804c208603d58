"""Journals of runs, event by event, as the worker writes them: the inputs the
Python fold (`journal.fold`) and the page's (`static/hermes/js/fold.js`) are
both fed in tests, which then compare what each folded.

Each journal is a list of `(type, payload)`; `seq` is its position from 1.
"""

from typing import Any

Journal = list[tuple[str, dict[str, Any]]]

_START = ("start", {"model": "fake-model", "provider": "fake", "session_id": 1})


def _end(status: str, state: str, **extra: Any) -> tuple[str, dict[str, Any]]:
    return (
        "end",
        {"status": status, "terminal_state": state, "message_id": 7, **extra},
    )


def _tool(call_id: str, name: str, args: str) -> tuple[str, dict[str, Any]]:
    return ("tool", {"tool_call_id": call_id, "name": name, "args": args})


def _done(call_id: str, name: str, result: str, **extra: Any):
    payload = {"is_error": False, "duration_ms": 3.5, **extra}
    return (
        "tool_complete",
        {"tool_call_id": call_id, "name": name, "result": result, **payload},
    )


JOURNALS: dict[str, Journal] = {
    "plain-text": [
        _START,
        ("token", {"text": "Hello, "}),
        ("token", {"text": "world"}),
        ("token", {"text": ""}),
        ("token", {"text": ".\n\n```py\nprint(1)\n```\n"}),
        ("usage", {"input_tokens": 12, "output_tokens": 34, "total_tokens": 46}),
        _end("completed", "completed"),
    ],
    "reasoning": [
        _START,
        ("reasoning", {"text": "The user wants "}),
        ("reasoning", {"text": "a greeting."}),
        ("token", {"text": "Hi "}),
        ("token", {"text": "there!"}),
        _end("completed", "completed"),
    ],
    "tools-between-text": [
        _START,
        ("reasoning", {"text": "Compute first."}),
        ("token", {"text": "Let me compute. What "}),
        _tool("call_1", "calculator", '{"expression": "6*7"}'),
        _tool("call_2", "current_time", "{}"),
        _tool("call_1", "calculator", '{"expression": "again"}'),  # repeated: no card
        _done("call_1", "calculator", "42"),
        _done("call_2", "current_time", "no clock", is_error=True, duration_ms=1),
        ("reasoning", {"text": "Now answer."}),
        ("token", {"text": "you are seeing: "}),
        ("token", {"text": "42."}),
        _done("call_9", "calculator", "late"),  # a completion with no call before it
        ("token", {"text": " Done."}),
        ("usage", {"input_tokens": 30, "output_tokens": 8}),
        _end("completed", "completed"),
    ],
    "cut-and-resume": [
        _START,
        ("token", {"text": "Durable streams keep "}),
        ("status", {"message": "Retry attempt: stream-resume 1/3; body cut"}),
        ("token", {"text": "every word"}),
        ("status", {"message": "Retry attempt: stream-resume 2/3; idle timeout"}),
        ("token", {"text": ", always."}),
        _end("completed", "completed"),
    ],
    "failed": [
        _START,
        ("token", {"text": "Partial answ"}),
        ("status", {"message": "Retry attempt: stream-resume 1/1; body cut"}),
        (
            "error",
            {"category": "network", "message": "peer closed", "retryable": True},
        ),
        _end(
            "failed",
            "provider-error",
            error={"category": "network", "message": "peer closed"},
        ),
    ],
    "failed-end-only": [
        _START,
        _end(
            "interrupted",
            "lost-worker",
            message_id=None,
            error={"category": "worker", "message": "the worker stopped"},
        ),
    ],
    "cancelled": [
        _START,
        ("reasoning", {"text": "Long thought"}),
        ("token", {"text": "Stopped mid"}),
        _end("cancelled", "cancelled-by-user"),
    ],
    "usage-in-several-events": [
        _START,
        ("token", {"text": "Step one."}),
        ("usage", {"input_tokens": 10, "output_tokens": 5, "total_tokens": 15}),
        _tool("call_1", "calculator", '{"expression": "1+1"}'),
        _done("call_1", "calculator", "2"),
        ("token", {"text": "Step two."}),
        ("usage", {"input_tokens": 20, "output_tokens": 7}),
        ("usage", {"total_tokens": 27}),
        _end("completed", "completed"),
    ],
    "steered": [  # two steers landed after a tool step (chat.pending)
        _START,
        ("token", {"text": "Let me compute."}),
        _tool("call_1", "calculator", '{"expression": "6*7"}'),
        _done("call_1", "calculator", "42"),
        ("steer", {"text": "In French.", "message_id": 7, "pending_id": 1}),
        ("steer", {"text": "In French.", "message_id": 8, "pending_id": 2}),
        ("steer", {"text": "", "message_id": 9, "pending_id": 3}),
        ("token", {"text": "Quarante-deux."}),
        _end("completed", "completed"),
    ],
}


def events_of(journal: Journal) -> list[dict[str, Any]]:
    """The journal as `events.json` pages list it: `{seq, event, data}`."""
    return [
        {"seq": seq, "event": kind, "data": data}
        for seq, (kind, data) in enumerate(journal, start=1)
    ]
