"""Backpressure for streams under daphne, and closing readers that fall behind.

uvicorn's `send` waits while its transport's buffer is above a high-water mark,
so a slow client slows the response's generator. daphne's does not: it hands
each body to Twisted, whose transport buffers everything the generator yields,
so a reader taking 1 byte/s made the web process hold the whole run in memory.
Twisted's transport knows how much it holds unsent; here a stream's `send`
looks at that after each body and waits while it is above `SEND_BUFFER_BYTES`
(a generator that waits reads nothing more). A reader that stays above the
mark for `HERMES["SLOW_READER_S"]` is closed: SSE gets a comment saying why,
a WebSocket the close code `CLOSE_TOO_SLOW`; both resume from their cursor.

Reaching Twisted's transport goes through daphne's `send` (a partial of its
server's `handle_reply` bound to the protocol) and, for a WebSocket, through
Channels' session wrapper of it. On any other server `transport_of` answers
None and nothing here applies (such servers apply backpressure themselves).
"""

import asyncio
import functools
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from django.conf import settings

from journal import wire

log = logging.getLogger(__name__)

# Unsent bytes one reader may leave queued in this process; with the one chunk
# being built and a journal page or two, a reader stays under ~1 MiB.
SEND_BUFFER_BYTES = 64 * 1024
# How often a waiting stream looks at its buffer again: soon at first, then
# less often, so a thousand stalled readers cost a few wakeups each a second.
DRAIN_POLL_S = (0.02, 0.5)
CLOSE_TOO_SLOW = 4408  # WebSocket close code (mirrors HTTP 408): fell behind


def _daphne_protocol_of(send: Any) -> Any | None:
    """daphne's protocol object (HTTP or WebSocket) behind its `send`, else None."""
    for _ in range(4):  # unwrap Channels' wrappers (sessions) down to daphne's
        if isinstance(send, functools.partial) and send.args:
            return send.args[0]
        owner = getattr(send, "__self__", None)
        send = getattr(owner, "real_send", None)
        if send is None:
            return None
    return None


def transport_of(send: Any) -> Any | None:
    """The Twisted transport behind daphne's `send`, else None."""
    transport = getattr(_daphne_protocol_of(send), "transport", None)
    if transport is not None and hasattr(transport, "dataBuffer"):
        return transport
    return None


def unsent_bytes(transport: Any) -> int:
    """Bytes a Twisted TCP transport still holds (`abstract.FileDescriptor`)."""
    return (
        len(transport.dataBuffer)
        - transport.offset
        + getattr(transport, "_tempDataLen", 0)
    )


def flush_now(transport: Any | None) -> None:
    """Write what a Twisted transport holds now, not on the loop's next turn.

    A write to a Twisted transport only buffers and registers the socket for
    writability; the reactor writes on a later turn and unregisters it. For
    a stream's frames that meant two epoll changes, a loop turn and Twisted's
    logging context per frame, about half of what a busy web process spent
    per frame (docs/benchmarks.md). This is the reactor's own `doWrite`, done
    at once: what the socket takes now is sent; the rest stays buffered and
    registered, for the reactor as before. A transport closing is left to
    the reactor (its `doWrite` then finishes the close).
    """
    if (
        transport is not None
        and not transport.disconnecting
        and not transport.disconnected
        and unsent_bytes(transport)
    ):
        transport.doWrite()


def write_chunk(request: Any, transport: Any | None, body: bytes) -> bool:
    """Send one chunk of a streaming response's body straight to its socket,
    when daphne has started the response and nothing is waiting to be sent;
    whether it did (if not, the chunk goes through daphne as any other).

    The way through daphne and Twisted (`handle_reply`, `Request.write`, the
    transport's buffer, registering the socket for writability and, once
    `flush_now` has written it, unregistering it: two epoll changes) cost a
    web process serving many readers more per frame than the frame's own
    work (docs/benchmarks.md, finding 18). This is what `Request.write` does
    for a chunked response, the chunk's framing and its count of bytes sent,
    then Twisted's own `writeSomeData`. What the socket does not take now is
    left in the transport's buffer for the reactor, as a write through daphne
    would; a socket that failed is left to the reactor to find and close.
    """
    if (
        transport is None
        or not body
        or getattr(transport, "TLS", True)
        or not transport.connected
        or transport.disconnecting
        or unsent_bytes(transport)
        or not getattr(request, "startedWriting", False)
        or not getattr(request, "chunked", False)
        or request.finished
        or request._disconnected
        or getattr(request, "queued", False)
        or request.channel is None
    ):
        return False
    chunk = b"%x\r\n%b\r\n" % (len(body), body)
    request.sentLength += len(body)
    sent = transport.writeSomeData(chunk)
    if isinstance(sent, Exception):  # lost: the reactor finds out and closes
        sent = 0
    if sent < len(chunk):
        transport.write(chunk[sent:])
    return True


