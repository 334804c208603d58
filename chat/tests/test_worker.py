"""The turn worker against the loopback model server, read over real sockets.

See docs/architecture.md §6.
"""

import time

import httpx
import pytest

from chat.models import ChatSession, Message, Turn
from hermes_testing.api import (
    CALCULATOR_STEP,
    LONG,
    new_session,
    start_run,
    stream,
    text_of,
)
from hermes_testing.fake_llm import Reply
from hermes_testing.harness import wait_until
from journal.models import Event


def test_completed_turn(server, alice, fake_llm, live_worker):
    fake_llm.push(
        Reply(
            text="Hello **there**, friend.",
            reasoning="think first",
            usage={"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18},
        )
    )
    session_id = new_session(server, alice[1])
    run_id = start_run(server, alice[1], session_id, "hi")
    events = stream(server, alice[1], run_id)
    kinds = [kind for _, kind, _ in events]
    assert kinds[0] == "start" and kinds[-1] == "end"
    assert text_of(events) == "Hello **there**, friend."
    assert "".join(d["text"] for _, k, d in events if k == "reasoning") == "think first"
    usage = [d for _, k, d in events if k == "usage"]
    assert usage == [{"input_tokens": 11, "output_tokens": 7, "total_tokens": 18}]
    end = events[-1][2]
    assert (end["status"], end["terminal_state"]) == ("completed", "completed")
    message = Message.objects.get(pk=end["message_id"])
    assert (message.content, message.complete) == ("Hello **there**, friend.", True)
    # Replay reproduces exactly what the live reader saw.
    assert stream(server, alice[1], run_id) == events
    turn = Turn.objects.get(run_id=run_id)
    assert (
        turn.usage["total_tokens"] == 18
        and turn.diagnostics["model_requests_started"] == 1
    )
    assert fake_llm.post_count == 1
    wait_until(lambda: live_worker.active_provider_requests == 0)


def _history_contents(request):
    return [(m["role"], m.get("content")) for m in request.messages]


def test_cut_stream_every_time_fails_then_next_turn_sends_each_fragment_once(
    server, alice, fake_llm, live_worker
):
    fake_llm.strict_roles = True  # a chat template that needs alternating roles
    fake_llm.push(*[Reply(text=LONG, cut_after_chars=40) for _ in range(4)])
    session_id = new_session(server, alice[1])
    run_id = start_run(server, alice[1], session_id, "first question")
    events = stream(server, alice[1], run_id)
    statuses = [d["message"] for _, k, d in events if k == "status"]
    assert [s.split(";")[0] for s in statuses] == [
        f"Retry attempt: stream-resume {k}/3" for k in (1, 2, 3)
    ]
    assert not [1 for _, k, _ in events if k == "usage"]
    end = events[-1][2]
    assert end["status"] == "failed" and end["error"]["category"] == "network"
    assert fake_llm.post_count == 4
    fragments = list(
        Message.objects.filter(session_id=session_id, role="assistant").values_list(
            "content", flat=True
        )
    )
    assert (
        len(fragments) == 4
        and all(fragments)
        and not any(
            Message.objects.filter(session_id=session_id, role="assistant").values_list(
                "complete", flat=True
            )
        )
    )
    assert "".join(fragments) == text_of(events)

    fake_llm.push(
        Reply(
            text="Second answer.",
            usage={"prompt_tokens": 50, "completion_tokens": 3, "total_tokens": 53},
        )
    )
    second = start_run(server, alice[1], session_id, "second question")
    events = stream(server, alice[1], second)
    assert (
        text_of(events) == "Second answer." and events[-1][2]["status"] == "completed"
    )
    assert fake_llm.post_count == 5
    # Each fragment once, in order, as one assistant message: the roles
    # alternate, as chat templates that require it need.
    sent = _history_contents(fake_llm.requests[-1])
    assert sent == [
        ("user", "first question"),
        ("assistant", "".join(fragments)),
        ("user", "second question"),
    ]
    # And each resume request ended in one assistant message holding all that
    # was shown so far.
    resumes = [_history_contents(r)[1:] for r in fake_llm.requests[1:4]]
    assert resumes == [[("assistant", "".join(fragments[:n]))] for n in (1, 2, 3)]
    assert Turn.objects.get(run_id=second).usage["total_tokens"] == 53
    wait_until(lambda: live_worker.active_provider_requests == 0)


@pytest.mark.slow
def test_cancel_of_a_stalled_stream_closes_the_provider_connection(
    server, alice, fake_llm, live_worker
):
    fake_llm.push(Reply(text=LONG, stall_after_chars=24))
    session_id = new_session(server, alice[1])
    run_id = start_run(server, alice[1], session_id, "stall please")
    fake_llm.wait_stalled(0, timeout=10)
    wait_until(lambda: Event.objects.filter(run_id=run_id, type="token").exists())
    asked = time.monotonic()
    response = httpx.post(f"{server.url}/api/runs/{run_id}/cancel/", headers=alice[1])
    assert response.status_code == 202
    fake_llm.wait_closed(0, timeout=10)
    closed = fake_llm.requests[0]
    # The stalled stream would wait out its idle timeout (minutes); the cancel
    # closing it within a few seconds, however busy the machine, proves the
    # cancel won the race (on an idle machine it takes well under a second).
    assert closed.closed_by == "client" and closed.closed_at - asked < 5.0
    events = stream(server, alice[1], run_id)
    end = events[-1][2]
    assert (end["status"], end["terminal_state"]) == ("cancelled", "cancelled-by-user")
    partial = text_of(events)
    assert partial and LONG.startswith(partial)
    kept = list(
        Message.objects.filter(session_id=session_id, role="assistant").values_list(
            "content", flat=True
        )
    )
    assert kept == [partial]
    fake_llm.push(Reply(text="Back again."))
    nxt = start_run(server, alice[1], session_id, "and now?")
    assert text_of(stream(server, alice[1], nxt)) == "Back again."
    wait_until(lambda: live_worker.active_provider_requests == 0)


def test_auth_failure_fails_at_once(server, alice, fake_llm, live_worker):
    fake_llm.push(Reply(status=401, error_body={"error": {"message": "bad key"}}))
    session_id = new_session(server, alice[1])
    run_id = start_run(server, alice[1], session_id, "hello")
    events = stream(server, alice[1], run_id)
    end = events[-1][2]
    assert end["status"] == "failed" and end["error"]["category"] == "auth"
    assert [d["category"] for _, k, d in events if k == "error"] == ["auth"]
    assert fake_llm.post_count == 1
    wait_until(lambda: live_worker.active_provider_requests == 0)


@pytest.mark.slow
def test_rate_limit_then_success_is_retried_with_retry_after(
    server, alice, fake_llm, live_worker
):
    fake_llm.push(
        Reply(status=429, retry_after=0.3), Reply(status=500), Reply(text="ok now")
    )
    session_id = new_session(server, alice[1])
    run_id = start_run(server, alice[1], session_id, "hello")
    events = stream(server, alice[1], run_id)
    assert text_of(events) == "ok now" and events[-1][2]["status"] == "completed"
    requests = fake_llm.requests
    assert len(requests) == 3
    assert requests[1].received_at - requests[0].received_at >= 0.3
    diagnostics = Turn.objects.get(run_id=run_id).diagnostics
    assert (
        diagnostics["http_retries"] == 2 and diagnostics["model_requests_started"] == 3
    )


def test_stream_dying_before_content_is_reopened_silently(
    server, alice, fake_llm, live_worker
):
    fake_llm.push(
        Reply(text="whole answer", cut_after_chars=0), Reply(text="whole answer")
    )
    session_id = new_session(server, alice[1])
    run_id = start_run(server, alice[1], session_id, "hello")
    events = stream(server, alice[1], run_id)
    assert text_of(events) == "whole answer"
    assert not [1 for _, k, _ in events if k == "status"]
    assert Turn.objects.get(run_id=run_id).diagnostics["transparent_retries"] == 1


@pytest.mark.slow
def test_tool_call_step_then_answer(server, alice, fake_llm, live_worker):
    fake_llm.push(CALCULATOR_STEP, Reply(text="It is 42."))
    session_id = new_session(server, alice[1])
    run_id = start_run(server, alice[1], session_id, "what is 6*7?")
    events = stream(server, alice[1], run_id)
    tool = [d for _, k, d in events if k == "tool"]
    done = [d for _, k, d in events if k == "tool_complete"]
    assert tool[0]["name"] == "calculator" and done[0]["result"] == "42"
    assert done[0]["is_error"] is False
    assert text_of(events) == "It is 42."
    second = fake_llm.requests[1].messages
    assert second[-1] == {"role": "tool", "tool_call_id": "call_1", "content": "42"}
    roles = list(
        Message.objects.filter(session_id=session_id).values_list("role", flat=True)
    )
    assert roles == ["user", "assistant", "tool", "assistant"]


@pytest.mark.slow
def test_second_run_while_one_is_active_is_409_and_idempotency_key_reuses(
    server, alice, fake_llm, live_worker
):
    fake_llm.push(Reply(text=LONG, stall_after_chars=8))
    session_id = new_session(server, alice[1])
    key = {"Idempotency-Key": "abc-123"}
    first = start_run(server, alice[1], session_id, "one", **key)
    assert start_run(server, alice[1], session_id, "one", **key) == first
    response = httpx.post(
        f"{server.url}/api/sessions/{session_id}/runs/",
        json={"content": "two"},
        headers=alice[1],
    )
    assert response.status_code == 409 and response.json()["run_id"] == first
    assert (
        ChatSession.objects.get(pk=session_id).messages.filter(role="user").count() == 1
    )
    listed = httpx.get(f"{server.url}/api/sessions/", headers=alice[1]).json()
    assert [s["active_run_id"] for s in listed] == [first]
    httpx.post(f"{server.url}/api/runs/{first}/cancel/", headers=alice[1])
    assert stream(server, alice[1], first)[-1][2]["status"] == "cancelled"
    listed = httpx.get(f"{server.url}/api/sessions/", headers=alice[1]).json()
    assert [s["active_run_id"] for s in listed] == [None]


def test_models_come_from_settings_and_v1_models_across_providers(
    server, alice, fake_llm, live_worker, settings
):
    from chat.providers import registry

    second = {
        "name": "second",
        "base_url": fake_llm.base_url,
        "api_key_env": "SECOND_KEY",
        "models": ["other-model"],
    }
    settings.HERMES = {**settings.HERMES, "PROVIDERS": [second]}
    registry.reset()
    listed = httpx.get(f"{server.url}/api/models/", headers=alice[1]).json()
    providers = {m["id"]: m["provider"] for m in listed["models"]}
    assert providers["demo"] == "demo" and providers["fake-model"] == "openai"
    assert providers["other-model"] == "second" and listed["default"] == "fake-model"
    fake_llm.push(Reply(text="From the second provider."))
    session_id = new_session(server, alice[1])
    response = httpx.post(
        f"{server.url}/api/sessions/{session_id}/runs/",
        json={"content": "hi", "model": "other-model"},
        headers=alice[1],
    )
    run_id = response.json()["run_id"]
    assert text_of(stream(server, alice[1], run_id)) == "From the second provider."
    assert Turn.objects.get(run_id=run_id).provider == "second"
    assert fake_llm.requests[-1].body["model"] == "other-model"
    registry.reset()


def test_a_question_after_a_run_that_failed_without_text_keeps_roles_alternating(
    server, alice, fake_llm, live_worker
):
    fake_llm.strict_roles = True  # a chat template that needs alternating roles
    fake_llm.push(Reply(status=401), Reply(text="Answered."))
    session_id = new_session(server, alice[1])
    first = start_run(server, alice[1], session_id, "first question")
    assert stream(server, alice[1], first)[-1][2]["status"] == "failed"
    second = start_run(server, alice[1], session_id, "second question")
    events = stream(server, alice[1], second)
    assert text_of(events) == "Answered.", events[-1]
    assert _history_contents(fake_llm.requests[-1]) == [
        ("user", "first question\n\nsecond question")
    ]
