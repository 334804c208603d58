"""Executing one claimed run: the tool loop over the turn engine, journaled.
See docs/architecture.md §6.

Everything the run shows goes through a `BatchWriter` holding the claim's
fencing token. Whatever way the run ends, the assistant text that was shown is
in the session exactly once and the journal ends with exactly one `end`: the
final message and the `end` are written in one fenced transaction, so a runner
that lost its lease writes neither.

What the provider sends is made storable first (`journal.events.storable`:
NUL and lone surrogates become U+FFFD; tool call ids and names become
strings), the same way for the journal and the session, so the two agree.

Through a database outage (docs/operating.md) the run's text waits in its
writer (chat.writer) and the run's other writes (kept fragments and tool steps,
the final message and `end`) are tried again with backoff. A write whose
outcome is unknown is never simply repeated: the runner first checks, under its
fencing token, whether it committed (`_write`). An outage longer than
`HERMES_DB_OUTAGE_MAX_S` stops the model; the run then ends `failed`, category
`database`, as soon as the database answers, with its text kept once.
"""

import asyncio
import logging
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from journal import dbpool, metrics
from journal.events import REATTACH_STATUS, storable
from journal.fold import usage_sum
from journal.leases import Claim, run_hand_over
from journal.logcontext import run_logging
from journal.models import Run
from journal.publish import publish
from journal.store import AppendRejected, append, read_after
from journal.waits import run_wait

from . import attachments, mcp_tools, pending, titles
from . import tools as tool_registry
from .approvals import gate_load, offered
from .budget import TIME_LIMIT, Budget
from .models import ChatSession, Message, Turn
from .providers import registry
from .providers.base import Upstream
from .reattach import stream_to_reattach
from .tool_steps import AwaitingApproval, answer_pending, run_tools, unless_stopped
from .tree import run_leaf, run_path
from .turn import CANCELLED_OUTCOME, COMPLETED, Reattach, run_turn
from .writer import BUFFER_MAX_CHARS, OVERFLOW, BatchWriter

log = logging.getLogger(__name__)
BACKOFF_MAX_S = 1.0  # a write that met an unreachable database is tried this often

_DIAG_SUMS = (
    "model_requests_started",
    "http_retries",
    "transparent_retries",
    "stream_resumes",
    "stream_reattaches",
)
OUTPUT_LIMIT = "output-limit"  # the terminal state of an answer cut at max_tokens
CANCEL_UPSTREAM_S = 5.0  # a Stop waits at most this long on the provider's cancel


def session_history(*, session_id: int, run_id: str | None = None) -> list[dict]:
    """The conversation as the provider receives it, each message once, in order.

    Only one branch of the session's tree (`chat.tree`) is sent: the one the
    run `run_id` continues (from the first message down to its question and
    whatever it kept so far), else the session's active branch. Other
    versions of a question or an answer are kept and shown, never sent.
    """
    session = ChatSession.objects.get(pk=session_id)
    history = (
        [{"role": "system", "content": session.system_prompt}]
        if session.system_prompt
        else []
    )
    path = run_path(session_id=session_id, run_id=run_id)
    by_id = Message.objects.in_bulk(path)
    files = attachments.by_message(path)
    vision = _takes_images(session, run_id) if files else False
    for pk in path:
        _add_alternating(history, _wire(by_id[pk], files.get(pk, []), vision))
    return history


def _add_alternating(history: list[dict], message: dict) -> None:
    """Append `message`, joined to the last one when both are plain messages of
    one role: chat templates that need user and assistant turns to alternate
    (many local models') refuse or misread two in a row. They come in a row
    after a resume (the partials of one answer: joined as they were shown) and
    after a run that failed before any text (two questions: a blank line
    between). Each message's text is still sent once, in order."""
    last = history[-1] if history else None
    role = message["role"]
    if (
        last is None
        or role not in ("user", "assistant")
        or last["role"] != role
        or last.get("tool_calls")
        or message.get("tool_calls")
    ):
        history.append(message)
        return
    joint = "" if role == "assistant" else "\n\n"
    last["content"] = _joined(last["content"], message["content"], joint)


