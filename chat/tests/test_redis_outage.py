"""Listeners and publishers through a Redis outage, on a private redis-server.

The test starts its own Redis on a free port, kills it and starts it again
(empty: group memberships are gone), while a run's SSE reader, the user's
notification stream and a turn worker listen through it. See
docs/operating.md, "Redis outage".
"""

import json
import logging
import re
import threading

import httpx
import pytest
from asgiref.sync import async_to_sync

from chat.services import WORKERS_GROUP
from hermes_testing.harness import group_size, read_sse, running_run, wait_until
from hermes_testing.private_servers import PrivateRedis
from journal.outages import Outage
from journal.publish import append_and_publish, group_name, owner_group

pytestmark = [
    pytest.mark.chaos,
    pytest.mark.skipif(
        not PrivateRedis.available(), reason="redis-server is not installed"
    ),
]


def _append(run_id: str, words: range, end: bool = False) -> None:
    events = [("token", {"text": f"w{i} "}) for i in words]
    if end:
        events.append(("end", {"status": "completed", "terminal_state": "completed"}))
    async_to_sync(append_and_publish)(run_id=run_id, token=1, events=events)


def _notifications(url: str, headers: dict, hellos: list, stop: threading.Event):
    with httpx.Client(timeout=60) as client:
        with client.stream("GET", url, headers=headers) as response:
            for line in response.iter_lines():
                if line == "event: hello":
                    hellos.append(line)
                if stop.is_set():
                    return


def _members(server, group: str) -> int:
    return server.call(group_size(group))


def test_listeners_rejoin_after_redis_restarts_and_log_once(
    private_redis, server, alice, fast_readers, live_worker, caplog
):
    caplog.set_level(logging.INFO, logger="journal.outages")
    user, headers = alice
    run = running_run(user)
    result: dict = {}
    reader = threading.Thread(
        target=lambda: result.update(
            sse=read_sse(
                f"{server.url}/api/runs/{run.id}/events/", headers=headers, timeout=60
            )
        )
    )
    hellos: list = []
    stop = threading.Event()
    notifier = threading.Thread(
        target=_notifications,
        args=(f"{server.url}/api/stream/", headers, hellos, stop),
        daemon=True,
    )
    reader.start()
    notifier.start()
    groups = [group_name(run.id), owner_group(user.pk), WORKERS_GROUP]
    wait_until(lambda: all(_members(server, g) == 1 for g in groups), timeout=30)
    _append(run.id, range(0, 10))

    private_redis.kill()
    for start in range(10, 50, 10):  # each publish fails; readers poll the journal
        _append(run.id, range(start, start + 10))
    wait_until(lambda: Outage.named("channel layer").failures >= 4, timeout=30)

    private_redis.start()  # empty: every listener must join its group again
    wait_until(lambda: all(_members(server, g) == 1 for g in groups), timeout=60)
    wait_until(lambda: len(hellos) >= 2, timeout=30)  # the page is told to refetch
    _append(run.id, range(50, 60), end=True)
    reader.join(60)
    stop.set()

    events = result["sse"].events
    assert [e[0] for e in events] == [f"{run.id}:{n}" for n in range(1, 62)]
    assert "".join(e[2]["text"] for e in events if e[1] == "token") == "".join(
        f"w{i} " for i in range(60)
    )
    down = [r for r in caplog.records if "unavailable" in r.getMessage()]
    back = [r for r in caplog.records if "recovered" in r.getMessage()]
    assert len(down) == 1, [r.getMessage() for r in down]
    assert len(back) == 1 and "failures during the outage" in back[0].getMessage()
    assert not [r for r in caplog.records if "publish failed" in r.getMessage()]
    assert json.loads(json.dumps(Outage.current())) == {}  # nothing down any more


def test_healthz_503s_through_an_outage_log_one_line_each_way(
    private_redis, client, transactional_db, caplog
):
    """Each 503 is the probe's answer, not a server error: no ERROR per
    probe, one warning when the spell starts and one line when it ends."""
    from journal.heartbeats import worker_beat

    caplog.set_level(logging.INFO)
    worker_beat(worker_id="w:1:w", active_runs=0)
    assert client.get("/healthz").status_code == 200
    private_redis.kill()
    codes = [client.get("/healthz").status_code for _ in range(5)]
    private_redis.start()
    wait_until(lambda: client.get("/healthz").status_code == 200, timeout=60)
    assert codes == [503] * 5
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors == []
    health = [r.getMessage() for r in caplog.records if r.name == "hermes_site.health"]
    assert len(health) == 2, health
    assert health[0].startswith("healthz unhealthy (failed: channel_layer)")
    assert health[1].startswith("healthz healthy again after")
    assert re.search(r"; \d+ unhealthy answers$", health[1]), health[1]


def test_run_starts_in_a_redis_outage_log_one_line_not_tracebacks(
    private_redis, server, alice, caplog
):
    """The workers' nudge and the tabs' notice fail at every run start while
    Redis is away (workers poll, tabs refetch): one line for the outage."""
    from hermes_testing.api import new_session, start_run

    caplog.set_level(logging.INFO)
    sessions = [new_session(server, alice[1]) for _ in range(3)]
    private_redis.kill()
    for session_id in sessions:
        start_run(server, alice[1], session_id, "while redis is away")
    private_redis.start()
    down = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert [r.getMessage().split(";")[0] for r in down] == [
        down[0].getMessage().split(";")[0]
    ], [r.getMessage() for r in down]
    assert down[0].name == "journal.outages"
    assert sum(bool(r.exc_info) for r in down) == 1  # the outage's traceback, once
