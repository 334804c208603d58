"""Replay-then-live over real sockets: the cursor table, readers, faults.

See docs/architecture.md §5.
"""

import asyncio
import random
import threading

import httpx
import pytest
from django.utils import timezone

from hermes_testing.harness import (
    group_size,
    read_sse,
    read_ws,
    running_run,
    wait_until,
)
from journal import wire
from journal.models import Run
from journal.publish import append_and_publish, group_name
from journal.store import append
from journal.subscribe import hubs

END = ("end", {"status": "completed", "terminal_state": "completed"})


def tokens(n, start=0):
    return [("token", {"text": f"w{i} "}) for i in range(start, start + n)]


def feed(server, run, events, *, publish=True):
    """Write as the worker does; without `publish` the doorbell never rings."""
    if publish:
        return server.call(append_and_publish(run_id=run.id, token=1, events=events))
    return append(run_id=run.id, token=1, events=events)


def finished_run(server, owner, n=10):
    run = running_run(owner)
    feed(server, run, [*tokens(n), END])
    return run


def seqs(result):
    return [int(event_id.rsplit(":", 1)[1]) for event_id, _, _ in result.events]


def events_url(server, run, query=""):
    return f"{server.url}/api/runs/{run.id}/events/{query}"


# --- the cursor table, over SSE ---------------------------------------------


def test_no_cursor_replays_the_whole_run_with_retry_and_ids(server, alice):
    run = finished_run(server, alice[0])
    result = read_sse(events_url(server, run), headers=alice[1])
    assert result.status == 200 and result.retry == 1000
    assert seqs(result) == list(range(1, 12))
    assert result.events[0][0] == f"{run.id}:1"
    assert [e[1] for e in result.events] == ["token"] * 10 + ["end"]
    assert result.events[-1][2]["status"] == "completed"


@pytest.mark.parametrize(
    "query,header,first",
    [
        ("?after_seq=4", None, 5),
        ("?after_event_id={run}:7", None, 8),
        ("", "{run}:3", 4),
        ("?after_seq=abc", "{run}:3", 1),  # present query wins even unparsable
        ("?after_seq=2", "{run}:6", 3),
        ("?after_event_id=run_OTHER:3", None, 1),
        ("?after_event_id=nonsense", None, 1),
        ("?after_seq=-1", None, 1),
        ("?after_seq=99", None, 1),  # beyond the journal
        ("", "{run}:zz", 1),
    ],
)
def test_cursor_rows(server, alice, query, header, first):
    run = finished_run(server, alice[0])
    headers = {**alice[1]}
    if header:
        headers["Last-Event-ID"] = header.format(run=run.id)
    result = read_sse(
        events_url(server, run, query.format(run=run.id)), headers=headers
    )
    assert seqs(result) == list(range(first, 12))


def test_cursor_at_or_past_a_finished_end_is_204(server, alice):
    run = finished_run(server, alice[0])
    assert (
        read_sse(events_url(server, run, "?after_seq=11"), headers=alice[1]).status
        == 204
    )
    headers = {**alice[1], "Last-Event-ID": f"{run.id}:11"}
    assert read_sse(events_url(server, run), headers=headers).status == 204


def test_cursor_equal_to_last_delivered_sends_nothing_twice(server, alice):
    run = running_run(alice[0])
    feed(server, run, tokens(5))
    got = []
    reader = threading.Thread(
        target=lambda: got.append(
            read_sse(events_url(server, run, "?after_seq=5"), headers=alice[1])
        )
    )
    reader.start()
    wait_until(lambda: server.call(group_size(group_name(run.id))) == 1)
    feed(server, run, [*tokens(2, start=5), END])
    reader.join(20)
    assert seqs(got[0]) == [6, 7, 8]


def test_pruned_run_answers_410_pointing_at_the_transcript(server, alice):
    run = finished_run(server, alice[0])
    Run.objects.filter(id=run.id).update(pruned_at=timezone.now())
    response = httpx.get(events_url(server, run), headers=alice[1])
    assert response.status_code == 410
    assert "pruned" in response.json()["error"]
    # The same row of the outcome table, for every reader and any cursor.
    page = httpx.get(f"{server.url}/api/runs/{run.id}/events.json", headers=alice[1])
    assert page.status_code == 410 and page.json() == response.json()
    assert ws_read(server, run, alice[1]) == ([], 4410)
    assert ws_read(server, run, alice[1], "?after_seq=11") == ([], 4410)


