"""The built-in ``demo`` model: streams a scripted reply with no network at all.

It lets a newcomer see Hermes work before configuring a real endpoint: some
reasoning, then (if the ``current_time`` tool is offered and not yet used) a
tool call, then, after the tool result, a markdown answer with a heading, a list
and a fenced code block, paced like a real model. It reports no usage: there
are no real tokens to count, and Hermes never fabricates them.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncGenerator
from typing import Any

from chat.providers.base import (
    TITLE_INSTRUCTION,
    ContentDelta,
    Finish,
    ReasoningDelta,
    RequestStats,
    StreamItem,
    ToolCallDelta,
)

DEMO_MODEL = "demo"
TIME_TOOL = "current_time"
_TOKEN = re.compile(r"\s*\S{1,6}|\s+")  # word-ish pieces, like a tokenizer's


class DemoProvider:
    """Same interface as :class:`~chat.providers.openai.OpenAIProvider`.

    ``tokens_per_s`` paces the stream (``None`` or 0: as fast as possible).
    """

    def __init__(self, name: str = "demo", *, tokens_per_s: float | None = 40.0):
        self.name = name
        self.tokens_per_s = tokens_per_s
        self.active_requests = 0
        self.requests_started = 0
        self.http_retries = 0  # there is no HTTP; kept for the common interface

    async def list_models(self) -> list[str]:
        return [DEMO_MODEL]

    async def aclose(self) -> None:
        return None

    def discard(self) -> None:
        return None  # no connections

    async def stream(
        self,
        model: str,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        *,
        stats: RequestStats | None = None,
        max_tokens: int | None = None,
    ) -> AsyncGenerator[StreamItem, None]:
        """Yield the scripted step for this point of the conversation
        (``max_tokens`` is moot: its scripts are short)."""
        self.requests_started += 1
        if stats is not None:
            stats.requests_started += 1
        self.active_requests += 1
        try:
            interval = 1 / self.tokens_per_s if self.tokens_per_s else 0.0
            for item in _script(messages, tools):
                if interval and isinstance(item, ContentDelta | ReasoningDelta):
                    await asyncio.sleep(interval)
                yield item
        finally:
            self.active_requests -= 1


def _script(
    messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None
) -> list[StreamItem]:
    first = messages[0] if messages else {}
    if first.get("role") == "system" and first.get("content") == TITLE_INSTRUCTION:
        title = _title(_last_user_text(messages))
        return [*_pieces(ContentDelta, title), Finish("stop")]
    last = messages[-1] if messages else {}
    offered = {
        (t.get("function") or {}).get("name")
        for t in tools or ()
        if isinstance(t, dict)
    }
    if last.get("role") == "tool":
        now = str(last.get("content") or "unknown")
        return [
            *_pieces(ReasoningDelta, "The tool answered; time to write the reply."),
            *_pieces(ContentDelta, _answer(_last_user_text(messages), now)),
            Finish("stop"),
        ]
    if TIME_TOOL in offered:
        return [
            *_pieces(
                ReasoningDelta,
                "A friendly demo should show a tool call. I will ask the "
                f"`{TIME_TOOL}` tool for the time, then answer.",
            ),
            *_pieces(ContentDelta, "Let me check the clock first.\n\n"),
            ToolCallDelta(index=0, id="call_demo_time", name=TIME_TOOL),
            ToolCallDelta(index=0, arguments="{}"),
            Finish("tool_calls"),
        ]
    return [
        *_pieces(ReasoningDelta, "No tools today, so I will answer directly."),
        *_pieces(ContentDelta, _answer(_last_user_text(messages), None)),
        Finish("stop"),
    ]


def _pieces(kind: type[ContentDelta] | type[ReasoningDelta], text: str) -> list[Any]:
    return [kind(piece) for piece in _TOKEN.findall(text)]


def _last_user_text(messages: list[dict[str, Any]]) -> str:
    for message in reversed(messages):
        if message.get("role") != "user":
            continue
        content = message.get("content")
        images = 0
        if isinstance(content, list):  # content parts: text and images
            images = sum(1 for p in content if p.get("type") == "image_url")
            content = " ".join(
                p.get("text", "") for p in content if p.get("type") == "text"
            )
        if isinstance(content, str):
            text = " ".join(content.split())
            text = text if len(text) <= 80 else text[:79] + "…"
            if images:
                text += f" (and {images} image{'s' if images > 1 else ''})"
            return text
    return ""


def _title(prompt: str) -> str:
    """A title run's answer: the first few words of the question."""
    question = prompt.removeprefix("Question:").strip()
    words = question.split("Answer:")[0].split()[:5]
    return " ".join(words).strip(".?!,;:") or "Demo chat"


def _answer(user_text: str, now: str | None) -> str:
    quote = f'You wrote: "{user_text}"\n\n' if user_text else ""
    clock = f"The `{TIME_TOOL}` tool says it is **{now}**.\n\n" if now else ""
    return (
        "## Hello from the demo model\n\n"
        f"{quote}{clock}"
        "This reply comes from Hermes' built-in **demo** model, which needs no "
        "network. What you are seeing:\n\n"
        "- every token is written to the run's journal before it is shown;\n"
        "- reload the page mid-stream and the reply continues where it was;\n"
        "- set `OPENAI_BASE_URL` to talk to a real model instead.\n\n"
        "A code block, to show the formatting:\n\n"
        "```python\n"
        "def greet(name: str) -> str:\n"
        '    return f"Hello, {name}!"\n'
        "```\n"
    )