def _joined(first: str | list, second: str | list, joint: str) -> str | list:
    """Two messages' content as one: text joined, or content parts listed."""
    if isinstance(first, str) and isinstance(second, str):
        return first + joint + second if first and second else first + second
    parts = []
    for content in (first, second):
        if isinstance(content, str):
            if content:
                parts.append({"type": "text", "text": content})
        else:
            parts.extend(content)
    return parts


def _takes_images(session: ChatSession, run_id: str | None) -> bool:
    """Whether the model of the run (else of the session) is sent images."""
    turn = Turn.objects.filter(run_id=run_id).only("model").first() if run_id else None
    model = (turn.model if turn else "") or session.model or registry.default_model()
    return registry.takes_images(model)


def _wire(m: Message, files: list, vision: bool) -> dict:
    if m.role == Message.Role.TOOL:
        return {"role": "tool", "tool_call_id": m.tool_call_id, "content": m.content}
    if m.role == Message.Role.ASSISTANT and m.tool_calls:
        return {"role": "assistant", "content": m.content, "tool_calls": m.tool_calls}
    if files:  # chat.attachments: text files inlined, images as content parts
        content = attachments.user_content(m.content, files, vision=vision)
        return {"role": m.role, "content": content}
    return {"role": m.role, "content": m.content}


def _load(run_id: str) -> tuple[Run, Turn, list[dict], Reattach | None] | None:
    """What a chat run needs to start; None for a title run (`chat.titles`)."""
    run = Run.objects.select_related("turn__session").get(id=run_id)
    if titles.is_title_subject(run.subject):
        return None
    history = session_history(session_id=run.turn.session_id, run_id=run.id)
    taken = stream_to_reattach(run_id=run_id) if run.last_seq else None
    return run, run.turn, history, taken


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
            session_id=session_id,
            run_id=claim.run_id,
            parent_id=run_leaf(run_id=claim.run_id),
            **fields,
        ).id


def _held(claim: Claim) -> Run:
    run = Run.objects.filter(id=claim.run_id).first()
    if run is None or run.fencing_token != claim.token:
        raise AppendRejected(claim.run_id, "lease lost")
    return run


def _message_kept(claim: Claim, index: int) -> int | None:
    """The id of the run's `index`-th kept message (0-based), if that write landed."""
    if _held(claim).status not in Run.ACTIVE:
        raise AppendRejected(claim.run_id, "lease lost")
    ids = (
        Message.objects.filter(run_id=claim.run_id)
        .exclude(role=Message.Role.USER)
        .order_by("id")
        .values_list("id", flat=True)
    )
    return next(iter(ids[index : index + 1]), None)


def _finished(claim: Claim, after_seq: int):
    """The records of the run's end, if `_finish` landed under this claim's token."""
    if _held(claim).status in Run.ACTIVE:
        return None
    return read_after(run_id=claim.run_id, after_seq=after_seq)


async def _write(fn: Callable, *args, confirm: Callable, **kwargs):
    """Run a fenced write on the writer pool, riding through a database outage.

    After a connection error the write's outcome is unknown, so before trying
    again `confirm()` reads, under the claim's token, whether it committed: a
    result other than None is the write's result; AppendRejected means the run
    was taken over. Other errors are raised at once.
    """
    delay, unsure = 0.05, False
    while True:
        try:
            if unsure:
                done = await dbpool.writers.run(confirm)
                if done is not None:
                    return done
                unsure = False
            return await dbpool.writers.run(fn, *args, **kwargs)
        except Exception as exc:
            if not dbpool.is_connection_error(exc):
                raise
            unsure = True
        await asyncio.sleep(delay)
        delay = min(delay * 2, BACKOFF_MAX_S)


def _clean_calls(calls: list) -> list[dict]:
    """Tool calls as the journal and the session can hold them: strings only."""
    cleaned = []
    for call in calls:
        function = call.get("function") or {}
        call_id, name = call.get("id"), function.get("name")
        args = function.get("arguments")
        if isinstance(call_id, int | float) and not isinstance(call_id, bool):
            call_id = str(call_id)
        if not isinstance(call_id, str) or not call_id:
            call_id = f"call_{secrets.token_hex(8)}"
        cleaned.append(
            {
                "id": storable(call_id)[:120],
                "type": "function",
                "function": {
                    "name": storable(str(name)) if name is not None else "",
                    "arguments": storable(args) if isinstance(args, str) else "",
                },
            }
        )
    return cleaned


