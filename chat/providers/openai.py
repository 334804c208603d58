"""Any OpenAI-compatible ``/v1/chat/completions`` endpoint, streamed.

Rule 1 (retries before response headers) and the reading of server-sent
events, with every transport fault after headers translated, are
``chat.providers.http``'s (docs/architecture.md §6; rules 2-5 live in
``chat/turn.py``). Here, after headers:

- a chunk that is not JSON, or an ``error`` object mid-stream → ``provider``
- a stream that ends without a ``finish_reason``, whatever ends it (``[DONE]``,
  the end of the body, a clean close) → ``network``: llama.cpp's Python
  server, for one, ends an answer it interrupts with ``[DONE]`` and no finish
  reason, so only a finish reason says an answer is whole

both ``retryable=True`` and ``during_stream=True``. Closing the generator (or
cancelling the task that is iterating it) closes the HTTP response at once, so
the server sees the socket close; ``active_requests`` returns to 0 on every
path.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncGenerator, Iterator
from typing import Any

import orjson

from chat.providers.base import (
    NETWORK,
    PROVIDER,
    ContentDelta,
    Finish,
    ProviderError,
    ReasoningDelta,
    StreamItem,
    ToolCallDelta,
    Usage,
)
from chat.providers.http import HTTPProvider, error_message, first_line


class OpenAIProvider(HTTPProvider):
    """A pooled client for one OpenAI-compatible endpoint (see HTTPProvider).

    ``max_tokens`` caps each answer (None: the server's own limit, which for a
    local server may be its whole context). ``continuation`` says how a
    request that ends in a partial assistant message (a resume) asks for its
    continuation: ``prefill`` sends it as it is, which servers that continue a
    final assistant message continue; ``continue_final_message`` adds vLLM's
    and SGLang's flags for it.
    """

    path = "/chat/completions"

    def __init__(
        self,
        name: str,
        base_url: str,
        api_key: str | None,
        *,
        max_tokens: int | None = None,
        continuation: str = "prefill",
        **kwargs: Any,
    ) -> None:
        super().__init__(name, base_url, api_key, **kwargs)
        self.max_tokens = max_tokens
        self.continuation = continuation

    async def list_models(self) -> list[str]:
        """Model ids from ``GET /models`` (one attempt; errors as ProviderError)."""
        payload = await self._get_json("/models")
        try:
            return [str(m["id"]) for m in payload["data"]]
        except (KeyError, TypeError) as exc:
            raise ProviderError(PROVIDER, f"bad model list: {exc}") from exc

    def _body(
        self,
        model: str,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
    ) -> dict[str, Any]:
        """The JSON body of one streamed request."""
        body: dict[str, Any] = {
            "model": model,
            "messages": messages,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if tools:
            body["tools"] = tools
        if self.max_tokens:
            body["max_tokens"] = self.max_tokens
        if self.continuation == "continue_final_message" and _ends_in_partial(messages):
            body["continue_final_message"] = True
            body["add_generation_prompt"] = False
        return body

    async def _items(self, response: Any) -> AsyncGenerator[StreamItem, None]:
        """Parse chunks into stream items."""
        done = finished = False
        async with contextlib.aclosing(self.sse_events(response)) as events:
            async for _event, data in events:
                if done or not data:
                    continue
                if data.strip() == "[DONE]":
                    # Like the official SDK, read on to the end of the body so
                    # the connection can go back to the pool; later frames
                    # are ignored.
                    done = True
                    continue
                for item in _parse_chunk(data):
                    if type(item) is Finish:
                        finished = True
                    yield item
        if not finished:
            raise ProviderError(
                NETWORK,
                "stream ended without a finish_reason"
                + (" ([DONE] came first)" if done else ""),
                retryable=True,
                during_stream=True,
                reason="ended without a finish reason"
                if done
                else "stream ended early",
            )


def _ends_in_partial(messages: list[dict[str, Any]]) -> bool:
    """Whether the request ends in an assistant's text (a resume's partial)."""
    last = messages[-1] if messages else {}
    return last.get("role") == "assistant" and not last.get("tool_calls")


def _loads(data: str) -> Any:
    """JSON text → value: orjson, or the standard library for what orjson
    refuses and JSON allows (a lone surrogate escape such as ``\\ud800``)."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return json.loads(data)


def _parse_chunk(data: str) -> Iterator[StreamItem]:
    """Items of one ``chat.completion.chunk``; malformed → ProviderError."""
    try:
        chunk = _loads(data)
    except (ValueError, RecursionError):  # hostile nesting too
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
            f"model error mid-stream: {first_line(error_message(chunk))}",
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
