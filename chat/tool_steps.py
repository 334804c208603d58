"""A run's tool steps: each call of the model's step answered in order,
journaled as `tool` / `tool_complete` and kept in the session
(docs/architecture.md §6). Built-in tools run in killable processes
(chat.tools), MCP tools through chat.mcp_tools; every call is raced by the
run's stop, bounded by its budget (chat.budget) and gated by the approval
policy (chat.approvals). `chat.runner` drives the steps.

Each call is journaled under an id unique within its run (`Gate.call_id`),
as `tool` before anything else happens to it; the session and the model keep
the provider's own id, so the next request answers each call as the model
made it. A person's decision applies only to the call it was shown.
"""

import asyncio
import time
from collections.abc import Awaitable
from typing import Protocol, TypeVar

from journal.events import storable

from . import mcp_tools
from . import tools as tool_registry
from .approvals import ASK, DENY, Gate
from .budget import Budget
from .models import Message
from .writer import BatchWriter

T = TypeVar("T")


class Keeper(Protocol):
    """Where a step's results go: the run's writer, and its session."""

    writer: BatchWriter

    async def keep(self, **fields) -> int: ...


class AwaitingApproval(Exception):
    """A tool call needs a person's decision: the attempt ends, the run waits."""

    def __init__(self, request: dict):
        super().__init__(request["tool_call_id"])
        self.request = request


async def run_tools(
    result, sink: Keeper, budget: Budget, stop: asyncio.Event, gate: Gate
) -> list[dict]:
    """Keep the assistant's tool-call step, then answer its calls (`_answer_calls`)."""
    writer = sink.writer
    await writer.flush()
    await sink.keep(
        role=Message.Role.ASSISTANT,
        content=result.content,
        reasoning=result.reasoning,
        tool_calls=result.tool_calls,
    )
    step = {"role": "assistant", "content": result.content}
    step["tool_calls"] = result.tool_calls
    calls = list(enumerate(result.tool_calls))
    return [step, *await _answer_calls(calls, sink, budget, stop, gate)]


async def answer_pending(
    history: list[dict], sink: Keeper, budget: Budget, stop: asyncio.Event, gate: Gate
) -> list[dict]:
    """A resumed run: answer the calls of its last tool step that have no
    result yet (the one that waited for a decision, and those after it).

    Results are kept in the order of the calls, so the step's first calls
    are the answered ones, however the provider named them (ids may repeat).
    """
    steps = [i for i, m in enumerate(history) if m.get("tool_calls")]
    if not steps or history[steps[-1]]["role"] != "assistant":
        return []
    after = history[steps[-1] + 1 :]
    answered = sum(1 for m in after if m.get("role") == "tool")
    pending = list(enumerate(history[steps[-1]]["tool_calls"]))[answered:]
    if not pending:
        return []
    first = pending[0][1]["function"]
    announced = gate.resumed(first["name"], first["arguments"])
    return await _answer_calls(pending, sink, budget, stop, gate, announced)


async def _answer_calls(
    calls: list[tuple[int, dict]],
    sink: Keeper,
    budget: Budget,
    stop: asyncio.Event,
    gate: Gate,
    announced: str | None = None,
) -> list[dict]:
    """Run each call in order; keep and journal its result.

    Every call gets a result, run or not (the next request's history must
    answer each call): past the step's or the run's tool budget, once the
    run is stopped, or denied, the result is an error saying so. A call that
    needs a person's approval raises `AwaitingApproval` (chat.approvals).
    Each call is journaled as `tool` under a journal id of its own first;
    only the first call of a resumed step, the one the run waited on, was
    announced before its wait (under `announced`).
    """
    writer = sink.writer
    added: list[dict] = []
    for index, call in calls:
        name, args = call["function"]["name"], call["function"]["arguments"]
        call_id = None if added else announced
        if call_id is None:
            call_id = gate.call_id(call["id"], step=budget.steps, index=index)
            writer.add("tool", {"tool_call_id": call_id, "name": name, "args": args})
        began = time.monotonic()
        output, is_error = await _answer(call_id, call, index, budget, stop, gate)
        writer.add(
            "tool_complete",
            {
                "tool_call_id": call_id,
                "name": name,
                "result": output,
                "is_error": is_error,
                "duration_ms": round((time.monotonic() - began) * 1000, 1),
            },
        )
        output = storable(output)
        await writer.flush()
        # The session and the model keep the provider's id for the call.
        await sink.keep(
            role=Message.Role.TOOL,
            content=output,
            tool_call_id=call["id"],
        )
        added.append({"role": "tool", "tool_call_id": call["id"], "content": output})
    return added


async def _answer(
    call_id: str,
    call: dict,
    index: int,
    budget: Budget,
    stop: asyncio.Event,
    gate: Gate,
) -> tuple[str, bool]:
    """One tool call's result: built-in or MCP (`<server>__<tool>`), raced by `stop`.

    `call_id` is the call's journal id, the one a person's decision names."""
    name, args = call["function"]["name"], call["function"]["arguments"]
    refusal = tool_registry.step_cap_refusal(index) or budget.refuse_tool_call()
    if refusal is not None:
        return refusal, True
    if stop.is_set():
        return "error: not run: the run was stopped", True
    rule, note, decided = gate.verdict(call_id, name, args)
    if rule == ASK:
        raise AwaitingApproval({"tool_call_id": call_id, "name": name, "args": args})
    if rule == DENY and decided:
        said = f"; their note: {note}" if note else ""
        return f"error: not run: a person denied this call of {name}{said}", True
    if rule == DENY:
        return f"error: no tool named {name!r} is available", True
    if mcp_tools.owns(name):
        work = mcp_tools.call_tool(name, args)
    else:
        work = tool_registry.run_tool(name, args, call_index=index)
    # A tool process is killed, an MCP request abandoned.
    answer = await unless_stopped(work, stop)
    if answer is None:
        return "error: stopped: the run was stopped while the tool ran", True
    return answer


async def unless_stopped(work: Awaitable[T], stop: asyncio.Event) -> T | None:
    """`work`'s result, or None once `stop` is set first (`work` is cancelled)."""
    task = asyncio.ensure_future(work)
    stopped = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({task, stopped}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopped.cancel()
        if not task.done():
            task.cancel()
            await asyncio.wait({task})
    return None if task.cancelled() else task.result()
