"""Open streams end within seconds of their credential going, over real sockets.

A token rotated, a session logged out, a user deactivated: the SSE stream
closes and the WebSocket closes with 4401, while a run is still going. With
valid credentials the same streams run to their end untouched.
"""

import asyncio
import threading
import time

import httpx
import pytest
from django.core.handlers.asgi import ASGIHandler
from django.test import Client
from rest_framework.authtoken.models import Token

from chat import access, limits
from chat.access import credential_of
from hermes_testing.harness import (
    AsgiServer,
    group_size,
    read_sse,
    read_ws,
    running_run,
    wait_until,
)
from journal.publish import append_and_publish, group_name, owner_group

CHECK_S = 0.3
CLOSED_WITHIN_S = 10  # many checks; a loaded machine still makes it


@pytest.fixture(autouse=True)
def fast_checks(settings):
    settings.HERMES = {**settings.HERMES, "CREDENTIAL_CHECK_S": CHECK_S}


def feed(server, run, n, start=0, end=False):
    events = [("token", {"text": f"w{i} "}) for i in range(start, start + n)]
    if end:
        events.append(("end", {"status": "completed", "terminal_state": "completed"}))
    server.call(append_and_publish(run_id=run.id, token=1, events=events))


def cookie_of(user) -> dict:
    client = Client()
    client.force_login(user)
    return {"Cookie": f"sessionid={client.cookies['sessionid'].value}"}


class Reader(threading.Thread):
    """Reads a stream in the background; `result` and `ended_at` when it ends."""

    def __init__(self, read):
        super().__init__(daemon=True)
        self.read = read
        self.result = None
        self.ended_at: float | None = None

    def run(self):
        self.result = self.read()
        self.ended_at = time.monotonic()


def sse_reader(server, run, headers):
    url = f"{server.url}/api/runs/{run.id}/events/"
    return Reader(lambda: read_sse(url, headers=headers, timeout=60))


def ws_reader(server, run, headers, origin=None):
    url = f"{server.ws_url}/ws/runs/{run.id}/"
    return Reader(
        lambda: asyncio.run(read_ws(url, headers=headers, origin=origin, timeout=60))
    )


def attached(server, run, reader):
    reader.start()
    wait_until(lambda: server.call(group_size(group_name(run.id))) == 1)


def ends_soon(reader) -> float:
    revoked_at = time.monotonic()
    reader.join(CLOSED_WITHIN_S + 5)
    assert not reader.is_alive(), "stream still open after its credential went"
    return reader.ended_at - revoked_at


def rotate_token(user) -> None:
    """What the account page's "new token" does."""
    Token.objects.filter(user=user).delete()
    Token.objects.create(user=user)


def test_sse_ends_when_the_token_is_rotated(server, alice):
    run = running_run(alice[0])
    feed(server, run, 3)
    reader = sse_reader(server, run, alice[1])
    attached(server, run, reader)
    rotate_token(alice[0])
    assert ends_soon(reader) < CLOSED_WITHIN_S
    assert [e[1] for e in reader.result.events] == ["token"] * 3  # no end: cut
    # Reconnecting with the old token is refused.
    again = httpx.get(f"{server.url}/api/runs/{run.id}/events/", headers=alice[1])
    assert again.status_code == 401


def test_sse_ends_when_the_session_logs_out(server, alice):
    run = running_run(alice[0])
    cookie = cookie_of(alice[0])
    reader = sse_reader(server, run, cookie)
    attached(server, run, reader)
    session_id = cookie["Cookie"].split("=", 1)[1]
    with httpx.Client(
        base_url=server.url, cookies={"sessionid": session_id}
    ) as browser:
        page = browser.get("/accounts/")  # a page, for its CSRF cookie
        assert page.status_code == 200
        out = browser.post(
            "/accounts/logout/",
            data={"csrfmiddlewaretoken": browser.cookies["csrftoken"]},
            headers={"Referer": server.url + "/accounts/"},
        )
        assert out.status_code == 302
    assert ends_soon(reader) < CLOSED_WITHIN_S


def test_websocket_closes_4401_when_the_user_is_deactivated(server, alice):
    run = running_run(alice[0])
    feed(server, run, 2)
    reader = ws_reader(server, run, alice[1])
    attached(server, run, reader)
    type(alice[0]).objects.filter(pk=alice[0].pk).update(is_active=False)
    assert ends_soon(reader) < CLOSED_WITHIN_S
    frames, code = reader.result
    assert code == 4401 and [f["seq"] for f in frames] == [1, 2]


def test_websocket_with_a_cookie_closes_4401_after_logout(server, alice):
    run = running_run(alice[0])
    cookie = cookie_of(alice[0])
    reader = ws_reader(server, run, cookie, origin=server.url)
    attached(server, run, reader)
    from django.contrib.sessions.models import Session

    Session.objects.all().delete()  # what logout does to the session's row
    assert ends_soon(reader) < CLOSED_WITHIN_S
    assert reader.result[1] == 4401


def test_websocket_closes_when_the_token_is_rotated(server, alice):
    run = running_run(alice[0])
    reader = ws_reader(server, run, alice[1])
    attached(server, run, reader)
    rotate_token(alice[0])
    assert ends_soon(reader) < CLOSED_WITHIN_S
    assert reader.result[1] == 4401


