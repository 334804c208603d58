"""`/healthz` and `/metrics` over a real server, on both deployments.

See docs/architecture.md §7.
"""

import re
import threading
from datetime import timedelta

import httpx
import pytest
from django.utils import timezone

from chat.models import ChatSession, Turn
from hermes_testing.api import LONG, new_session, start_run, stream, text_of
from hermes_testing.fake_llm import Reply
from hermes_testing.harness import read_sse, wait_until
from journal.heartbeats import worker_beat
from journal.models import Run, WorkerHeartbeat

CLOSED_REDIS = "redis://127.0.0.1:6390/0"  # nothing listens there: a stopped Redis


def healthz(url: str) -> tuple[int, dict]:
    response = httpx.get(f"{url}/healthz", timeout=15)
    return response.status_code, response.json()


def test_healthz_is_healthy_with_a_live_worker(transactional_db, server, live_worker):
    wait_until(
        lambda: WorkerHeartbeat.objects.filter(worker_id=live_worker.worker_id).exists()
    )
    status, body = healthz(server.url)
    assert status == 200, body
    assert body["status"] == "ok"
    checks = body["checks"]
    assert {name: check["ok"] for name, check in checks.items()} == {
        "database": True,
        "channel_layer": True,
        "workers": True,
        "providers": True,
        "outages": True,
    }
    assert body["failed"] == [] and body["warnings"] == []
    assert checks["workers"]["alive"] >= 1


def test_healthz_without_a_recent_worker_heartbeat_is_unhealthy(
    server, transactional_db
):
    status, body = healthz(server.url)
    assert status == 503 and body["status"] == "unhealthy"
    assert body["failed"] == ["workers"]  # which check failed, by name
    assert body["checks"]["workers"] == {
        **body["checks"]["workers"],
        "ok": False,
        "alive": 0,
    }
    assert body["checks"]["database"]["ok"] and body["checks"]["channel_layer"]["ok"]
    worker_beat(worker_id="gone:1:w", active_runs=2)
    WorkerHeartbeat.objects.update(seen_at=timezone.now() - timedelta(minutes=10))
    status, body = healthz(server.url)
    assert status == 503 and body["checks"]["workers"]["last_seen_at"] is not None
    worker_beat(worker_id="gone:1:w", active_runs=2)  # it came back
    status, body = healthz(server.url)
    assert status == 200 and body["checks"]["workers"]["active_runs"] == 2


def test_healthz_reports_a_stopped_redis(client, transactional_db, settings):
    worker_beat(worker_id="w:1:w", active_runs=0)
    assert client.get("/healthz").status_code == 200
    settings.CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            "CONFIG": {"hosts": [CLOSED_REDIS]},
        }
    }
    response = client.get("/healthz")
    assert response.status_code == 503
    checks = response.json()["checks"]
    assert response.json()["failed"] == ["channel_layer"]
    assert checks["channel_layer"]["ok"] is False and checks["channel_layer"]["error"]
    assert "6390" not in response.content.decode()  # errors by class name only
    assert checks["database"]["ok"] and checks["workers"]["ok"]


def scrape(url: str) -> dict[str, float]:
    response = httpx.get(f"{url}/metrics", timeout=10)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
    samples = {}
    for line in response.text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            samples[name] = float(value)
    return samples


EVENTS = "hermes_journal_events_appended_total"
COMPLETED = 'hermes_runs{status="completed"}'
REPLAYS = "hermes_replay_first_batch_seconds_count"
FIRST_TOKENS = "hermes_model_first_token_seconds_count"
TICKS = "hermes_journal_tick_seconds_count"
SUBSCRIBED = "hermes_subscriptions_active"
IN_FLIGHT = "hermes_provider_requests_in_flight"
OPENAI_REQUESTS = 'hermes_provider_requests_total{provider="openai"}'


@pytest.mark.slow
def test_metrics_counters_move_when_a_run_streams(server, alice, fake_llm, live_worker):
    before = scrape(server.url)
    fake_llm.push(Reply(text="Counted, every word."))
    session_id = new_session(server, alice[1])
    run_id = start_run(server, alice[1], session_id, "count me")
    assert text_of(stream(server, alice[1], run_id)) == "Counted, every word."
    stream(server, alice[1], run_id)  # a second reader replays the finished run
    after = scrape(server.url)
    last_seq = Run.objects.get(id=run_id).last_seq
    assert after[EVENTS] - before[EVENTS] >= last_seq
    assert after[COMPLETED] == before[COMPLETED] + 1
    assert after[REPLAYS] >= before[REPLAYS] + 1
    assert after[FIRST_TOKENS] == before[FIRST_TOKENS] + 1
    assert after[TICKS] >= before[TICKS] + 1  # the reply's text was committed
    assert after[OPENAI_REQUESTS] == before.get(OPENAI_REQUESTS, 0) + 1
    wait_until(lambda: scrape(server.url)[IN_FLIGHT] == 0)
    wait_until(
        lambda: scrape(server.url)["hermes_workers_alive"] >= 1
    )  # its first beat


