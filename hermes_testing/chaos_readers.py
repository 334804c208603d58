"""Readers of the fault-injection suite, and the verdicts on what they got.

`Reader` follows one run to its `end`, hanging up and reconnecting at random
across the live web servers of a `hermes_testing.chaos.Deployment` with every
cursor form; `verify` compares what every reader got, the journal and the
session's kept text (docs/operating.md, "Fault-injection suite").
"""

from __future__ import annotations

import json
import random
import socket
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx
from websockets.client import ClientProtocol
from websockets.exceptions import ConnectionClosed, InvalidHandshake
from websockets.frames import Frame, Opcode
from websockets.http11 import Response
from websockets.protocol import State
from websockets.sync.client import connect as ws_connect
from websockets.uri import parse_uri

from hermes_testing.chaos import Deployment, JournalDB

CURSOR_FORMS = ("after_seq", "after_event_id", "last_event_id", "ws")
_TEXT_OPCODES = (Opcode.TEXT, Opcode.CONT)


def api_client(**kw: Any) -> httpx.Client:
    return httpx.Client(timeout=httpx.Timeout(30, connect=5), trust_env=False, **kw)


@dataclass
class Refusal:
    status: int
    retry_after: str | None
    body: str


class Reader(threading.Thread):
    """Follows one run to its `end`, hanging up and reconnecting at random.

    Each connection goes to a random live web server with a random cursor form
    naming the last event received, and is hung up after a random number of
    events. `pace_bps` reads the stream no faster than that many bytes a
    second through a small socket buffer (a slow phone). Everything received
    is kept, duplicates included, for `verify`.
    """

    def __init__(
        self,
        deployment: Deployment,
        run_id: str,
        headers: dict,
        *,
        seed: int,
        hangup_after: tuple[int, int] | None = (1, 60),
        forms: tuple[str, ...] = CURSOR_FORMS,
        urls: list[str] | None = None,
        pace_bps: int | None = None,
        deadline_s: float = 300.0,
    ) -> None:
        super().__init__(name=f"reader {run_id}", daemon=True)
        self.deployment, self.run_id, self.headers = deployment, run_id, headers
        self.rng = random.Random(seed)
        self.hangup_after, self.forms, self.urls = hangup_after, forms, urls
        self.pace_bps = pace_bps
        self.deadline = time.monotonic() + deadline_s
        self.got: list[tuple[int, str, Any]] = []
        self.connections = 0
        self.refusals: list[Refusal] = []
        self.keepalives = 0  # WebSocket keepalive frames (a database outage)
        self.errors: list[str] = []
        self.finished = False  # got `end`

    @property
    def last_seq(self) -> int | None:
        return self.got[-1][0] if self.got else None

    def run(self) -> None:
        while not self.finished and time.monotonic() < self.deadline:
            urls = self.urls or [w.url for w in self.deployment.live_webs()]
            if not urls:
                time.sleep(0.2)  # every web server is down: a client retries
                continue
            base = self.rng.choice(urls)
            form = self.rng.choice(self.forms)
            budget = self.rng.randint(*self.hangup_after) if self.hangup_after else None
            self.connections += 1
            try:
                if form == "ws":
                    delay = self._read_ws(base, budget)
                else:
                    delay = self._read_sse(base, form, budget)
            except (httpx.HTTPError, OSError, ConnectionClosed, InvalidHandshake) as e:
                self.errors.append(f"{type(e).__name__}: {e}")
                delay = self.rng.uniform(0.2, 0.5)
            if delay and not self.finished:
                time.sleep(delay)

    def _take(self, seq: int, kind: str, data: Any) -> None:
        self.got.append((seq, kind, data))
        if kind == "end":
            self.finished = True

    def _read_sse(self, base: str, form: str, budget: int | None) -> float:
        """One SSE connection; returns how long to wait before the next one."""
        last, params, headers = self.last_seq, {}, dict(self.headers)
        if form == "after_seq" and last is not None:
            params["after_seq"] = str(last)
        elif form == "after_event_id" and last is not None:
            params["after_event_id"] = f"{self.run_id}:{last}"
        elif form == "last_event_id" and last is not None:
            headers["Last-Event-ID"] = f"{self.run_id}:{last}"
        options: dict[str, Any] = {}
        if self.pace_bps:
            options["transport"] = httpx.HTTPTransport(
                socket_options=[(socket.SOL_SOCKET, socket.SO_RCVBUF, 16384)]
            )
        url = f"{base}/api/runs/{self.run_id}/events/"
        with api_client(**options) as client:
            with client.stream("GET", url, params=params, headers=headers) as resp:
                if resp.status_code != 200:
                    return self._refused(resp)
                return self._consume_sse(resp, budget)

    def _refused(self, resp: httpx.Response) -> float:
        body = resp.read().decode("utf-8", "replace")[:300]
        retry_after = resp.headers.get("Retry-After")
        self.refusals.append(Refusal(resp.status_code, retry_after, body))
        if resp.status_code == 204:  # "nothing after your cursor": no `end` for us
            self.errors.append(f"204 at cursor {self.last_seq}")
            self.deadline = 0
        try:
            return min(2.0, float(retry_after)) if retry_after else 0.5
        except ValueError:
            return 0.5

    def _consume_sse(self, resp: httpx.Response, budget: int | None) -> float:
        buffer, count = bytearray(), 0
        chunk = 4096 if self.pace_bps else None
        for data in resp.iter_raw(chunk):
            if time.monotonic() > self.deadline:  # keepalives alone never end it
                self.errors.append(f"gave up at its deadline after seq {self.last_seq}")
                return 0.0
            if self.pace_bps:
                time.sleep(len(data) / self.pace_bps)
            # Search only the new bytes (and one before): events may be large.
            start = max(0, len(buffer) - 1)
            buffer += data
            cut = buffer.rfind(b"\n\n", start)
            if cut < 0:
                continue
            blocks = bytes(buffer[:cut]).split(b"\n\n")
            del buffer[: cut + 2]
            for block in blocks:
                event = _sse_event(block)
                if event is None:
                    continue
                seq_id, kind, payload = event
                run_id, _, seq = seq_id.rpartition(":")
                if run_id != self.run_id:
                    self.errors.append(f"event id of another run: {seq_id}")
                    continue
                self._take(int(seq), kind, json.loads(payload))
                count += 1
                if self.finished or (budget is not None and count >= budget):
                    return 0.0
        return 0.0 if count else self.rng.uniform(0.2, 0.5)

    def _read_ws(self, base: str, budget: int | None) -> float:
        last = self.last_seq
        query = ""
        if last is not None:
            query = self.rng.choice(
                [f"?after_seq={last}", f"?after_event_id={self.run_id}:{last}"]
            )
        url = base.replace("http://", "ws://") + f"/ws/runs/{self.run_id}/{query}"
        if self.pace_bps:
            return self._read_ws_paced(url, budget)
        count = 0
        with ws_connect(
            url,
            additional_headers=self.headers,
            proxy=None,
            compression=None,
            max_size=None,
            max_queue=4,
            open_timeout=10,
            close_timeout=2,
        ) as ws:
            while not self.finished and (budget is None or count < budget):
                try:
                    raw = ws.recv(timeout=60)
                except ConnectionClosed as closed:
                    close = closed.rcvd
                    if close is not None and close.code != 1000:
                        self.refusals.append(Refusal(close.code, None, close.reason))
                    elif close is None:  # no close frame: the connection dropped
                        self.errors.append(f"websocket dropped: {closed}")
                    return 0.0 if count else self.rng.uniform(0.2, 0.5)
                self._take_frame(raw)
                count += 1
        return 0.0

    def _take_frame(self, raw: str | bytes) -> None:
        frame = json.loads(raw)
        if frame.get("event") == "keepalive" and "seq" not in frame:
            self.keepalives += 1  # sent while the journal cannot be read
            return
        if frame["id"] != f"{self.run_id}:{frame['seq']}":
            self.errors.append(f"frame id {frame['id']} seq {frame['seq']}")
        self._take(frame["seq"], frame["event"], frame["data"])

    def _read_ws_paced(self, url: str, budget: int | None) -> float:
        """A WebSocket read no faster than `pace_bps` through a 16 KiB socket buffer.

        The socket is read here, at that pace, and websockets' sans-I/O
        protocol parses the frames (and answers pings): a client library's
        own reader thread would drain the socket at full speed.
        """
        assert self.pace_bps
        protocol = ClientProtocol(parse_uri(url), max_size=None)
        request = protocol.connect()
        for name, value in self.headers.items():
            request.headers[name] = value
        protocol.send_request(request)
        host, port = url.split("/")[2].split(":")
        with socket.socket() as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16384)
            sock.settimeout(60)
            sock.connect((host, int(port)))
            count, text = 0, bytearray()
            while not self.finished and (budget is None or count < budget):
                for out in protocol.data_to_send():  # the request, pongs, a close
                    if out:
                        sock.sendall(out)
                data = sock.recv(4096)
                time.sleep(len(data) / self.pace_bps)
                if data:
                    protocol.receive_data(data)
                else:
                    protocol.receive_eof()
                for event in protocol.events_received():
                    if isinstance(event, Response) and event.status_code != 101:
                        self.refusals.append(Refusal(event.status_code, None, ""))
                        return 0.5
                    if isinstance(event, Frame) and event.opcode in _TEXT_OPCODES:
                        text += event.data
                        if event.fin:
                            self._take_frame(bytes(text))
                            text.clear()
                            count += 1
                close = protocol.close_rcvd
                if data and close is None and protocol.state is not State.CLOSED:
                    continue
                if close is not None and close.code != 1000:
                    self.refusals.append(Refusal(close.code, None, close.reason))
                elif close is None:  # no close frame: the connection dropped
                    self.errors.append("websocket dropped without a close frame")
                return 0.0 if count else self.rng.uniform(0.2, 0.5)
        return 0.0


