"""The Anthropic Messages API (``POST /v1/messages``, streamed).

The fault rules are the OpenAI-compatible provider's (docs/architecture.md §6):
this class reuses its client, its retries before headers (429, 5xx including
529 ``overloaded_error``, transport errors; ``retry-after`` replaces the
delay) and its error classes; after headers every fault is a
``ProviderError(during_stream=True)`` for ``chat/turn.py``:

- a body cut, reset or undecodable, or one that ends before ``message_stop``
  → ``network``; no byte for the idle timeout → ``timeout``;
- a frame that is not JSON, or an ``error`` event (``overloaded_error`` mid-
  stream) → ``provider``, retryable.

Events: ``message_start`` (usage: input tokens), ``content_block_start/delta/
stop`` for ``text``, ``thinking`` (shown as reasoning; signatures are not kept)
and ``tool_use`` (its ``input_json_delta`` pieces are the call's arguments),
``message_delta`` (stop reason, cumulative usage), ``message_stop``; ``ping``
and event types this module does not know are skipped, as the API asks.

History (``to_messages``): the system prompt goes to the top-level ``system``;
tool results become ``tool_result`` blocks of a user message; consecutive
messages of one role merge into one, because the API wants strict
alternation. Consecutive assistant fragments (kept when a stream was resumed)
join into one text, which the model continues (a prefill); a final assistant
text loses its trailing whitespace, which the API refuses.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncGenerator, Iterator
from typing import Any

import aiohttp

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
from chat.providers.http import load_event
from chat.providers.openai import OpenAIProvider

API_VERSION = "2023-06-01"  # the Messages API version this module speaks
DEFAULT_MAX_TOKENS = 8192  # the API requires a cap; this one fits every model
#: The API's stop reasons in the turn engine's words.
FINISH = {"end_turn": "stop", "tool_use": "tool_calls", "max_tokens": "length"}


class AnthropicProvider(OpenAIProvider):
    """A pooled client for one Anthropic Messages endpoint (``base_url`` ends
    in ``/v1``). ``max_tokens`` caps each answer (the API requires one);
    ``thinking_budget`` turns extended thinking on with that many tokens."""

    path = "/messages"

    def __init__(
        self,
        name: str,
        base_url: str,
        api_key: str | None,
        *,
        max_tokens: int = DEFAULT_MAX_TOKENS,
        thinking_budget: int | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(name, base_url, api_key, **kwargs)
        self.max_tokens = max_tokens
        self.thinking_budget = thinking_budget

    def __repr__(self) -> str:  # never shows the key
        return f"AnthropicProvider({self.name!r}, {self.base_url!r})"

    def _headers(self) -> dict[str, str]:
        headers = {"Accept": "text/event-stream", "anthropic-version": API_VERSION}
        if self.api_key:
            headers["x-api-key"] = self.api_key
        return headers

    def _body(
        self,
        model: str,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
    ) -> dict[str, Any]:
        system, turns = to_messages(messages)
        body: dict[str, Any] = {
            "model": model,
            "max_tokens": self.max_tokens,
            "messages": turns,
            "stream": True,
        }
        if system:
            body["system"] = system
        if tools:
            body["tools"] = [to_tool(t) for t in tools]
        if self.thinking_budget:
            body["thinking"] = {
                "type": "enabled",
                "budget_tokens": self.thinking_budget,
            }
        return body

    async def _items(
        self, response: aiohttp.ClientResponse
    ) -> AsyncGenerator[StreamItem, None]:
        """Parse Messages events into stream items (transport faults: sse_events)."""
        state = _State()
        async with contextlib.aclosing(self.sse_events(response)) as events:
            async for event, data in events:
                if not data:
                    continue
                for item in state.parse(event, data):
                    yield item
        if not state.stopped:
            raise ProviderError(
                NETWORK,
                "stream ended before message_stop",
                retryable=True,
                during_stream=True,
                reason="stream ended early",
            )


class _State:
    """What one stream said so far: open blocks by index, and whether it stopped."""

    def __init__(self) -> None:
        self.blocks: dict[int, str] = {}  # index → block type
        self.args_seen: set[int] = set()
        self.stopped = False

    def parse(self, name: str, data: str) -> Iterator[StreamItem]:
        event = load_event(data, name)
        kind = event.get("type", name)
        if kind == "error":
            error = event.get("error") or {}
            label = error.get("type") or "error"
            raise ProviderError(
                PROVIDER,
                f"model error mid-stream: {label}: {error.get('message') or ''}",
                retryable=True,
                during_stream=True,
                reason="overloaded"
                if label == "overloaded_error"
                else "provider error",
            )
        if kind == "message_start":
            usage = (event.get("message") or {}).get("usage")
            if isinstance(usage, dict) and usage:
                yield Usage(usage)
        elif kind == "content_block_start":
            yield from self._start(_index(event), event.get("content_block") or {})
        elif kind == "content_block_delta":
            yield from self._delta(_index(event), event.get("delta") or {})
        elif kind == "content_block_stop":
            index = _index(event)
            if self.blocks.get(index) == "tool_use" and index not in self.args_seen:
                yield ToolCallDelta(index=index, arguments="{}")  # a call without input
        elif kind == "message_delta":
            reason = (event.get("delta") or {}).get("stop_reason")
            if reason:
                yield Finish(FINISH.get(reason, str(reason)))
            usage = event.get("usage")
            if isinstance(usage, dict) and usage:
                yield Usage(usage)
        elif kind == "message_stop":
            self.stopped = True

    def _start(self, index: int, block: dict[str, Any]) -> Iterator[StreamItem]:
        kind = block.get("type")
        self.blocks[index] = str(kind)
        if kind == "tool_use":
            yield ToolCallDelta(
                index=index, id=block.get("id") or None, name=block.get("name") or None
            )
        elif kind == "text" and block.get("text"):
            yield ContentDelta(str(block["text"]))
        elif kind == "thinking" and block.get("thinking"):
            yield ReasoningDelta(str(block["thinking"]))

    def _delta(self, index: int, delta: dict[str, Any]) -> Iterator[StreamItem]:
        kind = delta.get("type")
        if kind == "text_delta" and delta.get("text"):
            yield ContentDelta(str(delta["text"]))
        elif kind == "thinking_delta" and delta.get("thinking"):
            yield ReasoningDelta(str(delta["thinking"]))
        elif kind == "input_json_delta" and delta.get("partial_json"):
            self.args_seen.add(index)
            yield ToolCallDelta(index=index, arguments=str(delta["partial_json"]))


def _index(event: dict[str, Any]) -> int:
    index = event.get("index", 0)
    return index if isinstance(index, int) and not isinstance(index, bool) else 0


def to_tool(tool: dict[str, Any]) -> dict[str, Any]:
    """An OpenAI-style function tool as an Anthropic tool."""
    function = tool.get("function") or tool
    out = {
        "name": function.get("name", ""),
        "input_schema": function.get("parameters") or {"type": "object"},
    }
    if function.get("description"):
        out["description"] = function["description"]
    return out


def to_messages(
    history: list[dict[str, Any]],
) -> tuple[str, list[dict[str, Any]]]:
    """The conversation as (``system``, strictly alternating ``messages``)."""
    system: list[str] = []
    turns: list[dict[str, Any]] = []
    for message in history:
        role = message.get("role")
        if role == "system":
            if message.get("content"):
                system.append(str(message["content"]))
            continue
        role, blocks = _blocks(message)
        if not blocks:
            continue  # the API refuses empty content
        if turns and turns[-1]["role"] == role:
            _extend(turns[-1]["content"], blocks, join_text=role == "assistant")
        else:
            turns.append({"role": role, "content": blocks})
    if turns and turns[-1]["role"] == "assistant":
        _strip_final(turns)
    return "\n\n".join(system), turns


def _blocks(message: dict[str, Any]) -> tuple[str, list[dict[str, Any]]]:
    role, content = message.get("role"), message.get("content")
    text = content if isinstance(content, str) else ""
    if role == "tool":
        result = {
            "type": "tool_result",
            "tool_use_id": str(message.get("tool_call_id") or ""),
            "content": text,
        }
        return "user", [result]
    blocks: list[dict[str, Any]] = [{"type": "text", "text": text}] if text else []
    if role != "assistant":
        if isinstance(content, list):  # OpenAI content parts: text and images
            blocks = [b for b in map(_part_block, content) if b is not None]
        return "user", blocks
    for call in message.get("tool_calls") or ():
        function = call.get("function") or {}
        blocks.append(
            {
                "type": "tool_use",
                "id": str(call.get("id") or ""),
                "name": str(function.get("name") or ""),
                "input": _arguments(function.get("arguments")),
            }
        )
    return "assistant", blocks


def _part_block(part: Any) -> dict[str, Any] | None:
    """An OpenAI content part (`text`, `image_url`) as an Anthropic block: an
    image's `data:` URL becomes a base64 source, any other URL a url source."""
    if not isinstance(part, dict):
        return None
    if part.get("type") == "text":
        text = part.get("text")
        return (
            {"type": "text", "text": text} if isinstance(text, str) and text else None
        )
    if part.get("type") != "image_url":
        return None
    url = str((part.get("image_url") or {}).get("url") or "")
    head, comma, data = url.partition(",")
    if url.startswith("data:") and comma and head.endswith(";base64"):
        media_type = head[len("data:") : -len(";base64")]
        source = {"type": "base64", "media_type": media_type, "data": data}
    else:
        source = {"type": "url", "url": url}
    return {"type": "image", "source": source}


