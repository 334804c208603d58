"""Runs on a `responses` provider, end to end: the worker re-attaches to the
model's own answer after a cut, after losing its worker, and Stop cancels the
response upstream (docs/architecture.md, "Two cursors")."""

import json
import signal
import time

import httpx
import pytest

from chat.models import Message, Turn
from chat.worker import Worker
from hermes_testing.api import LONG, new_session, stream, text_of
from hermes_testing.fake_responses import (
    ResponsesReply,
    responses_provider,
)
from hermes_testing.harness import spawn, subprocess_env, wait_until
from hermes_testing.workers import LEASE_S
from journal.models import Event

USAGE = {"input_tokens": 30, "output_tokens": 90, "total_tokens": 120}


@pytest.fixture
def responses(settings, fake_llm):
    """A `responses` provider serving model `gpt-bg`, on the loopback fake."""
    with responses_provider(settings) as server:
        yield server


def start(server, alice, content: str = "tell me") -> tuple[int, str]:
    session_id = new_session(server, alice[1])
    response = httpx.post(
        f"{server.url}/api/sessions/{session_id}/runs/",
        json={"content": content, "model": "gpt-bg"},
        headers=alice[1],
    )
    assert response.status_code == 201, response.text
    return session_id, response.json()["run_id"]


def journal(run_id: str, kind: str) -> list[dict]:
    rows = Event.objects.filter(run_id=run_id, type=kind).order_by("seq")
    return [json.loads(payload) for payload in rows.values_list("payload", flat=True)]


@pytest.mark.slow
def test_a_cut_mid_answer_is_re_attached_not_regenerated(
    server, alice, responses, live_worker, monkeypatch
):
    monkeypatch.setattr("chat.turn.CURSOR_EVERY_S", 0.0)  # every cursor journaled
    # Paced, so the worker has read what came before the cut (a client library
    # may drop bytes that arrive together with the connection's failure).
    responses.push(
        ResponsesReply(
            text=LONG, chunk_chars=6, tokens_per_s=50, cut_after_chars=60, usage=USAGE
        )
    )
    session_id, run_id = start(server, alice)
    events = stream(server, alice[1], run_id)
    assert text_of(events) == LONG
    statuses = [data["message"] for _, kind, data in events if kind == "status"]
    assert statuses == ["Retry attempt: re-attach 1/3; body cut"]
    assert [data for _, kind, data in events if kind == "usage"] == [
        {"input_tokens": 30, "output_tokens": 90, "total_tokens": 120}
    ]
    assert events[-1][2]["status"] == "completed"
    assert [(r.method, r.path.count("/")) for r in responses.requests] == [
        ("POST", 2),
        ("GET", 3),
    ]
    kinds = [kind for _, kind, _ in events]
    before = [d for _, k, d in events[: kinds.index("status")] if k == "upstream"]
    at = before[-1]["sequence_number"]
    assert responses.requests[1].query == f"stream=true&starting_after={at}"
    kept = Message.objects.filter(session_id=session_id, role="assistant")
    assert list(kept.values_list("content", flat=True)) == [LONG]
    turn = Turn.objects.get(run_id=run_id)
    assert turn.diagnostics["model_requests_started"] == 1
    assert turn.diagnostics["stream_reattaches"] == 1
    assert turn.usage == {"input_tokens": 30, "output_tokens": 90, "total_tokens": 120}
    cursors = journal(run_id, "upstream")
    assert cursors and {c["response_id"] for c in cursors} == set(responses.stored)


@pytest.mark.slow
def test_stop_cancels_the_response_upstream(server, alice, responses, live_worker):
    responses.push(ResponsesReply(text=LONG, chunk_chars=2, tokens_per_s=40))
    _session_id, run_id = start(server, alice)
    wait_until(lambda: Event.objects.filter(run_id=run_id, type="token").exists(), 15)
    response = httpx.post(f"{server.url}/api/runs/{run_id}/cancel/", headers=alice[1])
    assert response.status_code == 202
    events = stream(server, alice[1], run_id)
    assert events[-1][2]["status"] == "cancelled"
    (cancel,) = responses.of_kind("POST", "/cancel")
    assert cancel.status == 200
    (stored,) = responses.stored.values()
    assert stored.cancelled_at is not None and cancel.path.split("/")[3] == stored.id


@pytest.mark.slow
def test_a_worker_killed_mid_answer_is_re_attached_by_the_next_worker(
    server, alice, responses, fake_llm, fast_readers, settings
):
    responses.push(
        ResponsesReply(text=LONG, chunk_chars=2, tokens_per_s=40, usage=USAGE)
    )
    env = subprocess_env(
        OPENAI_BASE_URL=fake_llm.base_url,
        HERMES_DEFAULT_MODEL="fake-model",
        HERMES_LEASE_S=str(LEASE_S),
        HERMES_HEARTBEAT_S="0.3",
        HERMES_PROVIDERS=json.dumps(settings.HERMES["PROVIDERS"]),
    )
    proc = spawn(["manage.py", "worker", "--concurrency", "2"], env, "running")
    try:
        session_id, run_id = start(server, alice, "talk slowly")
        wait_until(lambda: len(journal(run_id, "token")) >= 3, timeout=15)
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    finally:
        proc.kill()
    killed = time.monotonic()
    shown_before = "".join(t["text"] for t in journal(run_id, "token"))
    assert shown_before and LONG.startswith(shown_before) and shown_before != LONG

    worker = Worker(concurrency=2)
    server.call(worker.start())
    try:
        events = stream(server, alice[1], run_id)
        assert time.monotonic() - killed < LEASE_S + 15
    finally:
        server.call(worker.stop(grace_s=5))
    assert text_of(events) == LONG  # the model's one answer, nothing twice
    end = events[-1][2]
    assert (end["status"], end["terminal_state"]) == ("completed", "completed")
    statuses = [data["message"] for _, kind, data in events if kind == "status"]
    assert statuses == ["Retry attempt: re-attach after the worker was lost (1/2)"]
    posts = responses.of_kind("POST")
    gets = responses.of_kind("GET")
    assert len(posts) == 1 and len(gets) == 1
    kinds = [kind for _, kind, _ in events]
    requeued = kinds.index("status")
    before = [data for _, kind, data in events[:requeued] if kind == "upstream"]
    at = before[-1]["sequence_number"]  # the dead worker's last journaled cursor
    assert gets[0].query == f"stream=true&starting_after={at}"
    assert [data for _, kind, data in events if kind == "usage"] == [USAGE]
    kept = Message.objects.filter(session_id=session_id, role="assistant")
    assert list(kept.values_list("content", flat=True)) == [LONG]
    assert [kind for _, kind, _ in events].count("start") == 1
