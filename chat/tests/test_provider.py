"""OpenAIProvider against the real loopback server: parsing, rule 1, closing."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from typing import Any

import pytest

from chat.providers.base import (
    ContentDelta,
    Finish,
    ProviderError,
    ReasoningDelta,
    RequestStats,
    ToolCallDelta,
    Usage,
)
from chat.providers.demo import DemoProvider
from chat.providers.openai import OpenAIProvider
from hermes_testing.fake_llm import FakeLLM, Reply

MESSAGES = [{"role": "user", "content": "hi"}]
TOOLS = [{"type": "function", "function": {"name": "calculator", "parameters": {}}}]


@pytest.fixture
def fake():
    with FakeLLM(api_key="key-1") as server:
        yield server


def provider_for(fake: FakeLLM, **kwargs: Any) -> OpenAIProvider:
    kwargs.setdefault("backoff_base", 0.01)
    return OpenAIProvider("fake", fake.base_url, "key-1", **kwargs)


async def collect(
    provider: Any, *, tools: Any = None, stats: RequestStats | None = None
) -> tuple[list[Any], ProviderError | None]:
    """Every item of one stream, and the error that ended it (if any)."""
    items: list[Any] = []
    try:
        async with contextlib.aclosing(
            provider.stream("fake-model", MESSAGES, tools, stats=stats)
        ) as stream:
            async for item in stream:
                items.append(item)
    except ProviderError as exc:
        return items, exc
    finally:
        assert provider.active_requests == 0
    return items, None


def text(items: list[Any], kind: type[ContentDelta | ReasoningDelta]) -> str:
    return "".join(i.text for i in items if isinstance(i, kind))


def run(provider_factory, **kwargs: Any) -> tuple[list[Any], ProviderError | None, Any]:
    async def main():
        provider = provider_factory()
        try:
            items, error = await collect(provider, **kwargs)
        finally:
            await provider.aclose()
        return items, error, provider

    return asyncio.run(main())


def test_happy_path_reasoning_tool_calls_and_usage(fake):
    usage = {"prompt_tokens": 7, "completion_tokens": 9, "total_tokens": 16}
    fake.push(
        Reply(
            text="Hello there",
            reasoning="let me think",
            tool_calls=[{"id": "call_1", "name": "calculator", "arguments": '{"x":1}'}],
            usage=usage,
        )
    )
    stats = RequestStats()
    items, error, provider = run(lambda: provider_for(fake), tools=TOOLS, stats=stats)
    assert error is None
    assert text(items, ReasoningDelta) == "let me think"
    assert text(items, ContentDelta) == "Hello there"
    calls = [i for i in items if isinstance(i, ToolCallDelta)]
    assert (calls[0].index, calls[0].id, calls[0].name) == (0, "call_1", "calculator")
    assert "".join(c.arguments for c in calls) == '{"x":1}'
    assert [i for i in items if isinstance(i, Finish)] == [Finish("tool_calls")]
    assert items[-1] == Usage(usage)
    body = fake.requests[0].body
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert body["tools"] == TOOLS and body["messages"] == MESSAGES
    assert fake.requests[0].headers["authorization"] == "Bearer key-1"
    assert (provider.requests_started, provider.http_retries) == (1, 0)
    assert (stats.requests_started, stats.http_retries) == (1, 0)


def test_reasoning_key_variant_and_no_usage(fake):
    fake.push(Reply(text="ok", reasoning="why", reasoning_key="reasoning", usage=None))
    items, error, _ = run(lambda: provider_for(fake))
    assert error is None
    assert text(items, ReasoningDelta) == "why"
    assert not any(isinstance(i, Usage) for i in items)
    assert items[-1] == Finish("stop")


def test_retry_after_replaces_the_backoff(fake):
    fake.push(Reply(status=429, retry_after=0.3), Reply(text="ok"))
    items, error, provider = run(lambda: provider_for(fake))
    assert error is None and text(items, ContentDelta) == "ok"
    first, second = fake.requests
    waited = second.received_at - first.last_byte_at  # both on the server's clock
    assert 0.3 <= waited < 0.3 + 0.5
    assert (provider.requests_started, provider.http_retries) == (2, 1)


def test_5xx_is_retried_then_succeeds(fake):
    fake.push(Reply(status=500), Reply(status=503), Reply(text="ok"))
    items, error, provider = run(lambda: provider_for(fake))
    assert error is None and text(items, ContentDelta) == "ok"
    assert fake.post_count == 3 and provider.http_retries == 2


def test_5xx_exhausts_three_retries(fake):
    fake.push(*[Reply(status=500, error_body={"error": {"message": "down"}})] * 4)
    items, error, provider = run(lambda: provider_for(fake))
    assert error is not None and items == []
    assert (error.category, error.status_code, error.retryable) == (
        "provider",
        500,
        True,
    )
    assert "down" in error.message and not error.during_stream
    assert fake.post_count == 4 and provider.requests_started == 4


@pytest.mark.parametrize(
    ("status", "category"),
    [(401, "auth"), (403, "auth"), (400, "invalid_request"), (404, "invalid_request")],
)
def test_client_errors_fail_at_once(fake, status, category):
    fake.push(Reply(status=status))
    _, error, provider = run(lambda: provider_for(fake))
    assert error is not None and error.category == category
    assert not error.retryable and error.status_code == status
    assert fake.post_count == 1 and provider.http_retries == 0


def test_wrong_key_is_auth_after_one_post(fake):
    _, error, _ = run(lambda: OpenAIProvider("fake", fake.base_url, "wrong"))
    assert error is not None and error.category == "auth"
    assert fake.post_count == 1


def test_connection_refused_is_network_after_retries():
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    factory = lambda: OpenAIProvider(  # noqa: E731
        "dead", f"http://127.0.0.1:{port}/v1", None, backoff_base=0.01
    )
    _, error, provider = run(factory)
    assert error is not None and error.category == "network" and error.retryable
    assert (provider.requests_started, provider.http_retries) == (4, 3)


def test_body_cut_is_a_network_stream_fault(fake):
    fake.push(Reply(text="Hello world", cut_after_chars=5))
    items, error, _ = run(lambda: provider_for(fake))
    assert text(items, ContentDelta) == "Hello"
    assert not any(isinstance(i, Finish) for i in items)
    assert error is not None and error.category == "network"
    assert error.during_stream and error.retryable and error.reason == "body cut"
    assert "payload is not completed" in error.message  # the client library's words


@pytest.mark.parametrize("after", [0, 5])
def test_done_without_a_finish_reason_is_a_cut_not_a_whole_answer(fake, after):
    # llama.cpp's Python server ends an answer it interrupts with [DONE] and no
    # finish reason, in a body that ends cleanly: the answer is not whole.
    fake.push(Reply(text="Hello world", done_after_chars=after))
    items, error, _ = run(lambda: provider_for(fake))
    assert text(items, ContentDelta) == "Hello"[:after]
    assert not any(isinstance(i, Finish) for i in items)
    assert error is not None and error.category == "network"
    assert error.during_stream and error.retryable
    assert error.reason == "ended without a finish reason"


def test_a_listing_that_interrupts_an_answer_cuts_it(fake):
    # The fake does what llama-cpp-python does by default: another request,
    # even `GET /v1/models`, ends a streaming answer with [DONE] and no finish
    # reason, in a body with no Content-Length that the server closes cleanly.
    fake.interrupt_requests = True
    hold = threading.Event()
    fake.push(Reply(text="Hello world", hold_after_chunks=2, hold=hold))

    async def main():
        provider = provider_for(fake)
        try:
            reader = asyncio.create_task(collect(provider))
            await asyncio.to_thread(fake.wait_held, 0)
            assert await provider.list_models() == ["fake-model"]
            return await reader
        finally:
            await provider.aclose()

    items, error = asyncio.run(main())
    assert text(items, ContentDelta) == "Hell"
    assert error is not None and error.reason == "ended without a finish reason"
    assert fake.requests[0].closed_by == "server"


def test_malformed_chunk_is_a_provider_stream_fault(fake):
    fake.push(Reply(text="Hello world", malformed_after_chars=3))
    items, error, _ = run(lambda: provider_for(fake))
    assert text(items, ContentDelta) == "Hel"
    assert error is not None and error.category == "provider"
    assert error.during_stream and error.retryable and error.reason == "malformed chunk"


def test_idle_timeout_is_a_timeout_stream_fault(fake):
    fake.push(Reply(text="Hello world", stall_after_chars=2))
    items, error, _ = run(lambda: provider_for(fake, idle_timeout=0.2))
    assert text(items, ContentDelta) == "He"
    assert error is not None and error.category == "timeout" and error.during_stream
    assert fake.wait_closed(0, timeout=2) < 1.0
    assert fake.requests[0].closed_by == "client"


def test_closing_the_stream_early_closes_the_socket(fake):
    fake.push(Reply(text="Hello world", stall_after_chars=5))

    async def main() -> float:
        provider = provider_for(fake)
        stream = provider.stream("fake-model", MESSAGES)
        first = await anext(stream)
        assert first == ContentDelta("Hell")
        assert provider.active_requests == 1
        await stream.aclose()
        closed = time.monotonic()
        assert provider.active_requests == 0
        await provider.aclose()
        return closed

    closed = asyncio.run(main())
    fake.wait_closed(0, timeout=2)
    record = fake.requests[0]
    assert record.closed_by == "client" and record.closed_at - closed < 1.0


def test_cancelling_the_reading_task_closes_the_socket(fake):
    fake.push(Reply(text="Hello world", stall_after_chars=5))

    async def main() -> tuple[OpenAIProvider, float]:
        provider = provider_for(fake)
        got_text = asyncio.Event()

        async def read() -> None:
            async for item in provider.stream("fake-model", MESSAGES):
                if isinstance(item, ContentDelta) and item.text == "o":
                    got_text.set()

        task = asyncio.create_task(read())
        await got_text.wait()  # the server is now stalled mid-body
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        return provider, time.monotonic()

    provider, cancelled = asyncio.run(main())
    assert provider.active_requests == 0
    fake.wait_closed(0, timeout=2)
    assert fake.requests[0].closed_at - cancelled < 1.0


def test_list_models_and_auth_failure(fake):
    async def main() -> tuple[list[str], ProviderError]:
        good = provider_for(fake)
        bad = OpenAIProvider("fake", fake.base_url, "wrong")
        models = await good.list_models()
        with pytest.raises(ProviderError) as caught:
            await bad.list_models()
        await good.aclose()
        await bad.aclose()
        return models, caught.value

    models, error = asyncio.run(main())
    assert models == ["fake-model"] and error.category == "auth"


def test_reset_closes_pooled_connections_on_the_loop_that_made_them(fake_llm, server):
    """Settings changed (`registry.reset`) from another thread: the provider's
    pool, made on the server's loop, is closed there, not left to the
    garbage collector's "Unclosed client session"."""
    from chat.providers import registry
    from hermes_testing.harness import wait_until

    provider = registry.get_provider("openai")
    assert server.call(provider.list_models()) == ["fake-model", "other-model"]
    client = provider._http
    assert client is not None and not client.closed
    registry.reset()
    wait_until(lambda: client.closed, timeout=30)
    assert registry.get_provider("openai") is not provider


