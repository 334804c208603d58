"""AnthropicProvider against the real loopback Messages server: request shape,
events, and each fault rule (docs/architecture.md §6)."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import httpx
import pytest

from chat.models import Message
from chat.providers.anthropic import AnthropicProvider, to_messages
from chat.providers.base import (
    NETWORK,
    PROVIDER,
    RATE_LIMIT,
    ContentDelta,
    Finish,
    ProviderError,
    ReasoningDelta,
    ToolCallDelta,
    Usage,
)
from chat.turn import run_turn
from hermes_testing.api import new_session, stream, text_of
from hermes_testing.fake_anthropic import (
    AnthropicReply,
    FakeAnthropic,
    anthropic_provider,
    request_problems,
)

MESSAGES = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "hi"},
]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "calculator",
            "description": "adds",
            "parameters": {"type": "object", "properties": {"x": {"type": "number"}}},
        },
    }
]


@pytest.fixture
def fake():
    with FakeAnthropic(api_key="key-a") as server:
        yield server


def provider_for(fake: FakeAnthropic, **kwargs: Any) -> AnthropicProvider:
    kwargs.setdefault("backoff_base", 0.01)
    return AnthropicProvider("claude", fake.base_url, "key-a", **kwargs)


def collect(
    fake: FakeAnthropic, messages: Any = MESSAGES, tools: Any = None, **kwargs: Any
) -> tuple[list[Any], ProviderError | None, AnthropicProvider]:
    async def main():
        provider = provider_for(fake, **kwargs)
        items: list[Any] = []
        try:
            async with contextlib.aclosing(
                provider.stream("claude-x", messages, tools)
            ) as stream:
                async for item in stream:
                    items.append(item)
        except ProviderError as exc:
            return items, exc, provider
        finally:
            assert provider.active_requests == 0
            await provider.aclose()
        return items, None, provider

    return asyncio.run(main())


def text(items: list[Any], kind: type[ContentDelta | ReasoningDelta]) -> str:
    return "".join(i.text for i in items if isinstance(i, kind))


def test_thinking_text_tool_use_usage_and_the_request_shape(fake):
    fake.push(
        AnthropicReply(
            text="Sum coming.",
            reasoning="add them",
            tool_calls=[
                {"id": "toolu_1", "name": "calculator", "arguments": '{"x":1}'}
            ],
            usage={"input_tokens": 21, "output_tokens": 9},
        )
    )
    items, error, provider = collect(fake, tools=TOOLS, thinking_budget=1024)
    assert error is None
    assert text(items, ReasoningDelta) == "add them"
    assert text(items, ContentDelta) == "Sum coming."
    calls = [i for i in items if isinstance(i, ToolCallDelta)]
    assert (calls[0].id, calls[0].name) == ("toolu_1", "calculator")
    assert "".join(c.arguments for c in calls) == '{"x":1}'
    assert [i for i in items if isinstance(i, Finish)] == [Finish("tool_calls")]
    usages = [i.data for i in items if isinstance(i, Usage)]
    assert usages == [{"input_tokens": 21, "output_tokens": 1}, {"output_tokens": 9}]
    (request,) = fake.requests
    assert request.path == "/v1/messages" and request.status == 200
    assert request.headers["x-api-key"] == "key-a"
    assert request.headers["anthropic-version"] == "2023-06-01"
    assert "authorization" not in request.headers
    body = request.body
    assert body["system"] == "Be brief."
    assert body["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "hi"}]}
    ]
    assert body["stream"] is True and body["max_tokens"] == 8192
    assert body["thinking"] == {"type": "enabled", "budget_tokens": 1024}
    assert body["tools"] == [
        {
            "name": "calculator",
            "input_schema": TOOLS[0]["function"]["parameters"],
            "description": "adds",
        }
    ]
    assert provider.requests_started == 1


def test_history_with_fragments_and_tool_results_alternates_strictly(fake):
    history = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "add 1 and 2"},
        {"role": "assistant", "content": "Let me "},
        {"role": "assistant", "content": "use the "},
        {
            "role": "assistant",
            "content": "calculator.",
            "tool_calls": [
                {
                    "id": "toolu_a",
                    "type": "function",
                    "function": {"name": "calculator", "arguments": '{"x": 1}'},
                },
                {
                    "id": "toolu_b",
                    "type": "function",
                    "function": {"name": "calculator", "arguments": ""},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "toolu_a", "content": "1"},
        {"role": "tool", "tool_call_id": "toolu_b", "content": "2"},
        {"role": "user", "content": "and?"},
        {"role": "assistant", "content": "It is "},
        {"role": "assistant", "content": "3 \n"},
    ]
    fake.push(AnthropicReply(text="."))
    items, error, _ = collect(fake, messages=history)
    assert error is None and text(items, ContentDelta) == "."
    body = fake.requests[0].body
    assert fake.requests[0].status == 200  # the server's own checks passed
    assert body["system"] == "Be brief."
    assert body["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "add 1 and 2"}]},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Let me use the calculator."},
                {
                    "type": "tool_use",
                    "id": "toolu_a",
                    "name": "calculator",
                    "input": {"x": 1},
                },
                {
                    "type": "tool_use",
                    "id": "toolu_b",
                    "name": "calculator",
                    "input": {},
                },
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_a", "content": "1"},
                {"type": "tool_result", "tool_use_id": "toolu_b", "content": "2"},
                {"type": "text", "text": "and?"},
            ],
        },
        {"role": "assistant", "content": [{"type": "text", "text": "It is 3"}]},
    ]


def test_the_fake_refuses_what_the_api_refuses():
    """The server's checks are what make the shape tests above mean something."""
    headers = {"anthropic-version": "2023-06-01"}
    ok = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]}
    assert request_problems(ok, headers) == []
    assert request_problems(ok, {}) == ["anthropic-version: header is required"]
    twice = [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]
    assert request_problems({**ok, "messages": twice}, headers)
    system = [{"role": "system", "content": "s"}, {"role": "user", "content": "b"}]
    assert request_problems({**ok, "messages": system}, headers)
    trailing = [
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "b "},
    ]
    assert request_problems({**ok, "messages": trailing}, headers)
    orphan = [
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "b"},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t"}]},
    ]
    assert request_problems({**ok, "messages": orphan}, headers)
    assert request_problems({**ok, "max_tokens": None}, headers)


