"""Raw-socket HTTP/1.1 and SSE clients for the benchmarks.

Raw asyncio sockets, not httpx, so that hundreds of readers in one client
process cost little and the client does not limit what is measured.
"""

import asyncio
import json
import re
import time


class HTTPError(Exception):
    pass


class SSEConn:
    """One SSE request on a raw asyncio socket: HTTP/1.1, chunked body decoded.

    Raw sockets, not httpx, so that hundreds of readers in one client process
    cost little and the client does not limit what is measured.
    """

    def __init__(self, port: int, path: str, token: str):
        self.port, self.path, self.token = port, path, token
        self.status = 0
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._chunked = False

    async def open(self) -> None:
        self._reader, self._writer = await asyncio.open_connection(
            "127.0.0.1", self.port, limit=2**20
        )
        self._writer.write(
            (
                f"GET {self.path} HTTP/1.1\r\nHost: 127.0.0.1:{self.port}\r\n"
                f"Authorization: Token {self.token}\r\n"
                "Accept: text/event-stream\r\n\r\n"
            ).encode()
        )
        head = await self._reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin1").split("\r\n")
        self.status = int(lines[0].split()[1])
        headers = {
            k.lower(): v.strip() for k, _, v in (x.partition(":") for x in lines[1:])
        }
        self._chunked = headers.get("transfer-encoding", "").lower() == "chunked"
        if self.status != 200:
            raise HTTPError(f"{self.path}: HTTP {self.status}")

    async def chunks(self):
        """Body bytes as they arrive, until the response ends."""
        reader = self._reader
        if not self._chunked:
            while data := await reader.read(2**18):
                yield data
            return
        while True:
            size_line = await reader.readuntil(b"\r\n")
            size = int(size_line.split(b";")[0], 16)
            if size == 0:
                await reader.readuntil(b"\r\n")
                return
            data = await reader.readexactly(size + 2)
            yield data[:-2]

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()


FRAME = re.compile(rb"id: [^\n]*:(\d+)\nevent: ([a-z_]+)\ndata: ([^\n]*)\n\n")


class FrameReader:
    """Parses SSE frames from body bytes; calls `on_frames(frames, t_ns)` per read.

    `frames` is a list of (seq, type, data bytes); `t_ns` is the CLOCK_MONOTONIC
    time the bytes were read. Comments and the `retry:` line are skipped.
    """

    def __init__(self):
        self.buf = b""

    def feed(self, data: bytes) -> list[tuple[int, bytes, bytes]]:
        buf = self.buf + data
        cut = buf.rfind(b"\n\n")
        if cut < 0:
            self.buf = buf
            return []
        self.buf = buf[cut + 2 :]
        return [(int(s), t, d) for s, t, d in FRAME.findall(buf, 0, cut + 2)]


class Reader:
    """One SSE reader of a run: every frame's seq, type and data, and when it came.

    `times[i]` is the CLOCK_MONOTONIC ns at which the bytes holding frame i were
    read. `first` is set once a frame arrived; `done` once the `end` did.
    """

    def __init__(
        self, port: int, token: str, run_id: str, after_seq: int | None = None
    ):
        path = f"/api/runs/{run_id}/events/"
        if after_seq is not None:
            path += f"?after_seq={after_seq}"
        self.conn = SSEConn(port, path, token)
        self.seqs: list[int] = []
        self.types: list[bytes] = []
        self.datas: list[bytes] = []
        self.times: list[int] = []
        self.first = asyncio.Event()
        self.done = asyncio.Event()
        self.error: BaseException | None = None

    async def run(self) -> None:
        frames = FrameReader()
        try:
            await self.conn.open()
            async for chunk in self.conn.chunks():
                now = time.monotonic_ns()
                got = frames.feed(chunk)
                for seq, kind, data in got:
                    self.seqs.append(seq)
                    self.types.append(kind)
                    self.datas.append(data)
                    self.times.append(now)
                if got:
                    self.first.set()
                    if got[-1][1] == b"end":
                        break
        except (OSError, asyncio.IncompleteReadError, HTTPError) as exc:
            self.error = exc
        finally:
            self.conn.close()
            self.first.set()
            self.done.set()

    def check(self) -> tuple[int, int, bool]:
        """(lost, duplicated, in order) against 1..last seq seen."""
        last = max(self.seqs, default=0)
        unique = set(self.seqs)
        lost = last - len(unique)
        dup = len(self.seqs) - len(unique)
        return lost, dup, self.seqs == sorted(self.seqs)


async def start_readers(
    port: int, token: str, run_id: str, count: int, *, wave: int = 25
) -> tuple[list[Reader], list[asyncio.Task]]:
    """Open `count` readers, `wave` connections at a time (small listen backlog)."""
    readers, tasks = [], []
    for i in range(0, count, wave):
        batch = [Reader(port, token, run_id) for _ in range(min(wave, count - i))]
        readers += batch
        tasks += [asyncio.create_task(r.run()) for r in batch]
        await asyncio.sleep(0.02)
    return readers, tasks


async def http_json(
    port: int, method: str, path: str, token: str, body: dict | None = None
) -> tuple[int, dict]:
    """A small JSON request over a raw socket (Connection: close)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    data = json.dumps(body).encode() if body is not None else b""
    writer.write(
        (
            f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
            f"Authorization: Token {token}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n"
        ).encode()
        + data
    )
    raw = await reader.read()
    writer.close()
    head, _, payload = raw.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    if b"transfer-encoding: chunked" in head.lower():
        out, rest = b"", payload
        while rest:
            size_line, _, rest = rest.partition(b"\r\n")
            size = int(size_line, 16)
            if not size:
                break
            out, rest = out + rest[:size], rest[size + 2 :]
        payload = out
    return status, (json.loads(payload) if payload.strip() else {})