def _sse_event(block: bytes) -> tuple[str, str, str] | None:
    """(id, event, data) of one SSE block; None for comments, `retry:`, no id."""
    seq_id = kind = None
    data = []
    for line in block.decode("utf-8").split("\n"):
        name, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if name == "id":
            seq_id = value
        elif name == "event":
            kind = value
        elif name == "data":
            data.append(value)
    if seq_id is None or kind is None:
        return None  # keepalive comments, `retry:`, live-only events
    return seq_id, kind, "\n".join(data)


def join_readers(readers: list[Reader], timeout: float = 300.0) -> None:
    deadline = time.monotonic() + timeout
    for reader in readers:
        reader.join(max(0.0, deadline - time.monotonic()))
    stuck = [r.run_id for r in readers if r.is_alive()]
    assert not stuck, f"readers still reading after {timeout:g} s: {stuck}"


# --- verdicts -------------------------------------------------------------------------


@dataclass
class RunVerdict:
    run_id: str
    run: dict
    journal: list[tuple[int, str, Any]]
    kept_text: str
    problems: list[str] = field(default_factory=list)
    reader_events: int = 0

    @property
    def end(self) -> dict:
        return self.journal[-1][2] if self.journal else {}

    @property
    def text(self) -> str:
        return "".join(d["text"] for _, kind, d in self.journal if kind == "token")


