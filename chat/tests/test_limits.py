"""Per-user limits over real sockets: 429 + Retry-After + a JSON body naming the
limit, WebSocket close 4429, and the fair claim with a real worker (chat.limits)."""

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import httpx
import pytest
import websockets
from django.utils import timezone

from chat import limits
from chat.models import ChatSession, Message, PendingMessage
from chat.services import run_cancel, run_start, session_create
from hermes_testing.api import decide, new_session, start_run, stream, waiting_at_tool
from hermes_testing.fake_llm import Reply
from hermes_testing.harness import wait_until
from hermes_testing.turns import running_turn
from journal.models import Run


def _limited(settings, **values):
    settings.HERMES = {**settings.HERMES, **values}


def assert_refused(response: httpx.Response, limit: str) -> int:
    """A 429 naming `limit`; returns its Retry-After in seconds."""
    assert response.status_code == 429, response.text
    body = response.json()
    retry_after = int(response.headers["Retry-After"])
    assert body["limit"] == limit and body["retry_after"] == retry_after
    assert 1 <= retry_after <= 3600
    assert isinstance(body["error"], str) and body["error"]
    return retry_after


def test_runs_per_minute(server, alice, bob, settings):
    _limited(settings, USER_RUNS_PER_MINUTE=2)
    sessions = [new_session(server, alice[1]) for _ in range(3)]
    for session_id in sessions[:2]:
        start_run(server, alice[1], session_id, "hi")
    refused = httpx.post(
        f"{server.url}/api/sessions/{sessions[2]}/runs/",
        json={"content": "one too many"},
        headers=alice[1],
    )
    assert assert_refused(refused, "runs_per_minute") <= 60
    assert "2 runs in the last minute" in refused.json()["error"]
    assert Run.objects.filter(owner=alice[0]).count() == 2  # nothing was queued
    start_run(server, bob[1], new_session(server, bob[1]), "bob is not limited")


def test_runs_per_minute_frees_as_the_window_moves(server, alice, settings):
    _limited(settings, USER_RUNS_PER_MINUTE=1)
    first, second = new_session(server, alice[1]), new_session(server, alice[1])
    start_run(server, alice[1], first, "hi")
    url = f"{server.url}/api/sessions/{second}/runs/"
    assert_refused(
        httpx.post(url, json={"content": "x"}, headers=alice[1]), "runs_per_minute"
    )
    # The run left the window (as a minute later): the next one is accepted.
    Run.objects.filter(owner=alice[0]).update(created_at="2000-01-01T00:00:00Z")
    assert httpx.post(url, json={"content": "x"}, headers=alice[1]).status_code == 201


PARALLEL = 30


@pytest.mark.slow
def test_runs_per_minute_holds_under_parallel_requests(
    server, alice, settings, monkeypatch
):
    """Thirty POSTs at once, each to a session of its own: the early look at
    the count is held until every request has made it, so all of them look
    before any run exists (as parallel requests do). Only the limit start."""
    _limited(settings, USER_RUNS_PER_MINUTE=5)
    sessions = [
        ChatSession.objects.create(owner=alice[0], title=f"s{n}")
        for n in range(PARALLEL)
    ]
    looked = []
    lock, release = threading.Lock(), threading.Event()
    early_look = limits.check_run_rate

    def held_look(*, user):
        try:
            early_look(user=user)
        finally:
            with lock:
                looked.append(user.pk)
        release.wait(60)

    monkeypatch.setattr(limits, "check_run_rate", held_look)

    def post(session: ChatSession) -> httpx.Response:
        return httpx.post(
            f"{server.url}/api/sessions/{session.pk}/runs/",
            json={"content": "at once"},
            headers=alice[1],
            timeout=90,
        )

    try:
        with ThreadPoolExecutor(PARALLEL) as pool:
            futures = [pool.submit(post, s) for s in sessions]
            wait_until(lambda: len(looked) == PARALLEL, timeout=60)
            release.set()
            answers = [f.result(90) for f in futures]
    finally:
        release.set()
    codes = sorted(a.status_code for a in answers)
    assert codes == [201] * 5 + [429] * (PARALLEL - 5), codes
    for refused in (a for a in answers if a.status_code == 429):
        assert_refused(refused, "runs_per_minute")
    assert Run.objects.filter(owner=alice[0]).count() == 5
    # Nothing of a refused request was kept: no question without its run.
    assert Message.objects.filter(session__owner=alice[0]).count() == 5


