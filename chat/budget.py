"""A run's bounds: model steps, tool calls, tokens and wall time
(docs/architecture.md §6, "Bounded agent loops").

1. Steps (``HERMES_RUN_MAX_STEPS``): model calls per run. The last step is
   offered no tools, so the model answers with what it has; a model that asks
   for tools anyway ends the run ``step-limit``.
2. Tool calls (``HERMES_RUN_MAX_TOOL_CALLS``): calls past it are not run and
   answer the model an error; the next step is then the last (rule 1), and a
   model that still asks for tools ends the run ``tool-call-limit``.
3. Tokens (``HERMES_RUN_MAX_TOKENS``, 0: unbounded): counted only from what
   the provider reported, after each step; a step that asks for tools once the
   budget is spent ends the run ``token-limit`` (a finished answer stands).
4. Wall time (``HERMES_RUN_MAX_SECONDS``, 0: unbounded): raced like a cancel;
   the run ends ``time-limit`` with what it showed kept.
A bound that ends a run ends it ``failed``, error category ``limit``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from django.conf import settings

STEP_LIMIT: Final = "step-limit"
TOOL_CALL_LIMIT: Final = "tool-call-limit"
TOKEN_LIMIT: Final = "token-limit"
TIME_LIMIT: Final = "time-limit"
LIMIT_CATEGORY: Final = "limit"


@dataclass
class Budget:
    """What a run may still spend, and what it spent."""

    max_steps: int
    max_tool_calls: int
    max_tokens: int
    max_seconds: float
    steps: int = 0
    tool_calls: int = 0
    tokens: int = 0

    @classmethod
    def from_settings(cls) -> Budget:
        hermes = settings.HERMES
        return cls(
            max_steps=max(1, int(hermes.get("RUN_MAX_STEPS", 8))),
            max_tool_calls=max(0, int(hermes.get("RUN_MAX_TOOL_CALLS", 32))),
            max_tokens=max(0, int(hermes.get("RUN_MAX_TOKENS", 0))),
            max_seconds=max(0.0, float(hermes.get("RUN_MAX_SECONDS", 1800.0))),
        )

    def arm_clock(self, expire: Callable[[str], None]) -> asyncio.TimerHandle | None:
        """Call ``expire(TIME_LIMIT)`` when the run's wall time is spent."""
        if not self.max_seconds:
            return None
        loop = asyncio.get_running_loop()
        return loop.call_later(self.max_seconds, expire, TIME_LIMIT)

    @property
    def final_step(self) -> bool:
        """Whether the step about to run is the last (it is offered no tools)."""
        return self.steps + 1 >= self.max_steps or self._tool_calls_spent

    @property
    def _tool_calls_spent(self) -> bool:
        return self.tool_calls >= self.max_tool_calls

    def progress(self) -> str:
        """The status line of the step about to run (journaled from step 2)."""
        return f"Step {self.steps + 1} of at most {self.max_steps}"

    def spend_tokens(self, usage: dict[str, Any] | None) -> None:
        """The run's tokens so far, from its merged provider usage."""
        if not usage:
            return
        total = usage.get("total_tokens")
        if not isinstance(total, int):
            total = sum(
                v
                for k in ("prompt_tokens", "completion_tokens")
                if isinstance(v := usage.get(k), int)
            )
        self.tokens = total

    def refuse_tool_call(self) -> str | None:
        """Count one tool call; the error the model gets if it is past the budget."""
        if self._tool_calls_spent:
            return (
                f"error: not run: this run may make at most {self.max_tool_calls} "
                "tool calls; answer with what you have"
            )
        self.tool_calls += 1
        return None

    def bound_after(self, *, was_final: bool) -> str | None:
        """The bound that ends a run whose last step asked for tools, if any."""
        if was_final:
            return TOOL_CALL_LIMIT if self._tool_calls_spent else STEP_LIMIT
        if self.max_tokens and self.tokens >= self.max_tokens:
            return TOKEN_LIMIT
        return None

    def error(self, bound: str) -> dict[str, Any]:
        """The run's error for the bound that ended it."""
        message = {
            STEP_LIMIT: f"the run reached its limit of {self.max_steps} model steps",
            TOOL_CALL_LIMIT: (
                f"the run reached its limit of {self.max_tool_calls} tool calls"
            ),
            TOKEN_LIMIT: (
                f"the run used {self.tokens} tokens of its {self.max_tokens} budget"
            ),
            TIME_LIMIT: f"the run reached its limit of {self.max_seconds:g} s",
        }[bound]
        return {"category": LIMIT_CATEGORY, "message": message, "retryable": False}
