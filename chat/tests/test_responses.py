"""ResponsesProvider and the turn engine's re-attach rule, against the real
loopback Responses server (docs/architecture.md §6, "Two cursors")."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import pytest

from chat.providers.base import (
    ContentDelta,
    Finish,
    ProviderError,
    ReasoningDelta,
    ToolCallDelta,
    Upstream,
    Usage,
)
from chat.providers.responses import ResponsesProvider, to_input
from chat.turn import Reattach, TurnResult, run_turn
from hermes_testing.fake_responses import FakeResponses, ResponsesReply

MESSAGES = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "hi"},
]
TOOLS = [{"type": "function", "function": {"name": "calculator", "parameters": {}}}]
ANSWER = "The one answer the model is writing, word after word, to its end."
USAGE = {
    "input_tokens": 20,
    "output_tokens": 16,
    "total_tokens": 36,
    "output_tokens_details": {"reasoning_tokens": 0},
}


@pytest.fixture
def fake():
    with FakeResponses(api_key="key-r") as server:
        yield server


def provider_for(fake: FakeResponses, **kwargs: Any) -> ResponsesProvider:
    kwargs.setdefault("backoff_base", 0.01)
    return ResponsesProvider("resp", fake.base_url, "key-r", **kwargs)


def collect(fake: FakeResponses, tools: Any = None, **kwargs: Any):
    async def main():
        provider = provider_for(fake, **kwargs)
        items: list[Any] = []
        try:
            async with contextlib.aclosing(
                provider.stream("gpt-x", MESSAGES, tools)
            ) as stream:
                async for item in stream:
                    items.append(item)
        except ProviderError as exc:
            return items, exc
        finally:
            assert provider.active_requests == 0
            await provider.aclose()
        return items, None

    return asyncio.run(main())


def text(items: list[Any], kind: type[ContentDelta | ReasoningDelta]) -> str:
    return "".join(i.text for i in items if isinstance(i, kind))


class Sink:
    def __init__(self) -> None:
        self.tokens: list[str] = []
        self.thoughts: list[str] = []
        self.statuses: list[str] = []
        self.partials: list[str] = []
        self.cursors: list[tuple[Upstream, int, int]] = []
        self.log: list[tuple[str, Any]] = []  # ("token" | "status" | "cursor", …)

    def token(self, text: str) -> None:
        self.tokens.append(text)
        self.log.append(("token", text))

    def before_first_status(self) -> tuple[str, int | None]:
        """The text shown and the last cursor handed on before the first status."""
        shown, at = "", None
        for kind, value in self.log:
            if kind == "status":
                break
            if kind == "token":
                shown += value
            if kind == "cursor":
                at = value
        return shown, at

    def reasoning(self, text: str) -> None:
        self.thoughts.append(text)

    def status(self, message: str) -> None:
        self.statuses.append(message)
        self.log.append(("status", message))

    async def commit_partial(self, content: str, reasoning: str) -> None:
        self.partials.append(content)

    def upstream(self, cursor: Upstream, content_chars: int, reasoning_chars: int):
        self.cursors.append((cursor, content_chars, reasoning_chars))
        self.log.append(("cursor", cursor.sequence))


def turn(
    fake: FakeResponses, sink: Sink, *, cancel_after: str | None = None, **kwargs: Any
) -> TurnResult:
    async def main():
        provider = provider_for(fake, idle_timeout=kwargs.pop("idle_timeout", 300))
        cancel = asyncio.Event()

        async def watch():
            while cancel_after and cancel_after not in "".join(sink.tokens):
                await asyncio.sleep(0.01)
            cancel.set()

        watcher = asyncio.create_task(watch()) if cancel_after else None
        try:
            return await run_turn(
                provider,
                model="gpt-x",
                messages=MESSAGES,
                tools=None,
                sink=sink,
                cancel=cancel,
                **kwargs,
            )
        finally:
            if watcher:
                watcher.cancel()
            assert provider.active_requests == 0
            await provider.aclose()

    return asyncio.run(main())


def test_text_reasoning_function_calls_usage_and_the_request_shape(fake):
    fake.push(
        ResponsesReply(
            text="Adding.",
            reasoning="sum it",
            tool_calls=[{"id": "call_9", "name": "calculator", "arguments": '{"x":1}'}],
            usage=USAGE,
        )
    )
    items, error = collect(fake, tools=TOOLS, reasoning_summary="auto")
    assert error is None
    assert text(items, ReasoningDelta) == "sum it"
    assert text(items, ContentDelta) == "Adding."
    calls = [i for i in items if isinstance(i, ToolCallDelta)]
    assert (calls[0].id, calls[0].name) == ("call_9", "calculator")
    assert "".join(c.arguments for c in calls) == '{"x":1}'
    assert [i for i in items if isinstance(i, Finish)] == [Finish("tool_calls")]
    assert [i.data for i in items if isinstance(i, Usage)] == [USAGE]
    cursors = [i for i in items if isinstance(i, Upstream)]
    assert [c.sequence for c in cursors] == list(range(len(cursors)))
    (request,) = fake.requests
    assert (request.method, request.path) == ("POST", "/v1/responses")
    assert request.headers["authorization"] == "Bearer key-r"
    body = request.body
    assert body["stream"] is True and body["background"] is True
    assert body["store"] is True and body["instructions"] == "Be brief."
    assert body["input"] == [{"role": "user", "content": "hi"}]
    assert body["tools"] == [
        {"type": "function", "name": "calculator", "parameters": {"type": "object"}}
    ]
    assert body["reasoning"] == {"summary": "auto"}


def test_history_keeps_fragments_and_tool_steps_as_items():
    history = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "part one, "},
        {"role": "assistant", "content": "part two"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"id": "c1", "function": {"name": "calculator", "arguments": "{}"}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "42"},
    ]
    instructions, items = to_input(history)
    assert instructions == ""
    assert items == [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "part one, "},
        {"role": "assistant", "content": "part two"},
        {
            "type": "function_call",
            "call_id": "c1",
            "name": "calculator",
            "arguments": "{}",
        },
        {"type": "function_call_output", "call_id": "c1", "output": "42"},
    ]


@pytest.fixture
def every_cursor(monkeypatch):
    """Every cursor is handed to the sink (not one a second), to compare with."""
    monkeypatch.setattr("chat.turn.CURSOR_EVERY_S", 0.0)


# Paced, so the client has read what came before the cut: a client library
# may drop bytes that arrive together with the connection's failure.
PACE = 50


def test_a_cut_mid_answer_is_re_attached_and_ends_with_the_one_answer(
    fake, every_cursor
):
    fake.push(
        ResponsesReply(
            text=ANSWER,
            chunk_chars=4,
            tokens_per_s=PACE,
            cut_after_chars=20,
            usage=USAGE,
        )
    )
    sink = Sink()
    result = turn(fake, sink)
    assert result.outcome == "completed"
    assert result.content == ANSWER and "".join(sink.tokens) == ANSWER
    assert sink.partials == []  # nothing regenerated, nothing kept as a fragment
    assert sink.statuses == ["Retry attempt: re-attach 1/3; body cut"]
    post, get = fake.requests
    assert (post.method, get.method) == ("POST", "GET")
    response_id = result.upstream.response_id
    assert get.path == f"/v1/responses/{response_id}"
    shown, at = sink.before_first_status()
    assert ANSWER.startswith(shown) and at is not None
    assert get.query == f"stream=true&starting_after={at}"
    assert result.usage == USAGE  # counted once
    diagnostics = result.diagnostics
    assert diagnostics["model_requests_started"] == 1
    assert (diagnostics["stream_reattaches"], diagnostics["stream_resumes"]) == (1, 0)


@pytest.mark.parametrize(
    ("fault", "reason"),
    [
        ({"malformed_after_chars": 8}, "malformed event"),
        ({"stall_after_chars": 8}, "idle timeout"),
    ],
)
def test_a_malformed_event_or_a_stall_is_re_attached_too(fake, fault, reason):
    fake.push(ResponsesReply(text=ANSWER, chunk_chars=4, **fault))
    sink = Sink()
    result = turn(fake, sink, idle_timeout=0.5)
    assert result.outcome == "completed" and result.content == ANSWER
    assert sink.statuses == [f"Retry attempt: re-attach 1/3; {reason}"]
    assert [r.method for r in fake.requests] == ["POST", "GET"]


def test_an_expired_response_falls_back_to_the_regenerate_rule(fake):
    fake.push(
        ResponsesReply(
            text=ANSWER,
            chunk_chars=4,
            tokens_per_s=PACE,
            cut_after_chars=8,
            expire_after_s=0,
        ),
        ResponsesReply(text="Regenerated rest."),
    )
    sink = Sink()
    result = turn(fake, sink)
    assert result.outcome == "completed" and result.content == "Regenerated rest."
    shown, _ = sink.before_first_status()
    assert sink.partials == [shown] and ANSWER.startswith(shown) and shown
    assert sink.statuses == [
        "Retry attempt: re-attach 1/3; body cut",
        "Retry attempt: stream-resume 1/3; re-attach refused: HTTP 404: "
        f"Response with id '{fake.requests[1].path.rsplit('/', 1)[1]}' not found.",
    ]
    assert [r.method for r in fake.requests] == ["POST", "GET", "POST"]
    assert fake.requests[1].status == 404
    assert fake.requests[2].body["input"][-1] == {
        "role": "assistant",
        "content": shown,
    }


def test_a_failed_response_is_not_re_attached(fake):
    fake.push(ResponsesReply(text="abc", fail=True), ResponsesReply(text="fine"))
    sink = Sink()
    result = turn(fake, sink)
    assert result.content == "fine" and sink.partials == ["abc"]
    assert [r.method for r in fake.requests] == ["POST", "POST"]


def test_429_before_the_response_exists_is_retried(fake):
    fake.push(ResponsesReply(status=429, retry_after=0.2), ResponsesReply(text="ok"))
    sink = Sink()
    result = turn(fake, sink)
    assert result.content == "ok" and result.diagnostics["http_retries"] == 1
    first, second = fake.requests
    assert 0.2 <= second.received_at - first.last_byte_at < 0.2 + 0.5


def test_a_lost_workers_stream_is_re_attached_skipping_what_it_showed(
    fake, monkeypatch
):
    """Another worker journaled a cursor, then showed more text before it died."""
    monkeypatch.setattr("chat.turn.CURSOR_EVERY_S", 0.0)  # every cursor handed on
    fake.push(ResponsesReply(text=ANSWER, chunk_chars=4, stall_after_chars=24))
    first = Sink()
    turn(fake, first, cancel_after=ANSWER[:24])
    fake.wait_closed(0)
    cursor, content_at, _ = first.cursors[len(first.cursors) // 2]
    assert 0 < content_at < 24
    sink = Sink()
    taken = Reattach(cursor, ANSWER[:24], "", content_at, 0)
    result = turn(fake, sink, reattach=taken)
    assert result.outcome == "completed" and result.content == ANSWER
    assert "".join(sink.tokens) == ANSWER[24:]  # only what nobody was shown
    get = fake.requests[-1]
    assert get.method == "GET" and get.query.endswith(
        f"starting_after={cursor.sequence}"
    )
    assert result.diagnostics["model_requests_started"] == 0


def test_cancel_stops_the_response_upstream(fake):
    fake.push(ResponsesReply(text=ANSWER, chunk_chars=4, tokens_per_s=50))
    sink = Sink()
    result = turn(fake, sink, cancel_after=ANSWER[:8])
    assert result.outcome == "cancelled" and result.upstream is not None

    async def cancel():
        provider = provider_for(fake)
        try:
            return await provider.cancel(result.upstream.response_id)
        finally:
            await provider.aclose()

    assert asyncio.run(cancel()) is True
    assert fake.of_kind("POST", "/cancel")[0].status == 200
    assert fake.stored[result.upstream.response_id].cancelled_at is not None