def slow_reader_s() -> float:
    return settings.HERMES.get("SLOW_READER_S", 30.0)


async def wait_drained(transport: Any | None) -> int:
    """Wait while more than `SEND_BUFFER_BYTES` are unsent, up to `SLOW_READER_S`.

    Returns 0 when the reader kept up (or the server has its own backpressure),
    else the bytes still unsent when the reader was given up on.
    """
    if transport is None:
        return 0
    pending = unsent_bytes(transport)
    if pending <= SEND_BUFFER_BYTES:
        return 0
    deadline = time.monotonic() + slow_reader_s()
    poll, poll_max = DRAIN_POLL_S
    while pending > SEND_BUFFER_BYTES // 2:
        if getattr(transport, "disconnected", False):
            return 0  # the server tells the application itself
        if time.monotonic() > deadline:
            return pending
        await asyncio.sleep(poll)
        poll = min(poll_max, poll * 2)
        pending = unsent_bytes(transport)
    return 0


def too_slow_reason(pending: int) -> str:
    return (
        f"reader too slow ({pending // 1024} KiB unsent for {slow_reader_s():g} s); "
        "reconnect to resume from the last event id"
    )


ABORT_AFTER = 4  # × SLOW_READER_S: a reader given up on that still reads nothing


def _close_after_flush(transport: Any) -> None:
    """No keep-alive for a reader given up on: close once it has read the rest.

    One that leaves bytes unsent for `ABORT_AFTER` × `SLOW_READER_S` more is
    cut (the kernel's buffers are not this process's memory; ours is).
    """
    # Twisted closes only once no producer is registered (daphne's HTTP channel is).
    transport.unregisterProducer()
    transport.loseConnection()

    def abort_if_stuck() -> None:
        if not getattr(transport, "disconnected", True) and unsent_bytes(transport):
            transport.abortConnection()

    asyncio.get_running_loop().call_later(ABORT_AFTER * slow_reader_s(), abort_if_stuck)


def let_websocket_close_after_flush(send: Any) -> None:
    """Give a WebSocket's closing handshake as long as a given-up SSE reader gets.

    A close frame (the `end` of a replay's 1000, or `CLOSE_TOO_SLOW`) queues
    behind the frames still unsent here and in the kernel; autobahn, under
    daphne, cuts the connection (a TCP reset, the rest and the close frame
    lost) when the client has not answered it within `closeHandshakeTimeout`,
    one second by default: a client reading at a modest pace never saw the
    close frame, nor the last frames before it. The client now has
    `ABORT_AFTER` × `SLOW_READER_S` to read up to the close frame; one that
    does not is cut then, as a given-up SSE reader is. This process holds at
    most `SEND_BUFFER_BYTES` for it meanwhile.
    """
    protocol = _daphne_protocol_of(send)
    if protocol is not None and hasattr(protocol, "closeHandshakeTimeout"):
        protocol.closeHandshakeTimeout = ABORT_AFTER * slow_reader_s()


