"""The OpenAI Responses API in background mode (``POST /v1/responses``).

Every answer is requested with ``stream: true, background: true, store: true``:
the response runs upstream whether or not Hermes is reading, and every stream
event carries a ``sequence_number``. So a cut costs nothing: the turn engine
re-attaches with ``GET /v1/responses/{id}?stream=true&starting_after=<n>``
(:meth:`ResponsesProvider.reattach`) and reads on from the event after the
last one it handled, the model's own answer, not a regenerated one. The
provider yields :class:`~chat.providers.base.Upstream` after each event so the
caller always knows that position (docs/architecture.md, "Two cursors").

Rule 1 (retries before headers) and the reading of events, transport faults
translated, are ``chat.providers.http``'s, for the POST and the re-attach GET
alike; a
re-attach to a response the server no longer keeps answers 404
(``invalid_request``), and the turn engine falls back to its regenerate rule.
After headers: a body cut or a stream that ends before ``response.completed``
→ ``network``; no byte for the idle timeout → ``timeout``; a frame that is not
JSON → ``provider``; ``response.failed`` or an ``error`` event → ``provider``
with ``final=True`` (re-attaching to a failed response cannot help).
:meth:`cancel` stops a background response upstream (the user's Stop).

Events used: ``response.created`` / ``queued`` / ``in_progress`` (the id),
``response.output_text.delta``, ``response.reasoning_summary_text.delta`` and
``response.reasoning_text.delta`` (reasoning), ``response.output_item.added``
(a ``function_call``: call id and name) and
``response.function_call_arguments.delta``, ``response.completed`` /
``response.incomplete`` (usage, finish). Others are skipped.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncGenerator, Iterator
from typing import Any
from urllib.parse import quote

import aiohttp

from chat.providers.base import (
    NETWORK,
    PROVIDER,
    ContentDelta,
    Finish,
    ProviderError,
    ReasoningDelta,
    RequestStats,
    StreamItem,
    ToolCallDelta,
    Upstream,
    Usage,
)
from chat.providers.http import load_event
from chat.providers.openai import OpenAIProvider

logger = logging.getLogger(__name__)

CANCEL_TIMEOUT_S = 5.0  # a Stop must not wait long on an upstream cancel
_ID_EVENTS = ("response.created", "response.queued", "response.in_progress")
_REASONING = ("response.reasoning_summary_text.delta", "response.reasoning_text.delta")


class ResponsesProvider(OpenAIProvider):
    """A pooled client for one Responses endpoint (``base_url`` ends in ``/v1``).

    ``reasoning_summary`` (``auto``, ``concise``, ``detailed``) asks reasoning
    models for summaries of their reasoning; unset, the request says nothing
    about reasoning (other models refuse the parameter).
    """

    path = "/responses"
    max_tokens_field = "max_output_tokens"

    def __init__(
        self,
        name: str,
        base_url: str,
        api_key: str | None,
        *,
        reasoning_summary: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(name, base_url, api_key, **kwargs)
        self.reasoning_summary = reasoning_summary

    def __repr__(self) -> str:  # never shows the key
        return f"ResponsesProvider({self.name!r}, {self.base_url!r})"

    def _body(
        self,
        model: str,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
    ) -> dict[str, Any]:
        instructions, items = to_input(messages)
        body: dict[str, Any] = {
            "model": model,
            "input": items,
            "stream": True,
            "background": True,  # the answer outlives a cut: re-attach to it
            "store": True,  # background mode requires it
        }
        if instructions:
            body["instructions"] = instructions
        if tools:
            body["tools"] = [to_tool(t) for t in tools]
        if self.reasoning_summary:
            body["reasoning"] = {"summary": self.reasoning_summary}
        if self.max_tokens:
            body["max_output_tokens"] = self.max_tokens
        return body

    async def reattach(
        self, upstream: Upstream, *, stats: RequestStats | None = None
    ) -> AsyncGenerator[StreamItem, None]:
        """The events of ``upstream.response_id`` after ``upstream.sequence``."""
        stats = stats if stats is not None else RequestStats()
        url = (
            f"{self.base_url}{self.path}/{quote(upstream.response_id, safe='')}"
            f"?stream=true&starting_after={upstream.sequence}"
        )
        self.active_requests += 1
        try:
            response = await self._open(None, stats, url=url)
            try:
                items = self._parse(response, upstream.response_id)
                async with contextlib.aclosing(items) as stream:
                    async for item in stream:
                        yield item
            finally:
                self._done_with(response)
        finally:
            self.active_requests -= 1

    async def cancel(self, response_id: str) -> bool:
        """Cancel a background response upstream; whether the server agreed."""
        url = f"{self.base_url}{self.path}/{quote(response_id, safe='')}/cancel"
        timeout = aiohttp.ClientTimeout(total=CANCEL_TIMEOUT_S)
        try:
            async with self._client().post(
                url, headers=self._headers(), timeout=timeout
            ) as response:
                status = response.status
        except (aiohttp.ClientError, TimeoutError) as exc:
            logger.warning("%s: cancelling a response failed (%s)", self.name, exc)
            return False
        if status != 200:
            logger.warning(
                "%s: cancelling a response answered HTTP %d", self.name, status
            )
        return status == 200

    def _items(
        self, response: aiohttp.ClientResponse
    ) -> AsyncGenerator[StreamItem, None]:
        return self._parse(response, None)

    async def _parse(
        self, response: aiohttp.ClientResponse, response_id: str | None
    ) -> AsyncGenerator[StreamItem, None]:
        """Parse Responses events into stream items (transport faults: sse_events)."""
        state = _State(response_id)
        async with contextlib.aclosing(self.sse_events(response)) as events:
            async for event, data in events:
                if not data:
                    continue
                for item in state.parse(event, data):
                    yield item
        if not state.done:
            raise ProviderError(
                NETWORK,
                "stream ended before response.completed",
                retryable=True,
                during_stream=True,
                reason="stream ended early",
            )


class _State:
    """One stream's parse state: the response id, calls seen, whether it ended."""

    def __init__(self, response_id: str | None) -> None:
        self.response_id = response_id
        self.calls: set[int] = set()
        self.done = False

    def parse(self, name: str, data: str) -> Iterator[StreamItem]:
        event = load_event(data, name)
        kind = event.get("type", name)
        if kind in _ID_EVENTS and not self.response_id:
            self.response_id = str((event.get("response") or {}).get("id") or "")
        if kind == "response.output_text.delta" and event.get("delta"):
            yield ContentDelta(str(event["delta"]))
        elif kind in _REASONING and event.get("delta"):
            yield ReasoningDelta(str(event["delta"]))
        elif kind == "response.output_item.added":
            yield from self._item(_index(event), event.get("item") or {})
        elif kind == "response.function_call_arguments.delta" and event.get("delta"):
            yield ToolCallDelta(index=_index(event), arguments=str(event["delta"]))
        elif kind in ("response.completed", "response.incomplete"):
            yield from self._finish(kind, event.get("response") or {})
        elif kind in ("response.failed", "response.cancelled", "error"):
            raise _failed(kind, event)
        sequence = event.get("sequence_number")
        if self.response_id and isinstance(sequence, int):
            yield Upstream(self.response_id, sequence)

    def _item(self, index: int, item: dict[str, Any]) -> Iterator[StreamItem]:
        if item.get("type") != "function_call":
            return
        self.calls.add(index)
        yield ToolCallDelta(
            index=index,
            id=str(item.get("call_id") or "") or None,
            name=str(item.get("name") or "") or None,
            arguments=str(item.get("arguments") or ""),
        )

    def _finish(self, kind: str, response: dict[str, Any]) -> Iterator[StreamItem]:
        self.done = True
        usage = response.get("usage")
        if isinstance(usage, dict) and usage:
            yield Usage(usage)
        if kind == "response.incomplete":
            yield Finish("length")
        else:
            yield Finish("tool_calls" if self.calls else "stop")


