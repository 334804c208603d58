"""A real loopback OpenAI-compatible HTTP server with fault injection.
See docs/architecture.md §8.

Tests, demos and benchmarks talk to this server over real sockets instead of
mocking the HTTP client. It is written on raw asyncio streams with a minimal
HTTP/1.1 so that every fault is exact: a body cut short of its declared
``Content-Length``, a stall that keeps the socket open, a malformed SSE chunk,
429 with ``Retry-After``, 5xx, tool calls, reasoning, with or without usage.

Replies are scripted with :meth:`FakeLLM.push`; every POST is recorded with the
server-side times of its last byte, its stall and the close of its connection,
so tests measure behaviour on the server's clock instead of sleeping.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from hermes_testing.fake_events import SSE_HEADERS, PeerStream, schedule
from hermes_testing.fake_wire import (
    DONE_FRAME,
    Reply,
    Request,
    completion,
    error_payload,
    plan_stream,
    read_request,
    response_head,
)

__all__ = ["FakeLLM", "RecordedRequest", "Reply"]

logger = logging.getLogger(__name__)


@dataclass
class RecordedRequest:
    """A POST the server received; times are ``time.monotonic()`` seconds."""

    index: int
    path: str
    headers: dict[str, str]  # lower-cased names
    body: dict[str, Any]
    received_at: float
    status: int | None = None
    last_byte_at: float | None = None
    stall_at: float | None = None
    held_at: float | None = None  # when a `hold_after_chunks` hold began
    #: When the connection that carried this request ended (either side).
    closed_at: float | None = None
    closed_by: str | None = None  # "client" or "server"
    method: str = "POST"
    query: str = ""  # the request target after "?"

    @property
    def messages(self) -> list[dict[str, Any]]:
        return self.body.get("messages", [])


@dataclass
class Conn:
    """One client connection, and the requests it carried (their records are
    closed with it)."""

    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    served: list[RecordedRequest] = field(default_factory=list)


class FakeLLM:
    """Loopback OpenAI-compatible server. Thread-safe; a context manager.

    ``start()`` serves on 127.0.0.1 on a free port from a background thread
    with its own event loop; ``serve_forever()`` serves in the caller's loop.
    """

    def __init__(
        self,
        *,
        models: Sequence[str] = ("fake-model",),
        api_key: str | None = None,
        default: Reply | None = None,
    ) -> None:
        self.models = list(models)
        self.api_key = api_key
        self._cond = threading.Condition()
        self._queue: deque[Reply] = deque()
        self._routes: dict[str, deque[Reply]] = {}
        self._initial_default = default or Reply(text="Hello from the fake model.")
        self._default = self._initial_default
        self._records: list[RecordedRequest] = []
        self._port: int | None = None
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._main: asyncio.Task[None] | None = None
        self._conns: set[asyncio.Task[Any]] = set()
        # Fault switch for `GET /v1/models`: None serves the list; a status
        # (e.g. 503) answers that error instead. `models_requests` counts GETs,
        # `models_answered` the answers sent.
        self.models_fault: int | None = None
        self.models_delay_s = 0.0  # and a pause before answering it
        self.models_requests = 0
        self.models_answered = 0
        # What llama.cpp's Python server does by default (`interrupt_requests`):
        # any request that arrives while an answer streams ends that answer at
        # once with `data: [DONE]` and no finish reason, in a body without a
        # Content-Length that ends cleanly.
        self.interrupt_requests = False
        # What chat templates that need alternating roles do: two user or two
        # assistant messages in a row answer 400 (the template's own words).
        self.strict_roles = False
        self._streaming: set[_StreamWriter] = set()

    # --- scripting and records (any thread) --------------------------------
    @property
    def default(self) -> Reply:
        with self._cond:
            return self._default

    @default.setter
    def default(self, reply: Reply) -> None:
        with self._cond:
            self._default = reply

    def push(self, *replies: Reply) -> None:
        """Queue replies, consumed one per chat-completions POST."""
        with self._cond:
            self._queue.extend(replies)

    def route(self, user_text: str, *replies: Reply) -> None:
        """Queue replies for POSTs whose last user message is exactly ``user_text``.

        Routed replies go before the shared queue, so concurrent runs each get
        their own script whatever order their requests arrive in.
        """
        with self._cond:
            self._routes.setdefault(user_text, deque()).extend(replies)

    def reset(self) -> None:
        """Forget queued replies and recorded requests; restore the default."""
        with self._cond:
            self._queue.clear()
            self._routes.clear()
            self._records.clear()
            self._default = self._initial_default
            self.models_fault = None
            self.models_delay_s = 0.0
            self.interrupt_requests = self.strict_roles = False

    @property
    def requests(self) -> list[RecordedRequest]:
        """Every POST received, in order (a snapshot list of live records)."""
        with self._cond:
            return list(self._records)

    @property
    def post_count(self) -> int:
        with self._cond:
            return len(self._records)

    def wait_requests(self, count: int, timeout: float = 5.0) -> None:
        """Block until at least ``count`` POSTs arrived, else ``TimeoutError``."""
        with self._cond:
            if not self._cond.wait_for(lambda: len(self._records) >= count, timeout):
                raise TimeoutError(f"{len(self._records)} of {count} POSTs arrived")

    def wait_held(self, index: int, timeout: float = 30.0) -> None:
        """Block until request ``index`` waits at its reply's hold."""
        self._wait(index, lambda r: r.held_at is not None, timeout, "hold")

    def wait_stalled(self, index: int, timeout: float = 5.0) -> None:
        """Block until request ``index`` has entered its stall."""
        self._wait(index, lambda r: r.stall_at is not None, timeout, "stall")

    def wait_closed(self, index: int, timeout: float = 5.0) -> float:
        """Block until the connection of request ``index`` ended.

        Returns the seconds from its stall start (or else its last byte sent)
        to the close; raises ``TimeoutError`` if that does not happen in time.
        """
        rec = self._wait(index, lambda r: r.closed_at is not None, timeout, "close")
        start = rec.stall_at or rec.last_byte_at or rec.received_at
        assert rec.closed_at is not None
        return rec.closed_at - start

    def _wait(
        self,
        index: int,
        pred: Callable[[RecordedRequest], bool],
        timeout: float,
        what: str,
    ) -> RecordedRequest:
        def ready() -> bool:
            return len(self._records) > index and pred(self._records[index])

        with self._cond:
            if not self._cond.wait_for(ready, timeout):
                raise TimeoutError(f"request {index}: no {what} within {timeout} s")
            return self._records[index]

    def _update(self, rec: RecordedRequest, **changes: Any) -> None:
        with self._cond:
            for name, value in changes.items():
                setattr(rec, name, value)
            self._cond.notify_all()

    # --- lifecycle -----------------------------------------------------------
    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError("FakeLLM is not serving")
        return self._port

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self) -> FakeLLM:
        """Serve from a background thread; returns once the port is bound."""
        ready = threading.Event()
        failure: list[BaseException] = []

        def run() -> None:
            try:
                asyncio.run(self._serve_in_thread(ready))
            except BaseException as exc:  # reported to start(), not lost in a thread
                failure.append(exc)
                ready.set()

        self._thread = threading.Thread(target=run, name="fake-llm", daemon=True)
        self._thread.start()
        ready.wait()
        if failure:
            raise failure[0]
        return self

    def stop(self) -> None:
        """Close every connection and the server, and join the thread."""
        if self._loop is not None and self._main is not None:
            self._loop.call_soon_threadsafe(self._main.cancel)
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._thread = self._loop = self._main = None

    def __enter__(self) -> FakeLLM:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    async def _serve_in_thread(self, ready: threading.Event) -> None:
        self._loop = asyncio.get_running_loop()
        self._main = asyncio.current_task()
        with contextlib.suppress(asyncio.CancelledError):  # stop() cancels us
            await self.serve_forever("127.0.0.1", 0, on_ready=lambda _u: ready.set())

    async def serve_forever(
        self,
        host: str = "127.0.0.1",
        port: int = 8001,
        *,
        on_ready: Callable[[str], None] | None = None,
    ) -> None:
        """Serve in the running loop until cancelled; ``on_ready(base_url)``."""
        server = await asyncio.start_server(self._handle_connection, host, port)
        self._port = server.sockets[0].getsockname()[1]
        url = f"http://{host}:{self._port}/v1"
        logger.info("fake LLM serving at %s", url)
        if on_ready is not None:
            on_ready(url)
        try:
            async with server:
                await server.serve_forever()
        finally:
            # server.close() leaves open connections alone (a stall would hang).
            for task in list(self._conns):
                task.cancel()
            await asyncio.gather(*self._conns, return_exceptions=True)

    # --- HTTP ----------------------------------------------------------------
    async def _handle_connection(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._conns.add(task)
        conn = Conn(reader, writer)
        closed_by = "server"
        try:
            while True:
                request = await read_request(reader)
                if request is None:
                    closed_by = "client"
                    break
                keep_alive, client_closed = await self._dispatch(request, conn)
                if client_closed:
                    closed_by = "client"
                if not keep_alive:
                    break
        except (ConnectionError, asyncio.IncompleteReadError, ValueError):
            closed_by = "client"
        finally:
            self._conns.discard(task)
            now = time.monotonic()
            for rec in conn.served:
                if rec.closed_at is None:
                    self._update(rec, closed_at=now, closed_by=closed_by)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    def _bearer_ok(self, request: Request) -> bool:
        """Whether the request carries the key (any will do without one)."""
        given = request.headers.get("authorization")
        return not self.api_key or given == f"Bearer {self.api_key}"

    async def _dispatch(self, request: Request, conn: Conn) -> tuple[bool, bool]:
        """Answer one request; returns (keep the connection, client closed it)."""
        method, path, route = request.method, request.path, request.route
        authorised, writer = self._bearer_ok(request), conn.writer
        if self.interrupt_requests:
            for stream in list(self._streaming):
                stream.interrupt()
        if method == "POST" and route == "/v1/chat/completions":
            rec, reply = self._record(request, authorised, conn)
            return await self._chat(rec, reply, authorised, conn.reader, writer)
        if route == "/v1/models" and method == "GET":
            self.models_requests += 1
            if self.models_delay_s:
                await asyncio.sleep(self.models_delay_s)
        if route == "/v1/models" and method == "GET" and self.models_fault:
            await self._send_json(
                writer,
                self.models_fault,
                error_payload("model listing unavailable", self.models_fault),
            )
        elif route == "/v1/models" and method == "GET" and authorised:
            models = [
                {"id": m, "object": "model", "created": 0, "owned_by": "fake"}
                for m in self.models
            ]
            await self._send_json(writer, 200, {"object": "list", "data": models})
            self.models_answered += 1
        elif route == "/v1/models":
            status = 401 if method == "GET" else 405
            problem = error_payload(
                "invalid api key" if status == 401 else "use GET", status
            )
            await self._send_json(writer, status, problem)
        else:
            problem = error_payload(f"no route {method} {path}", "not_found")
            await self._send_json(writer, 404, problem)
        return True, False

    def _record(
        self, request: Request, authorised: bool, conn: Conn
    ) -> tuple[RecordedRequest, Reply | None]:
        """Record a POST and take its scripted reply (none if refused)."""
        raw = request.body
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            body = {"_unparsed": raw.decode("utf-8", "replace")}
        with self._cond:
            rec = self._note(request, conn, body)
            if not authorised or "_unparsed" in body:
                return rec, None
            key = self._route_key(body)
            routed = self._routes.get(key) if key is not None else None
            if routed:
                return rec, routed.popleft()
            return rec, self._queue.popleft() if self._queue else self._default

    def _note(
        self, request: Request, conn: Conn, body: dict[str, Any] | None = None
    ) -> RecordedRequest:
        """Record a request as it arrives (the one place records are made),
        as one its connection served."""
        with self._cond:
            rec = RecordedRequest(
                len(self._records),
                request.path,
                request.headers,
                {} if body is None else body,
                time.monotonic(),
                method=request.method,
                query=request.query,
            )
            self._records.append(rec)
            self._cond.notify_all()
        conn.served.append(rec)
        return rec

    def _route_key(self, body: dict[str, Any]) -> str | None:
        """The text that picks a routed reply: the last user message's."""
        return _last_user_text(body.get("messages"))

    async def _chat(
        self,
        rec: RecordedRequest,
        reply: Reply | None,
        authorised: bool,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> tuple[bool, bool]:
        if not authorised:
            await self._send_error(writer, rec, 401, "invalid api key", "auth")
        elif reply is None:
            await self._send_error(writer, rec, 400, "body is not JSON", "bad")
        elif reply.status != 200:
            await self._send_scripted_error(writer, rec, reply)
        elif self.strict_roles and not _alternating(rec.messages):
            message = (
                "Conversation roles must alternate user/assistant/user/assistant/..."
            )
            await self._send_error(writer, rec, 400, message, "invalid_request_error")
        elif not rec.body.get("stream"):
            await self._send_json(writer, 200, completion(reply, rec.body), rec)
        else:
            client_closed = await _StreamWriter(self, rec, reply, reader, writer).run()
            return False, client_closed
        return True, False

    async def _send_scripted_error(
        self, writer: asyncio.StreamWriter, rec: RecordedRequest, reply: Reply
    ) -> None:
        body = reply.error_body or error_payload(
            f"fake error {reply.status}", reply.status
        )
        extra = {}
        if reply.retry_after is not None:
            extra["Retry-After"] = f"{reply.retry_after:g}"
        await self._send_json(writer, reply.status, body, rec, extra)

    async def _send_error(
        self,
        writer: asyncio.StreamWriter,
        rec: RecordedRequest,
        status: int,
        message: str,
        code: str | None = None,
    ) -> None:
        body = self._error_body(status, message, code)
        await self._send_json(writer, status, body, rec)

    def _error_body(self, status: int, message: str, code: str | None) -> dict:
        """An error in this API's shape (``code`` defaults to the status)."""
        return error_payload(message, status if code is None else code)

    async def _send_json(
        self,
        writer: asyncio.StreamWriter,
        status: int,
        payload: dict[str, Any],
        rec: RecordedRequest | None = None,
        extra: dict[str, str] | None = None,
    ) -> None:
        data = json.dumps(payload).encode()
        headers = {"Content-Type": "application/json", "Content-Length": str(len(data))}
        if rec is not None:
            # Recorded before the bytes leave, so a client that has read the
            # response always finds the record complete.
            self._update(rec, status=status, last_byte_at=time.monotonic())
        writer.write(response_head(status, {**headers, **(extra or {})}) + data)
        await writer.drain()


def _alternating(messages: list[dict[str, Any]]) -> bool:
    """No two user or two assistant messages in a row (tool results between
    an assistant's calls and its next words are fine)."""
    roles = [m.get("role") for m in messages if isinstance(m, dict)]
    return not any(
        a == b and a in ("user", "assistant") for a, b in itertools.pairwise(roles)
    )


def _last_user_text(messages: Any) -> str | None:
    """The last user message's text (a string, or the text of content blocks)."""
    if not isinstance(messages, list):
        return None
    for message in reversed(messages):
        if isinstance(message, dict) and message.get("role") == "user":
            content = message.get("content")
            if isinstance(content, list):
                texts = [
                    b.get("text") or ""
                    for b in content
                    if isinstance(b, dict) and b.get("type") in ("text", "input_text")
                ]
                return "".join(texts) if texts else None
            return content if isinstance(content, str) else None
    return None


class _StreamWriter(PeerStream):
    """Streams one scripted reply as SSE, injecting its fault, watching for EOF."""

    def __init__(
        self,
        fake: FakeLLM,
        rec: RecordedRequest,
        reply: Reply,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> None:
        super().__init__(fake, rec, reader, writer)
        self.reply = reply
        self.interrupted = False

    async def run(self) -> bool:
        """Send the reply; returns whether the client closed the connection."""
        frames, length = self.plan()
        headers = dict(SSE_HEADERS)
        if not self.fake.interrupt_requests:
            headers["Content-Length"] = str(length)
        head = response_head(200, headers)
        self.fake._streaming.add(self)
        try:
            return await self.stream(head, lambda: self._send(frames))
        finally:
            self.fake._streaming.discard(self)

    def interrupt(self) -> None:
        """Another request came: end the answer with ``[DONE]`` (no finish)."""
        self.interrupted = True

    def plan(self) -> tuple[list[bytes], int]:
        """The frames to send and the Content-Length to declare."""
        return plan_stream(self.reply, self.rec.body)

    def paced(self, frame: bytes) -> bool:
        """Whether ``frame`` waits its turn at ``tokens_per_s`` (a chunk frame)."""
        return frame.startswith(b"data: {")

    async def _send(self, frames: list[bytes]) -> None:
        due = schedule(
            map(self.paced, frames), self.reply.tokens_per_s, time.monotonic()
        )
        chunks, held_s = 0, 0.0
        for frame, at in zip(frames, due, strict=True):
            await self.until_due(at + held_s)
            if self.peer_closed.is_set():
                return
            if self.interrupted:
                self.rec.last_byte_at = time.monotonic()
                self.writer.write(DONE_FRAME)
                await self.writer.drain()
                return
            # Set before the write, so a client that read the frame finds it.
            self.rec.last_byte_at = time.monotonic()  # a float store is atomic
            self.sending(frame)
            self.writer.write(frame)
            await self.writer.drain()
            chunks += self.paced(frame)
            if chunks == self.reply.hold_after_chunks:
                held_s += await self._held()
        if self.reply.stall_after_chars is not None:
            await self.stall()

    async def _held(self) -> float:
        """Wait for the reply's ``hold`` to be set (or the client to close);
        the seconds it took, by which the rest of the pacing moves on."""
        hold, began = self.reply.hold, time.monotonic()
        assert hold is not None, "hold_after_chunks needs a hold event"
        self.fake._update(self.rec, held_at=began)
        while not (hold.is_set() or self.peer_closed.is_set() or self.interrupted):
            await asyncio.sleep(0.01)  # a threading.Event, set by the test
        return time.monotonic() - began

    def sending(self, frame: bytes) -> None:
        """Called just before each frame is written (benchmarks time frames here)."""