def test_notification_stream_ends_when_the_token_is_rotated(server, alice):
    url = f"{server.url}/api/stream/"
    reader = Reader(lambda: read_sse(url, headers=alice[1], timeout=60))
    reader.start()
    wait_until(lambda: server.call(group_size(owner_group(alice[0].pk))) == 1)
    rotate_token(alice[0])
    assert ends_soon(reader) < CLOSED_WITHIN_S


@pytest.mark.slow
def test_valid_credentials_stream_to_the_end_across_many_checks(server, alice):
    run = running_run(alice[0])
    sse = sse_reader(server, run, alice[1])
    ws = ws_reader(server, run, cookie_of(alice[0]), origin=server.url)
    sse.start()
    ws.start()
    wait_until(lambda: server.call(group_size(group_name(run.id))) == 1)
    checks_passed = time.monotonic() + 4 * CHECK_S
    for i in range(10):
        feed(server, run, 2, start=2 * i)
    wait_until(lambda: time.monotonic() > checks_passed, interval=CHECK_S / 3)
    feed(server, run, 1, start=20, end=True)
    sse.join(30)
    ws.join(30)
    assert [int(e[0].rsplit(":", 1)[1]) for e in sse.result.events] == list(
        range(1, 23)
    )
    frames, code = ws.result
    assert code == 1000 and [f["seq"] for f in frames] == list(range(1, 23))


# --- one check per credential ---------------------------------------------------


def streams_watched(user, headers) -> int:
    """How many open SSE streams of this token share its one credential check
    in the server (chat.access.watch_credential); 0 when it has no check."""
    token = headers["Authorization"].split(" ", 1)[1]
    wanted = credential_of(
        user_id=user.pk, authorization=f"Token {token}", session_key=""
    )
    counts = [
        len(w.streams) for (_, c), w in list(access._watches.items()) if c == wanted
    ]
    assert len(counts) <= 1, "one check per credential and loop"
    return counts[0] if counts else 0


def test_streams_of_one_token_share_one_check_and_all_end_when_it_goes(server, alice):
    user, headers = alice
    run = running_run(user)
    feed(server, run, 2)
    readers = [sse_reader(server, run, headers) for _ in range(2)]
    url = f"{server.url}/api/stream/"
    readers.append(Reader(lambda: read_sse(url, headers=headers, timeout=60)))
    for reader in readers:
        reader.start()
    wait_until(lambda: streams_watched(user, headers) == 3)
    rotate_token(user)
    for reader in readers:
        assert ends_soon(reader) < CLOSED_WITHIN_S
    assert [e[1] for e in readers[0].result.events] == ["token"] * 2
    wait_until(lambda: streams_watched(user, headers) == 0)
    wait_until(lambda: limits.open_streams(user.pk) == 0)


def test_a_stream_whose_client_leaves_stops_being_watched(server, alice):
    user, headers = alice
    run = running_run(user)
    with httpx.Client(timeout=30) as client:
        with client.stream(
            "GET", f"{server.url}/api/runs/{run.id}/events/", headers=headers
        ) as first:
            assert first.status_code == 200
            with client.stream(
                "GET", f"{server.url}/api/stream/", headers=headers
            ) as second:
                assert second.status_code == 200
                wait_until(lambda: streams_watched(user, headers) == 2)
            wait_until(lambda: streams_watched(user, headers) == 1)
            assert limits.open_streams(user.pk) == 1
    wait_until(lambda: streams_watched(user, headers) == 0)
    wait_until(lambda: limits.open_streams(user.pk) == 0)


@pytest.fixture
def stock_server(django_db_setup, django_db_blocker):
    """The same views behind Django's own ASGI handler, which iterates an
    `SSEResponse` as any streaming response (the guard is then
    `until_revoked`)."""
    with django_db_blocker.unblock():
        srv = AsgiServer(ASGIHandler()).start()
        yield srv
        srv.stop()


@pytest.mark.slow
def test_behind_djangos_own_handler_a_stream_still_ends_when_its_token_goes(
    stock_server, alice
):
    user, headers = alice
    run = running_run(user)
    feed(stock_server, run, 2)
    reader = sse_reader(stock_server, run, headers)
    attached(stock_server, run, reader)
    assert streams_watched(user, headers) == 0  # not `serve`d: its own guard
    assert limits.open_streams(user.pk) == 1
    rotate_token(user)
    assert ends_soon(reader) < CLOSED_WITHIN_S
    assert [e[1] for e in reader.result.events] == ["token"] * 2
    wait_until(lambda: limits.open_streams(user.pk) == 0)


@pytest.mark.slow
def test_a_check_that_fails_keeps_the_streams_watched(server, alice, monkeypatch):
    """A check that raises (a bug, not an outage) is logged and tried again:
    the shared check must not die with it, leaving the credential's streams
    unwatched."""
    user, headers = alice
    real, failures = access.credential_valid, []

    def failing_once(credential):
        if not failures:
            failures.append(credential)
            raise RuntimeError("check broke")
        return real(credential)

    monkeypatch.setattr(access, "credential_valid", failing_once)
    run = running_run(user)
    reader = sse_reader(server, run, headers)
    attached(server, run, reader)
    wait_until(lambda: failures)
    rotate_token(user)
    assert ends_soon(reader) < CLOSED_WITHIN_S
    wait_until(lambda: streams_watched(user, headers) == 0)
