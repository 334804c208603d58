"""Queue and steer: messages typed while a run streams (docs/architecture.md,
"Queue and steer").

1. A *queued* message (`pending_add(kind="queue")`) waits for the session's
   next turn. When the session's run ends — completed, failed, cancelled (a
   Stop), interrupted — the oldest pending one starts that turn
   (`deliver_next`) in the transaction that journals the end: the worker's
   (`chat.runner`) or that of whoever settles the run (the `run_settled`
   signal of `journal.leases.run_settle`). The message's state and the new
   run commit with the `end` or not at all: exactly once, on the server,
   whichever process ends the run and whatever happened to the browser.
2. A *steer* (`pending_add(kind="steer")`) is for the running turn. Before
   each request to the model its worker lands every pending steer of the run
   (`steers_land`): one fenced transaction journals a `steer` event, keeps the
   text as a user message of the run (`Message.steer`) and marks it landed;
   the model's next request ends with it. A steer still pending when its run
   ends becomes a queued message, so it starts the next turn (rule 1).
3. A pending message can be cancelled until it starts or lands (one
   conditional update: whichever of the cancel and the delivery commits first
   wins, the other finds it no longer pending).

The owner's tabs hear `session` notices with `action: "queue"` and refetch
the session's pending messages.
"""

from __future__ import annotations

import json
import logging
from datetime import timedelta

from django.db import connection, transaction
from django.utils import timezone

from journal.leases import Claim
from journal.models import Run
from journal.signals import run_settled
from journal.store import AppendRejected, Record, append, read_after

from . import limits
from .models import ChatSession, Message, PendingMessage, Turn
from .services import _announce_on_commit, run_start
from .tree import run_leaf

log = logging.getLogger(__name__)

MAX_PENDING = 20  # pending messages per session: a queue, not a backlog
QUEUE = PendingMessage.Kind.QUEUE
STEER = PendingMessage.Kind.STEER
PENDING = PendingMessage.State.PENDING


class NoActiveRun(Exception):
    """The session has no run in progress (or not the one named)."""


class TooManyPending(Exception):
    """The session already holds `MAX_PENDING` pending messages."""


class NotPending(Exception):
    """The message already started, landed or was cancelled."""

    def __init__(self, state: str):
        super().__init__(f"the message is no longer pending ({state})")
        self.state = state


def pending_of(*, session_id: int) -> list[dict]:
    """The session's pending messages, oldest first, as the API shows them."""
    rows = PendingMessage.objects.filter(session_id=session_id, state=PENDING)
    return [as_json(p) for p in rows.order_by("id")]


def as_json(item: PendingMessage) -> dict:
    return {
        "id": item.pk,
        "kind": item.kind,
        "state": item.state,
        "content": item.content,
        "run_id": item.run_id,
        "delivered_run_id": item.delivered_run_id,
        "created_at": item.created_at.isoformat() if item.created_at else None,
    }


def _notify(owner_id: int, session_id: int) -> None:
    _announce_on_commit(
        owner_id, "session", {"action": "queue", "session_id": session_id}
    )


def pending_add(
    *,
    session: ChatSession,
    kind: str,
    content: str,
    model: str = "",
    provider: str = "",
    run_id: str = "",
) -> PendingMessage:
    """Store a message typed while the session's run is active.

    Raises `NoActiveRun` when no run is queued, running or waiting (or when
    `run_id` is given and is not that run), `TooManyPending` past the cap.
    """
    with transaction.atomic():
        # The session's lock orders this against the end of its run
        # (`deliver_next` takes it too): a message stored here is seen there.
        ChatSession.objects.select_for_update().filter(pk=session.pk).first()
        active = (
            Run.objects.filter(turn__session=session, status__in=Run.ACTIVE)
            .order_by("-created_at")
            .first()
        )
        if active is None or (run_id and active.id != run_id):
            raise NoActiveRun(run_id or session.pk)
        waiting = PendingMessage.objects.filter(session=session, state=PENDING)
        if waiting.count() >= MAX_PENDING:
            raise TooManyPending(session.pk)
        item = PendingMessage.objects.create(
            session=session,
            kind=kind,
            content=content,
            model=model,
            provider=provider,
            run=active if kind == STEER else None,
        )
        _notify(session.owner_id, session.pk)
    log.info("%s message stored session_id=%s run_id=%s", kind, session.pk, active.id)
    return item


