"""Executing one claimed run: the tool loop over the turn engine, journaled (DESIGN §6).

Everything the run shows goes through a `BatchWriter` holding the claim's
fencing token. Whatever way the run ends, the assistant text that was shown is
in the session exactly once and the journal ends with exactly one `end`: the
final message and the `end` are written in one fenced transaction, so a runner
that lost its lease writes neither.
"""

import asyncio
import logging
import time
from dataclasses import dataclass, field

from django.conf import settings
from django.db import transaction

from journal import dbpool, metrics
from journal.leases import Claim
from journal.logcontext import run_logging
from journal.models import Run
from journal.publish import publish
from journal.store import AppendRejected, append

from . import tools as tool_registry
from .models import ChatSession, Message
from .providers import registry
from .turn import CANCELLED_OUTCOME, COMPLETED, run_turn
from .writer import BatchWriter

log = logging.getLogger(__name__)

MAX_TOOL_STEPS = 8  # model calls per run: bounds a model that keeps calling tools

_DIAG_SUMS = (
    "model_requests_started",
    "http_retries",
    "transparent_retries",
    "stream_resumes",
)


def session_history(*, session_id: int) -> list[dict]:
    """The conversation as the provider receives it, each message once, in order."""
    session = ChatSession.objects.get(pk=session_id)
    history = (
        [{"role": "system", "content": session.system_prompt}]
        if session.system_prompt
        else []
    )
    for m in session.messages.order_by("id"):
        if m.role == Message.Role.TOOL:
            history.append(
                {"role": "tool", "tool_call_id": m.tool_call_id, "content": m.content}
            )
        elif m.role == Message.Role.ASSISTANT and m.tool_calls:
            history.append(
                {"role": "assistant", "content": m.content, "tool_calls": m.tool_calls}
            )
        else:
            history.append({"role": m.role, "content": m.content})
    return history


def _load(run_id: str) -> tuple[Run, list[dict]]:
    run = Run.objects.get(id=run_id)
    return run, session_history(session_id=run.session_id)


def _fenced(claim: Claim) -> None:
    """Inside a transaction: fail unless the claim still holds the run."""
    held = (
        Run.objects.select_for_update()
        .filter(id=claim.run_id, fencing_token=claim.token, status=Run.Status.RUNNING)
        .exists()
    )
    if not held:
        raise AppendRejected(claim.run_id, "lease lost")


def _keep_message(claim: Claim, session_id: int, **fields) -> int:
    with transaction.atomic():
        _fenced(claim)
        return Message.objects.create(
            session_id=session_id, run_id=claim.run_id, **fields
        ).id


class _Sink:
    """The turn engine's sink: journal text through the writer, keep partials."""

    def __init__(self, writer: BatchWriter, claim: Claim, session_id: int):
        self.writer, self.claim, self.session_id = writer, claim, session_id

    def token(self, text: str) -> None:
        self.writer.add("token", {"text": text})

    def reasoning(self, text: str) -> None:
        self.writer.add("reasoning", {"text": text})

    def status(self, message: str) -> None:
        self.writer.add("status", {"message": message})

    async def commit_partial(self, content: str, reasoning: str) -> None:
        await self.writer.flush()  # the fragment is journaled before it is kept
        await dbpool.writers.run(
            _keep_message,
            self.claim,
            self.session_id,
            role=Message.Role.ASSISTANT,
            content=content,
            reasoning=reasoning,
            complete=False,
        )


def _merge_diagnostics(total: dict, step: dict) -> None:
    """Add one model step's diagnostics to the run's: counters add up, the first
    token is the run's first, the rate is the latest step's."""
    for key in _DIAG_SUMS:
        total[key] += step.get(key) or 0
    if step.get("first_token_ms") is not None:
        metrics.FIRST_TOKEN_S.observe(step["first_token_ms"] / 1000)
        total.setdefault("first_token_ms", step["first_token_ms"])
    if step.get("tokens_per_s") is not None:
        total["tokens_per_s"] = step["tokens_per_s"]


def _usage_event(usage: dict) -> dict:
    mapped = {
        "input_tokens": usage.get("prompt_tokens", usage.get("input_tokens")),
        "output_tokens": usage.get("completion_tokens", usage.get("output_tokens")),
        "total_tokens": usage.get("total_tokens"),
    }
    return {k: v for k, v in mapped.items() if isinstance(v, int)}


def _merge_usage(total: dict | None, step: dict | None) -> dict | None:
    if step is None:
        return total
    merged = dict(total or {})
    for key, value in step.items():
        if isinstance(value, int):
            merged[key] = merged.get(key, 0) + value
    return merged


def _finish(
    claim: Claim,
    session_id: int,
    *,
    message: dict | None,
    events: list,
    run_fields: dict,
):
    """The last write of a run: its final message and `end`, in one transaction.

    The `end` append is fenced; if it is rejected the transaction, message
    included, rolls back.
    """
    with transaction.atomic():
        message_id = None
        if message is not None:
            message_id = Message.objects.create(
                session_id=session_id, run_id=claim.run_id, **message
            ).id
        end_type, end_payload = events[-1]
        events[-1] = (end_type, {**end_payload, "message_id": message_id})
        return append(
            run_id=claim.run_id, token=claim.token, events=events, run_fields=run_fields
        )


