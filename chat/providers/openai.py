"""Any OpenAI-compatible ``/v1/chat/completions`` endpoint, streamed over httpx.

This module owns DESIGN §6 rule 1 (retries before response headers); rules
2-5 (what to do when a stream dies, cancel, caps) live in ``chat/turn.py``.
After headers, every fault is raised as a :class:`ProviderError` with
``during_stream=True`` and is never retried here:

- no byte for ``idle_timeout`` (httpx read timeout) → ``timeout``
- body cut, connection reset, undecodable bytes, a body that ends before
  ``finish_reason``/``[DONE]`` → ``network``, message from the client library
- a chunk that is not JSON, or an ``error`` object mid-stream → ``provider``

all ``retryable=True``. Closing the generator (or cancelling the task that is
iterating it) closes the HTTP response at once, so the server sees the socket
close; ``active_requests`` returns to 0 on every path.
"""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import json
import logging
import random
import time
from collections.abc import AsyncGenerator, Iterator
from typing import Any

import httpx
from httpx_sse import EventSource

from chat.providers.base import (
    AUTH,
    INVALID_REQUEST,
    NETWORK,
    PROVIDER,
    RATE_LIMIT,
    TIMEOUT,
    ContentDelta,
    Finish,
    ProviderError,
    ReasoningDelta,
    RequestStats,
    StreamItem,
    ToolCallDelta,
    Usage,
)

logger = logging.getLogger(__name__)

ERROR_BODY_LIMIT = 64 * 1024  # enough for any JSON error; bounds a hostile body
JITTER = 0.2  # ±20 %: spreads retries of many runs hit by the same outage


