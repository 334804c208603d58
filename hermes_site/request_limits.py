"""Bounds on what a request may make the server hold before any view runs
(docs/security.md, "Request bodies and headers").

A request body is bounded per route (`body_limit`): uploads
(`/api/attachments/`) by `HERMES_ATTACHMENT_MAX_BYTES` and a multipart
envelope, imports (`/api/sessions/import/`) by `HERMES_IMPORT_MAX_BYTES`,
everything else by `HERMES_MAX_REQUEST_BYTES`. Past it the answer is 413
naming the bound, before the body is read when its length is declared, as
soon as the bound is passed when it is not (chunked); a body that stops
arriving for `HERMES_REQUEST_BODY_TIMEOUT_S` is answered 408. Nothing here
needs a login: the bound is what an anonymous client may send.

Two places enforce it, because the servers differ in when an application
sees a body:

- `RequestLimits`, an ASGI middleware around the whole site, for servers
  that hand the body over as it arrives (uvicorn, the tests' server).
- `guard_daphne`, for daphne, which reads a request's whole body (Twisted's
  `Request`) before it calls the application at all, and then queues all of
  it at once: there the checks run in daphne's request object, as the
  headers and each piece of the body arrive.

A request line or header line longer than Twisted's 16 KiB line bound was
dropped by daphne without a word (`LineReceiver.lineLengthExceeded` closes
the connection); it is answered 431 here. Headers over 16 KiB in all get
Twisted's own 400.
"""

from __future__ import annotations

import asyncio
import io
import json
from typing import Any
from urllib.parse import unquote

from django.conf import settings

MULTIPART_ENVELOPE = 64 * 1024  # an upload's bytes besides the file's own
IMPORT_PATH = "/api/sessions/import/"
UPLOAD_PATH = "/api/attachments/"


def body_limit(path: str) -> tuple[int, str]:
    """The most bytes a request body to `path` may have, and the setting
    that says so."""
    hermes = settings.HERMES
    if path == UPLOAD_PATH:
        return hermes["ATTACHMENT_MAX_BYTES"] + MULTIPART_ENVELOPE, (
            "HERMES_ATTACHMENT_MAX_BYTES"
        )
    if path == IMPORT_PATH:
        return hermes["IMPORT_MAX_BYTES"], "HERMES_IMPORT_MAX_BYTES"
    return hermes["MAX_REQUEST_BYTES"], "HERMES_MAX_REQUEST_BYTES"


def body_timeout_s() -> float:
    return float(settings.HERMES["REQUEST_BODY_TIMEOUT_S"])


def too_large_body(path: str) -> bytes:
    limit, setting = body_limit(path)
    return _json(
        {
            "error": f"the request body is larger than {limit} bytes, "
            f"the most {path} takes",
            "limit": setting,
            "max_bytes": limit,
        }
    )


def too_slow_body() -> bytes:
    timeout = body_timeout_s()
    return _json(
        {
            "error": f"the request body stopped arriving (nothing for {timeout:g} s)",
            "limit": "HERMES_REQUEST_BODY_TIMEOUT_S",
        }
    )


def _json(body: dict) -> bytes:
    return json.dumps(body).encode()


def _declared_length(headers) -> int | None:
    """The declared Content-Length, None when there is none; -1 when it
    is not a number (the server refuses that itself)."""
    for name, value in headers:
        if name.lower() == b"content-length":
            text = value.strip()
            return int(text) if text.isdigit() else -1
    return None


def _chunked(headers) -> bool:
    return any(
        name.lower() == b"transfer-encoding" and b"chunked" in value.lower()
        for name, value in headers
    )


# --- ASGI -------------------------------------------------------------------


