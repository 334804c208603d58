"""What every HTTP model provider shares: the pooled client, rule 1, reading SSE.

docs/architecture.md §6 rule 1 (retries before response headers) lives here,
in :meth:`HTTPProvider._open`; a provider module adds its request body and how
its chunks become stream items. The client is aiohttp: its HTTP parser is C and
its connections feed a buffer as bytes arrive, so one read costs a few
microseconds where the httpx stack (httpcore, h11, anyio) cost tens; with
hundreds of runs streaming one-token chunks, that read was most of a worker's
CPU (docs/benchmarks.md).

After headers, :meth:`HTTPProvider.sse_events` raises every fault as a
:class:`ProviderError` with ``during_stream=True``, ``retryable=True``, and
never retries it:

- no byte for ``idle_timeout`` (:class:`IdleWatch`) → ``timeout`` (reason
  ``idle timeout``)
- body cut (fewer bytes than ``Content-Length``, a chunked body that ends
  early) → ``network``, reason ``body cut``; undecodable compressed bytes →
  ``network``, reason ``decode error``; any other transport fault → ``network``,
  reason ``connection lost``; the message is the client library's own.

Closing the response (the provider's ``finally``) closes its socket at once
unless the body was read to its end, when the connection goes back to the pool.
"""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import json
import logging
import os
import random
import time
from collections.abc import AsyncGenerator
from typing import Any

import aiohttp
from aiohttp.http_exceptions import ContentEncodingError

from chat.providers.base import (
    AUTH,
    INVALID_REQUEST,
    NETWORK,
    PROVIDER,
    RATE_LIMIT,
    TIMEOUT,
    ProviderError,
    RequestStats,
    StreamItem,
)

logger = logging.getLogger(__name__)

ERROR_BODY_LIMIT = 64 * 1024  # enough for any JSON error; bounds a hostile body
JITTER = 0.2  # ±20 %: spreads retries of many runs hit by the same outage
KEEPALIVE_S = 30.0  # idle pooled connections are closed after this