def _clean(result) -> None:
    result.content = storable(result.content)
    result.reasoning = storable(result.reasoning)
    result.tool_calls = _clean_calls(result.tool_calls)


class _Sink:
    """The turn engine's sink: journal text through the writer, keep partials."""

    def __init__(self, writer: BatchWriter, claim: Claim, session_id: int):
        self.writer, self.claim, self.session_id = writer, claim, session_id
        self.kept = 0  # messages this run's worker kept (assistant and tool)

    def token(self, text: str) -> None:
        self.writer.add("token", {"text": text})

    def reasoning(self, text: str) -> None:
        self.writer.add("reasoning", {"text": text})

    def status(self, message: str) -> None:
        self.writer.add("status", {"message": message})

    def upstream(self, cursor: Upstream, content_chars: int, reasoning_chars: int):
        self.writer.add(
            "upstream",
            {
                "response_id": cursor.response_id,
                "sequence_number": cursor.sequence,
                "content_chars": content_chars,
                "reasoning_chars": reasoning_chars,
            },
        )

    async def commit_partial(self, content: str, reasoning: str) -> None:
        await self.writer.flush()  # the fragment is journaled before it is kept
        await self.keep(
            role=Message.Role.ASSISTANT,
            content=storable(content),
            reasoning=storable(reasoning),
            complete=False,
        )

    async def keep(self, **fields) -> int:
        """Keep a message of this run in the session, once, fenced."""
        message_id = await _write(
            _keep_message,
            self.claim,
            self.session_id,
            confirm=lambda: _message_kept(self.claim, self.kept),
            **fields,
        )
        self.kept += 1
        return message_id


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


def _finish(
    claim: Claim,
    session_id: int,
    *,
    message: dict | None,
    events: list,
    turn_fields: dict,
):
    """The last write of a run: its final message, its turn's usage and
    diagnostics and its `end`, in one transaction.

    The `end` append is fenced; if it is rejected the transaction, message
    and turn included, rolls back.
    """
    with transaction.atomic():
        message_id = None
        if message is not None:
            message_id = Message.objects.create(
                session_id=session_id,
                run_id=claim.run_id,
                parent_id=run_leaf(run_id=claim.run_id),
                **message,
            ).id
        end_type, end_payload = events[-1]
        events[-1] = (end_type, {**end_payload, "message_id": message_id})
        records = append(run_id=claim.run_id, token=claim.token, events=events)
        Turn.objects.filter(run_id=claim.run_id).update(**turn_fields)
        if end_payload["status"] == Run.Status.COMPLETED:
            titles.title_queue(session_id=session_id)  # after the first answer
        pending.deliver_after_end(claim.run_id, session_id)  # the next queued one
        return records


@dataclass
class RunControl:
    """How the worker stops a run: `stop` is raced by every read; `reason` says why."""

    stop: asyncio.Event = field(default_factory=asyncio.Event)
    # "cancel" (the user), "shutdown" (the worker is stopping, no other is
    # alive) or "handover" (it is stopping and another worker goes on).
    reason: str = ""

    def request(self, reason: str) -> None:
        self.reason = self.reason or reason
        self.stop.set()


async def execute_run(claim: Claim, control: RunControl) -> str:
    """Run a claimed run to its `end`; returns the final status written (or "fenced").

    Raises what it cannot handle (`chat.writer.EventsNotStored`, a bug): the
    worker then settles the run as `failed` / `worker-error` at once.
    """
    delay = 0.05
    while True:  # the claim landed; the database may have gone right after
        try:
            loaded = await dbpool.readers.run(_load, claim.run_id)
            break
        except Exception as exc:
            if not dbpool.is_connection_error(exc) or control.stop.is_set():
                raise
        await asyncio.sleep(delay)
        delay = min(delay * 2, BACKOFF_MAX_S)
    if loaded is None:
        with run_logging(run_id=claim.run_id):
            return await titles.execute_title_run(claim, control)
    run, turn, history, taken = loaded
    with run_logging(run_id=claim.run_id, session_id=turn.session_id):
        return await _drive(claim, control, run, turn, history, taken)