def test_client_is_built_lazily_and_key_never_shown():
    provider = OpenAIProvider("p", "http://127.0.0.1:9/v1", "sk-secret")
    assert provider._http is None  # nothing connects at construction
    assert "sk-secret" not in repr(provider)


def test_demo_provider_calls_the_clock_then_answers():
    async def main() -> tuple[list[Any], list[Any], DemoProvider]:
        demo = DemoProvider(tokens_per_s=None)
        tools = [{"type": "function", "function": {"name": "current_time"}}]
        first, error = await collect(demo, tools=tools)
        assert error is None
        followup: list[dict[str, Any]] = [
            *MESSAGES,
            {"role": "assistant", "content": "", "tool_calls": []},
            {"role": "tool", "tool_call_id": "call_demo_time", "content": "noon"},
        ]
        second = [i async for i in demo.stream("demo", followup, tools)]
        return first, second, demo

    first, second, demo = asyncio.run(main())
    assert text(first, ReasoningDelta) and first[-1] == Finish("tool_calls")
    calls = [i for i in first if isinstance(i, ToolCallDelta)]
    assert calls[0].name == "current_time"
    answer = text(second, ContentDelta)
    assert answer.startswith("## ") and "\n- " in answer and "```python" in answer
    assert "noon" in answer and second[-1] == Finish("stop")
    assert not any(isinstance(i, Usage) for i in first + second)
    assert (demo.requests_started, demo.active_requests) == (2, 0)


def test_demo_provider_is_paced():
    async def main() -> float:
        demo = DemoProvider(tokens_per_s=400)
        start = time.monotonic()
        items, _ = await collect(demo)
        deltas = sum(isinstance(i, ContentDelta | ReasoningDelta) for i in items)
        return (time.monotonic() - start) * 400 / deltas

    assert asyncio.run(main()) >= 0.9  # about one delta per 1/400 s, not a burst