class HTTPProvider:
    """A pooled client for one HTTP endpoint, with rule 1 and an SSE reader.

    The ``aiohttp.ClientSession`` is built on first use (never at import) and
    is rebuilt if used from another event loop, whose sockets it cannot share.
    ``backoff_base`` is the first retry delay (1 s in production; tests make
    it small); a ``Retry-After`` header replaces the computed delay, and both
    are capped at ``backoff_cap``. ``max_http_retries`` and ``retry_budget_s``
    (all the waits of one request's retries together) are per provider: behind
    a proxy that retries itself, fewer retries keep a refusal quick. A wait
    the budget cannot cover fails the request at once, saying how long the
    server asked to wait. An API is ``path``, ``_headers``, ``_body``
    and ``_items`` (which reads :meth:`sse_events`): ``chat/providers/openai.py``,
    ``chat/providers/anthropic.py``, ``chat/providers/responses.py``.
    """

    path = "/chat/completions"  # POSTed under ``base_url``
    max_tokens_field = "max_tokens"  # the request's output limit

    def __init__(
        self,
        name: str,
        base_url: str,
        api_key: str | None,
        *,
        connect_timeout: float = 10.0,
        idle_timeout: float = 300.0,
        max_http_retries: int = 3,
        backoff_base: float = 1.0,
        backoff_cap: float = 60.0,
        retry_budget_s: float = 60.0,
        max_connections: int = 512,
        model_max_tokens: dict[str, int] | None = None,
    ) -> None:
        self.name = name
        self.base_url = base_url.rstrip("/")
        self.api_key = api_key
        self.connect_timeout = connect_timeout
        self.idle_timeout = idle_timeout
        self.max_http_retries = max_http_retries
        self.backoff_base = backoff_base
        self.backoff_cap = backoff_cap
        self.retry_budget_s = retry_budget_s
        # Output limits of some models, over the provider's own.
        self.model_max_tokens = dict(model_max_tokens or {})
        self.max_connections = max_connections
        self.active_requests = 0
        self.requests_started = 0
        self.http_retries = 0
        self._http: aiohttp.ClientSession | None = None
        self._http_loop: asyncio.AbstractEventLoop | None = None

    def __repr__(self) -> str:  # never shows the key
        return f"{type(self).__name__}({self.name!r}, {self.base_url!r})"

    def _client(self) -> aiohttp.ClientSession:
        loop = asyncio.get_running_loop()
        if self._http is None or self._http_loop is not loop or self._http.closed:
            if self._http is not None and not self._http.closed:
                # Made on another (ended) loop: it cannot be closed from here;
                # forget it without the unclosed-session warning at collection.
                self._http.detach()
            # A read timeout is the idle timeout: it bounds the gap between
            # bytes, not the whole stream (rule 5 caps that separately).
            # `connect` includes waiting for a free connection of the pool.
            timeout = aiohttp.ClientTimeout(
                total=None, connect=self.connect_timeout, sock_read=self.idle_timeout
            )
            connector = aiohttp.TCPConnector(
                limit=self.max_connections,
                limit_per_host=0,
                keepalive_timeout=KEEPALIVE_S,
            )
            # trust_env: proxies from HTTP(S)_PROXY / NO_PROXY, as before.
            self._http = aiohttp.ClientSession(
                connector=connector, timeout=timeout, trust_env=True
            )
            self._http_loop = loop
        return self._http

    def _headers(self) -> dict[str, str]:
        """Request headers; a provider adds its own credentials scheme."""
        headers = {"Accept": "text/event-stream", "Cache-Control": "no-store"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        return headers

    def discard(self) -> None:
        """Forget the pooled connections from any thread: closed on the loop
        that made them if it still runs, else let go without a warning."""
        client, loop, self._http = self._http, self._http_loop, None
        if client is None or client.closed:
            return
        if loop is not None and loop.is_running():
            asyncio.run_coroutine_threadsafe(client.close(), loop)
        else:
            client.detach()

    async def aclose(self) -> None:
        """Close pooled connections (only possible from the loop that made them)."""
        client, self._http = self._http, None
        if client is not None and self._http_loop is asyncio.get_running_loop():
            await client.close()

    async def _get_json(self, path: str) -> Any:
        """``GET`` a JSON document (one attempt; errors as ProviderError)."""
        client = self._client()
        try:
            async with client.get(
                f"{self.base_url}{path}", headers=self._headers()
            ) as response:
                data = await response.read()
                status = response.status
        except TimeoutError as exc:
            raise ProviderError(TIMEOUT, describe(exc), retryable=True) from exc
        except aiohttp.ClientError as exc:
            raise ProviderError(NETWORK, describe(exc), retryable=True) from exc
        if status != 200:
            raise status_error(status, detail(data))
        try:
            return json.loads(data)
        except (ValueError, RecursionError) as exc:
            raise ProviderError(PROVIDER, f"bad response: {exc}") from exc

    async def stream(
        self,
        model: str,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        *,
        stats: RequestStats | None = None,
        max_tokens: int | None = None,
    ) -> AsyncGenerator[StreamItem, None]:
        """Stream one answer; see the module docstring for the error contract.
        ``max_tokens`` bounds this answer (a title's) below the provider's own."""
        stats = stats if stats is not None else RequestStats()
        body = self._body(model, messages, tools)
        if model in self.model_max_tokens:
            body[self.max_tokens_field] = self.model_max_tokens[model]
        if max_tokens:
            limit = body.get(self.max_tokens_field)
            body[self.max_tokens_field] = min(max_tokens, limit or max_tokens)
        self.active_requests += 1
        try:
            response = await self._open(body, stats)
            try:
                async with contextlib.aclosing(self._items(response)) as items:
                    async for item in items:
                        yield item
            finally:
                self._done_with(response)
        finally:
            self.active_requests -= 1

    def _body(
        self,
        model: str,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
    ) -> dict[str, Any]:
        """The JSON body of one streamed request."""
        raise NotImplementedError

    @staticmethod
    def _done_with(response: aiohttp.ClientResponse) -> None:
        """Close a stream's response: back to the pool if read to its end."""
        if response.content.at_eof():
            response.release()
        else:
            response.close()  # the server sees the socket close now

    def _items(
        self, response: aiohttp.ClientResponse
    ) -> AsyncGenerator[StreamItem, None]:
        """The stream items of one response (read through :meth:`sse_events`)."""
        raise NotImplementedError

    async def _open(
        self,
        body: dict[str, Any] | None,
        stats: RequestStats,
        *,
        url: str | None = None,
    ) -> aiohttp.ClientResponse:
        """POST until response headers say 200 (docs/architecture.md §6 rule 1).

        Returns an event-stream response; the caller must close it. With
        ``body=None``, a GET of ``url`` instead (re-attaching to a stream the
        provider keeps, ``chat/providers/responses.py``): the same retries, but
        not a new model request.
        """
        client = self._client()
        url = url or f"{self.base_url}{self.path}"
        attempt, waited = 0, 0.0
        while True:
            if body is not None:
                self.requests_started += 1
                stats.requests_started += 1
            retry_after = None
            try:
                if body is None:
                    response = await client.get(url, headers=self._headers())
                else:
                    response = await client.post(
                        url, json=body, headers=self._headers()
                    )
            except TimeoutError as exc:
                error = ProviderError(TIMEOUT, describe(exc), retryable=True)
            except aiohttp.ClientConnectorError as exc:
                # aiohttp names the host, port and TLS context: the log keeps
                # them, a person reads what to do.
                logger.warning("%s: cannot connect: %s", self.name, describe(exc))
                error = ProviderError(NETWORK, unreachable(exc), retryable=True)
            except aiohttp.ClientError as exc:
                error = ProviderError(NETWORK, describe(exc), retryable=True)
            else:
                if response.status == 200:
                    return await _check_event_stream(response)
                retry_after = parse_retry_after(response.headers.get("Retry-After"))
                error = status_error(
                    response.status, await read_error(response), posted=body is not None
                )
            if not error.retryable or attempt >= self.max_http_retries:
                raise error
            delay = self._backoff(attempt) if retry_after is None else retry_after
            delay = min(delay, self.backoff_cap)
            if waited + delay > self.retry_budget_s:
                raise _over_budget(error, retry_after, self.retry_budget_s)
            waited += delay
            attempt += 1
            self.http_retries += 1
            stats.http_retries += 1
            logger.info(
                "%s: %s (%s); retry %d/%d in %.2f s",
                self.name,
                error.category,
                error.message,
                attempt,
                self.max_http_retries,
                delay,
            )
            await asyncio.sleep(delay)

    def _backoff(self, attempt: int) -> float:
        delay = self.backoff_base * 2**attempt
        return min(self.backoff_cap, delay * random.uniform(1 - JITTER, 1 + JITTER))

    async def sse_events(
        self, response: aiohttp.ClientResponse
    ) -> AsyncGenerator[tuple[str, str], None]:
        """``(event, data)`` of each server-sent event, transport faults translated.

        ``event`` is ``""`` when the event names none; an event without a
        ``data`` line is skipped, as EventSource does.
        """
        decoder = SSEDecoder()
        watch = IdleWatch(response, self.idle_timeout)
        try:
            async for chunk in response.content.iter_any():
                for event in decoder.feed(chunk):
                    yield event
        except TimeoutError as exc:
            raise ProviderError(
                TIMEOUT,
                f"no data for {self.idle_timeout:g} s ({describe(exc)})",
                retryable=True,
                during_stream=True,
                reason="idle timeout",
            ) from exc
        except aiohttp.ClientError as exc:
            reason = "connection lost"
            if isinstance(exc, aiohttp.ClientPayloadError):
                causes = (exc.__cause__, exc.__context__)
                encoding = any(isinstance(c, ContentEncodingError) for c in causes)
                reason = "decode error" if encoding else "body cut"
            elif isinstance(exc, aiohttp.ServerDisconnectedError):
                reason = "body cut"
            raise ProviderError(
                NETWORK,
                describe(exc),
                retryable=True,
                during_stream=True,
                reason=reason,
            ) from exc
        finally:
            watch.cancel()


class IdleWatch:
    """The idle timeout of one streamed body: no byte for ``timeout`` seconds
    fails the body's next read with aiohttp's own read-timeout error.

    aiohttp's ``sock_read`` timeout re-arms a loop timer on every read (a
    cancelled timer and a new one per chunk: about a tenth of a busy worker's
    CPU with hundreds of one-token streams, docs/benchmarks.md). This watch
    takes over once the headers are in: a timer a quarter of the timeout
    apart compares the body's byte count with its last look, so a stall is
    caught between ``timeout`` and 1.25 × ``timeout`` after the last byte,
    and a read costs nothing.
    """

    __slots__ = (
        "_content",
        "_timeout",
        "_period",
        "_loop",
        "_handle",
        "_seen",
        "_since",
    )

    def __init__(self, response: aiohttp.ClientResponse, timeout: float) -> None:
        connection = response.connection
        if connection is not None and connection.protocol is not None:
            # aiohttp's timer, armed already, is dropped at the next read.
            connection.protocol.read_timeout = None
        self._content = response.content
        self._timeout = timeout
        self._period = timeout / 4
        self._loop = asyncio.get_running_loop()
        self._seen = self._content.total_bytes
        self._since = self._loop.time()
        self._handle: asyncio.TimerHandle | None = self._loop.call_later(
            self._period, self._check
        )

    def _check(self) -> None:
        now = self._loop.time()
        if self._content.total_bytes != self._seen:
            self._seen, self._since = self._content.total_bytes, now
        # A loop may run a timer up to its clock's resolution early: a hair of
        # slack, so an early check does not wait a whole period more.
        elif now - self._since >= self._timeout - self._period / 100:
            self._handle = None
            self._content.set_exception(
                aiohttp.SocketTimeoutError("Timeout on reading data from socket")
            )
            return
        self._handle = self._loop.call_later(self._period, self._check)

    def cancel(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None


class SSEDecoder:
    """An incremental ``text/event-stream`` decoder (the WHATWG rules).

    ``feed(bytes)`` returns the events completed by those bytes. Lines end in
    LF, CRLF or CR; ``data`` lines join with LF; comments and unknown fields
    are ignored; text is UTF-8 with undecodable bytes replaced.
    """

    __slots__ = ("_rest", "_event", "_data")

    def __init__(self) -> None:
        self._rest = b""
        self._event = ""
        self._data: list[str] = []

    def feed(self, chunk: bytes) -> list[tuple[str, str]]:
        buffer = self._rest + chunk if self._rest else chunk
        if b"\r" in buffer:
            # A CR at the very end may be the first half of a CRLF: wait for more.
            held = buffer.endswith(b"\r")
            if held:
                buffer = buffer[:-1]
            buffer = buffer.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
            if held:
                buffer += b"\r"
        lines = buffer.split(b"\n")
        self._rest = lines.pop()
        events = []
        for raw in lines:
            if not raw:  # a blank line dispatches the event
                if self._data:
                    events.append((self._event, "\n".join(self._data)))
                self._event, self._data = "", []
                continue
            line = raw.decode("utf-8", "replace")
            name, colon, value = line.partition(":")
            if not name:
                continue  # a comment
            if colon and value.startswith(" "):
                value = value[1:]
            if name == "data":
                self._data.append(value)
            elif name == "event":
                self._event = value
        return events


def _over_budget(
    error: ProviderError, retry_after: float | None, budget: float
) -> ProviderError:
    """``error``, saying that waiting for another try was over the budget."""
    wait = f"asked to wait {retry_after:g} s" if retry_after is not None else "busy"
    return ProviderError(
        error.category,
        f"{error.message} (the server {wait}, past the {budget:g} s retry budget)",
        retryable=True,
        status_code=error.status_code,
    )


async def _check_event_stream(
    response: aiohttp.ClientResponse,
) -> aiohttp.ClientResponse:
    content_type = response.headers.get("Content-Type", "")
    if "text/event-stream" in content_type:
        return response
    message = await read_error(response)
    raise ProviderError(
        PROVIDER, f"expected an event stream, got {content_type!r}: {message}"
    )


async def read_error(response: aiohttp.ClientResponse) -> str:
    """The error text of a non-200 response (bounded), closing the response."""
    data = b""
    try:
        while len(data) < ERROR_BODY_LIMIT:
            piece = await response.content.read(ERROR_BODY_LIMIT - len(data))
            if not piece:
                break
            data += piece
    except (aiohttp.ClientError, TimeoutError):
        pass  # the status code alone still classifies the failure
    finally:
        response.close()
    return detail(data)


def detail(data: bytes) -> str:
    try:
        message = error_message(json.loads(data))
    except (ValueError, RecursionError):  # hostile nesting too
        message = None
    return message or data[:500].decode("utf-8", "replace").strip()


def first_line(message: str | None, limit: int = 200) -> str:
    """An upstream error's first line, bounded: a proxy may send a whole
    traceback, with its file paths, as the message; the log has the rest."""
    if message and ("\n" in message.strip() or len(message) > limit):
        logger.info("upstream error in full: %s", message[:ERROR_BODY_LIMIT])
    line = (message or "").strip().splitlines()[0] if (message or "").strip() else ""
    if len(line) > limit:
        line = line[: limit - 1] + "…"
    return line or "unknown"


def error_message(payload: Any) -> str | None:
    if not isinstance(payload, dict):
        return None
    error = payload.get("error", payload.get("detail"))
    if isinstance(error, dict):
        return str(error.get("message") or error)
    return str(error) if error else None


def unreachable(exc: aiohttp.ClientConnectorError) -> str:
    """A connection failure in a person's words: no host, port or TLS context."""
    errno = exc.os_error.errno
    why = os.strerror(errno) if errno else type(exc.os_error).__name__
    return (
        f"could not connect to the model's server ({why.lower()}): "
        "is it running, and is its address in the settings right?"
    )


def status_error(
    status: int, message_detail: str, *, posted: bool = False
) -> ProviderError:
    message_detail = first_line(message_detail) if message_detail else ""
    message = f"HTTP {status}: {message_detail}" if message_detail else f"HTTP {status}"
    if status == 404 and posted:
        # The commonest cause: a base URL without the `/v1` the API lives under.
        message += " (is the model's base URL right? It usually ends in /v1)"
    if status in (401, 403):
        return ProviderError(AUTH, message, status_code=status)
    if status == 429:
        return ProviderError(RATE_LIMIT, message, retryable=True, status_code=status)
    if status == 408:
        return ProviderError(TIMEOUT, message, retryable=True, status_code=status)
    if status >= 500:
        return ProviderError(PROVIDER, message, retryable=True, status_code=status)
    return ProviderError(INVALID_REQUEST, message, status_code=status)


def parse_retry_after(value: str | None) -> float | None:
    """Seconds from a ``Retry-After`` header (delta-seconds or an HTTP date)."""
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def describe(exc: BaseException) -> str:
    """The client library's message; some errors carry an empty one."""
    return str(exc) or type(exc).__name__


def load_event(data: str, name: str) -> dict[str, Any]:
    """A named SSE event's JSON object; anything else is a malformed event."""
    try:
        event = json.loads(data)
    except (ValueError, RecursionError):
        event = None
    if not isinstance(event, dict):
        raise ProviderError(
            PROVIDER,
            f"malformed {name or 'event'} from the model: {data[:120]!r}",
            retryable=True,
            during_stream=True,
            reason="malformed event",
        )
    return event