class SSEFlow:
    """Wraps one streaming response's `send` and `receive` (see the module text).

    When the reader is given up on, the response ends with an SSE comment, and
    whoever watches for the client leaving (`receive`, `on_disconnect`) is
    told the client left, so the response's body stops.
    """

    def __init__(self, receive, send):
        self._receive, self._send = receive, send
        self._protocol = _daphne_protocol_of(send)
        self.transport = transport_of(send)
        self._given_up = False
        # The task waiting in `receive`, interrupted when the reader is given
        # up on: no task or event of its own (an idle stream's memory counts).
        self._receiver: asyncio.Task | None = None
        self._doorbell: _Doorbell | None = None  # see `on_disconnect`
        self._headers_held = self.transport is not None  # see `_forget_headers`

    async def send(self, message: Mapping[str, Any]) -> None:
        if self._given_up:
            return
        if message["type"] != "http.response.body" or not message.get("more_body"):
            await self._send(message)
            return
        if self._headers_held or not write_chunk(
            self._protocol, self.transport, message["body"]
        ):
            await self._send(message)
            if self._headers_held:
                self._headers_held = _forget_headers(self._protocol)
            flush_now(self.transport)
        pending = await wait_drained(self.transport)
        if pending:
            reason = too_slow_reason(pending)
            log.info("stream closed: %s", reason)
            self._given_up = True
            if self._receiver is not None:
                self._receiver.cancel()
            if self._doorbell is not None:
                self._doorbell.ring()
            body = wire.sse_comment(f"closed: {reason}").encode()
            await self._send({"type": "http.response.body", "body": body})
            _close_after_flush(self.transport)

    async def receive(self) -> dict:
        if self.transport is None:
            return await self._receive()
        if self._given_up:
            return {"type": "http.disconnect"}
        self._receiver = task = asyncio.current_task()
        try:
            return await self._receive()
        except asyncio.CancelledError:
            # Ours alone (given up on): a disconnect; anyone else's goes on.
            if self._given_up and task is not None and task.uncancel() == 0:
                return {"type": "http.disconnect"}
            raise
        finally:
            self._receiver = None

    def on_disconnect(self, left: Callable[[], None]) -> Callable[[], None]:
        """Call `left` once the client leaves or is given up on, from now until
        the returned function is called. The request's body must have been
        read: `receive` is not to be called after this.

        Elsewhere a task waits in `receive` for the disconnect. Under daphne
        no task waits: daphne tells the request's input queue (an
        `asyncio.Queue`) when the client leaves, and that queue is replaced
        here by a `_Doorbell` that calls `left`. The queue, its three deques
        and the waiting task were an idle stream's largest holders of memory
        (docs/benchmarks.md, finding 17); once the caller drops the `receive`
        it was given, nothing holds the queue.
        """
        queue = getattr(self._protocol, "application_queue", None)
        if self.transport is None or not isinstance(queue, asyncio.Queue):
            waiting = asyncio.ensure_future(self._until_disconnect(left))

            def stop() -> None:
                waiting.cancel()

            return stop
        self._doorbell = doorbell = _Doorbell(left)
        self._protocol.application_queue = doorbell
        self._receive = _read_after_doorbell
        gone = self._given_up or self.transport.disconnected
        while not queue.empty():  # what daphne said before the doorbell was in
            if queue.get_nowait()["type"] == "http.disconnect":
                gone = True
        if gone:
            asyncio.get_running_loop().call_soon(doorbell.ring)
        return doorbell.silence

    async def _until_disconnect(self, left: Callable[[], None]) -> None:
        while (await self.receive())["type"] != "http.disconnect":
            pass
        left()


def _forget_headers(request: Any) -> bool:
    """Let go of the headers Twisted and daphne keep once the response's head
    is written; whether they are still held (not written yet).

    Twisted's request keeps every response header (its `Headers`, about
    1 KiB for a stream's) for as long as the response lasts, but reads them
    only to write them, before the body's first bytes (`Request.write`). The
    request's own headers are kept twice, by Twisted and in daphne's list
    for the scope (`clean_headers`), though neither is read once the
    application has its scope and the connection's persistence is decided,
    but by the line Twisted's own access log writes when the response ends
    (its referer and user agent are then "-"; daphne logs requests itself).
    Letting them go also lets go of the credential the client sent.
    """
    if not getattr(request, "startedWriting", False):
        return True
    from twisted.web.http_headers import Headers

    request.responseHeaders = Headers()
    request.requestHeaders = Headers()
    if getattr(request, "clean_headers", None):
        request.clean_headers = []
    return False


class _Doorbell:
    """Stands in for daphne's input queue of a request whose body is read:
    daphne's only message to it then is `http.disconnect` (`put_nowait`)."""

    __slots__ = ("left",)

    def __init__(self, left: Callable[[], None]):
        self.left: Callable[[], None] | None = left

    def put_nowait(self, message: Mapping[str, Any]) -> None:
        if message["type"] == "http.disconnect":
            self.ring()

    def ring(self) -> None:
        left, self.left = self.left, None
        if left is not None:
            left()

    def silence(self) -> None:
        self.left = None


async def _read_after_doorbell() -> dict:
    raise RuntimeError("the client's leaving is told by SSEFlow.on_disconnect")
