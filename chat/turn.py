"""The turn engine: one model step, streamed (docs/architecture.md §6, rules 2-5).

Rule 1 (retries before response headers) belongs to the provider. Here:
2. a stream that dies before anything was shown is reopened silently, at most
   ``max_transparent_retries`` times;
3. a stream that dies after text was shown has that partial committed through
   the sink, a ``Retry attempt: stream-resume k/N; <reason>`` status, and the
   conversation, now ending in the fragment, POSTed again; after N resumes the
   turn fails with the client library's message; tool calls of a cut stream
   are dropped, never resumed or returned;
4. every read races ``cancel`` and cancel wins: the response is closed at once;
5. each stream is capped in time and in bytes.
Before rules 2-3, a stream the provider keeps upstream (it yields ``Upstream``
cursors and has ``reattach``: the Responses API in background mode) is
re-attached after the last event handled, at most ``max_reattaches`` times,
with a ``Retry attempt: re-attach k/N; <reason>`` status: the same answer goes
on, nothing is regenerated or billed twice, and its tool calls are whole. A
re-attach the server refuses (the response expired) falls back to rules 2-3.
The cursor is handed to the sink (``upstream``) so that the run's journal
holds it and another worker can re-attach after this one is lost.
Text is made storable as it arrives (``journal.events.storable``: NUL and lone
surrogates become U+FFFD), so what is shown, journaled and kept is the same.
Nothing here touches Django or awaits a database inside the read loop: the sink's
``token``/``reasoning``/``status`` are plain calls that hand data to a batcher.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

from chat.providers.base import (
    CANCELLED,
    NETWORK,
    PROVIDER,
    TIMEOUT,
    ContentDelta,
    Finish,
    Provider,
    ProviderError,
    ReasoningDelta,
    RequestStats,
    ToolCallDelta,
    Upstream,
    Usage,
)
from journal.events import REATTACH_STATUS, RESUME_STATUS, storable
from journal.fold import usage_sum

logger = logging.getLogger(__name__)

COMPLETED: Final = "completed"
FAILED: Final = "failed"
CANCELLED_OUTCOME: Final = "cancelled"
MAX_STREAM_SECONDS = 30 * 60  # rule 5: no honest answer streams for half an hour
MAX_CONTENT_BYTES = 10 * 2**20  # rule 5: bounds memory and the journal per stream
MAX_REATTACHES = 3  # re-attaches per stream: a cut is cheap, an endless loop is not
MIN_RATE_SPAN_S = 0.25  # a shorter stream is a burst: no tokens/s is shown
CURSOR_EVERY_S = 1.0  # journal the upstream cursor this often: a takeover re-reads
# at most this much of the stream (the first cursor of a stream goes at once)


class TurnSink(Protocol):
    """Where a turn's output goes; the worker's implementation journals it."""

    def token(self, text: str) -> None:
        """Visible text; must not block (hand it to a batching writer)."""

    def reasoning(self, text: str) -> None:
        """Reasoning text; must not block."""

    def status(self, message: str) -> None:
        """A status line such as a stream-resume notice; must not block."""

    async def commit_partial(self, content: str, reasoning: str) -> None:
        """Persist the shown partial as an assistant message (rule 3)."""

    def upstream(
        self, cursor: Upstream, content_chars: int, reasoning_chars: int
    ) -> None:
        """The upstream cursor, and how much of this stream was shown by then."""


@dataclass(frozen=True)
class Reattach:
    """A stream another worker was reading, to re-attach to instead of POSTing.

    ``content``/``reasoning`` are what the journal holds of it; the cursor
    was journaled when ``content_at_cursor``/``reasoning_at_cursor`` of them
    had been shown, so that much more of the re-attached stream is skipped.
    """

    upstream: Upstream
    content: str
    reasoning: str
    content_at_cursor: int
    reasoning_at_cursor: int


@dataclass(frozen=True)
class TurnError:
    category: str
    message: str
    retryable: bool = False


@dataclass
class TurnResult:
    """How a turn ended.

    ``content``/``reasoning`` are the last stream's text, not yet committed
    (earlier fragments went through ``commit_partial``). ``tool_calls`` come
    only from a stream that finished. ``usage`` holds only what the provider
    reported, summed over the turn's streams (``None`` if none reported).
    """

    outcome: str
    content: str = ""
    reasoning: str = ""
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    usage: dict[str, Any] | None = None
    finish_reason: str | None = None
    error: TurnError | None = None
    diagnostics: dict[str, Any] = field(default_factory=dict)
    upstream: Upstream | None = None  # the last stream's response kept upstream


@dataclass
class _Attempt:
    """What one stream (one POST that got headers, or not) produced."""

    content: list[str] = field(default_factory=list)
    reasoning: list[str] = field(default_factory=list)
    calls: dict[int, dict[str, Any]] = field(default_factory=dict)
    usage: dict[str, Any] | None = None
    finish_reason: str | None = None
    size: int = 0
    upstream: Upstream | None = None
    journaled_at: float | None = None  # when the cursor was last handed on
    skip_content: int = 0  # shown by a lost worker after its last cursor
    skip_reasoning: int = 0

    @classmethod
    def resuming(cls, taken: Reattach) -> _Attempt:
        return cls(
            content=[taken.content] if taken.content else [],
            reasoning=[taken.reasoning] if taken.reasoning else [],
            upstream=taken.upstream,
            skip_content=max(0, len(taken.content) - taken.content_at_cursor),
            skip_reasoning=max(0, len(taken.reasoning) - taken.reasoning_at_cursor),
        )

    @property
    def text(self) -> str:
        return "".join(self.content)

    @property
    def thought(self) -> str:
        return "".join(self.reasoning)

    @property
    def shown(self) -> bool:
        return bool(self.content or self.reasoning)

    def add_call(self, delta: ToolCallDelta) -> None:
        call = self.calls.setdefault(
            delta.index,
            {"id": None, "type": "function", "function": {"name": "", "arguments": ""}},
        )
        # id and name arrive once, first; some servers repeat them, so keep the first.
        call["id"] = call["id"] or delta.id
        call["function"]["name"] = call["function"]["name"] or delta.name or ""
        call["function"]["arguments"] += delta.arguments

    def skip(
        self, item: ContentDelta | ReasoningDelta
    ) -> ContentDelta | ReasoningDelta | None:
        """Drop what a lost worker already showed past its journaled cursor."""
        if isinstance(item, ContentDelta) and self.skip_content:
            cut = min(self.skip_content, len(item.text))
            self.skip_content -= cut
            return ContentDelta(item.text[cut:]) if item.text[cut:] else None
        if isinstance(item, ReasoningDelta) and self.skip_reasoning:
            cut = min(self.skip_reasoning, len(item.text))
            self.skip_reasoning -= cut
            return ReasoningDelta(item.text[cut:]) if item.text[cut:] else None
        return item

    def moved(self, cursor: Upstream, sink: TurnSink) -> None:
        """Keep the cursor; hand it on when new, then every ``CURSOR_EVERY_S``."""
        new = self.upstream is None or self.upstream.response_id != cursor.response_id
        self.upstream = cursor
        now = time.monotonic()
        if (
            new
            or self.journaled_at is None
            or now - self.journaled_at >= CURSOR_EVERY_S
        ):
            self.journaled_at = now
            sink.upstream(cursor, len(self.text), len(self.thought))

    def tool_calls(self) -> list[dict[str, Any]]:
        calls = [self.calls[i] for i in sorted(self.calls)]
        for call in calls:
            call["id"] = call["id"] or f"call_{secrets.token_hex(8)}"
        return calls


@dataclass
class _Meter:
    """First-token latency and delta rate over the whole turn."""

    started: float = field(default_factory=time.monotonic)
    first: float | None = None
    last: float = 0.0
    deltas: int = 0

    def tick(self) -> None:
        now = time.monotonic()
        self.first = self.first or now
        self.last = now
        self.deltas += 1

    def report(self) -> dict[str, Any]:
        span = self.last - self.first if self.first else 0.0
        return {
            "first_token_ms": (
                round((self.first - self.started) * 1000) if self.first else None
            ),
            # Delta frames per second: OpenAI-compatible servers send about one
            # token per frame; usage, when reported, is the exact count. The
            # frames after the first came over the span; an answer that came
            # in one burst has no rate worth showing (it read 72,707.9 tok/s).
            "tokens_per_s": (
                round((self.deltas - 1) / span, 1) if span >= MIN_RATE_SPAN_S else None
            ),
        }


async def run_turn(
    provider: Provider,
    *,
    model: str,
    messages: Sequence[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    sink: TurnSink,
    cancel: asyncio.Event,
    max_stream_retries: int = 3,
    max_transparent_retries: int = 2,
    max_stream_seconds: float = MAX_STREAM_SECONDS,
    max_content_bytes: int = MAX_CONTENT_BYTES,
    max_reattaches: int = MAX_REATTACHES,
    reattach: Reattach | None = None,
) -> TurnResult:
    """Run one model step to completion, failure or cancel (see module doc).

    Never raises ``ProviderError``; a ``CancelledError`` of the calling task
    propagates after the HTTP response was closed. ``reattach``: begin by
    re-attaching to a stream a lost worker was reading.
    """
    turn = _Turn(
        provider,
        model=model,
        tools=tools,
        sink=sink,
        cancel=cancel,
        max_resumes=max_stream_retries,
        max_reopens=max_transparent_retries,
        max_seconds=max_stream_seconds,
        max_bytes=max_content_bytes,
        max_reattaches=max_reattaches,
    )
    return await turn.run(list(messages), reattach)


@dataclass
class _Turn:
    """The state of one ``run_turn`` call: counters, usage, limits."""

    provider: Provider
    model: str
    tools: list[dict[str, Any]] | None
    sink: TurnSink
    cancel: asyncio.Event
    max_resumes: int
    max_reopens: int
    max_seconds: float
    max_bytes: int
    max_reattaches: int = MAX_REATTACHES
    stats: RequestStats = field(default_factory=RequestStats)
    meter: _Meter = field(default_factory=_Meter)
    usage: dict[str, Any] | None = None
    resumes: int = 0
    reopens: int = 0
    reattaches: int = 0

    async def run(
        self, history: list[dict[str, Any]], taken: Reattach | None = None
    ) -> TurnResult:
        attempt = _Attempt.resuming(taken) if taken else _Attempt()
        via = attempt.upstream  # re-attach to this instead of POSTing
        while True:
            if self.cancel.is_set():
                self.usage = _sum_usage(self.usage, attempt.usage)
                return self._result(CANCELLED_OUTCOME, attempt, _cancelled())
            error = await _stream_once(
                self.provider,
                cancel=self.cancel,
                max_seconds=self.max_seconds,
                model=self.model,
                messages=list(history),
                tools=self.tools,
                sink=self.sink,
                attempt=attempt,
                via=via,
                stats=self.stats,
                meter=self.meter,
                max_bytes=self.max_bytes,
            )
            if via is not None and error is not None and _refused(error):
                # The response is gone upstream (expired) or out of reach:
                # what was shown stands, and rules 2-3 take over.
                attempt.upstream = None
                error = ProviderError(
                    NETWORK,
                    error.message,
                    retryable=True,
                    during_stream=True,
                    reason=f"re-attach refused: {error.reason}",
                )
            via = self._reattach_to(error, attempt)
            if via is not None:
                continue  # the same attempt reads on
            self.usage = _sum_usage(self.usage, attempt.usage)
            outcome = self._verdict(error, attempt)
            if outcome is not None:
                return self._result(outcome, attempt, error)
            assert error is not None
            if attempt.shown:
                await self._prepare_resume(error, attempt, history)
            attempt = _Attempt()

    def _reattach_to(
        self, error: ProviderError | None, attempt: _Attempt
    ) -> Upstream | None:
        """The upstream response to re-attach to after this fault, if any."""
        if (
            error is None
            or not error.during_stream
            or error.final
            or error.category == CANCELLED
            or attempt.upstream is None
            or not hasattr(self.provider, "reattach")
            or self.reattaches >= self.max_reattaches
        ):
            return None
        self.reattaches += 1
        logger.warning("stream died (%s); re-attach %d", error, self.reattaches)
        self.sink.status(
            f"{REATTACH_STATUS} {self.reattaches}/{self.max_reattaches}; {error.reason}"
        )
        return attempt.upstream

    def _verdict(self, error: ProviderError | None, attempt: _Attempt) -> str | None:
        """How the turn ends after this stream, or ``None`` to POST again."""
        if error is None:
            return COMPLETED
        if error.category == CANCELLED:
            return CANCELLED_OUTCOME
        if not error.during_stream:  # rule 1 already retried it, or a cap
            return FAILED
        if not attempt.shown:  # rule 2
            if self.reopens >= self.max_reopens:
                return FAILED
            self.reopens += 1
            logger.info("stream died before content (%s); reopening", error.message)
            return None
        if self.resumes >= self.max_resumes:  # rule 3, exhausted
            return FAILED
        self.resumes += 1
        logger.warning("stream died after content (%s); resume %d", error, self.resumes)
        return None

    async def _prepare_resume(
        self, error: ProviderError, attempt: _Attempt, history: list[dict[str, Any]]
    ) -> None:
        """Rule 3: keep the shown partial, say so, end the history with it."""
        await self.sink.commit_partial(attempt.text, attempt.thought)
        self.sink.status(
            f"{RESUME_STATUS} {self.resumes}/{self.max_resumes}; {error.reason}"
        )
        if attempt.content:
            # Reasoning-only partials are committed but not replayed: an empty
            # assistant message would give the model nothing to continue from.
            # A second resume extends the first's message: the request ends in
            # one assistant message holding all that was shown, which servers
            # that continue a final assistant message continue, and which keeps
            # the roles alternating for chat templates that require it.
            last = history[-1] if history else None
            if last is not None and _plain_assistant(last):
                history[-1] = {**last, "content": last["content"] + attempt.text}
            else:
                history.append({"role": "assistant", "content": attempt.text})

    def _result(
        self, outcome: str, attempt: _Attempt, error: ProviderError | None
    ) -> TurnResult:
        done = outcome == COMPLETED
        return TurnResult(
            outcome=outcome,
            content=attempt.text,
            reasoning=attempt.thought,
            tool_calls=attempt.tool_calls() if done else [],
            usage=self.usage,
            finish_reason=(attempt.finish_reason or "stop") if done else None,
            error=(
                TurnError(error.category, error.message, error.retryable)
                if error
                else None
            ),
            diagnostics={
                "model_requests_started": self.stats.requests_started,
                "http_retries": self.stats.http_retries,
                "transparent_retries": self.reopens,
                "stream_resumes": self.resumes,
                "stream_reattaches": self.reattaches,
                **self.meter.report(),
            },
            upstream=attempt.upstream,
        )


async def _stream_once(
    provider: Provider,
    *,
    cancel: asyncio.Event,
    max_seconds: float,
    **read_args: Any,
) -> ProviderError | None:
    """Read one stream in a task raced against ``cancel`` and the time cap.

    Returns the fault, a ``cancelled``/``timeout`` error, or ``None`` when the
    stream finished. Cancelling the reader closes the HTTP response at once.
    """
    reader = asyncio.create_task(_read(provider, **read_args))
    waiter = asyncio.create_task(cancel.wait())
    try:
        done, _ = await asyncio.wait(
            {reader, waiter}, timeout=max_seconds, return_when=asyncio.FIRST_COMPLETED
        )
    finally:
        waiter.cancel()
        if not reader.done():
            reader.cancel()
            await asyncio.wait({reader})  # its finally blocks close the response
    if waiter in done or cancel.is_set():  # rule 4: cancel wins every race
        if not reader.cancelled():
            reader.exception()  # retrieved: a fault that lost the race is moot
        return _cancelled()
    if reader not in done:
        return ProviderError(TIMEOUT, f"stream exceeded the {max_seconds:g} s cap")
    if reader.cancelled():  # cannot happen unless someone else cancelled it
        return _cancelled()
    exc = reader.exception()
    if exc is None or isinstance(exc, ProviderError):
        return exc
    raise exc


def _refused(error: ProviderError) -> bool:
    """A re-attach that failed before any stream (404 expired, retries spent)."""
    return not error.during_stream and error.category != CANCELLED


async def _read(
    provider: Provider,
    *,
    model: str,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    sink: TurnSink,
    attempt: _Attempt,
    via: Upstream | None,
    stats: RequestStats,
    meter: _Meter,
    max_bytes: int,
) -> None:
    """Consume one stream (or a re-attach ``via``) into ``attempt``."""
    if via is not None:
        stream = provider.reattach(via, stats=stats)  # type: ignore[attr-defined]
    else:
        stream = provider.stream(model, messages, tools, stats=stats)
    async with contextlib.aclosing(stream) as items:
        async for item in items:
            if isinstance(item, ContentDelta | ReasoningDelta):
                item = attempt.skip(item)
                if item is None:
                    continue
            if isinstance(item, ContentDelta):
                text = storable(item.text)  # no NUL, no lone surrogate
                attempt.content.append(text)
                attempt.size += len(text.encode())
                meter.tick()
                sink.token(text)
            elif isinstance(item, ReasoningDelta):
                text = storable(item.text)
                attempt.reasoning.append(text)
                attempt.size += len(text.encode())
                meter.tick()
                sink.reasoning(text)
            elif isinstance(item, ToolCallDelta):
                attempt.add_call(item)
                attempt.size += len(item.arguments.encode())
            elif isinstance(item, Finish):
                attempt.finish_reason = item.reason
            elif isinstance(item, Usage):
                attempt.usage = _max_usage(attempt.usage, item.data)
            elif isinstance(item, Upstream):
                attempt.moved(item, sink)
            if attempt.size > max_bytes:
                raise ProviderError(
                    PROVIDER, f"stream exceeded the {max_bytes} byte cap"
                )


def _plain_assistant(message: dict[str, Any] | None) -> bool:
    """An assistant message of text alone (no tool calls, no content parts)."""
    return (
        message is not None
        and message.get("role") == "assistant"
        and isinstance(message.get("content"), str)
        and not message.get("tool_calls")
    )


def _cancelled() -> ProviderError:
    return ProviderError(CANCELLED, "cancelled by the user")


def _max_usage(old: dict[str, Any] | None, new: dict[str, Any]) -> dict[str, Any]:
    """Merge two reports of one stream: numbers by max (cumulative counters)."""
    return _merge(old or {}, new, max)


def _sum_usage(
    total: dict[str, Any] | None, stream: dict[str, Any] | None
) -> dict[str, Any] | None:
    """Add one stream's usage to the turn's: every POST billed its own tokens."""
    return usage_sum(total, stream)


def _merge(
    a: dict[str, Any], b: dict[str, Any], combine: Callable[[Any, Any], Any]
) -> dict[str, Any]:
    out = dict(a)
    for key, value in b.items():
        old = out.get(key)
        if isinstance(value, dict) and isinstance(old, dict):
            out[key] = _merge(old, value, combine)
        elif _is_number(value) and _is_number(old):
            out[key] = combine(old, value)
        elif value is not None or key not in out:
            out[key] = value
    return out


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)