@pytest.mark.slow
def test_runs_started_by_queued_messages_count_and_wait_for_room(
    server, alice, settings, fake_llm, live_worker, asking
):
    """Queued messages start their runs under `runs_per_minute` too: past it
    a message stays pending (not a run) until the window has room, and then
    the reaper starts it."""
    _limited(settings, USER_RUNS_PER_MINUTE=3)
    session_id, run_id = waiting_at_tool(server, alice[1], fake_llm, Reply(text="42."))
    for n in range(4):
        queued = httpx.post(
            f"{server.url}/api/sessions/{session_id}/pending/",
            json={"content": f"queued {n}"},
            headers=alice[1],
        )
        assert queued.status_code == 201, queued.text
    fake_llm.push(*(Reply(text=f"answer {n}.") for n in range(4)))
    decided = decide(server, alice[1], run_id, decision="approve")
    assert decided.status_code == 202, decided.text
    runs = Run.objects.filter(owner=alice[0])
    # A queued message starts in the transaction that ends the run before
    # it: with no run active, every start that was going to happen has.
    wait_until(
        lambda: runs.count() >= 3 and not runs.filter(status__in=Run.ACTIVE).exists(),
        timeout=60,
    )
    assert runs.count() == 3
    waiting = PendingMessage.objects.filter(session_id=session_id, state="pending")
    assert [p.content for p in waiting.order_by("id")] == ["queued 2", "queued 3"]
    # A minute later (the runs leave the window; the messages are old
    # enough for the reaper): the next one starts, by the worker's reaper.
    first_three = set(runs.values_list("id", flat=True))
    runs.update(created_at=timezone.now() - timedelta(seconds=61))
    waiting.update(created_at=timezone.now() - timedelta(seconds=61))
    started = PendingMessage.objects.filter(content="queued 2", state="started")
    wait_until(started.exists, timeout=60)
    assert started.get().delivered_run_id not in first_three


@pytest.mark.slow
def test_sessions_per_user(server, alice, bob, settings):
    _limited(settings, USER_MAX_SESSIONS=2)
    new_session(server, alice[1])
    new_session(server, alice[1])
    refused = httpx.post(
        f"{server.url}/api/sessions/", json={"title": "third"}, headers=alice[1]
    )
    assert_refused(refused, "sessions")
    assert ChatSession.objects.filter(owner=alice[0]).count() == 2
    new_session(server, bob[1])


@pytest.mark.slow
def test_request_rate(server, alice, bob, settings):
    _limited(settings, USER_REQUEST_RATE="5/min")
    with httpx.Client(base_url=server.url, headers=alice[1]) as client:
        answers = [client.get("/api/sessions/").status_code for _ in range(5)]
        assert answers == [200] * 5
        refused = client.get("/api/models/")
    assert assert_refused(refused, "requests") <= 60
    assert "5/min" in refused.json()["error"]
    assert httpx.get(f"{server.url}/api/sessions/", headers=bob[1]).status_code == 200


class HeldStream(threading.Thread):
    """An SSE request held open until `close` is set."""

    def __init__(self, url: str, headers: dict):
        super().__init__(daemon=True)
        self.url, self.headers = url, headers
        self.status: int | None = None
        self.opened, self.close = threading.Event(), threading.Event()

    def run(self) -> None:
        with httpx.Client(timeout=30) as client:
            with client.stream("GET", self.url, headers=self.headers) as response:
                self.status = response.status_code
                self.opened.set()
                for _ in response.iter_raw():
                    if self.close.is_set():
                        break
        self.opened.set()

    def stop(self) -> None:
        self.close.set()
        self.join(30)


@pytest.fixture
def held_streams():
    held = []

    def hold(url, headers):
        open_stream = HeldStream(url, headers)
        open_stream.start()
        assert open_stream.opened.wait(30) and open_stream.status == 200
        held.append(open_stream)
        return open_stream

    yield hold
    for open_stream in held:
        open_stream.stop()