async def _drive(
    claim: Claim,
    control: RunControl,
    run: Run,
    turn: Turn,
    history: list[dict],
    taken: Reattach | None = None,
) -> str:
    writer = BatchWriter(
        run_id=claim.run_id,
        token=claim.token,
        last_seq=run.last_seq,
        on_trouble=control.request,
    )
    sink = _Sink(writer, claim, turn.session_id)
    # Started before: taken over from a lost worker, or resumed after an
    # approval decision (docs/architecture.md §6).
    if not run.last_seq:
        writer.add(
            "start",
            {"model": turn.model, "provider": turn.provider, "subject": run.subject},
        )
    gate = await dbpool.readers.run(gate_load, run_id=run.id, session=turn.session)
    provider = registry.get_provider(turn.provider)
    diagnostics, usage, budget = _carried_over(turn)
    started = time.monotonic()
    clock = budget.arm_clock(control.request)
    bound = None  # the bound (chat.budget) that ended the run, if one did
    try:
        # Connecting MCP servers may take their connect timeout: a stop wins.
        mcp_schema = await unless_stopped(mcp_tools.tools_schema(), control.stop)
        schema = offered(tool_registry.tools_schema() + (mcp_schema or [])) or None
        if gate.decisions:  # resumed after a decision: answer the waiting calls
            history += await answer_pending(history, sink, budget, control.stop, gate)
        first_step = budget.steps + 1
        while bound is None:
            final = budget.final_step
            reattach = taken if budget.steps + 1 == first_step else None
            if reattach is None and not control.stop.is_set():
                history += await _land_steers(claim, writer)
            if budget.steps and not control.stop.is_set():
                sink.status(budget.progress())
            budget.steps += 1
            result = await run_turn(
                provider,
                model=turn.model,
                messages=history,
                tools=None if final else schema,
                sink=sink,
                cancel=control.stop,
                max_stream_retries=settings.HERMES["MAX_STREAM_RETRIES"],
                reattach=reattach,
            )
            _clean(result)
            _merge_diagnostics(diagnostics, result.diagnostics)
            usage = usage_sum(usage, result.usage)
            budget.spend_tokens(usage)
            if result.outcome != COMPLETED or not result.tool_calls:
                break
            bound = budget.bound_after(was_final=final)
            if bound is None:
                history += await run_tools(result, sink, budget, control.stop, gate)
        await writer.flush()
    except AwaitingApproval as waiting:
        waited = diagnostics, usage, budget, started
        return await _wait(claim, writer, waiting.request, waited)
    except AppendRejected as exc:
        writer.close()
        log.warning("run fenced out, stopping run_id=%s (%s)", claim.run_id, exc.reason)
        return "fenced"
    finally:
        if clock is not None:
            clock.cancel()
    if result.outcome == CANCELLED_OUTCOME and control.reason == HANDOVER:
        handed = diagnostics, usage, budget, started
        return await _hand_over(claim, writer, sink, result, handed)
    if result.outcome == CANCELLED_OUTCOME and control.reason != "fenced":
        # A worker fenced out leaves the response to the one that took over.
        await _cancel_upstream(provider, result.upstream)
    diagnostics["duration_ms"] += round((time.monotonic() - started) * 1000)
    diagnostics["journal_rows"] += writer.rows_written
    diagnostics["steps"] = budget.steps
    diagnostics["tool_calls"] = budget.tool_calls
    events, status = _closing_events(result, usage, control.reason, budget, bound)
    message = None
    done = result.outcome == COMPLETED and bound is None
    if result.content or result.reasoning or done:
        message = {
            "role": Message.Role.ASSISTANT,
            "content": result.content,
            "reasoning": result.reasoning,
            "complete": done,
        }
    try:
        records = await _write(
            _finish,
            claim,
            turn.session_id,
            confirm=lambda: _finished(claim, writer.last_seq),
            message=message,
            events=events,
            turn_fields={
                "usage": _usage_event(usage) if usage else {},
                "diagnostics": diagnostics,
            },
        )
    except AppendRejected as exc:
        log.warning(
            "run fenced out at the end run_id=%s (%s)", claim.run_id, exc.reason
        )
        return "fenced"
    finally:
        writer.close()
    await publish(claim.run_id, records)
    log.info(
        "run ended run_id=%s session_id=%s status=%s",
        claim.run_id,
        turn.session_id,
        status,
    )
    return status


