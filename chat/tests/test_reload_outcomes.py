"""What a page drawing finished answers from saved messages learns from the
API about their tool calls (issue 41, item 6): a call's failure and a
person's decision, which a tool message does not keep (`tool_outcomes` of
`GET /api/sessions/<id>/`)."""

import httpx
import pytest

from hermes_testing.api import (
    CALCULATOR_STEP,
    decide,
    new_session,
    start_run,
    stream,
    waiting_at_tool,
)
from hermes_testing.fake_llm import Reply


def _detail(server, headers: dict, session_id: int) -> dict:
    response = httpx.get(f"{server.url}/api/sessions/{session_id}/", headers=headers)
    assert response.status_code == 200, response.text
    return response.json()


def test_a_denied_call_is_listed_denied_with_its_note(
    server, alice, fake_llm, live_worker, asking
):
    _, headers = alice
    session_id, run_id = waiting_at_tool(
        server, headers, fake_llm, Reply(text="No maths then.")
    )
    assert (
        decide(server, headers, run_id, decision="deny", note="not now").status_code
        == 202
    )
    stream(server, headers, run_id)
    assert _detail(server, headers, session_id)["tool_outcomes"] == {
        run_id: {
            "call_1": {
                "is_error": True,
                "approval": {"decision": "deny", "note": "not now"},
            }
        }
    }


@pytest.mark.slow
def test_failed_calls_are_listed_and_calls_that_ran_are_not(
    server, alice, fake_llm, live_worker
):
    _, headers = alice
    broken = Reply(
        tool_calls=[
            {"id": "call_1", "name": "calculator", "arguments": '{"expression": "6*"}'}
        ]
    )
    fake_llm.push(CALCULATOR_STEP, Reply(text="42."), broken, Reply(text="Oops."))
    session_id = new_session(server, headers)
    first = start_run(server, headers, session_id, "what is 6*7?")
    stream(server, headers, first)
    assert _detail(server, headers, session_id)["tool_outcomes"] == {}
    second = start_run(server, headers, session_id, "and 6*?")
    stream(server, headers, second)
    # Both runs' calls are named "call_1": listed by run.
    assert _detail(server, headers, session_id)["tool_outcomes"] == {
        second: {"call_1": {"is_error": True}}
    }
