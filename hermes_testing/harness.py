"""Test tools for the whole site: a real ASGI server on a real socket, and readers.

`AsgiServer` runs uvicorn in a thread of its own, with its own event loop, on a
free loopback port. Code that must run beside the server's readers (the
in-memory channel layer lives in that loop) is handed to `call()`.
"""

import asyncio
import contextlib
import json
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta

import httpx
import uvicorn
import websockets
from channels.layers import get_channel_layer
from django.db.backends.signals import connection_created
from django.utils import timezone
from httpx_sse import EventSource
from rest_framework.authtoken.models import Token
from websockets.typing import Origin

from hermes_site.database_url import postgres_url
from journal.models import Run


class AsgiServer:
    def __init__(self, app):
        self.app = app
        self.loop: asyncio.AbstractEventLoop | None = None
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def ws_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}"

    def start(self) -> "AsgiServer":
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(
            self.app, lifespan="off", log_level="warning", ws="auto"
        )
        server = self._server = uvicorn.Server(config)
        started = threading.Event()

        def serve() -> None:
            loop = self.loop = asyncio.new_event_loop()
            asyncio.set_event_loop(loop)
            loop.call_soon(started.set)
            loop.run_until_complete(server.serve(sockets=[sock]))

        self._thread = threading.Thread(target=serve, name="asgi-server", daemon=True)
        self._thread.start()
        started.wait(10)
        while not server.started:
            self.call(asyncio.sleep(0.01))
        return self

    def call(self, coro, timeout: float = 30):
        """Run `coro` on the server's event loop and return its result."""
        assert self.loop is not None, "the server is not started"
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(10)


@dataclass
class SSEResult:
    status: int
    events: list  # (id, event, data-dict) in order
    retry: int | None = None
    comments: int = 0


def read_sse(
    url: str,
    *,
    headers: dict | None = None,
    max_events: int | None = None,
    timeout: float = 20,
) -> SSEResult:
    """Read a run's SSE stream over a real socket until it closes (or max_events)."""
    events = []
    retry = None
    with httpx.Client(timeout=timeout) as client:
        with client.stream("GET", url, headers=headers or {}) as response:
            if response.status_code != 200:
                response.read()
                return SSEResult(response.status_code, [])
            for sse in EventSource(response).iter_sse():
                if sse.retry is not None and retry is None:
                    retry = sse.retry
                if not sse.data:
                    continue
                events.append((sse.id, sse.event, json.loads(sse.data)))
                if max_events is not None and len(events) >= max_events:
                    break
    return SSEResult(200, events, retry)


async def read_ws(
    url: str,
    *,
    headers: dict | None = None,
    origin: str | None = None,
    max_events: int | None = None,
    timeout: float = 20,
):
    """Read a run's WebSocket frames until the server closes (or max_events)."""
    frames: list = []
    async with websockets.connect(
        url,
        additional_headers=headers or {},
        origin=None if origin is None else Origin(origin),
        open_timeout=timeout,
    ) as ws:
        while max_events is None or len(frames) < max_events:
            try:
                raw = await asyncio.wait_for(ws.recv(), timeout)
            except websockets.ConnectionClosed as closed:
                return frames, closed.rcvd.code if closed.rcvd else None
            frames.append(json.loads(raw))
    return frames, None


def make_user(django_user_model, name: str):
    user = django_user_model.objects.create_user(
        username=name, password="pw-" + name * 3
    )
    return user, {"Authorization": f"Token {Token.objects.create(user=user).key}"}


def running_run(owner, *, lease_s: float = 60, subject: str = "") -> Run:
    """A run as a worker holds it right after claiming: running, token 1."""
    return Run.objects.create(
        owner=owner,
        subject=subject,
        status=Run.Status.RUNNING,
        fencing_token=1,
        lease_owner="test-writer",
        lease_expires_at=timezone.now() + timedelta(seconds=lease_s),
        started_at=timezone.now(),
    )