def _arguments(text: Any) -> dict[str, Any]:
    """A call's JSON arguments as the object the API wants ({} if not one)."""
    try:
        value = json.loads(text) if isinstance(text, str) and text else {}
    except (ValueError, RecursionError):
        value = {}
    return value if isinstance(value, dict) else {}


def _extend(
    blocks: list[dict[str, Any]], more: list[dict[str, Any]], *, join_text: bool
) -> None:
    """Merge a message into the previous one of the same role.

    Assistant fragments are one answer cut in pieces, so adjacent texts join
    with nothing between them; tool results stay first in a user message.
    """
    for block in more:
        last = blocks[-1] if blocks else None
        if (
            join_text
            and last is not None
            and last["type"] == "text"
            and block["type"] == "text"
        ):
            last["text"] += block["text"]
        elif block["type"] == "tool_result":
            at = sum(1 for b in blocks if b["type"] == "tool_result")
            blocks.insert(at, block)
        else:
            blocks.append(block)


def _strip_final(turns: list[dict[str, Any]]) -> None:
    """The API refuses a final assistant text ending in whitespace."""
    blocks = turns[-1]["content"]
    if blocks[-1]["type"] == "text":
        blocks[-1]["text"] = blocks[-1]["text"].rstrip()
        if not blocks[-1]["text"]:
            blocks.pop()
    if not blocks:
        turns.pop()