def test_merging_keeps_a_single_message_and_drops_empty_ones():
    system, turns = to_messages(
        [
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": ""},
            {"role": "assistant", "content": "  "},
        ]
    )
    assert (system, turns) == (
        "",
        [{"role": "user", "content": [{"type": "text", "text": "q"}]}],
    )


def test_retry_after_on_429_and_529_overloaded_are_retried(fake):
    fake.push(
        AnthropicReply(status=429, retry_after=0.3),
        AnthropicReply(status=529, retry_after=0.2),
        AnthropicReply(text="ok"),
    )
    items, error, provider = collect(fake)
    assert error is None and text(items, ContentDelta) == "ok"
    first, second, third = fake.requests
    assert (first.status, second.status, third.status) == (429, 529, 200)
    assert 0.3 <= second.received_at - first.last_byte_at < 0.3 + 0.5
    assert 0.2 <= third.received_at - second.last_byte_at < 0.2 + 0.5
    assert (provider.requests_started, provider.http_retries) == (3, 2)


def test_overloaded_exhausts_three_retries(fake):
    fake.push(*[AnthropicReply(status=529, retry_after=0) for _ in range(4)])
    items, error, provider = collect(fake)
    assert items == [] and error is not None
    assert (error.category, error.retryable, error.status_code) == (PROVIDER, True, 529)
    assert error.message == "HTTP 529: fake error"
    assert fake.post_count == 4 and provider.http_retries == 3


@pytest.mark.parametrize(
    ("status", "category"), [(400, "invalid_request"), (401, "auth")]
)
def test_client_errors_fail_at_once(fake, status, category):
    fake.push(AnthropicReply(status=status))
    _items, error, _ = collect(fake)
    assert error is not None and error.category == category
    assert fake.post_count == 1


def test_rate_limit_exhausted_is_rate_limit(fake):
    fake.push(*[AnthropicReply(status=429, retry_after=0) for _ in range(4)])
    _items, error, _ = collect(fake)
    assert error is not None and error.category == RATE_LIMIT and fake.post_count == 4