def process_alive(pid: int) -> bool:
    """Whether process `pid` runs: a zombie (ended, not reaped) does not, nor
    one reaped before its /proc entry is opened or while it is read."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:  # FileNotFoundError, or ESRCH between the open and the read
        return False


@contextlib.contextmanager
def connections_opened() -> Iterator[list[str]]:
    """The names of the threads that open a database connection, in order,
    while the block runs (Django's `connection_created`, any thread)."""
    names: list[str] = []

    def note(sender, **kwargs):
        names.append(threading.current_thread().name)

    connection_created.connect(note, weak=False)
    try:
        yield names
    finally:
        connection_created.disconnect(note)


def wait_until(predicate, timeout: float = 30, interval: float = 0.02):
    """Wait for a condition another thread or process brings about."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(interval)


async def wait_until_async(predicate, timeout: float = 10, interval: float = 0.01):
    """`wait_until` for a condition other tasks of this event loop bring about."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(interval)


async def group_size(group: str) -> int:
    """Members of a channel-layer group, in-memory or Redis."""
    layer = get_channel_layer()
    if hasattr(layer, "groups"):  # InMemoryChannelLayer
        return len(layer.groups.get(group, {}))
    connection = layer.connection(layer.consistent_hash(group))
    return await connection.zcard(layer._group_key(group))


def subprocess_env(**overrides: str) -> dict:
    """Environment for a child Hermes process sharing this test run's database."""
    import os

    from django.db import connection

    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    db = connection.settings_dict
    if db["ENGINE"].endswith("sqlite3"):
        env["HERMES_SQLITE_PATH"] = str(db["NAME"])
    else:
        env["DATABASE_URL"] = postgres_url(
            db["USER"], db["HOST"] or "127.0.0.1", db["PORT"] or 5432, db["NAME"]
        )
    env.update(overrides)
    return env


def spawn(args: list[str], env: dict, ready_text: str, timeout: float = 30):
    """Start a child process and wait until it prints `ready_text` on stdout."""
    import subprocess
    import sys

    from django.conf import settings

    proc = subprocess.Popen(
        [sys.executable, *args],
        cwd=settings.BASE_DIR,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.monotonic() + timeout
    seen = []
    assert proc.stdout is not None
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        seen.append(line)
        if ready_text in line:
            threading.Thread(target=proc.stdout.read, daemon=True).start()  # drain
            return proc
    proc.kill()
    raise AssertionError(f"child did not start: {''.join(seen)[-2000:]}")


def spawn_logged(args: list[str], env: dict, log_path, ready_text: str, timeout=60):
    """Like `spawn`, with the child's output kept in `log_path` for assertions."""
    import subprocess
    import sys

    from django.conf import settings

    out = open(log_path, "w")  # noqa: SIM115  (the child writes to it until it exits)
    proc = subprocess.Popen(
        [sys.executable, *args],
        cwd=settings.BASE_DIR,
        env=env,
        stdout=out,
        stderr=subprocess.STDOUT,
        text=True,
    )
    wait_until(
        lambda: ready_text in log_path.read_text() or proc.poll() is not None, timeout
    )
    if proc.poll() is not None:
        raise AssertionError(f"child did not start: {log_path.read_text()[-2000:]}")
    return proc


def daphne_args(port: int) -> list[str]:
    return [
        "-m",
        "daphne",
        "-b",
        "127.0.0.1",
        "-p",
        str(port),
        "hermes_site.asgi:application",
    ]


def csp_directives(header: str) -> dict[str, str]:
    """A Content-Security-Policy header as {directive: sources}: the order of
    the directives carries no meaning."""
    parts = (part.strip().partition(" ") for part in header.split(";"))
    return {name: rest for name, _, rest in parts if name}


# The policy every response carries (hermes_site/settings.py), as the tests
# expect it: nothing inline, nothing from another origin.
STRICT_CSP = {
    "default-src": "'self'",
    "script-src": "'self'",
    "worker-src": "'self'",
    "style-src": "'self'",
    "img-src": "'self' data: blob:",
    "connect-src": "'self'",
    "object-src": "'none'",
    "base-uri": "'none'",
    "form-action": "'self'",
    "frame-ancestors": "'none'",
}