class OpenAIProvider:
    """A pooled client for one OpenAI-compatible endpoint.

    The ``httpx.AsyncClient`` is built on first use (never at import) and is
    rebuilt if used from another event loop, whose sockets it cannot share.
    ``backoff_base`` is the first retry delay (1 s in production; tests make
    it small); a ``Retry-After`` header replaces the computed delay, and both
    are capped at ``backoff_cap``.
    """

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
        max_connections: int = 512,
    ) -> None:
        self.name = name
        self.base_url = base_url.rstrip("/")
        self.api_key = api_key
        self.connect_timeout = connect_timeout
        self.idle_timeout = idle_timeout
        self.max_http_retries = max_http_retries
        self.backoff_base = backoff_base
        self.backoff_cap = backoff_cap
        self.max_connections = max_connections
        self.active_requests = 0
        self.requests_started = 0
        self.http_retries = 0
        self._http: httpx.AsyncClient | None = None
        self._http_loop: asyncio.AbstractEventLoop | None = None

    def __repr__(self) -> str:  # never shows the key
        return f"OpenAIProvider({self.name!r}, {self.base_url!r})"

    def _client(self) -> httpx.AsyncClient:
        loop = asyncio.get_running_loop()
        if self._http is None or self._http_loop is not loop:
            # A read timeout is the idle timeout: it bounds the gap between
            # bytes, not the whole stream (rule 5 caps that separately).
            timeout = httpx.Timeout(
                connect=self.connect_timeout,
                read=self.idle_timeout,
                write=self.idle_timeout,
                pool=self.connect_timeout,
            )
            limits = httpx.Limits(
                max_connections=self.max_connections, max_keepalive_connections=64
            )
            self._http = httpx.AsyncClient(timeout=timeout, limits=limits)
            self._http_loop = loop
        return self._http

    def _headers(self) -> dict[str, str]:
        headers = {"Accept": "text/event-stream", "Cache-Control": "no-store"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        return headers

    async def aclose(self) -> None:
        """Close pooled connections (only possible from the loop that made them)."""
        client, self._http = self._http, None
        if client is not None and self._http_loop is asyncio.get_running_loop():
            await client.aclose()

    async def list_models(self) -> list[str]:
        """Model ids from ``GET /models`` (one attempt; errors as ProviderError)."""
        client = self._client()
        try:
            response = await client.get(
                f"{self.base_url}/models", headers=self._headers()
            )
        except httpx.TimeoutException as exc:
            raise ProviderError(TIMEOUT, _describe(exc), retryable=True) from exc
        except httpx.TransportError as exc:
            raise ProviderError(NETWORK, _describe(exc), retryable=True) from exc
        if response.status_code != 200:
            raise _status_error(response.status_code, _detail(response.content))
        try:
            return [str(m["id"]) for m in response.json()["data"]]
        except (ValueError, KeyError, TypeError) as exc:
            raise ProviderError(PROVIDER, f"bad model list: {exc}") from exc

    async def stream(
        self,
        model: str,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        *,
        stats: RequestStats | None = None,
    ) -> AsyncGenerator[StreamItem, None]:
        """Stream one completion; see the module docstring for the error contract."""
        stats = stats if stats is not None else RequestStats()
        body: dict[str, Any] = {
            "model": model,
            "messages": messages,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if tools:
            body["tools"] = tools
        self.active_requests += 1
        try:
            response = await self._open(body, stats)
            try:
                async with contextlib.aclosing(self._items(response)) as items:
                    async for item in items:
                        yield item
            finally:
                await response.aclose()
        finally:
            self.active_requests -= 1

    async def _open(self, body: dict[str, Any], stats: RequestStats) -> httpx.Response:
        """POST until response headers say 200 (DESIGN §6 rule 1)."""
        client = self._client()
        url = f"{self.base_url}/chat/completions"
        attempt = 0
        while True:
            self.requests_started += 1
            stats.requests_started += 1
            retry_after = None
            try:
                request = client.build_request(
                    "POST", url, json=body, headers=self._headers()
                )
                response = await client.send(request, stream=True)
            except httpx.TimeoutException as exc:
                error = ProviderError(TIMEOUT, _describe(exc), retryable=True)
            except httpx.TransportError as exc:
                error = ProviderError(NETWORK, _describe(exc), retryable=True)
            else:
                if response.status_code == 200:
                    return await _check_event_stream(response)
                retry_after = _parse_retry_after(response.headers.get("retry-after"))
                error = _status_error(response.status_code, await _read_error(response))
            if not error.retryable or attempt >= self.max_http_retries:
                raise error
            delay = self._backoff(attempt) if retry_after is None else retry_after
            delay = min(delay, self.backoff_cap)
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

    async def _items(
        self, response: httpx.Response
    ) -> AsyncGenerator[StreamItem, None]:
        """Parse SSE frames into stream items, translating transport faults."""
        done = finished = False
        try:
            async with contextlib.aclosing(EventSource(response).aiter_sse()) as events:
                async for sse in events:
                    if sse.data.strip() == "[DONE]":
                        # Like the official SDK, read on to the end of the body so
                        # the connection can go back to the pool; later frames
                        # are ignored.
                        done = True
                        continue
                    if done or not sse.data:
                        continue
                    for item in _parse_chunk(sse.data):
                        finished = finished or isinstance(item, Finish)
                        yield item
        except httpx.TimeoutException as exc:
            raise ProviderError(
                TIMEOUT,
                f"no data for {self.idle_timeout:g} s ({_describe(exc)})",
                retryable=True,
                during_stream=True,
                reason="idle timeout",
            ) from exc
        except httpx.RequestError as exc:  # transport faults and DecodingError
            reason = "body cut" if isinstance(exc, httpx.RemoteProtocolError) else None
            if isinstance(exc, httpx.DecodingError):
                reason = "decode error"
            raise ProviderError(
                NETWORK,
                _describe(exc),
                retryable=True,
                during_stream=True,
                reason=reason or "connection lost",
            ) from exc
        if not (done or finished):
            raise ProviderError(
                NETWORK,
                "stream ended before a finish_reason or [DONE]",
                retryable=True,
                during_stream=True,
                reason="stream ended early",
            )


def _parse_chunk(data: str) -> Iterator[StreamItem]:
    """Items of one ``chat.completion.chunk``; malformed → ProviderError."""
    try:
        chunk = json.loads(data)
    except ValueError:
        chunk = None
    if not isinstance(chunk, dict):
        raise ProviderError(
            PROVIDER,
            f"malformed chunk from the model: {data[:120]!r}",
            retryable=True,
            during_stream=True,
            reason="malformed chunk",
        )
    if chunk.get("error"):
        raise ProviderError(
            PROVIDER,
            f"model error mid-stream: {_error_message(chunk) or 'unknown'}",
            retryable=True,
            during_stream=True,
            reason="provider error",
        )
    for choice in chunk.get("choices") or ():
        if not isinstance(choice, dict) or choice.get("index", 0) != 0:
            continue  # we ask for one choice (n=1)
        delta = choice.get("delta") or {}
        reasoning = delta.get("reasoning_content") or delta.get("reasoning")
        if isinstance(reasoning, str) and reasoning:
            yield ReasoningDelta(reasoning)
        content = delta.get("content")
        if isinstance(content, str) and content:
            yield ContentDelta(content)
        for call in delta.get("tool_calls") or ():
            function = call.get("function") or {}
            yield ToolCallDelta(
                index=int(call.get("index", 0)),
                id=call.get("id") or None,
                name=function.get("name") or None,
                arguments=function.get("arguments") or "",
            )
        if choice.get("finish_reason"):
            yield Finish(str(choice["finish_reason"]))
    usage = chunk.get("usage")
    if isinstance(usage, dict) and usage:
        yield Usage(usage)


async def _check_event_stream(response: httpx.Response) -> httpx.Response:
    content_type = response.headers.get("content-type", "")
    if "text/event-stream" in content_type:
        return response
    detail = await _read_error(response)
    raise ProviderError(
        PROVIDER, f"expected an event stream, got {content_type!r}: {detail}"
    )


async def _read_error(response: httpx.Response) -> str:
    """The error text of a non-200 response (bounded), closing the response."""
    data = b""
    try:
        async for piece in response.aiter_bytes():
            data += piece
            if len(data) >= ERROR_BODY_LIMIT:
                break
    except httpx.RequestError:
        pass  # the status code alone still classifies the failure
    finally:
        await response.aclose()
    return _detail(data)


def _detail(data: bytes) -> str:
    try:
        message = _error_message(json.loads(data))
    except ValueError:
        message = None
    return message or data[:500].decode("utf-8", "replace").strip()


def _error_message(payload: Any) -> str | None:
    if not isinstance(payload, dict):
        return None
    error = payload.get("error", payload.get("detail"))
    if isinstance(error, dict):
        return str(error.get("message") or error)
    return str(error) if error else None


def _status_error(status: int, detail: str) -> ProviderError:
    message = f"HTTP {status}: {detail}" if detail else f"HTTP {status}"
    if status in (401, 403):
        return ProviderError(AUTH, message, status_code=status)
    if status == 429:
        return ProviderError(RATE_LIMIT, message, retryable=True, status_code=status)
    if status == 408:
        return ProviderError(TIMEOUT, message, retryable=True, status_code=status)
    if status >= 500:
        return ProviderError(PROVIDER, message, retryable=True, status_code=status)
    return ProviderError(INVALID_REQUEST, message, status_code=status)


def _parse_retry_after(value: str | None) -> float | None:
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


def _describe(exc: BaseException) -> str:
    """The client library's message; some httpx errors carry an empty one."""
    return str(exc) or type(exc).__name__