async def _land_steers(claim: Claim, writer: BatchWriter) -> list[dict]:
    """At a model-call boundary: the run's pending steers (chat.pending),
    journaled where they land, as user messages for the next request."""
    try:
        waiting = await dbpool.readers.run(pending.steers_waiting, run_id=claim.run_id)
    except Exception as exc:
        if not dbpool.is_connection_error(exc):
            raise
        return []  # the database is away: they land at a later boundary, or queue
    if not waiting:
        return []
    await writer.flush()  # the steer lands after everything shown so far
    records, texts = await _write(
        pending.steers_land,
        claim,
        confirm=lambda: pending.steers_landed(claim, writer.last_seq),
    )
    if records:
        writer.last_seq = records[-1].seq
        writer.rows_written += len(records)
        await publish(claim.run_id, records)
        log.info("run steered run_id=%s messages=%d", claim.run_id, len(records))
    return [{"role": "user", "content": text} for text in texts]


async def _cancel_upstream(provider, upstream: Upstream | None) -> None:
    """Stop a response the provider runs upstream (background mode) on a Stop."""
    cancel = getattr(provider, "cancel", None)
    if upstream is None or cancel is None:
        return
    try:
        async with asyncio.timeout(CANCEL_UPSTREAM_S):
            await cancel(upstream.response_id)
    except TimeoutError:
        log.warning("cancelling the upstream response timed out")


def _carried_over(turn: Turn) -> tuple[dict, dict | None, Budget]:
    """What a run resumed after a decision carries from its earlier attempts:
    diagnostics, provider usage and the budget spent; nothing for a new run."""
    saved = turn.diagnostics or {}
    diagnostics: dict = {
        key: saved.get(key, 0) for key in (*_DIAG_SUMS, "duration_ms", "journal_rows")
    }
    if saved.get("first_token_ms") is not None:
        diagnostics["first_token_ms"] = saved["first_token_ms"]
    budget = Budget.from_settings()
    budget.steps = saved.get("steps", 0)
    budget.tool_calls = saved.get("tool_calls", 0)
    names = {"input_tokens": "prompt_tokens", "output_tokens": "completion_tokens"}
    usage = {names.get(k, k): v for k, v in (turn.usage or {}).items()} or None
    return diagnostics, usage, budget


async def _wait(claim: Claim, writer: BatchWriter, request: dict, waited) -> str:
    """End this attempt waiting for a decision on `request` (chat.approvals):
    journal it, save what the turn spent so far, release the run."""
    until = timezone.now() + timedelta(seconds=settings.HERMES["APPROVAL_TIMEOUT_S"])

    async def release(turn_fields: dict) -> list:
        return await _write(
            _release,
            claim,
            confirm=lambda: _released(claim),
            request={**request, "expires_at": until.isoformat()},
            until=until,
            turn_fields=turn_fields,
        )

    # The waiting call was counted; it is counted again when answered.
    if not await _pause(claim, writer, waited, release, steps=0, tool_calls=-1):
        return "fenced"
    log.info("run waits for approval run_id=%s tool=%s", claim.run_id, request["name"])
    return Run.Status.WAITING


async def _pause(claim: Claim, writer: BatchWriter, spent, write, **less) -> bool:
    """Leave the run for later (a decision, another worker): flush its output,
    save what its turn spent so far (`less` the steps and tool calls that are
    done again later), `write(turn_fields)` and publish what that journaled.
    False if the run was fenced out meanwhile."""
    diagnostics, usage, budget, started = spent
    try:
        await writer.flush()
        diagnostics = {
            **diagnostics,
            "duration_ms": diagnostics["duration_ms"]
            + round((time.monotonic() - started) * 1000),
            "journal_rows": diagnostics["journal_rows"] + writer.rows_written,
            "steps": budget.steps + less["steps"],
            "tool_calls": budget.tool_calls + less["tool_calls"],
        }
        records = await write(
            {"usage": _usage_event(usage) if usage else {}, "diagnostics": diagnostics}
        )
    except AppendRejected as exc:
        log.warning("run fenced out, stopping run_id=%s (%s)", claim.run_id, exc.reason)
        return False
    finally:
        writer.close()
    await publish(claim.run_id, records)
    return True


HANDOVER = "handover"  # RunControl reason: the worker stops, another goes on
HANDED_OVER = "Retry attempt: handed over; the worker writing it stopped"