@pytest.mark.slow
def test_open_streams_per_user_sse(server, alice, bob, settings, held_streams):
    _limited(settings, USER_MAX_STREAMS=2, SSE_KEEPALIVE_S=0.2)
    session = session_create(owner=alice[0])
    run = running_turn(alice[0], session=session)
    notifications = f"{server.url}/api/stream/"
    first = held_streams(notifications, alice[1])
    held_streams(f"{server.url}/api/runs/{run.id}/events/", alice[1])
    wait_until(lambda: limits.open_streams(alice[0].pk) == 2)

    for url in (notifications, f"{server.url}/api/runs/{run.id}/events/"):
        assert_refused(httpx.get(url, headers=alice[1], timeout=30), "streams")
    held_streams(notifications, bob[1])  # Bob has slots of his own

    first.stop()  # a closed stream gives its slot back
    wait_until(lambda: limits.open_streams(alice[0].pk) == 1)
    held_streams(notifications, alice[1])


async def _ws_close(url: str, headers: dict) -> tuple[int, str]:
    async with websockets.connect(url, additional_headers=headers) as ws:
        try:
            await asyncio.wait_for(ws.recv(), 30)
        except websockets.ConnectionClosed as closed:
            assert closed.rcvd is not None, "closed without a close frame"
            return closed.rcvd.code, closed.rcvd.reason
    raise AssertionError("the socket stayed open")


def test_open_streams_per_user_websocket(server, alice, settings, held_streams):
    _limited(settings, USER_MAX_STREAMS=2, SSE_KEEPALIVE_S=0.2)
    session = session_create(owner=alice[0])
    run = running_turn(alice[0], session=session)
    ws_url = f"{server.ws_url}/ws/runs/{run.id}/"
    for _ in range(2):
        held_streams(f"{server.url}/api/stream/", alice[1])
    code, reason = asyncio.run(_ws_close(ws_url, alice[1]))
    assert code == limits.CLOSE_TOO_MANY_STREAMS == 4429
    assert "too many open streams (limit 2)" in reason
    assert limits.open_streams(alice[0].pk) == 2

    async def hold_socket():
        async with websockets.connect(ws_url, additional_headers=alice[1]):
            # Wait until the server counts it, then give it back by closing.
            while limits.open_streams(alice[0].pk) < 3:
                await asyncio.sleep(0.02)

    _limited(settings, USER_MAX_STREAMS=3)
    asyncio.run(asyncio.wait_for(hold_socket(), 30))
    wait_until(lambda: limits.open_streams(alice[0].pk) == 2)


@pytest.mark.slow
def test_a_backlog_of_100_runs_does_not_delay_another_users_first_run(
    server, alice, bob, fake_llm, live_worker, settings
):
    """Alice queues 100 runs whose answers never finish; the worker has 8 slots
    and runs at most 2 of one user's runs at once. Bob's run is the very next
    one claimed, ahead of Alice's 98 older queued runs."""
    _limited(
        settings,
        USER_MAX_CONCURRENT_RUNS=2,
        USER_RUNS_PER_MINUTE=1000,
        SSE_KEEPALIVE_S=60,  # a stream Bob waits on forever times out instead
    )
    fake_llm.default = Reply(text="stalled answer", stall_after_chars=4)
    backlog = []
    for i in range(100):
        session = session_create(owner=alice[0], title=f"backlog {i}")
        backlog.append(
            run_start(
                session=session, content="wait", model="fake-model", provider="openai"
            )[0]
        )
    try:
        wait_until(lambda: _running(alice[0]) == 2, timeout=30)
        fake_llm.default = Reply(text="Bob's answer.")
        bob_session = new_session(server, bob[1])
        queued_at = time.monotonic()
        bob_run = start_run(server, bob[1], bob_session, "me first?")
        events = stream(server, bob[1], bob_run, timeout=20)
        waited = time.monotonic() - queued_at
        assert "".join(d["text"] for _, k, d in events if k == "token") == (
            "Bob's answer."
        )
        assert _running(alice[0]) == 2
        assert Run.objects.filter(owner=alice[0], status="queued").count() == 98
        # One scheduling tick is a claim-loop poll (1 s) at most; the bound is
        # generous for a loaded machine and far below a backlog's wait.
        assert waited < 15, waited
    finally:
        for run in Run.objects.filter(owner=alice[0], status__in=Run.ACTIVE):
            run_cancel(run=run)
        wait_until(lambda: not live_worker.held, timeout=30)


def _running(owner) -> int:
    return Run.objects.filter(owner=owner, status=Run.Status.RUNNING).count()