# --- live readers ------------------------------------------------------------


def _reader(server, run, headers, out, **kw):
    thread = threading.Thread(
        target=lambda: out.append(
            read_sse(events_url(server, run), headers=headers, **kw)
        )
    )
    thread.start()
    return thread


def test_reader_attached_mid_run_and_a_second_reader_get_identical_whole_runs(
    server, alice
):
    run = running_run(alice[0])
    feed(server, run, tokens(30))
    first, second = [], []
    t1 = _reader(server, run, alice[1], first)
    feed(server, run, tokens(30, start=30))
    t2 = _reader(server, run, alice[1], second)
    for i in range(60, 200, 20):
        feed(server, run, tokens(20, start=i))
    feed(server, run, [END])
    t1.join(20)
    t2.join(20)
    assert seqs(first[0]) == list(range(1, 202))
    assert first[0].events == second[0].events
    text = "".join(e[2]["text"] for e in first[0].events if e[1] == "token")
    assert text == "".join(f"w{i} " for i in range(200))


@pytest.mark.slow
def test_reconnecting_twenty_times_with_last_event_id_gets_every_seq_once(
    server, alice
):
    run = running_run(alice[0])
    total_batches = 60
    done = threading.Event()

    def write():
        for i in range(total_batches):
            feed(server, run, tokens(5, start=i * 5))
        feed(server, run, [END])
        done.set()

    writer = threading.Thread(target=write)
    writer.start()
    rng = random.Random(7)
    collected, last_id, reconnects = [], None, 0
    while not collected or collected[-1][1] != "end":
        headers = {**alice[1], **({"Last-Event-ID": last_id} if last_id else {})}
        limit = rng.randint(1, 12) if reconnects < 20 else None
        result = read_sse(events_url(server, run), headers=headers, max_events=limit)
        if result.status == 204:
            break
        collected += result.events
        last_id = collected[-1][0] if collected else None
        reconnects += 1
    writer.join(20)
    assert reconnects >= 20
    assert [int(e[0].rsplit(":", 1)[1]) for e in collected] == list(
        range(1, total_batches * 5 + 2)
    )


def test_dropped_channel_messages_are_filled_from_the_journal(
    server, alice, fast_readers
):
    run = running_run(alice[0])
    out = []
    reader = _reader(server, run, alice[1], out)
    wait_until(lambda: server.call(group_size(group_name(run.id))) == 1)
    for i in range(20):
        feed(
            server, run, tokens(3, start=i * 3), publish=i % 3 == 0
        )  # 2 of 3 never rung
    feed(server, run, [END], publish=False)  # even the end: the quiet check finds it
    reader.join(20)
    assert seqs(out[0]) == list(range(1, 62))


def test_disconnected_reader_leaves_no_group_membership(server, alice):
    run = running_run(alice[0])
    feed(server, run, tokens(3))
    result = read_sse(events_url(server, run), headers=alice[1], max_events=2)
    assert seqs(result) == [1, 2]
    wait_until(lambda: server.call(group_size(group_name(run.id))) == 0)
    # This run's hub, not every hub: the server is shared with other tests.
    wait_until(lambda: not server.call(_has_hub(run.id)))


async def _has_hub(run_id: str) -> bool:
    return run_id in hubs()


@pytest.mark.slow
def test_a_run_whose_lease_expired_is_settled_for_a_waiting_reader(
    server, alice, fast_readers
):
    run = running_run(alice[0], lease_s=0.5)
    feed(server, run, tokens(4))
    result = read_sse(events_url(server, run), headers=alice[1])
    assert seqs(result) == [1, 2, 3, 4, 5]
    end = result.events[-1]
    assert end[1] == "end"
    assert (end[2]["status"], end[2]["terminal_state"]) == (
        "interrupted",
        "lost-worker",
    )
    assert Run.objects.get(id=run.id).status == "interrupted"


# --- authorisation and bad input ---------------------------------------------


@pytest.mark.slow
def test_other_users_and_unknown_runs_are_404_everywhere(server, alice, bob):
    run = finished_run(server, alice[0])
    for path in ("events/", "events.json", "", "cancel/"):
        method = "POST" if path == "cancel/" else "GET"
        for target in (run.id, "run_DOESNOTEXIST"):
            response = httpx.request(
                method, f"{server.url}/api/runs/{target}/{path}", headers=bob[1]
            )
            assert response.status_code == 404, (path, target)
            assert "error" in response.json()
    assert httpx.get(events_url(server, run)).status_code in (401, 403)