def pending_cancel(*, session: ChatSession, pending_id: int) -> PendingMessage:
    """Cancel a pending message; `NotPending` once it started or landed,
    `PendingMessage.DoesNotExist` if the session has no such message."""
    with transaction.atomic():
        item = PendingMessage.objects.get(pk=pending_id, session=session)
        cancelled = PendingMessage.objects.filter(pk=item.pk, state=PENDING).update(
            state=PendingMessage.State.CANCELLED, ended_at=timezone.now()
        )
        item.refresh_from_db()
        if not cancelled:
            raise NotPending(item.state)
        _notify(session.owner_id, session.pk)
    return item


def deliver_next(*, run_id: str, session_id: int | None = None) -> str | None:
    """In the transaction that journals run `run_id`'s end: start the session's
    next turn from its oldest pending message (rule 1). Returns the new
    run's id, or None. Steers of the run that did not land become queued.

    `session_id` (the worker knows it) saves looking it up. Most runs end
    with nothing pending: the session's lock and one indexed look settle
    that, before anything else is read.
    """
    turn = None
    if session_id is None:
        turn = Turn.objects.filter(run_id=run_id).first()
        if turn is None:  # not a chat turn (a title run)
            return None
        session_id = turn.session_id
    if not _pending_locked(session_id):
        return None
    session = ChatSession.objects.get(pk=session_id)  # locked just now
    turn = turn or Turn.objects.get(run_id=run_id)
    unlanded = PendingMessage.objects.filter(run_id=run_id, kind=STEER, state=PENDING)
    converted = unlanded.update(kind=QUEUE, model=turn.model, provider=turn.provider)
    started = _start_oldest(session, model=turn.model, provider=turn.provider)
    if started is None and converted:
        _notify(session.owner_id, session.pk)
    if started is not None:
        log.info("queued message started run_id=%s after run_id=%s", started, run_id)
    return started


def _start_oldest(session: ChatSession, *, model: str, provider: str) -> str | None:
    """With the session locked: its oldest pending queued message as a new
    run (its id), unless a run is active or nothing is queued."""
    item = (
        PendingMessage.objects.filter(session=session, kind=QUEUE, state=PENDING)
        .order_by("id")
        .first()
    )
    busy = Run.objects.filter(turn__session=session, status__in=Run.ACTIVE).exists()
    if item is None or busy:
        return None
    # Counted like a run the API starts (`runs_per_minute`), under the same
    # lock: over the limit the message stays pending, shown and cancellable,
    # and `deliver_stranded` starts it once the window has room.
    limits.lock_run_rate(session.owner_id)
    wait = limits.run_rate_wait(session.owner_id)
    if wait is not None:
        log.info(
            "queued message waits for runs_per_minute session_id=%s retry_in=%.0fs",
            session.pk,
            wait,
        )
        return None
    run, _ = run_start(
        session=session,
        content=item.content,
        model=item.model or model,
        provider=item.provider or provider,
    )
    PendingMessage.objects.filter(pk=item.pk).update(
        state=PendingMessage.State.STARTED,
        delivered_run=run,
        ended_at=timezone.now(),
    )
    _notify(session.owner_id, session.pk)
    return run.id


STRANDED_AFTER_S = 10.0  # older than this with no run active: nothing will start it


def deliver_stranded(*, limit: int = 20) -> list[str]:
    """The safety net of rule 1 (the worker's reaper calls it): a queued
    message whose run's end could not start it (`deliver_after_end` logged
    why) starts now, if its session has no active run. Locked and checked
    like `deliver_next`, so it never starts a second run beside one."""
    cutoff = timezone.now() - timedelta(seconds=STRANDED_AFTER_S)
    busy = Run.objects.filter(status__in=Run.ACTIVE).values("turn__session_id")
    sessions = list(
        PendingMessage.objects.filter(kind=QUEUE, state=PENDING, created_at__lt=cutoff)
        .exclude(session_id__in=busy)
        # Users at `runs_per_minute` wait: their sessions would crowd others'.
        .exclude(session__owner_id__in=limits.owners_at_run_rate())
        .values_list("session_id", flat=True)
        .distinct()[:limit]
    )
    started = []
    for session_id in sessions:
        try:
            with transaction.atomic():
                session = (
                    ChatSession.objects.select_for_update()
                    .filter(pk=session_id)
                    .first()
                )
                run_id = session and _start_oldest(session, model="", provider="")
        except Exception:
            log.exception(
                "starting a stranded queued message of session_id=%s", session_id
            )
            continue
        if run_id:
            log.info("stranded queued message started run_id=%s", run_id)
            started.append(run_id)
    return started