@dataclass
class RunControl:
    """How the worker stops a run: `stop` is raced by every read; `reason` says why."""

    stop: asyncio.Event = field(default_factory=asyncio.Event)
    reason: str = ""  # "cancel" (the user) or "shutdown" (the worker is stopping)

    def request(self, reason: str) -> None:
        self.reason = self.reason or reason
        self.stop.set()


async def execute_run(claim: Claim, control: RunControl) -> str:
    """Run a claimed run to its `end`; returns the final status written (or "fenced")."""
    run, history = await dbpool.readers.run(_load, claim.run_id)
    with run_logging(run_id=claim.run_id, session_id=run.session_id):
        return await _drive(claim, control, run, history)


async def _drive(
    claim: Claim, control: RunControl, run: Run, history: list[dict]
) -> str:
    writer = BatchWriter(run_id=claim.run_id, token=claim.token)
    sink = _Sink(writer, claim, run.session_id)
    writer.add(
        "start",
        {"model": run.model, "provider": run.provider, "session_id": run.session_id},
    )
    provider = registry.get_provider(run.provider)
    schema = tool_registry.tools_schema() or None
    diagnostics: dict = dict.fromkeys(_DIAG_SUMS, 0)
    usage = None
    started = time.monotonic()
    try:
        for step in range(MAX_TOOL_STEPS):
            result = await run_turn(
                provider,
                model=run.model,
                messages=history,
                tools=schema if step < MAX_TOOL_STEPS - 1 else None,
                sink=sink,
                cancel=control.stop,
                max_stream_retries=settings.HERMES["MAX_STREAM_RETRIES"],
            )
            _merge_diagnostics(diagnostics, result.diagnostics)
            usage = _merge_usage(usage, result.usage)
            if result.outcome != COMPLETED or not result.tool_calls:
                break
            history += await _run_tools(result, writer, claim, run.session_id)
        await writer.flush()
    except AppendRejected:
        await writer.close()
        log.warning("run fenced out, stopping run_id=%s", claim.run_id)
        return "fenced"
    diagnostics["duration_ms"] = round((time.monotonic() - started) * 1000)
    diagnostics["journal_rows"] = writer.rows_written
    events, status = _closing_events(result, usage, control.reason)
    message = None
    if result.content or result.reasoning or result.outcome == COMPLETED:
        message = {
            "role": Message.Role.ASSISTANT,
            "content": result.content,
            "reasoning": result.reasoning,
            "complete": result.outcome == COMPLETED,
        }
    try:
        records = await dbpool.writers.run(
            _finish,
            claim,
            run.session_id,
            message=message,
            events=events,
            run_fields={
                "usage": _usage_event(usage) if usage else {},
                "diagnostics": diagnostics,
            },
        )
    except AppendRejected:
        log.warning("run fenced out at the end run_id=%s", claim.run_id)
        return "fenced"
    finally:
        await writer.close()
    await publish(claim.run_id, records)
    log.info(
        "run ended run_id=%s session_id=%s status=%s",
        claim.run_id,
        run.session_id,
        status,
    )
    return status


def _closing_events(result, usage, stop_reason: str):
    events: list = []
    if usage:
        events.append(("usage", _usage_event(usage)))
    if result.outcome == COMPLETED:
        status, state, error = Run.Status.COMPLETED, "completed", None
    elif result.outcome == CANCELLED_OUTCOME and stop_reason == "shutdown":
        status, state, error = Run.Status.INTERRUPTED, "worker-shutdown", None
    elif result.outcome == CANCELLED_OUTCOME:
        status, state, error = Run.Status.CANCELLED, "cancelled-by-user", None
    else:
        err = result.error
        error = {
            "category": err.category,
            "message": err.message,
            "retryable": err.retryable,
        }
        events.append(("error", error))
        status, state = Run.Status.FAILED, "provider-error"
    payload = {"status": status, "terminal_state": state}
    if error:
        payload["error"] = {"category": error["category"], "message": error["message"]}
    events.append(("end", payload))
    return events, status


async def _run_tools(
    result, writer: BatchWriter, claim: Claim, session_id: int
) -> list[dict]:
    """Keep the assistant's tool-call step, run each tool, keep and journal results."""
    await writer.flush()
    await dbpool.writers.run(
        _keep_message,
        claim,
        session_id,
        role=Message.Role.ASSISTANT,
        content=result.content,
        reasoning=result.reasoning,
        tool_calls=result.tool_calls,
    )
    added = [
        {
            "role": "assistant",
            "content": result.content,
            "tool_calls": result.tool_calls,
        }
    ]
    for call in result.tool_calls:
        name, args = call["function"]["name"], call["function"]["arguments"]
        writer.add("tool", {"tool_call_id": call["id"], "name": name, "args": args})
        began = time.monotonic()
        output, is_error = await tool_registry.run_tool(name, args)
        writer.add(
            "tool_complete",
            {
                "tool_call_id": call["id"],
                "name": name,
                "result": output,
                "is_error": is_error,
                "duration_ms": round((time.monotonic() - began) * 1000, 1),
            },
        )
        await writer.flush()
        await dbpool.writers.run(
            _keep_message,
            claim,
            session_id,
            role=Message.Role.TOOL,
            content=output,
            tool_call_id=call["id"],
        )
        added.append({"role": "tool", "tool_call_id": call["id"], "content": output})
    return added