@pytest.mark.slow
def test_metrics_gauges_follow_a_stalled_stream_and_its_reader(
    server, alice, fake_llm, live_worker, fast_readers
):
    baseline = scrape(server.url)[SUBSCRIBED]
    fake_llm.push(Reply(text=LONG, stall_after_chars=20))
    session_id = new_session(server, alice[1])
    run_id = start_run(server, alice[1], session_id, "stall")
    fake_llm.wait_stalled(0, timeout=10)
    result = {}
    reader = threading.Thread(
        target=lambda: result.update(
            sse=read_sse(f"{server.url}/api/runs/{run_id}/events/", headers=alice[1])
        ),
        daemon=True,
    )
    reader.start()
    wait_until(
        lambda: (
            (m := scrape(server.url))[SUBSCRIBED] >= baseline + 1 and m[IN_FLIGHT] == 1
        )
    )
    assert (
        httpx.post(
            f"{server.url}/api/runs/{run_id}/cancel/", headers=alice[1]
        ).status_code
        == 202
    )
    reader.join(15)
    assert result["sse"].events[-1][2]["status"] == "cancelled"
    wait_until(
        lambda: (m := scrape(server.url))[SUBSCRIBED] == baseline and m[IN_FLIGHT] == 0
    )


def test_metrics_need_no_login_and_show_no_user_data(server, alice):
    session = ChatSession.objects.create(owner=alice[0], title="secret-project-title")
    run = Run.objects.create(owner=alice[0], subject=session.subject)
    Turn.objects.create(
        run=run, owner=alice[0], session=session, model="m", provider="p"
    )
    response = httpx.get(f"{server.url}/metrics")
    assert response.status_code == 200
    body = response.text
    for private in (
        "alice",
        "secret-project-title",
        "Token",
        alice[1]["Authorization"][6:],
    ):
        assert private not in body
    assert 'hermes_runs{status="queued"}' in body
    labels = set(re.findall(r"[{,](\w+)=", body))
    assert labels <= {"status", "le", "provider"}
    providers = set(re.findall(r'provider="([^"]*)"', body))
    assert providers <= {"demo", "openai"}  # configured names only


@pytest.mark.parametrize("path", ["/healthz", "/metrics"])
def test_probes_answer_get_only(client, db, path):
    assert client.post(path).status_code == 405


def _burn() -> None:
    while True:
        pass


@pytest.mark.slow
def test_healthz_stays_healthy_under_cpu_load(server, live_worker):
    """Busy CPUs make checks slower, not failed: no 503 for load alone."""
    import multiprocessing
    import os

    wait_until(
        lambda: WorkerHeartbeat.objects.filter(worker_id=live_worker.worker_id).exists()
    )
    context = multiprocessing.get_context("fork")
    burners = [context.Process(target=_burn) for _ in range(2 * (os.cpu_count() or 2))]
    for burner in burners:
        burner.start()
    try:
        answers = [healthz(server.url) for _ in range(10)]
    finally:
        for burner in burners:
            burner.kill()
            burner.join()
    assert [status for status, _ in answers] == [200] * 10, [b for _, b in answers]
    assert all(body["failed"] == [] for _, body in answers)


def test_a_working_round_trip_ends_a_channel_layer_outage(
    server, transactional_db, live_worker
):
    """`outages` reports what this process counts as down, until it works again."""
    from journal.outages import CHANNEL_LAYER, Outage, outage

    Outage._all.clear()
    outage(CHANNEL_LAYER).failed("publish", ConnectionError("refused"))
    assert CHANNEL_LAYER in Outage.current()
    wait_until(
        lambda: WorkerHeartbeat.objects.filter(worker_id=live_worker.worker_id).exists()
    )
    healthz(server.url)  # its channel-layer round trip succeeds
    status, body = healthz(server.url)
    assert status == 200 and body["checks"]["outages"]["down"] == {}
    assert "outages" not in body["warnings"]
    Outage._all.clear()
