"""Stream instances end promptly when their client leaves, under daphne.

Clients of a run's SSE stream and of the notification stream connect to a
daphne process and then drop their sockets while the streams idle between
keepalives. The run streams' subscriptions (the `/metrics` gauge) go to zero,
and daphne never has to kill an application instance that outlived its client
(`--application-close-timeout` is shortened so its warning would show soon).
"""

import socket
import time

import httpx
import pytest

from hermes_testing.harness import (
    daphne_args,
    make_user,
    running_run,
    spawn_logged,
    subprocess_env,
    wait_until,
)
from hermes_testing.private_servers import free_port

pytestmark = pytest.mark.chaos

CLOSE_TIMEOUT_S = (
    2  # daphne kills (and logs) instances alive this long after their client
)
CLIENTS = 10


def _gauge(base: str, name: str) -> float:
    for line in httpx.get(f"{base}/metrics", timeout=30).text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"no {name}")


def _request(port: int, path: str, token: str) -> socket.socket:
    """A connection that has sent a stream's request, nothing read yet."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    sock.sendall(
        f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Authorization: Token {token}\r\n\r\n".encode()
    )
    return sock


def _open(port: int, path: str, token: str) -> socket.socket:
    sock = _request(port, path, token)
    assert sock.recv(4096).startswith(b"HTTP/1.1 200")  # headers, then the stream
    return sock


def _daphne(tmp_path, port: int, close_timeout_s: float, **env):
    """A daphne of its own (no Redis) whose streams idle between keepalives."""
    env = subprocess_env(HERMES_SSE_KEEPALIVE_S="30", **env)
    env.pop("REDIS_URL", None)
    args = [*daphne_args(port), "--application-close-timeout", str(close_timeout_s)]
    return spawn_logged(args, env, tmp_path / "daphne.log", "Listening on TCP address")


def test_streams_end_promptly_when_their_clients_leave(
    transactional_db, django_user_model, tmp_path
):
    user, headers = make_user(django_user_model, "dora")
    run = running_run(user, lease_s=600)  # never ends: only the clients leave
    token = headers["Authorization"].split()[1]
    port = free_port()
    daphne = _daphne(tmp_path, port, CLOSE_TIMEOUT_S)
    base = f"http://127.0.0.1:{port}"
    try:
        socks = [
            _open(port, path, token)
            for _ in range(CLIENTS)
            for path in (f"/api/runs/{run.id}/events/", "/api/stream/")
        ]
        wait_until(lambda: _gauge(base, "hermes_subscriptions_active") == CLIENTS, 30)
        left = time.monotonic()
        for sock in socks:
            sock.close()
        wait_until(lambda: _gauge(base, "hermes_subscriptions_active") == 0, 10)
        assert time.monotonic() - left < CLOSE_TIMEOUT_S
        # daphne checks its instances every second: give it the close timeout
        # and two checks to complain, if it were going to.
        time.sleep(CLOSE_TIMEOUT_S + 2)
    finally:
        daphne.terminate()
        daphne.wait(20)
    assert "took too long to shut down" not in (tmp_path / "daphne.log").read_text()


def _holds_all_slots(port: int, path: str, token: str, slots: int) -> bool:
    """Whether the user can hold `slots` streams at once now (then let go)."""
    socks = []
    try:
        for _ in range(slots):
            sock = _request(port, path, token)
            socks.append(sock)
            if not sock.recv(4096).startswith(b"HTTP/1.1 200"):
                return False
        return True
    finally:
        for sock in socks:
            sock.close()


def test_clients_that_leave_before_their_stream_starts_free_their_slots(
    transactional_db, django_user_model, tmp_path
):
    """Clients gone while their request is still in Django's hands (before
    the body is served, when daphne's disconnect is still queued) end their
    streams too: every stream slot comes back. daphne would kill instances
    that outlive their client only after two minutes here: the slots come
    back sooner only if Hermes heard each client leave."""
    user, headers = make_user(django_user_model, "early")
    run = running_run(user, lease_s=600)
    token = headers["Authorization"].split()[1]
    port = free_port()
    slots = 4
    daphne = _daphne(tmp_path, port, 120, HERMES_USER_MAX_STREAMS=str(slots))
    base = f"http://127.0.0.1:{port}"
    path = f"/api/runs/{run.id}/events/"
    try:
        for _ in range(10 * slots):  # each sends its request and leaves at once
            _request(port, path, token).close()
        wait_until(lambda: _holds_all_slots(port, path, token, slots), 60)
        wait_until(lambda: _gauge(base, "hermes_subscriptions_active") == 0, 30)
    finally:
        daphne.terminate()
        daphne.wait(20)