class RequestLimits:
    """The body bounds as an ASGI middleware (see the module's docstring)."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope["path"]
        limit, _ = body_limit(path)
        headers = scope.get("headers", ())
        declared = _declared_length(headers)
        if declared is None and not _chunked(headers):
            # No body (HTTP/1.1: neither a length nor chunks): the request
            # goes on untouched; a stream's `receive` stays the server's.
            return await self.app(scope, receive, send)
        if declared is not None and declared > limit:
            return await _answer(send, 413, too_large_body(path))
        body = _BoundedBody(receive, limit)
        started = False

        async def tracked_send(message):
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        await self.app(scope, body.receive, tracked_send)
        if body.refusal is not None and not started:
            status = 413 if body.refusal == "large" else 408
            payload = too_large_body(path) if status == 413 else too_slow_body()
            await _answer(send, status, payload)


class _BoundedBody:
    """`receive` for the application: body messages counted as they come,
    each waited for at most the body timeout. Past the bound, or past the
    timeout, the application is told the client left (Django then drops
    the request without an answer) and the middleware answers instead."""

    def __init__(self, receive, limit: int):
        self._receive = receive
        self._limit = limit
        self._received = 0
        self._done = False
        self.refusal: str | None = None

    async def receive(self) -> dict[str, Any]:
        if self.refusal is not None:
            return {"type": "http.disconnect"}
        if self._done:  # the body is in: what follows is the disconnect
            return await self._receive()
        try:
            message = await asyncio.wait_for(self._receive(), body_timeout_s())
        except TimeoutError:
            self.refusal = "slow"
            return {"type": "http.disconnect"}
        if message["type"] != "http.request":
            return message
        self._received += len(message.get("body", b""))
        if self._received > self._limit:
            self.refusal = "large"
            return {"type": "http.disconnect"}
        if not message.get("more_body", False):
            self._done = True
        return message


async def _answer(send, status: int, payload: bytes) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(payload)).encode()),
                (b"connection", b"close"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": payload})


# --- daphne -----------------------------------------------------------------

REASONS = {
    408: b"Request Timeout",
    413: b"Content Too Large",
    431: b"Request Header Fields Too Large",
}


def _raw_answer(status: int, payload: bytes) -> bytes:
    return (
        b"HTTP/1.1 %d %s\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\nConnection: close\r\n\r\n"
        % (status, REASONS[status], len(payload))
    ) + payload


def guard_daphne() -> bool:
    """Install the bounds in daphne's request and Twisted's HTTP channel
    (once; False when daphne is not installed)."""
    try:
        from daphne.http_protocol import WebRequest
        from twisted.web.http import HTTPChannel
    except ImportError:
        return False
    if getattr(WebRequest, "_hermes_guarded", False):
        return True

    def refuse(request, status: int, payload: bytes) -> None:
        request._hermes_refused = True
        _stop_timer(request)
        request.requestHeaders.removeHeader(b"expect")  # no 100 Continue now
        if request.content is None:
            request.content = io.BytesIO()
        channel = request.channel
        if channel is not None and channel.transport is not None:
            channel.transport.write(_raw_answer(status, payload))
            channel.loseConnection()

    def request_path(request) -> str:
        raw = request.channel._path if request.channel is not None else b"/"
        return unquote(raw.split(b"?", 1)[0].decode("latin-1"))

    def timed_out(request) -> None:
        request._hermes_timer = None
        if not getattr(request, "_hermes_refused", False):
            refuse(request, 408, too_slow_body())

    def got_length(self, length):
        path = request_path(self)
        limit, _ = body_limit(path)
        self._hermes_path, self._hermes_limit, self._hermes_received = path, limit, 0
        if length is not None and length > limit:
            return refuse(self, 413, too_large_body(path))
        original_got_length(self, length)
        if length != 0:  # a body is coming: it must keep coming
            # daphne's reactor, installed before this runs (importing it
            # earlier would install Twisted's default one instead).
            from twisted.internet import reactor

            self._hermes_timer = reactor.callLater(body_timeout_s(), timed_out, self)

    def handle_content_chunk(self, data):
        if getattr(self, "_hermes_refused", False):
            return
        self._hermes_received += len(data)
        if self._hermes_received > self._hermes_limit:
            return refuse(self, 413, too_large_body(self._hermes_path))
        timer = getattr(self, "_hermes_timer", None)
        if timer is not None:
            timer.reset(body_timeout_s())
        original_handle_content_chunk(self, data)

    def request_received(self, command, path, version):
        _stop_timer(self)
        return original_request_received(self, command, path, version)

    def connection_lost(self, reason):
        _stop_timer(self)
        return original_connection_lost(self, reason)

    def line_length_exceeded(self, line):
        # Twisted's LineReceiver closes the connection without an answer.
        self.transport.write(
            _raw_answer(
                431,
                _json(
                    {
                        "error": "a request line or header is longer than "
                        f"{self.MAX_LENGTH} bytes",
                        "limit": "header line",
                    }
                ),
            )
        )
        self.loseConnection()

    original_got_length = WebRequest.gotLength
    original_handle_content_chunk = WebRequest.handleContentChunk
    original_request_received = WebRequest.requestReceived
    original_connection_lost = WebRequest.connectionLost
    WebRequest.gotLength = got_length
    WebRequest.handleContentChunk = handle_content_chunk
    WebRequest.requestReceived = request_received
    WebRequest.connectionLost = connection_lost
    HTTPChannel.lineLengthExceeded = line_length_exceeded  # type: ignore[method-assign]
    WebRequest._hermes_guarded = True
    return True


def _stop_timer(request) -> None:
    timer = getattr(request, "_hermes_timer", None)
    request._hermes_timer = None
    if timer is not None and timer.active():
        timer.cancel()
