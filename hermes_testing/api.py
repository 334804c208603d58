"""What tests do through the HTTP API, shared by every test module that needs it:
make a session, start a run, read its SSE stream, and the text it streamed.

These talk to a real server (`hermes_testing.harness.AsgiServer`, the `server`
fixture) over a real socket.
"""

import httpx

from hermes_testing.harness import read_sse

from .fake_llm import Reply

LONG = "The quick brown fox jumps over the lazy dog. " * 8
# A model step that only calls the calculator; the model answers on the next.
CALCULATOR_STEP = Reply(
    text="",
    tool_calls=[
        {"id": "call_1", "name": "calculator", "arguments": '{"expression": "6*7"}'}
    ],
)


def start_run(server, headers: dict, session_id: int, content: str, **extra) -> str:
    """POST a run to the session; its id. `extra` are more request headers."""
    response = httpx.post(
        f"{server.url}/api/sessions/{session_id}/runs/",
        json={"content": content},
        headers={**headers, **extra},
    )
    assert response.status_code in (200, 201), response.text
    return response.json()["run_id"]


def new_session(server, headers: dict) -> int:
    """A new session of the user whose credentials `headers` carry; its id."""
    response = httpx.post(
        f"{server.url}/api/sessions/", json={"title": "t"}, headers=headers
    )
    assert response.status_code == 201, response.text
    return response.json()["id"]


def stream(server, headers: dict, run_id: str, **kw) -> list:
    """The run's SSE events `(id, type, data)` until the server closes."""
    result = read_sse(f"{server.url}/api/runs/{run_id}/events/", headers=headers, **kw)
    assert result.status == 200
    return result.events


def text_of(events: list) -> str:
    """The assistant text of `token` events, joined."""
    return "".join(data["text"] for _, kind, data in events if kind == "token")


def waiting_at_tool(
    server, headers: dict, fake_llm, *answers: Reply
) -> tuple[int, str]:
    """A new session whose run calls the calculator and waits for a person's
    approval (the test sets the policy to ask); `answers` follow the approval.
    Its session id and run id."""
    from hermes_testing.harness import wait_until
    from journal.models import Run

    fake_llm.push(CALCULATOR_STEP, *answers)
    session_id = new_session(server, headers)
    run_id = start_run(server, headers, session_id, "what is 6*7?")
    waiting = Run.objects.filter(id=run_id, status=Run.Status.WAITING)
    wait_until(waiting.exists, timeout=30)
    return session_id, run_id


def decide(server, headers: dict, run_id: str, **body) -> httpx.Response:
    """POST an approval decision (`decision=`, `note=`) for the run."""
    return httpx.post(
        f"{server.url}/api/runs/{run_id}/approval/", json=body, headers=headers
    )


def event_types(events: list) -> list[str]:
    """The event types, without step statuses and usage, a run of text events
    of one kind counted once: how a reply's text is cut into events is the
    committer's cadence (a delta after a pause is committed at once, the
    rest a tick later, `chat.writer`), not the run's shape."""
    kinds = [kind for _, kind, _ in events if kind not in ("status", "usage")]
    return [
        kind
        for i, kind in enumerate(kinds)
        if i == 0 or kind != kinds[i - 1] or kind not in ("token", "reasoning")
    ]
