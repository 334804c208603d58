"""Bounded agent loops (chat.budget) through real runs against the loopback
model: steps, tool calls, tokens and wall time, each with its end state.
"""

from __future__ import annotations

import json
import sys

import pytest
from django.conf import settings as django_settings

from chat.models import Message, Turn
from hermes_testing.api import LONG, new_session, start_run, stream, text_of
from hermes_testing.fake_llm import Reply
from journal.models import Event, Run


def _calculator(*expressions: str) -> Reply:
    return Reply(
        tool_calls=[
            {
                "id": f"call_{i}",
                "name": "calculator",
                "arguments": json.dumps({"expression": e}),
            }
            for i, e in enumerate(expressions)
        ]
    )


def _limits(settings, **limits) -> None:
    settings.HERMES = {**settings.HERMES, **limits}


def _run(server, alice) -> tuple[str, list]:
    session_id = new_session(server, alice[1])
    run_id = start_run(server, alice[1], session_id, "work on it")
    return run_id, stream(server, alice[1], run_id)


def _kinds(events: list, kind: str) -> list[dict]:
    return [data for _, k, data in events if k == kind]


def _end(events: list) -> dict:
    assert events[-1][1] == "end"
    return events[-1][2]


@pytest.mark.slow
def test_steps_are_shown_and_the_last_step_is_offered_no_tools(
    server, alice, fake_llm, live_worker, settings
):
    _limits(settings, RUN_MAX_STEPS=3)
    fake_llm.push(_calculator("1+1"), _calculator("2+2"), Reply(text="Done: 4."))
    run_id, events = _run(server, alice)
    assert [s["message"] for s in _kinds(events, "status")] == [
        "Step 2 of at most 3",
        "Step 3 of at most 3",
    ]
    offered = [bool(r.body.get("tools")) for r in fake_llm.requests]
    assert offered == [True, True, False]
    assert _end(events)["status"] == "completed"
    assert Turn.objects.get(run_id=run_id).diagnostics["steps"] == 3


def test_a_model_that_keeps_calling_tools_ends_at_the_step_limit(
    server, alice, fake_llm, live_worker, settings
):
    _limits(settings, RUN_MAX_STEPS=2)
    fake_llm.push(_calculator("1+1"), _calculator("2+2"))
    run_id, events = _run(server, alice)
    end = _end(events)
    assert (end["status"], end["terminal_state"]) == ("failed", "step-limit")
    assert end["error"] == {
        "category": "limit",
        "message": "the run reached its limit of 2 model steps",
    }
    assert len(_kinds(events, "tool_complete")) == 1  # the second step's call never ran
    assert fake_llm.post_count == 2
    run = Run.objects.get(id=run_id)
    assert (run.status, run.terminal_state) == ("failed", "step-limit")


def test_calls_past_the_tool_call_budget_are_refused(
    server, alice, fake_llm, live_worker, settings
):
    _limits(settings, RUN_MAX_TOOL_CALLS=2)
    fake_llm.push(_calculator("1+1", "2+2", "3+3"), Reply(text="Two of three."))
    _, events = _run(server, alice)
    results = [(d["result"], d["is_error"]) for d in _kinds(events, "tool_complete")]
    assert results[:2] == [("2", False), ("4", False)]
    assert results[2][1] is True and "at most 2 tool calls" in results[2][0]
    assert not fake_llm.requests[1].body.get("tools")  # budget spent: answer now
    assert _end(events)["status"] == "completed"


@pytest.mark.slow
def test_a_model_past_the_tool_call_budget_ends_the_run(
    server, alice, fake_llm, live_worker, settings
):
    _limits(settings, RUN_MAX_TOOL_CALLS=1)
    fake_llm.push(_calculator("1+1"), _calculator("2+2"))
    _, events = _run(server, alice)
    end = _end(events)
    assert (end["status"], end["terminal_state"]) == ("failed", "tool-call-limit")
    assert end["error"]["category"] == "limit"


def test_the_token_budget_ends_a_run_that_wants_more_steps(
    server, alice, fake_llm, live_worker, settings
):
    _limits(settings, RUN_MAX_TOKENS=40)  # each scripted reply reports 46 tokens
    fake_llm.push(_calculator("1+1"), Reply(text="never asked"))
    run_id, events = _run(server, alice)
    end = _end(events)
    assert (end["status"], end["terminal_state"]) == ("failed", "token-limit")
    assert end["error"]["message"] == "the run used 46 tokens of its 40 budget"
    assert _kinds(events, "tool") == []  # the step's call was not run
    assert fake_llm.post_count == 1
    assert _kinds(events, "usage")[0]["total_tokens"] == 46


def test_a_finished_answer_stands_past_the_token_budget(
    server, alice, fake_llm, live_worker, settings
):
    _limits(settings, RUN_MAX_TOKENS=10)
    fake_llm.push(Reply(text="Short answer."))
    _, events = _run(server, alice)
    assert _end(events)["status"] == "completed"


@pytest.mark.slow
def test_the_wall_time_limit_stops_a_streaming_run_and_keeps_its_text(
    server, alice, fake_llm, live_worker, settings
):
    _limits(settings, RUN_MAX_SECONDS=1.0)
    fake_llm.push(Reply(text=LONG, tokens_per_s=20, chunk_chars=2))
    run_id, events = _run(server, alice)
    end = _end(events)
    assert (end["status"], end["terminal_state"]) == ("failed", "time-limit")
    assert end["error"]["message"] == "the run reached its limit of 1 s"
    shown = text_of(events)
    assert shown and len(shown) < len(LONG)
    kept = Message.objects.filter(run_id=run_id, role="assistant")
    assert [m.content for m in kept] == [shown]


@pytest.mark.slow
def test_the_wall_time_limit_stops_a_hanging_tool(
    server, alice, fake_llm, live_worker, settings
):
    server_entry = {
        "name": "local",
        "command": sys.executable,
        "args": ["-m", "hermes_testing.mcp_server", "stdio"],
        "cwd": str(django_settings.BASE_DIR),
        "timeout_s": 120,
    }
    _limits(settings, MCP_SERVERS=[server_entry])
    # A first run starts the server, so the bounded run does not wait for it.
    fake_llm.push(
        Reply(tool_calls=[{"id": "call_0", "name": "local__pid", "arguments": "{}"}]),
        Reply(text="Started."),
    )
    _, warm = _run(server, alice)
    assert _kinds(warm, "tool_complete")[0]["is_error"] is False
    _limits(settings, RUN_MAX_SECONDS=3.0)
    fake_llm.push(
        Reply(tool_calls=[{"id": "call_0", "name": "local__hang", "arguments": "{}"}])
    )
    run_id, events = _run(server, alice)
    (done,) = _kinds(events, "tool_complete")
    assert done["is_error"] is True
    assert done["result"] == "error: stopped: the run was stopped while the tool ran"
    end = _end(events)
    assert (end["status"], end["terminal_state"]) == ("failed", "time-limit")
    # The history answers the call, so the session's next request is valid.
    tool_rows = Event.objects.filter(run_id=run_id, type="tool_complete").count()
    kept = Message.objects.filter(run_id=run_id, role="tool")
    assert tool_rows == kept.count() == 1