def reader_faults(got: list[tuple[int, str, Any]], last_seq: int) -> dict[str, int]:
    """Lost, duplicated and out-of-order events in what one reader received."""
    seqs = [seq for seq, _, _ in got]
    seen: set[int] = set()
    dup = ooo = 0
    high = 0
    for seq in seqs:
        if seq in seen:
            dup += 1
        elif seq < high:
            ooo += 1
        seen.add(seq)
        high = max(high, seq)
    lost = len(set(range(1, last_seq + 1)) - seen)
    return {"lost": lost, "duplicated": dup, "out_of_order": ooo}


def verify(db: JournalDB, run_id: str, readers: Sequence[Reader] = ()) -> RunVerdict:
    """The run's promises, against its journal: see the module docstring."""
    run = db.run(run_id)
    journal = db.events(run_id)
    verdict = RunVerdict(run_id, run, journal, db.kept_text(run_id))
    seqs = [seq for seq, _, _ in journal]
    if seqs != list(range(1, len(seqs) + 1)) or run["last_seq"] != len(seqs):
        verdict.problems.append(f"journal not dense: last_seq {run['last_seq']}")
    ends = [seq for seq, kind, _ in journal if kind == "end"]
    if ends != [len(seqs)] or run["status"] in ("queued", "running"):
        verdict.problems.append(f"ends at {ends} of {len(seqs)}, {run['status']}")
    if verdict.kept_text != verdict.text:
        verdict.problems.append(
            f"kept text ({len(verdict.kept_text)} chars) differs from the"
            f" journal's ({len(verdict.text)} chars)"
        )
    for reader in readers:
        verdict.reader_events += len(reader.got)
        faults = reader_faults(reader.got, len(seqs))
        if any(faults.values()) or reader.got != journal:
            verdict.problems.append(
                f"reader ({reader.connections} connections): {faults},"
                f" matches journal: {reader.got == journal},"
                f" errors: {reader.errors[-3:]}"
            )
    return verdict


def assert_promises(verdicts: list[RunVerdict]) -> None:
    problems = [f"{v.run_id}: {p}" for v in verdicts for p in v.problems]
    assert not problems, "\n".join(problems)