def _failed(kind: str, event: dict[str, Any]) -> ProviderError:
    error = event if kind == "error" else (event.get("response") or {}).get("error")
    message = (error or {}).get("message") if isinstance(error, dict) else None
    return ProviderError(
        PROVIDER,
        f"model error mid-stream: {kind}: {message or 'no details'}",
        retryable=True,
        during_stream=True,
        reason="response failed",
        final=True,
    )


def _index(event: dict[str, Any]) -> int:
    index = event.get("output_index", 0)
    return index if isinstance(index, int) and not isinstance(index, bool) else 0


def to_tool(tool: dict[str, Any]) -> dict[str, Any]:
    """An OpenAI chat-completions function tool in the Responses shape."""
    function = tool.get("function") or tool
    out: dict[str, Any] = {"type": "function", "name": function.get("name", "")}
    if function.get("description"):
        out["description"] = function["description"]
    out["parameters"] = function.get("parameters") or {"type": "object"}
    return out


def to_input(history: list[dict[str, Any]]) -> tuple[str, list[dict[str, Any]]]:
    """The conversation as (``instructions``, ``input`` items).

    The API takes several assistant messages in a row, so kept fragments are
    sent as they are, each once; tool calls and their results become
    ``function_call`` and ``function_call_output`` items.
    """
    instructions: list[str] = []
    items: list[dict[str, Any]] = []
    for message in history:
        role, content = message.get("role"), message.get("content")
        text = content if isinstance(content, str) else ""
        if role == "system":
            if text:
                instructions.append(text)
        elif role == "tool":
            items.append(
                {
                    "type": "function_call_output",
                    "call_id": str(message.get("tool_call_id") or ""),
                    "output": text,
                }
            )
        elif role == "assistant":
            if text:
                items.append({"role": "assistant", "content": text})
            for call in message.get("tool_calls") or ():
                function = call.get("function") or {}
                items.append(
                    {
                        "type": "function_call",
                        "call_id": str(call.get("id") or ""),
                        "name": str(function.get("name") or ""),
                        "arguments": str(function.get("arguments") or ""),
                    }
                )
        elif isinstance(content, list):  # OpenAI content parts: text and images
            parts = [p for p in map(_input_part, content) if p is not None]
            if parts:
                items.append({"role": "user", "content": parts})
        elif text:
            items.append({"role": "user", "content": text})
    return "\n\n".join(instructions), items


def _input_part(part: Any) -> dict[str, Any] | None:
    """An OpenAI chat content part as a Responses input part."""
    if not isinstance(part, dict):
        return None
    if part.get("type") == "text":
        text = part.get("text")
        if isinstance(text, str) and text:
            return {"type": "input_text", "text": text}
        return None
    if part.get("type") == "image_url":
        url = str((part.get("image_url") or {}).get("url") or "")
        return {"type": "input_image", "image_url": url} if url else None
    return None
