"""Writes of the chat app: sessions, starting and cancelling runs, keeping partials."""

import json
import logging

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.db import IntegrityError, transaction
from django.dispatch import receiver
from django.utils import timezone

from journal.leases import run_settle
from journal.models import Event, Run
from journal.publish import announce, publish_on_commit
from journal.signals import run_settling

from .models import ChatSession, Message

log = logging.getLogger(__name__)

WORKERS_GROUP = "hermes.workers"


class RunConflict(Exception):
    """The session already has an active run."""

    def __init__(self, run_id: str):
        super().__init__(f"session already has an active run {run_id}")
        self.run_id = run_id


def _signal_workers(message: dict) -> None:
    """Best effort, after commit: workers also poll the database."""

    def send() -> None:
        layer = get_channel_layer()
        if layer is None:
            return
        try:
            async_to_sync(layer.group_send)(WORKERS_GROUP, message)
        except Exception:
            log.warning("worker signal failed: %s", message.get("type"), exc_info=True)

    transaction.on_commit(send)


def _announce_on_commit(user_id: int, event: str, data: dict) -> None:
    transaction.on_commit(lambda: async_to_sync(announce)(user_id, event, data))


def session_create(
    *,
    owner,
    title: str = "",
    model: str = "",
    system_prompt: str = "",
    archived: bool = False,
) -> ChatSession:
    session = ChatSession.objects.create(
        owner=owner,
        title=title or "New chat",
        model=model,
        system_prompt=system_prompt,
        archived=archived,
    )
    _announce_on_commit(
        owner.pk, "session", {"action": "created", "session_id": session.pk}
    )
    return session


def session_update(*, session: ChatSession, **fields) -> ChatSession:
    for name, value in fields.items():
        setattr(session, name, value)
    session.save()
    _announce_on_commit(
        session.owner_id, "session", {"action": "updated", "session_id": session.pk}
    )
    return session


def session_delete(*, session: ChatSession) -> None:
    """Delete a session, its messages and its runs' journals."""
    owner_id, pk = session.owner_id, session.pk
    active = Run.objects.filter(session=session, status__in=Run.ACTIVE)
    for run in active:
        run_cancel(run=run)
    session.delete()
    _announce_on_commit(owner_id, "session", {"action": "deleted", "session_id": pk})


def run_start(
    *,
    session: ChatSession,
    content: str,
    model: str,
    provider: str,
    idempotency_key: str = "",
) -> tuple[Run, bool]:
    """Queue a run for the session's next turn; (run, created).

    With an `idempotency_key` already used by this user, returns that run instead
    of starting (and paying for) a second one.
    """
    owner_id = session.owner_id
    if idempotency_key:
        existing = Run.objects.filter(
            owner_id=owner_id, idempotency_key=idempotency_key
        ).first()
        if existing is not None:
            return existing, False
    try:
        with transaction.atomic():
            # Locks the session row on PostgreSQL; SQLite's IMMEDIATE transaction
            # already serialises writers. Either way one active run per session.
            ChatSession.objects.select_for_update().filter(pk=session.pk).first()
            active = (
                Run.objects.filter(session=session, status__in=Run.ACTIVE)
                .values_list("id", flat=True)
                .first()
            )
            if active:
                raise RunConflict(active)
            run = Run.objects.create(
                owner_id=owner_id,
                session=session,
                model=model,
                provider=provider,
                idempotency_key=idempotency_key,
            )
            Message.objects.create(
                session=session, role=Message.Role.USER, content=content, run=run
            )
            ChatSession.objects.filter(pk=session.pk).update(updated_at=timezone.now())
            _signal_workers({"type": "worker.nudge"})
            _announce_on_commit(
                owner_id,
                "run",
                {"action": "started", "run_id": run.id, "session_id": session.pk},
            )
    except IntegrityError:
        if idempotency_key:  # a concurrent retry with the same key won the race
            return Run.objects.get(
                owner_id=owner_id, idempotency_key=idempotency_key
            ), False
        raise
    log.info("run queued run_id=%s session_id=%s", run.id, session.pk)
    return run, True


def run_cancel(*, run: Run) -> None:
    """Record the request (the worker checks it) and signal it (the fast path).

    A run no live worker holds (still queued, or its lease expired) is settled
    here at once.
    """
    with transaction.atomic():
        Run.objects.filter(
            id=run.id, status__in=Run.ACTIVE, cancel_requested_at__isnull=True
        ).update(cancel_requested_at=timezone.now())
        records = run_settle(
            run_id=run.id,
            status=Run.Status.CANCELLED,
            terminal_state="cancelled-by-user",
            by="cancel",
            only_if_lost=True,
        )
        if not records:
            records = _settle_queued(run.id)
        if records:
            publish_on_commit(run.id, records)
        else:
            _signal_workers({"type": "run.cancel", "run_id": run.id})
    log.info("run cancel requested run_id=%s", run.id)


def _settle_queued(run_id: str):
    if not Run.objects.filter(id=run_id, status=Run.Status.QUEUED).exists():
        return []
    return run_settle(
        run_id=run_id,
        status=Run.Status.CANCELLED,
        terminal_state="cancelled-by-user",
        by="cancel",
        only_if_lost=False,
    )


def journal_text(*, run_id: str) -> str:
    """The assistant text a run streamed, rebuilt from its journal."""
    payloads = (
        Event.objects.filter(run_id=run_id, type="token")
        .order_by("seq")
        .values_list("payload", flat=True)
    )
    return "".join(json.loads(p)["text"] for p in payloads.iterator(chunk_size=2000))


@receiver(run_settling)
def keep_partial(sender, *, run_id: str, status: str, **kwargs) -> int | None:
    """Keep the part of a settled run's answer not yet in the session, exactly once.

    Fragments the worker already committed (stream resumes, tool steps) are
    assistant messages of this run; what the journal holds beyond them is the
    tail nobody kept yet.
    """
    run = Run.objects.filter(id=run_id).values("session_id").first()
    if not run or not run["session_id"]:
        return None
    text = journal_text(run_id=run_id)
    committed = "".join(
        Message.objects.filter(run_id=run_id, role=Message.Role.ASSISTANT)
        .order_by("id")
        .values_list("content", flat=True)
    )
    tail = text[len(committed) :] if text.startswith(committed) else ""
    if not tail:
        return None
    message = Message.objects.create(
        session_id=run["session_id"],
        role=Message.Role.ASSISTANT,
        content=tail,
        run_id=run_id,
        complete=False,
    )
    return message.id