def test_events_json_pages_and_rejects_a_bad_limit(server, alice):
    run = finished_run(server, alice[0])
    url = f"{server.url}/api/runs/{run.id}/events.json"
    page = httpx.get(url, params={"after_seq": 3, "limit": 4}, headers=alice[1]).json()
    assert [e["seq"] for e in page["events"]] == [4, 5, 6, 7]
    assert page["next_after_seq"] == 7
    assert page["events"][0]["data"] == {"text": "w3 "}
    for bad in ({"limit": "lots"}, {"limit": 0}, {"limit": 10**9}, {"after_seq": "x"}):
        response = httpx.get(url, params=bad, headers=alice[1])
        with pytest.raises(wire.BadPageParam) as expected:  # the admin's answer too
            wire.parse_page_params({k: str(v) for k, v in bad.items()})
        assert response.status_code == 400, bad
        assert response.json() == expected.value.body(), bad


def test_status_document(server, alice):
    run = finished_run(server, alice[0])
    body = httpx.get(f"{server.url}/api/runs/{run.id}/", headers=alice[1]).json()
    assert body["status"] == "completed" and body["terminal"] is True
    assert body["last_seq"] == 11 and body["last_event_id"] == f"{run.id}:11"
    assert body["replay_available"] is True and body["worker_alive"] is False


# --- the WebSocket transport ---------------------------------------------------


def ws_read(server, run, headers, query="", **kw):
    return asyncio.run(
        read_ws(f"{server.ws_url}/ws/runs/{run.id}/{query}", headers=headers, **kw)
    )


@pytest.mark.parametrize(
    "query,first",
    [
        ("", 1),
        ("?after_seq=4", 5),
        ("?after_event_id={run}:9", 10),
        ("?after_seq=zz", 1),
        ("?after_event_id=run_OTHER:2", 1),
        ("?after_seq=500", 1),
    ],
)
def test_websocket_cursor_rows(server, alice, query, first):
    run = finished_run(server, alice[0])
    frames, code = ws_read(server, run, alice[1], query.format(run=run.id))
    assert [f["seq"] for f in frames] == list(range(first, 12))
    assert frames[-1]["event"] == "end" and code == 1000
    assert frames[0]["id"] == f"{run.id}:{first}"


def test_websocket_live_and_closed_after_end(server, alice):
    run = running_run(alice[0])
    feed(server, run, tokens(3))
    out = []
    reader = threading.Thread(target=lambda: out.append(ws_read(server, run, alice[1])))
    reader.start()
    wait_until(lambda: server.call(group_size(group_name(run.id))) == 1)
    feed(server, run, [*tokens(3, start=3), END])
    reader.join(20)
    frames, code = out[0]
    assert [f["seq"] for f in frames] == list(range(1, 8)) and code == 1000


def test_websocket_refuses_other_users_and_foreign_origins(server, alice, bob):
    run = finished_run(server, alice[0])
    frames, code = ws_read(server, run, bob[1])
    assert frames == [] and code == 4404
    frames, code = ws_read(server, run, {})
    assert frames == [] and code == 4401
    frames, code = ws_read(server, run, alice[1], "?after_seq=11")
    assert frames == [] and code == 1000
    with pytest.raises(Exception, match="403"):
        ws_read(server, run, alice[1], origin="http://evil.example")


def test_readers_fall_back_to_polling_when_the_channel_layer_fails(
    server, alice, fast_readers, settings
):
    # A Redis layer on a port where nothing listens: every layer call fails.
    settings.CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            "CONFIG": {"hosts": ["redis://127.0.0.1:1/0"]},
        }
    }
    run = running_run(alice[0])
    feed(server, run, tokens(3), publish=False)
    assert server.call(_hub_joined_layer(run.id)) is False
    out = []
    reader = _reader(server, run, alice[1], out)
    for i in range(3, 30, 3):
        feed(server, run, tokens(3, start=i), publish=False)
    feed(server, run, [END], publish=False)
    reader.join(30)
    assert seqs(out[0]) == list(range(1, 32))


async def _hub_joined_layer(run_id):
    hub = await hubs().acquire(run_id)
    try:
        return hub.layer_ok
    finally:
        await hubs().release(hub)
