"""Slow readers cost bounded memory under daphne, and are closed with a reason.

Raw sockets with a tiny receive buffer read a 10 MiB run slowly from a daphne
process; its RSS may grow by about 1 MiB per reader at most (without
backpressure it held the whole run per reader). Each reader is closed with an
SSE comment saying why, and resumes from its last event id to the end with no
gap and no duplicate. See docs/operating.md, "Slow readers".
"""

import asyncio
import json
import socket
import subprocess
import threading
import time
from pathlib import Path
from typing import NamedTuple

import h11
import pytest

from hermes_testing.chaos import rss_bytes
from hermes_testing.harness import (
    daphne_args,
    make_user,
    read_sse,
    read_ws,
    running_run,
    spawn_logged,
    subprocess_env,
    wait_until,
)
from hermes_testing.private_servers import free_port
from journal.store import append

pytestmark = pytest.mark.chaos

EVENT_TEXT = "x" * 8000
EVENTS = 700  # about 5.5 MiB of frames: far more than any buffer on the way
# Slow readers in the first and the second round. The cost of a reader is
# the growth from FEW to MANY divided by their difference; the process's own
# steps (an allocator arena, the run's shared window) come once whatever the
# number of readers, so the more readers, the less they weigh in it.
FEW, MANY = 2, 40
GIVEN_UP = "stream closed: reader too slow"
WS_GIVEN_UP = "websocket closed: reader too slow"
MiB = 1024 * 1024


class SlowReader:
    """An SSE reader on a raw socket that takes a little now and then."""

    def __init__(self, port: int, path: str, token: str):
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        self.sock.connect(("127.0.0.1", port))
        self.sock.sendall(self.request(port, path, token))
        self.data = bytearray()
        self.closed = threading.Event()
        self.fast = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()

    def request(self, port: int, path: str, token: str) -> bytes:
        return (
            f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            f"Authorization: Token {token}\r\n\r\n"
        ).encode()

    def _read(self) -> None:
        while True:
            try:
                chunk = self.sock.recv(65536 if self.fast.is_set() else 512)
            except ConnectionResetError:  # cut by the server: what came is kept
                break
            if not chunk:
                break
            self.data += chunk
            if not self.fast.is_set():
                time.sleep(0.05)  # about 10 KiB/s
        self.sock.close()
        self.closed.set()

    def body(self) -> bytes:
        """The response body, de-chunked (daphne streams with chunked encoding)."""
        conn = h11.Connection(h11.CLIENT)
        conn.send(h11.Request(method="GET", target="/", headers=[("Host", "x")]))
        conn.send(h11.EndOfMessage())
        conn.receive_data(bytes(self.data))
        conn.receive_data(b"")
        body = bytearray()
        while True:
            event = conn.next_event()
            if isinstance(event, h11.Data):
                body += event.data
            elif event in (h11.NEED_DATA, h11.PAUSED) or isinstance(
                event, (h11.EndOfMessage, h11.ConnectionClosed)
            ):
                return bytes(body)

    def event_ids(self) -> list[str]:
        """Ids of the complete events received (the last frame may be cut)."""
        frames = self.body().split(b"\n\n")[:-1]
        return [
            line[4:].decode()
            for frame in frames
            for line in frame.split(b"\n")
            if line.startswith(b"id: ")
        ]


class SlowWebSocket(SlowReader):
    """The same, on the run's WebSocket (frames parsed by hand: the server's
    frames are unmasked)."""

    def request(self, port: int, path: str, token: str) -> bytes:
        return (
            f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
            "Upgrade: websocket\r\nConnection: Upgrade\r\n"
            "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
            f"Sec-WebSocket-Version: 13\r\nOrigin: http://127.0.0.1:{port}\r\n"
            f"Authorization: Token {token}\r\n\r\n"
        ).encode()

    def frames(self) -> list[tuple[int, bytes]]:
        """The complete frames received: (opcode, payload)."""
        head, data = bytes(self.data).split(b"\r\n\r\n", 1)
        assert head.startswith(b"HTTP/1.1 101"), head
        frames, at = [], 0
        while at + 2 <= len(data):
            opcode, size, at2 = data[at] & 0x0F, data[at + 1] & 0x7F, at + 2
            if size == 126:
                size, at2 = int.from_bytes(data[at2 : at2 + 2]), at2 + 2
            elif size == 127:
                size, at2 = int.from_bytes(data[at2 : at2 + 8]), at2 + 8
            if at2 + size > len(data):
                break
            frames.append((opcode, data[at2 : at2 + size]))
            at = at2 + size
        return frames

    def event_ids(self) -> list[str]:
        return [json.loads(p)["id"] for op, p in self.frames() if op == 1]


def _slow_round(
    daphne, port: int, path: str, token: str, log: Path, n: int, kind=SlowReader
):
    """`n` slow readers until the server gives up on each; their RSS peak."""
    marker = GIVEN_UP if kind is SlowReader else WS_GIVEN_UP
    closed_before = log.read_text().count(marker)
    readers = [kind(port, path, token) for _ in range(n)]
    peak, deadline = 0, time.monotonic() + 120
    while log.read_text().count(marker) < closed_before + n:
        peak = max(peak, rss_bytes(daphne.pid))
        assert daphne.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)  # the sampling period of RSS, not a wait
    for reader in readers:  # given up on: now read what is left quickly
        reader.fast.set()
    wait_until(lambda: all(r.closed.is_set() for r in readers), 30)
    for reader in readers:
        if kind is SlowReader:
            assert reader.body().endswith(b"\n\n")
            assert b": closed: reader too slow (" in reader.body()[-300:]
    return peak, readers