def deliver_after_end(run_id: str, session_id: int | None = None) -> str | None:
    """`deliver_next` in a savepoint: a failure (a deadlock over the
    session's lock included) is logged and the run's end stands (the message
    stays pending, shown and cancellable)."""
    try:
        with transaction.atomic():
            return deliver_next(run_id=run_id, session_id=session_id)
    except Exception:
        log.exception("starting the queued message failed after run_id=%s", run_id)
        return None


def _pending_locked(session_id: int) -> bool:
    """Lock the session, then look for a pending message: two plain
    statements, all that most runs' ends pay. The lock comes first so that a
    `pending_add` committing now (it takes the lock too) is seen by the look."""
    lock = " FOR UPDATE" if connection.features.has_select_for_update else ""
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT id FROM {ChatSession._meta.db_table} WHERE id = %s{lock}",
            [session_id],
        )
        cursor.execute(
            f"SELECT 1 FROM {PendingMessage._meta.db_table}"
            " WHERE session_id = %s AND state = %s LIMIT 1",
            [session_id, PENDING],
        )
        return cursor.fetchone() is not None


def _on_settled(sender, *, run_id: str, **kwargs) -> None:
    deliver_after_end(run_id)


run_settled.connect(_on_settled, dispatch_uid="chat.pending.deliver_next")


def steers_waiting(*, run_id: str) -> bool:
    """Whether the run has steers to land (a cheap read before each step)."""
    return PendingMessage.objects.filter(
        run_id=run_id, kind=STEER, state=PENDING
    ).exists()


def steers_land(claim: Claim) -> tuple[list[Record], list[str]]:
    """Journal the run's pending steers as `steer` events, keep each as a user
    message of the run and mark it landed, in one fenced transaction.
    Returns the records and the texts, in order; AppendRejected if the claim
    no longer holds the run (then nothing is written)."""
    with transaction.atomic():
        held = (
            Run.objects.select_for_update()
            .filter(
                id=claim.run_id, fencing_token=claim.token, status=Run.Status.RUNNING
            )
            .exists()
        )
        if not held:
            raise AppendRejected(claim.run_id, "lease lost")
        items = list(
            PendingMessage.objects.select_for_update()
            .filter(run_id=claim.run_id, kind=STEER, state=PENDING)
            .order_by("id")
        )
        if not items:
            return [], []
        events = []
        for item in items:
            message = Message.objects.create(
                session_id=item.session_id,
                role=Message.Role.USER,
                content=item.content,
                run_id=claim.run_id,
                parent_id=run_leaf(run_id=claim.run_id),
                steer=True,
            )
            payload = {"text": item.content, "message_id": message.pk}
            events.append(("steer", {**payload, "pending_id": item.pk}))
        records = append(run_id=claim.run_id, token=claim.token, events=events)
        PendingMessage.objects.filter(pk__in=[i.pk for i in items]).update(
            state=PendingMessage.State.LANDED,
            delivered_run_id=claim.run_id,
            ended_at=timezone.now(),
        )
        owner_id = Run.objects.values_list("owner_id", flat=True).get(id=claim.run_id)
        _notify(owner_id, items[0].session_id)
        return records, [item.content for item in items]


def steers_landed(
    claim: Claim, after_seq: int
) -> tuple[list[Record], list[str]] | None:
    """Whether `steers_land` committed after `after_seq` under this claim (its
    outcome was unknown): its records and texts, else None."""
    run = Run.objects.filter(id=claim.run_id).first()
    if run is None or run.fencing_token != claim.token:
        raise AppendRejected(claim.run_id, "lease lost")
    records = read_after(run_id=claim.run_id, after_seq=after_seq)
    steers = [r for r in records if r.type == "steer"]
    if not steers:
        return None
    return steers, [json.loads(r.payload)["text"] for r in steers]