@pytest.mark.parametrize(
    ("reply", "category", "reason"),
    [
        (AnthropicReply(text="Hello world", cut_after_chars=5), NETWORK, "body cut"),
        (
            AnthropicReply(text="Hello world", malformed_after_chars=5),
            PROVIDER,
            "malformed event",
        ),
        (
            AnthropicReply(text="Hello world", error_after_chars=5),
            PROVIDER,
            "overloaded",
        ),
    ],
)
def test_stream_faults_after_text(fake, reply, category, reason):
    fake.push(reply)
    items, error, _ = collect(fake)
    assert text(items, ContentDelta) == "Hello"
    assert error is not None and error.during_stream and error.retryable
    assert (error.category, error.reason) == (category, reason)


def test_stall_is_an_idle_timeout(fake):
    fake.push(AnthropicReply(text="Hello world", stall_after_chars=5))
    items, error, _ = collect(fake, idle_timeout=0.3)
    assert text(items, ContentDelta) == "Hello"
    assert error is not None and error.category == "timeout" and error.during_stream
    fake.wait_closed(0, timeout=5)


class Sink:
    def __init__(self) -> None:
        self.tokens: list[str] = []
        self.statuses: list[str] = []
        self.partials: list[str] = []

    def token(self, text: str) -> None:
        self.tokens.append(text)

    def reasoning(self, text: str) -> None:
        pass

    def status(self, message: str) -> None:
        self.statuses.append(message)

    async def commit_partial(self, content: str, reasoning: str) -> None:
        self.partials.append(content)


def test_a_cut_after_text_resumes_with_the_fragment_as_a_prefill(fake):
    fake.push(
        AnthropicReply(
            text="The answer is ",
            cut_after_chars=14,
            usage={"input_tokens": 5, "output_tokens": 4},
        ),
        AnthropicReply(text="42.", usage={"input_tokens": 9, "output_tokens": 2}),
    )
    sink = Sink()

    async def main():
        provider = provider_for(fake)
        try:
            return await run_turn(
                provider,
                model="claude-x",
                messages=MESSAGES,
                tools=None,
                sink=sink,
                cancel=asyncio.Event(),
            )
        finally:
            await provider.aclose()

    result = asyncio.run(main())
    assert result.outcome == "completed" and result.content == "42."
    assert sink.partials == ["The answer is "]
    assert sink.statuses == ["Retry attempt: stream-resume 1/3; body cut"]
    second = fake.requests[1]
    assert second.status == 200
    assert second.body["messages"][-1] == {
        "role": "assistant",
        "content": [{"type": "text", "text": "The answer is"}],
    }
    # usage of the cut stream was never reported in full: only what arrived counts
    assert result.usage == {"input_tokens": 14, "output_tokens": 3}


@pytest.fixture
def claude(settings, fake_llm, monkeypatch):
    """An `anthropic` provider in HERMES_PROVIDERS, served by the loopback fake."""
    with anthropic_provider(settings, monkeypatch, max_tokens=512) as server:
        yield server


@pytest.mark.slow
def test_a_run_on_an_anthropic_model_streams_and_keeps_its_answer(
    server, alice, claude, live_worker
):
    claude.push(AnthropicReply(text="Hello from Claude.", reasoning="greet"))
    models = httpx.get(f"{server.url}/api/models/", headers=alice[1]).json()
    assert {
        "id": "claude-x",
        "provider": "claude",
        "kind": "anthropic",
        "vision": False,
    } in models["models"]
    session_id = new_session(server, alice[1])
    response = httpx.post(
        f"{server.url}/api/sessions/{session_id}/runs/",
        json={"content": "hello", "model": "claude-x"},
        headers=alice[1],
    )
    assert response.status_code == 201, response.text
    events = stream(server, alice[1], response.json()["run_id"])
    assert text_of(events) == "Hello from Claude."
    assert events[0][2]["provider"] == "claude"
    assert events[-1][2]["status"] == "completed"
    usage = [data for _, kind, data in events if kind == "usage"]
    assert usage == [{"input_tokens": 12, "output_tokens": 34}]
    (request,) = claude.requests
    assert request.body["max_tokens"] == 512
    assert request.body["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "hello"}]}
    ]
    kept = Message.objects.get(session_id=session_id, role="assistant")
    assert (kept.content, kept.reasoning) == ("Hello from Claude.", "greet")