class Served(NamedTuple):
    """A finished 5.5 MiB run, and a warmed daphne process serving it."""

    run_id: str
    headers: dict
    token: str
    port: int
    daphne: subprocess.Popen
    log: Path
    baseline: int  # the daphne's RSS once warmed by one whole read


@pytest.fixture
def served(transactional_db, django_user_model, tmp_path):
    user, headers = make_user(django_user_model, "sloane")
    run = running_run(user)
    for start in range(0, EVENTS, 100):
        append(
            run_id=run.id,
            token=1,
            events=[("token", {"text": EVENT_TEXT})] * min(100, EVENTS - start),
        )
    append(
        run_id=run.id,
        token=1,
        events=[("end", {"status": "completed", "terminal_state": "completed"})],
    )
    port = free_port()
    env = subprocess_env(
        HERMES_SLOW_READER_S="3", HERMES_USER_MAX_STREAMS=str(MANY + FEW + 8)
    )
    env.pop("REDIS_URL", None)
    log = tmp_path / "daphne.log"
    daphne = spawn_logged(daphne_args(port), env, log, "Listening on TCP address")
    try:
        url = f"http://127.0.0.1:{port}/api/runs/{run.id}/events/"
        warm = read_sse(url, headers=headers, timeout=60)  # allocator warmed once
        assert len(warm.events) == EVENTS + 1
        token = headers["Authorization"].split()[1]
        yield Served(run.id, headers, token, port, daphne, log, rss_bytes(daphne.pid))
    finally:
        daphne.terminate()
        daphne.wait(20)


def test_slow_readers_are_bounded_and_resume_from_their_cursor(served):
    run_id, headers, token, port, daphne, log, baseline = served
    path = f"/api/runs/{run_id}/events/"
    url = f"http://127.0.0.1:{port}{path}"
    # The allocator and the journal pool settle once, whatever the number
    # of readers; the cost of a reader is the growth from FEW to MANY.
    few_peak, few = _slow_round(daphne, port, path, token, log, FEW)
    many_peak, many = _slow_round(daphne, port, path, token, log, MANY)
    per_reader = (many_peak - baseline - (few_peak - baseline)) / (MANY - FEW)
    print(
        f"RSS: +{(few_peak - baseline) / MiB:.2f} MiB for {FEW} slow readers, "
        f"+{(many_peak - baseline) / MiB:.2f} MiB for {MANY}: "
        f"{per_reader / MiB:.2f} MiB per reader"
    )
    assert per_reader <= MiB
    assert many_peak - baseline <= 8 * MiB + MANY * MiB  # no run-sized growth

    expected = [f"{run_id}:{n}" for n in range(1, EVENTS + 2)]
    for reader in few + many[:2]:
        got = reader.event_ids()
        assert got == expected[: len(got)] and len(got) < len(expected)
        rest = read_sse(url, headers={**headers, "Last-Event-ID": got[-1]})
        assert got + [e[0] for e in rest.events] == expected
    daphne.terminate()
    daphne.wait(20)
    text = log.read_text()
    assert text.count(GIVEN_UP) == FEW + MANY, text[-2000:]
    assert "took too long to shut down" not in text


def test_slow_websocket_readers_are_bounded_and_resume_from_their_cursor(served):
    run_id, headers, token, port, daphne, log, baseline = served
    path = f"/ws/runs/{run_id}/"
    few_peak, few = _slow_round(daphne, port, path, token, log, FEW, SlowWebSocket)
    many_peak, many = _slow_round(daphne, port, path, token, log, MANY, SlowWebSocket)
    per_reader = (many_peak - few_peak) / (MANY - FEW)
    print(f"WebSocket RSS: {per_reader / MiB:.2f} MiB per reader")
    # The close frame queues behind the unsent data; each reader, reading
    # the rest once given up on, gets to it before the server's closing
    # handshake times out and reads code 4408 (daphne sends no reason).
    closes = [[p[:2] for op, p in r.frames() if op == 8] for r in few + many]
    assert closes == [[(4408).to_bytes(2, "big")]] * (FEW + MANY)
    assert per_reader <= MiB
    assert many_peak - baseline <= 8 * MiB + MANY * MiB

    expected = [f"{run_id}:{n}" for n in range(1, EVENTS + 2)]
    for reader in few + many[:2]:
        got = reader.event_ids()
        assert got == expected[: len(got)] and len(got) < len(expected)
        after = got[-1].split(":")[-1]
        rest, code = asyncio.run(
            read_ws(
                f"ws://127.0.0.1:{port}{path}?after_seq={after}",
                headers=headers,
                origin=f"http://127.0.0.1:{port}",
                timeout=60,
            )
        )
        assert code == 1000 and got + [f["id"] for f in rest] == expected
    daphne.terminate()
    daphne.wait(20)
    assert log.read_text().count(WS_GIVEN_UP) == FEW + MANY
