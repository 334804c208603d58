"""The model catalogue survives its provider: stale on error, never blocking.

The provider is the loopback model server with its `/v1/models` fault switch.
See docs/operating.md, "Model catalogue failing".
"""

import logging
import threading
import time

import httpx

from chat.providers import registry
from hermes_testing.api import new_session, start_run, stream, text_of
from hermes_testing.fake_llm import Reply
from hermes_testing.harness import wait_until
from journal.models import Run


def models(server, headers) -> dict:
    response = httpx.get(f"{server.url}/api/models/", headers=headers, timeout=30)
    assert response.status_code == 200, response.text
    return response.json()


def listing(server, headers) -> str:
    return models(server, headers)["providers"]["openai"]["listing"]


def test_a_failing_listing_keeps_the_last_good_list_and_says_so(
    server, alice, fake_llm, live_worker, monkeypatch, caplog
):
    caplog.set_level(logging.INFO, logger="chat.providers.registry")
    first = models(server, alice[1])
    assert {m["id"] for m in first["models"]} >= {"fake-model", "other-model"}
    assert first["providers"]["openai"]["listing"] == "ok"

    monkeypatch.setattr(registry, "MODELS_CACHE_S", 0.0)  # every look refreshes
    monkeypatch.setattr(registry, "MODELS_RETRY_S", 0.0)
    fake_llm.models_fault = 503
    wait_until(lambda: listing(server, alice[1]) == "failing", timeout=30)
    failing = models(server, alice[1])
    assert {m["id"] for m in failing["models"]} == {m["id"] for m in first["models"]}
    assert failing["providers"]["openai"]["error"] == "HTTP 503"
    assert failing["providers"]["openai"]["failing_since"]

    health = httpx.get(f"{server.url}/healthz", timeout=30)
    assert health.status_code == 200, health.text  # reported, not fatal
    body = health.json()
    assert "providers" in body["warnings"] and body["failed"] == []
    assert body["checks"]["providers"]["failing"] == ["openai"]

    # A model known only from the listing is still accepted and runs.
    fake_llm.push(Reply(text="Still here."))
    session_id = new_session(server, alice[1])
    response = httpx.post(
        f"{server.url}/api/sessions/{session_id}/runs/",
        json={"content": "hi", "model": "other-model"},
        headers=alice[1],
    )
    assert response.status_code == 201, response.text
    assert text_of(stream(server, alice[1], response.json()["run_id"])) == "Still here."

    fake_llm.models_fault = None
    wait_until(lambda: listing(server, alice[1]) == "ok", timeout=30)
    lines = [
        r.getMessage() for r in caplog.records if "provider openai" in r.getMessage()
    ]
    assert len([m for m in lines if "failed" in m]) == 1, lines  # once per outage
    assert len([m for m in lines if "works again" in m]) == 1, lines


def test_a_slow_listing_never_blocks_a_request(server, alice, fake_llm, monkeypatch):
    assert listing(server, alice[1]) == "ok"  # the process's first look
    monkeypatch.setattr(registry, "MODELS_CACHE_S", 0.0)
    fake_llm.models_delay_s = 4.0  # each refresh now takes 4 s in the background
    seen = fake_llm.models_requests
    for _ in range(3):
        began = time.monotonic()
        body = models(server, alice[1])
        assert time.monotonic() - began < 2.0  # well under the provider's 4 s
        assert "other-model" in {m["id"] for m in body["models"]}
    wait_until(lambda: fake_llm.models_requests > seen, timeout=30)
    assert fake_llm.models_requests - seen == 1  # one refresh at a time


def test_a_listing_that_never_answered_fails_open(server, alice, fake_llm):
    fake_llm.models_fault = 500
    registry.reset()
    body = models(server, alice[1])
    assert body["providers"]["openai"]["listing"] == "failing"
    assert registry.is_known_model("other-model")  # the provider decides


def test_no_listing_reaches_a_provider_while_it_streams(
    server, alice, fake_llm, live_worker, monkeypatch
):
    # llama.cpp's Python server cuts the answer it streams when any other
    # request reaches it (the fake does the same); a listing must wait.
    assert listing(server, alice[1]) == "ok"
    monkeypatch.setattr(registry, "MODELS_CACHE_S", 0.0)  # every look is due
    monkeypatch.setattr(registry, "MODELS_RETRY_S", 0.0)
    fake_llm.interrupt_requests = True
    hold = threading.Event()
    fake_llm.push(Reply(text="A whole answer.", hold_after_chunks=2, hold=hold))
    session_id = new_session(server, alice[1])
    run_id = start_run(server, alice[1], session_id, "hi")
    fake_llm.wait_held(0)
    seen = fake_llm.models_requests
    for _ in range(3):
        models(server, alice[1])  # each look would have listed
    hold.set()
    assert text_of(stream(server, alice[1], run_id)) == "A whole answer."
    assert fake_llm.post_count == 1  # not cut, so not resumed
    assert fake_llm.models_requests == seen
    wait_until(lambda: models(server, alice[1]) and fake_llm.models_requests > seen)


def test_an_answer_cut_by_another_request_is_resumed_never_completed(
    server, alice, fake_llm, live_worker
):
    # Whatever reaches the server mid-answer (here a second chat's request),
    # the cut answer ends with [DONE] and no finish reason: the run resumes,
    # keeps the partial once, and ends with the rest.
    fake_llm.interrupt_requests = True
    hold = threading.Event()
    fake_llm.route("first", Reply(text="Once upon", hold_after_chunks=2, hold=hold))
    fake_llm.route("first", Reply(text=" a time."))
    fake_llm.route("second", Reply(text="Other."))
    first = start_run(server, alice[1], new_session(server, alice[1]), "first")
    fake_llm.wait_held(0)
    second = start_run(server, alice[1], new_session(server, alice[1]), "second")
    assert text_of(stream(server, alice[1], second)) == "Other."
    events = stream(server, alice[1], first)
    assert text_of(events) == "Once a time."
    statuses = [d["message"] for _, kind, d in events if kind == "status"]
    assert any("stream-resume 1/" in m for m in statuses), statuses
    assert any("ended without a finish reason" in m for m in statuses), statuses
    assert Run.objects.get(id=first).status == Run.Status.COMPLETED
    resumed = [r for r in fake_llm.requests if r.messages[-1]["role"] == "assistant"]
    assert [r.messages[-1]["content"] for r in resumed] == ["Once"]