async def _hand_over(claim, writer: BatchWriter, sink: _Sink, result, handed) -> str:
    """The worker is stopping and another is alive: give the run back to the
    queue instead of ending it (journal.leases.run_hand_over). The text shown
    so far stays in the journal; the next worker resumes the run from there,
    as after a lost worker: re-attached to a response kept upstream
    (`chat.reattach`, nothing kept here), else the partial kept once now and
    the conversation, ending with it, sent again (rule 3)."""
    reattach = result.upstream is not None
    note = f"{REATTACH_STATUS} after the worker stopped" if reattach else HANDED_OVER

    async def hand_over(turn_fields: dict) -> list:
        if not reattach and (result.content or result.reasoning):
            await sink.commit_partial(result.content, result.reasoning)
        return await _write(
            _hand_over_write,
            claim,
            confirm=lambda: _handed_over(claim, writer.last_seq),
            events=[("status", {"message": note})],
            turn_fields=turn_fields,
        )

    # The next worker does this step again.
    if not await _pause(claim, writer, handed, hand_over, steps=-1, tool_calls=0):
        return "fenced"
    return Run.Status.QUEUED


def _hand_over_write(claim: Claim, *, events: list, turn_fields: dict):
    with transaction.atomic():
        records = run_hand_over(run_id=claim.run_id, token=claim.token, events=events)
        Turn.objects.filter(run_id=claim.run_id).update(**turn_fields)
        return records


def _handed_over(claim: Claim, after_seq: int) -> list | None:
    """Whether `_hand_over_write` committed: [] if so (the journal has it)."""
    run = Run.objects.filter(id=claim.run_id).first()
    if run is not None and run.fencing_token == claim.token:
        return None
    mine = read_after(run_id=claim.run_id, after_seq=after_seq, limit=1)
    if mine and mine[0].type == "status" and "stopped" in mine[0].payload:
        return []
    raise AppendRejected(claim.run_id, "lease lost")


def _release(claim: Claim, *, request: dict, until, turn_fields: dict):
    with transaction.atomic():
        records = run_wait(
            claim=claim, events=[("approval_request", request)], until=until
        )
        Turn.objects.filter(run_id=claim.run_id).update(**turn_fields)
        return records


def _released(claim: Claim) -> list | None:
    """Whether `_release` committed: [] (readers find its event in the journal)."""
    return [] if _held(claim).status == Run.Status.WAITING else None


def _closing_events(result, usage, stop_reason: str, budget: Budget, bound):
    events: list = []
    if usage:
        events.append(("usage", _usage_event(usage)))
    if result.outcome == CANCELLED_OUTCOME and stop_reason == TIME_LIMIT:
        bound = TIME_LIMIT
    if bound is not None:
        error = budget.error(bound)
        events.append(("error", error))
        status, state = Run.Status.FAILED, bound
    elif result.outcome == COMPLETED:
        # An answer the model ended at its output limit is whole as far as
        # the model goes, but cut for the person: it says so (Continue).
        state = OUTPUT_LIMIT if result.finish_reason == "length" else "completed"
        status, error = Run.Status.COMPLETED, None
    elif result.outcome == CANCELLED_OUTCOME and stop_reason == "shutdown":
        status, state, error = Run.Status.INTERRUPTED, "worker-shutdown", None
    elif result.outcome == CANCELLED_OUTCOME and stop_reason == OVERFLOW:
        error = {
            "category": "limit",
            "message": "the model wrote faster than the journal could store it: "
            f"more than {BUFFER_MAX_CHARS:,} characters waited to be written",
            "retryable": True,
        }
        events.append(("error", error))
        status, state = Run.Status.FAILED, "journal-backlog"
    elif result.outcome == CANCELLED_OUTCOME and stop_reason == "database":
        error = {
            "category": "database",
            "message": "the database was out of reach for more than "
            f"{settings.HERMES['DB_OUTAGE_MAX_S']:g} s",
            "retryable": True,
        }
        events.append(("error", error))
        status, state = Run.Status.FAILED, "database-unavailable"
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
    payload: dict = {"status": status, "terminal_state": state}
    if error:
        payload["error"] = {"category": error["category"], "message": error["message"]}
    events.append(("end", payload))
    return events, status
