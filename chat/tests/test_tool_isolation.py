"""A tool that computes forever does not freeze the server (chat.toolpool).

The turn worker runs inside the server's event loop, as in the embedded
deployment; a client thread keeps asking `/healthz` while the tool runs.
"""

import threading
import time

import httpx
import pytest

from chat import tools
from hermes_testing import tool_doubles
from hermes_testing.api import new_session, start_run, stream
from hermes_testing.fake_llm import Reply

HEALTH_BUDGET_S = 1.0  # the server must answer within this while a tool runs


def _tool_step(*calls: tuple[str, str]) -> Reply:
    return Reply(
        tool_calls=[
            {"id": f"call_{i}", "name": name, "arguments": args}
            for i, (name, args) in enumerate(calls)
        ]
    )


class HealthProbe(threading.Thread):
    """Asks `/healthz` back to back; records (start, latency) of each answer."""

    def __init__(self, url: str):
        super().__init__(daemon=True)
        self.url, self.done = url, threading.Event()
        self.answers: list[tuple[float, float]] = []

    def run(self) -> None:
        with httpx.Client(timeout=30) as client:
            while not self.done.is_set():
                began = time.monotonic()
                client.get(f"{self.url}/healthz")
                self.answers.append((began, time.monotonic() - began))

    def during(self, start: float, end: float) -> list[float]:
        return [lat for began, lat in self.answers if start <= began <= end]


@pytest.fixture
def gil_bomb_tool(settings):
    tools.register(
        tools.Tool(name="gil_bomb", description="", func=tool_doubles.gil_bomb)
    )
    settings.HERMES = {
        **settings.HERMES,
        "TOOLS": ["calculator", "gil_bomb"],
        "TOOL_TIMEOUT_S": 3.0,  # low, so the kill comes within the test
    }
    yield
    tools.unregister("gil_bomb")


@pytest.mark.slow
def test_server_answers_while_a_runaway_tool_runs_and_the_tool_is_killed(
    server, alice, fake_llm, live_worker, gil_bomb_tool
):
    fake_llm.push(_tool_step(("gil_bomb", "{}")), Reply(text="It did not finish."))
    session_id = new_session(server, alice[1])
    probe = HealthProbe(server.url)
    probe.start()
    try:
        run_id = start_run(server, alice[1], session_id, "run the bomb")
        seen = {}
        events = []
        for event in _timed_events(server, alice[1], run_id):
            seen.setdefault(event[1], time.monotonic())
            events.append(event)
    finally:
        probe.done.set()
        probe.join(30)
    done = next(d for _, k, d in events if k == "tool_complete")
    assert done["is_error"] is True
    assert done["result"] == "error: gil_bomb took longer than 3 s and was stopped"
    assert done["duration_ms"] >= 2900  # it really ran until the kill
    latencies = probe.during(seen["tool"], seen["tool_complete"])
    assert len(latencies) >= 3, probe.answers  # asked throughout the bomb
    assert max(latencies) < HEALTH_BUDGET_S, latencies
    assert events[-1][1] == "end" and events[-1][2]["status"] == "completed"


def _timed_events(server, headers, run_id):
    """The run's events as they arrive, so the test sees when each came."""
    import json

    from httpx_sse import EventSource

    with httpx.Client(timeout=60) as client:
        url = f"{server.url}/api/runs/{run_id}/events/"
        with client.stream("GET", url, headers=headers) as response:
            assert response.status_code == 200
            for sse in EventSource(response).iter_sse():
                if sse.data:
                    yield sse.id, sse.event, json.loads(sse.data)


def test_calculator_bombs_are_refused_at_once_through_a_real_run(
    server, alice, fake_llm, live_worker
):
    bombs = ["round(1, -10**9)", "round(1, -4*10**7)", "9**9**9", "10**10**10"]
    fake_llm.push(
        _tool_step(*(("calculator", f'{{"expression": "{b}"}}') for b in bombs)),
        Reply(text="Too big."),
    )
    session_id = new_session(server, alice[1])
    probe = HealthProbe(server.url)
    probe.start()
    try:
        run_id = start_run(server, alice[1], session_id, "compute these")
        events = stream(server, alice[1], run_id)
    finally:
        probe.done.set()
        probe.join(30)
    results = [d["result"] for _, k, d in events if k == "tool_complete"]
    assert results == [
        "error: round() takes at most 1000 digits",
        "error: round() takes at most 1000 digits",
        "error: result too large (over 10000 bits)",
        "error: result too large (over 10000 bits)",
    ]
    assert max(lat for _, lat in probe.answers) < HEALTH_BUDGET_S


def test_tool_calls_past_the_per_step_cap_answer_an_error(
    server, alice, fake_llm, live_worker, settings
):
    settings.HERMES = {**settings.HERMES, "MAX_TOOL_CALLS_PER_STEP": 3}
    calls = [("calculator", f'{{"expression": "{i}*7"}}') for i in range(5)]
    fake_llm.push(_tool_step(*calls), Reply(text="Done."))
    session_id = new_session(server, alice[1])
    run_id = start_run(server, alice[1], session_id, "five sums")
    events = stream(server, alice[1], run_id)
    done = [d for _, k, d in events if k == "tool_complete"]
    assert [d["result"] for d in done[:3]] == ["0", "7", "14"]
    assert all(d["is_error"] for d in done[3:]) and len(done) == 5
    assert "at most 3 tool calls per model step" in done[3]["result"]
    # Every call got its tool message, so the next request is well formed.
    answered = [m["tool_call_id"] for m in fake_llm.requests[1].messages[-5:]]
    assert answered == [f"call_{i}" for i in range(5)]
