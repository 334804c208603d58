"""What every model provider yields and raises (docs/architecture.md §6).

A provider's ``stream()`` is an async generator of the small items below. The
caller must close it (``contextlib.aclosing``) when it stops early; closing, or
cancelling the task that iterates it, closes the HTTP response at once.
Errors are one type, :class:`ProviderError`, whose ``category`` is one of the
seven the journal records.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import Any, Final, Protocol, runtime_checkable

from chat.redact import redact

NETWORK: Final = "network"
TIMEOUT: Final = "timeout"
RATE_LIMIT: Final = "rate_limit"
PROVIDER: Final = "provider"
AUTH: Final = "auth"
INVALID_REQUEST: Final = "invalid_request"
CANCELLED: Final = "cancelled"
CATEGORIES: Final = frozenset(
    {NETWORK, TIMEOUT, RATE_LIMIT, PROVIDER, AUTH, INVALID_REQUEST, CANCELLED}
)


@dataclass(frozen=True, slots=True)
class ContentDelta:
    """Visible assistant text."""

    text: str


@dataclass(frozen=True, slots=True)
class ReasoningDelta:
    """Reasoning text (``reasoning_content`` or ``reasoning`` on the wire)."""

    text: str


@dataclass(frozen=True, slots=True)
class ToolCallDelta:
    """A fragment of streamed tool call ``index``; id and name usually come first."""

    index: int
    id: str | None = None
    name: str | None = None
    arguments: str = ""


@dataclass(frozen=True, slots=True)
class Finish:
    """The model said why it stopped (``stop``, ``length``, ``tool_calls`` …)."""

    reason: str


@dataclass(frozen=True, slots=True)
class Usage:
    """A usage report exactly as the provider sent it (never estimated)."""

    data: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Upstream:
    """Where the stream stands in a response the provider keeps upstream.

    Only providers that can re-attach to a response (``reattach``) yield it:
    ``sequence`` is the last upstream event handled, so re-attaching after it
    continues exactly there (docs/architecture.md, "Two cursors").
    """

    response_id: str
    sequence: int


StreamItem = ContentDelta | ReasoningDelta | ToolCallDelta | Finish | Usage | Upstream


class ProviderError(Exception):
    """A model request failed.

    ``retryable`` says whether trying again later may help (shown to users);
    ``during_stream`` is true when the failure struck after response headers,
    which is what the turn engine resumes or reopens:
    See docs/architecture.md §6 rules 2-3.
    failures before headers were already retried by the provider (rule 1).
    ``reason`` is a short label for status messages (``body cut``).
    ``final`` says the upstream response itself failed, so re-attaching to it
    cannot help (only providers that re-attach set it).
    """

    def __init__(
        self,
        category: str,
        message: str,
        *,
        retryable: bool = False,
        status_code: int | None = None,
        during_stream: bool = False,
        reason: str | None = None,
        final: bool = False,
    ) -> None:
        if category not in CATEGORIES:
            raise ValueError(f"unknown error category {category!r}")
        # Provider text is outside input: no secrets, bounded (chat/redact.py).
        message = redact(message)
        super().__init__(message)
        self.category = category
        self.message = message
        self.retryable = retryable
        self.status_code = status_code
        self.during_stream = during_stream
        self.reason = redact(reason) if reason else message
        self.final = final

    def __repr__(self) -> str:
        return f"ProviderError({self.category!r}, {self.message!r})"


@dataclass(slots=True)
class RequestStats:
    """Per-caller counters, so concurrent turns on one provider stay apart."""

    requests_started: int = 0
    http_retries: int = 0


@runtime_checkable
class Provider(Protocol):
    """The interface the turn engine and the worker rely on."""

    name: str
    active_requests: int
    requests_started: int
    http_retries: int

    def stream(
        self,
        model: str,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        *,
        stats: RequestStats | None = None,
        max_tokens: int | None = None,
    ) -> AsyncGenerator[StreamItem, None]:
        """Yield the items of one completion; see the module docstring.
        ``max_tokens`` bounds this one answer below the provider's limit."""
        ...

    async def list_models(self) -> list[str]:
        """Model ids this provider serves."""
        ...

    async def aclose(self) -> None:
        """Release pooled connections."""
        ...

    def discard(self) -> None:
        """Let pooled connections go from any thread (settings changed)."""
        ...


# The system message of a title run (`chat.titles`); the demo provider knows it.
TITLE_INSTRUCTION = (
    "Write a title of at most six words for the conversation below. "
    "Answer with the title only: no quotes, no final period."
)
