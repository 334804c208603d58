"""The turn engine against the real loopback server.

See docs/architecture.md §6 rules 2-5.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from chat.providers.demo import DemoProvider
from chat.providers.openai import OpenAIProvider
from chat.turn import TurnResult, _max_usage, _sum_usage, run_turn
from hermes_testing.fake_llm import FakeLLM, Reply

MESSAGES = [{"role": "user", "content": "hi"}]


class RecordingSink:
    """Keeps everything a turn hands over; lets a test wait for shown text."""

    def __init__(self) -> None:
        self.tokens: list[str] = []
        self.thoughts: list[str] = []
        self.statuses: list[str] = []
        self.partials: list[tuple[str, str]] = []
        self._changed = asyncio.Event()

    def token(self, text: str) -> None:
        self.tokens.append(text)
        self._changed.set()

    def reasoning(self, text: str) -> None:
        self.thoughts.append(text)

    def status(self, message: str) -> None:
        self.statuses.append(message)

    async def commit_partial(self, content: str, reasoning: str) -> None:
        self.partials.append((content, reasoning))

    def upstream(self, cursor: Any, content_chars: int, reasoning_chars: int) -> None:
        raise AssertionError("chat completions keep no response upstream")

    async def wait_text(self, text: str) -> None:
        while "".join(self.tokens) != text:
            self._changed.clear()
            await self._changed.wait()


@pytest.fixture
def fake():
    with FakeLLM() as server:
        yield server


def turn(
    fake: FakeLLM, sink: RecordingSink | None = None, **kwargs: Any
) -> tuple[TurnResult, RecordingSink]:
    """Run one turn on a fresh provider; asserts every slot was released."""
    sink = sink or RecordingSink()

    async def main() -> TurnResult:
        provider = OpenAIProvider("fake", fake.base_url, None, backoff_base=0.01)
        kwargs.setdefault("cancel", asyncio.Event())
        try:
            return await run_turn(
                provider,
                model="fake-model",
                messages=MESSAGES,
                tools=kwargs.pop("tools", None),
                sink=sink,
                **kwargs,
            )
        finally:
            assert provider.active_requests == 0
            await provider.aclose()

    return asyncio.run(main()), sink


def test_happy_path_with_reasoning_tool_calls_and_usage(fake):
    usage = {"prompt_tokens": 5, "completion_tokens": 8, "total_tokens": 13}
    fake.push(
        Reply(
            text="Let me add.",
            reasoning="Arithmetic, so the calculator.",
            tool_calls=[
                {"id": "c1", "name": "calculator", "arguments": {"expression": "2+2"}},
                {"id": "c2", "name": "current_time", "arguments": {}},
            ],
            usage=usage,
        )
    )
    result, sink = turn(fake)
    assert result.outcome == "completed" and result.error is None
    assert result.content == "Let me add." == "".join(sink.tokens)
    assert (
        result.reasoning == "Arithmetic, so the calculator." == "".join(sink.thoughts)
    )
    assert result.tool_calls == [
        {
            "id": "c1",
            "type": "function",
            "function": {"name": "calculator", "arguments": '{"expression": "2+2"}'},
        },
        {
            "id": "c2",
            "type": "function",
            "function": {"name": "current_time", "arguments": "{}"},
        },
    ]
    assert result.usage == usage and result.finish_reason == "tool_calls"
    diagnostics = result.diagnostics
    assert diagnostics["model_requests_started"] == 1
    assert diagnostics["transparent_retries"] == diagnostics["stream_resumes"] == 0
    assert diagnostics["first_token_ms"] is not None
    assert sink.partials == [] and sink.statuses == []


def test_usage_absent_is_none(fake):
    fake.push(Reply(text="ok", usage=None))
    result, _ = turn(fake)
    assert result.outcome == "completed" and result.usage is None


def test_http_retries_before_headers_are_counted(fake):
    fake.push(Reply(status=429, retry_after=0.05), Reply(status=500), Reply(text="ok"))
    result, sink = turn(fake)
    assert result.outcome == "completed" and result.content == "ok"
    assert result.diagnostics["http_retries"] == 2
    assert result.diagnostics["model_requests_started"] == 3
    assert sink.statuses == []


def test_auth_error_fails_at_once(fake):
    fake.push(Reply(status=401))
    result, sink = turn(fake)
    assert result.outcome == "failed" and result.error.category == "auth"
    assert fake.post_count == 1 and sink.partials == [] and sink.tokens == []


def test_stream_dying_before_content_is_reopened_silently(fake):
    fake.push(
        Reply(text="Hello", reasoning="r", cut_after_chars=0), Reply(text="Hello")
    )
    result, sink = turn(fake)
    assert result.outcome == "completed" and result.content == "Hello"
    assert result.diagnostics["transparent_retries"] == 1
    assert result.diagnostics["stream_resumes"] == 0
    assert sink.partials == [] and sink.statuses == []
    first, second = fake.requests
    assert first.body == second.body  # the identical request


def test_silent_reopens_are_bounded(fake):
    fake.push(*[Reply(text="x", cut_after_chars=0)] * 3)
    result, sink = turn(fake)
    assert result.outcome == "failed" and result.error.category == "network"
    assert result.diagnostics["transparent_retries"] == 2 and fake.post_count == 3
    assert sink.partials == []


def test_body_cut_after_content_every_time(fake):
    fragments = ["one, ", "two, ", "three, ", "four"]
    fake.push(*[Reply(text=f, cut_after_chars=len(f)) for f in fragments])
    result, sink = turn(fake)
    assert fake.post_count == 4  # MAX_STREAM_RETRIES + 1
    assert sink.partials == [(f, "") for f in fragments[:3]]
    assert result.content == "four"  # the final partial, not committed by the turn
    assert sink.statuses == [
        f"Retry attempt: stream-resume {k}/3; body cut" for k in (1, 2, 3)
    ]
    assert result.outcome == "failed" and result.error.category == "network"
    assert "payload is not completed" in result.error.message
    assert result.usage is None and result.tool_calls == []
    # Each resume request ends in one assistant message holding everything
    # shown so far (roles alternate; a server may continue it).
    for k, request in enumerate(fake.requests):
        shown = "".join(fragments[:k])
        fragments_sent = [{"role": "assistant", "content": shown}] if k else []
        assert request.messages == MESSAGES + fragments_sent
    assert result.diagnostics["stream_resumes"] == 3
    assert result.diagnostics["model_requests_started"] == 4


def test_resume_then_completion_and_no_tool_calls_from_a_cut_stream(fake):
    call = {"id": "c1", "name": "calculator", "arguments": '{"expression": "1"}'}
    fake.push(
        Reply(text="Hel", tool_calls=[call], cut_after_chars=3 + 5),  # cut mid-args
        Reply(text="lo!"),
    )
    result, sink = turn(fake)
    assert result.outcome == "completed" and result.content == "lo!"
    assert result.tool_calls == [] and result.finish_reason == "stop"
    assert sink.partials == [("Hel", "")] and len(sink.statuses) == 1
    assert fake.requests[1].messages[-1] == {"role": "assistant", "content": "Hel"}
    assert "tool_calls" not in fake.requests[1].messages[-1]
    assert result.usage is not None  # the completed stream reported its usage


def test_reasoning_only_partial_is_committed_but_not_replayed(fake):
    fake.push(
        Reply(text="answer", reasoning="think", cut_after_chars=5), Reply(text="ok")
    )
    result, sink = turn(fake)
    assert result.outcome == "completed"
    assert sink.partials == [("", "think")]
    assert fake.requests[1].messages == MESSAGES


def test_malformed_chunk_is_resumed(fake):
    fake.push(Reply(text="Hello", malformed_after_chars=3), Reply(text="lo"))
    result, sink = turn(fake)
    assert result.outcome == "completed" and result.content == "lo"
    assert sink.partials == [("Hel", "")]
    assert sink.statuses == ["Retry attempt: stream-resume 1/3; malformed chunk"]


def test_cancel_during_a_stall_closes_the_connection_at_once(fake):
    fake.push(Reply(text="Hello world", stall_after_chars=5))
    sink = RecordingSink()
    cancelled_at: list[float] = []

    async def cancel_when_shown(cancel: asyncio.Event) -> None:
        await sink.wait_text("Hello")
        cancelled_at.append(time.monotonic())
        cancel.set()

    async def main() -> TurnResult:
        cancel = asyncio.Event()
        # Provider's idle timeout stays 300 s: the turn must not wait for it.
        provider = OpenAIProvider("fake", fake.base_url, None)
        canceller = asyncio.create_task(cancel_when_shown(cancel))
        result = await run_turn(
            provider, model="m", messages=MESSAGES, tools=None, sink=sink, cancel=cancel
        )
        await canceller
        assert provider.active_requests == 0
        await provider.aclose()
        return result

    result = asyncio.run(main())
    assert result.outcome == "cancelled" and result.error.category == "cancelled"
    assert result.content == "Hello" and sink.partials == []
    fake.wait_closed(0, timeout=2)
    record = fake.requests[0]
    assert record.closed_by == "client" and record.closed_at - cancelled_at[0] < 1.0


def test_cancel_before_start_sends_nothing(fake):
    cancel = asyncio.Event()
    cancel.set()
    result, _ = turn(fake, cancel=cancel)
    assert result.outcome == "cancelled" and fake.post_count == 0


def test_worker_shutdown_cancels_the_turn_and_closes_the_socket(fake):
    fake.push(Reply(text="Hello world", stall_after_chars=5))
    sink = RecordingSink()

    async def main() -> OpenAIProvider:
        provider = OpenAIProvider("fake", fake.base_url, None)
        task = asyncio.create_task(
            run_turn(
                provider,
                model="m",
                messages=MESSAGES,
                tools=None,
                sink=sink,
                cancel=asyncio.Event(),
            )
        )
        await sink.wait_text("Hello")
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return provider

    provider = asyncio.run(main())
    assert provider.active_requests == 0
    assert fake.wait_closed(0, timeout=2) < 1.0


def test_content_cap_fails_the_stream(fake):
    fake.push(Reply(text="x" * 100))
    result, _ = turn(fake, max_content_bytes=10)
    assert result.outcome == "failed" and result.error.category == "provider"
    assert "cap" in result.error.message and fake.post_count == 1
    assert 10 < len(result.content) <= 14  # stopped at the chunk that crossed it


@pytest.mark.slow
def test_time_cap_fails_the_stream_and_closes_it(fake):
    fake.push(Reply(text="Hello world", stall_after_chars=5))
    # The cap must fire after "Hello" arrived, however busy the machine is.
    result, _ = turn(fake, max_stream_seconds=3)
    assert result.outcome == "failed" and result.error.category == "timeout"
    assert result.content == "Hello" and fake.post_count == 1
    fake.wait_closed(0, timeout=2)


def test_demo_provider_runs_a_turn():
    async def main() -> TurnResult:
        tools = [{"type": "function", "function": {"name": "current_time"}}]
        return await run_turn(
            DemoProvider(tokens_per_s=None),
            model="demo",
            messages=MESSAGES,
            tools=tools,
            sink=RecordingSink(),
            cancel=asyncio.Event(),
        )

    result = asyncio.run(main())
    assert result.outcome == "completed" and result.finish_reason == "tool_calls"
    assert result.tool_calls[0]["function"]["name"] == "current_time"
    assert result.usage is None


def test_usage_merges_by_max_within_and_sums_across_streams():
    within = _max_usage(
        {"prompt_tokens": 5, "completion_tokens": 1}, {"completion_tokens": 9}
    )
    assert within == {"prompt_tokens": 5, "completion_tokens": 9}
    total = _sum_usage(
        _sum_usage(None, within), {"prompt_tokens": 7, "details": {"c": 1}}
    )
    assert total == {"prompt_tokens": 12, "completion_tokens": 9, "details": {"c": 1}}
    assert _sum_usage(None, None) is None


def test_tokens_per_second_is_the_pace_and_none_for_a_burst(fake):
    fake.push(Reply(text="x" * 400, chunk_chars=1))  # 400 frames at once
    result, _ = turn(fake)
    assert result.outcome == "completed"
    assert result.diagnostics["tokens_per_s"] is None  # it read 72,707.9
    fake.push(Reply(text="x" * 20, chunk_chars=1, tokens_per_s=40))
    result, _ = turn(fake)
    # 19 intervals at 40 frames/s take ~0.475 s; a busy machine only slows it.
    assert 0 < result.diagnostics["tokens_per_s"] <= 41
