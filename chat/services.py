"""Writes of the chat app: sessions, starting and cancelling runs, keeping partials."""

import hashlib
import json
import logging
import os

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models.signals import pre_delete
from django.dispatch import receiver
from django.utils import timezone

from journal.events import storable
from journal.fold import Fold
from journal.leases import run_settle
from journal.models import Event, Run
from journal.outages import CHANNEL_LAYER, outage
from journal.publish import announce, publish_on_commit
from journal.signals import run_settling

from .attachments import copy_to as copy_attachments
from .limits import SESSIONS_RETRY_AFTER_S, LimitExceeded
from .models import Attachment, ChatSession, Message, PendingMessage, Turn
from .tree import active_leaf, branch_last_run, run_leaf

log = logging.getLogger(__name__)

WORKERS_GROUP = "hermes.workers"


class RunConflict(Exception):
    """The session already has an active run."""

    def __init__(self, run_id: str):
        super().__init__(f"session already has an active run {run_id}")
        self.run_id = run_id


class IdempotencyMismatch(Exception):
    """The Idempotency-Key was first used for another request."""

    def __init__(self, run_id: str):
        super().__init__(
            "this Idempotency-Key was already used for a different request"
        )
        self.run_id = run_id


class RetryRefused(Exception):
    """`retry_of` names a run that cannot be retried (`status`: 400 or 409)."""

    def __init__(self, message: str, status: int):
        super().__init__(message)
        self.status = status


def idempotency_hash(*, session_id: int, body: dict) -> str:
    """What a key is bound to: the session and the request body, as parsed."""
    canonical = json.dumps(
        {"session": session_id, "body": body}, sort_keys=True, ensure_ascii=False
    )
    return hashlib.sha256(canonical.encode()).hexdigest()


def _signal_workers(message: dict) -> None:
    """Best effort, after commit: workers also poll the database."""

    def send() -> None:
        layer = get_channel_layer()
        if layer is None:
            return
        try:
            async_to_sync(layer.group_send)(WORKERS_GROUP, message)
        except Exception as exc:  # one line per outage, not a traceback per run
            outage(CHANNEL_LAYER).failed("worker signal", exc)
        else:
            outage(CHANNEL_LAYER).recovered()

    transaction.on_commit(send)


def workers_nudge_on_commit() -> None:
    """Wake the workers after commit: a run was queued (they also poll)."""
    _signal_workers({"type": "worker.nudge"})


def _announce_on_commit(user_id: int, event: str, data: dict) -> None:
    transaction.on_commit(lambda: async_to_sync(announce)(user_id, event, data))


def session_create(
    *,
    owner,
    title: str = "",
    model: str = "",
    system_prompt: str = "",
    archived: bool = False,
    pinned: bool = False,
) -> ChatSession:
    session = ChatSession.objects.create(
        owner=owner,
        title=title or "New chat",
        title_by_user=bool(title),
        model=model,
        system_prompt=system_prompt,
        archived=archived,
        pinned=pinned,
    )
    _announce_on_commit(
        owner.pk, "session", {"action": "created", "session_id": session.pk}
    )
    return session


def session_update(*, session: ChatSession, **fields) -> ChatSession:
    """Change a session's fields. A title given here is the user's: a generated
    one never replaces it. Pinning alone is not activity, so it leaves
    `updated_at` (and the chat's date group) as it was."""
    if "title" in fields:
        fields["title_by_user"] = True
    for name, value in fields.items():
        setattr(session, name, value)
    if set(fields) <= {"pinned"}:
        ChatSession.objects.filter(pk=session.pk).update(**fields)
    else:
        session.save()
    _announce_on_commit(
        session.owner_id, "session", {"action": "updated", "session_id": session.pk}
    )
    return session


def session_delete(*, session: ChatSession) -> None:
    """Delete a session, its messages and its runs' journals."""
    owner_id, pk = session.owner_id, session.pk
    # Nothing queued starts when the cancels below end its run (chat.pending).
    PendingMessage.objects.filter(session=session, state="pending").update(
        state="cancelled", ended_at=timezone.now()
    )
    active = Run.objects.filter(turn__session=session, status__in=Run.ACTIVE)
    for run in active:
        run_cancel(run=run)
    session.delete()  # its runs go too (`_delete_runs_of_session`)
    _announce_on_commit(owner_id, "session", {"action": "deleted", "session_id": pk})


def run_start(
    *,
    session: ChatSession,
    content: str = "",
    model: str,
    provider: str,
    retry_of: str = "",
    regenerate: int | None = None,
    edit_of: int | None = None,
    attachments: list[int] | None = None,
    idempotency_key: str = "",
    idempotency_hash: str = "",
) -> tuple[Run, bool]:
    """Queue a run for the session's next turn; (run, created).

    The turn answers `content`, a new user message at the end of the active
    branch or, with `edit_of`, beside that user message (an edit). With
    `regenerate` (a user message) or `retry_of` (a run; only the active
    branch's latest), it answers that question again: no second copy of it is written,
    and the new answer is a branch beside the earlier ones (`chat.tree`). The
    model is sent the run's own branch only (`chat.runner.session_history`).
    A message that is not a user message of this session is refused
    (`RetryRefused`, 400).

    `attachments` are ids of the owner's uploads (`chat.attachments`, checked
    by the caller), stored with the new user message; one another request
    sent meanwhile is refused (`RetryRefused`, 409). An edit given none keeps
    the files of the version it replaces.

    With an `idempotency_key` this user already used for the same request
    (`idempotency_hash`: session and body), returns that run instead of
    starting (and paying for) a second one; used for another request, raises
    `IdempotencyMismatch`.
    """
    owner_id = session.owner_id
    if idempotency_key:
        existing = _idempotent_replay(owner_id, idempotency_key, idempotency_hash)
        if existing is not None:
            return existing, False
    try:
        with transaction.atomic():
            # Locks the session row on PostgreSQL; SQLite's IMMEDIATE transaction
            # already serialises writers. Either way one active run per session.
            ChatSession.objects.select_for_update().filter(pk=session.pk).first()
            active = (
                Run.objects.filter(turn__session=session, status__in=Run.ACTIVE)
                .values_list("id", flat=True)
                .first()
            )
            if active:
                raise RunConflict(active)
            if retry_of:
                _check_retry(session, retry_of)
                regenerate = _question_of(retry_of)
            elif regenerate is not None:
                _user_message(session, regenerate, "regenerate")
            _check_session_size(session)
            run = Run.objects.create(owner_id=owner_id, subject=session.subject)
            if regenerate is None:
                edited = (
                    _user_message(session, edit_of, "edit_of")
                    if edit_of is not None
                    else None
                )
                question = Message.objects.create(
                    session=session,
                    role=Message.Role.USER,
                    content=content,
                    run=run,
                    parent_id=(
                        edited.parent_id
                        if edited
                        else active_leaf(session_id=session.pk)
                    ),
                )
                _attach(owner_id, question, attachments or [], edited)
                regenerate = question.pk
            Turn.objects.create(
                run=run,
                owner_id=owner_id,
                session=session,
                reply_to_id=regenerate,
                model=model,
                provider=provider,
                idempotency_key=idempotency_key,
                idempotency_hash=idempotency_hash if idempotency_key else "",
            )
            _name_after_first_message(session, content)
            ChatSession.objects.filter(pk=session.pk).update(updated_at=timezone.now())
            _signal_workers({"type": "worker.nudge"})
            _announce_on_commit(
                owner_id,
                "run",
                {"action": "started", "run_id": run.id, "session_id": session.pk},
            )
    except IntegrityError:
        if idempotency_key:  # a concurrent retry with the same key won the race
            existing = _idempotent_replay(owner_id, idempotency_key, idempotency_hash)
            if existing is not None:
                return existing, False
        raise
    log.info("run queued run_id=%s session_id=%s", run.id, session.pk)
    return run, True


def _check_session_size(session: ChatSession) -> None:
    """Refuse a run of a session that holds the most messages one may (every
    version of every branch): 429 `session_messages`. A queued message meant
    to start it stays pending (`chat.pending.deliver_after_end`)."""
    limit = settings.HERMES["SESSION_MAX_MESSAGES"]
    if Message.objects.filter(session=session).count() >= limit:
        raise LimitExceeded(
            "session_messages",
            f"this chat holds {limit} messages, the most one may; start a new "
            "chat to go on",
            SESSIONS_RETRY_AFTER_S,
        )


def _attach(
    owner_id: int, question: Message, ids: list[int], edited: Message | None
) -> None:
    """Give the new question its files: the uploads `ids`, else (an edit) a
    copy of the edited version's."""
    if not ids:
        if edited is not None:
            copy_attachments(source=edited, target=question)
        return
    taken = Attachment.objects.filter(
        pk__in=ids, owner_id=owner_id, message__isnull=True
    ).update(message=question)
    if taken != len(ids):
        raise RetryRefused("an attachment was sent with another message meanwhile", 409)


PROVISIONAL_TITLE_CHARS = 60  # a sidebar line


def _name_after_first_message(session: ChatSession, content: str) -> None:
    """An unnamed chat is called after the start of its first message until its
    generated title (`chat.titles`) replaces that; neither is the user's."""
    line = content.strip().split("\n")[0].strip()
    if not line or session.title_by_user or session.title != "New chat":
        return
    if len(line) > PROVISIONAL_TITLE_CHARS:
        line = line[: PROVISIONAL_TITLE_CHARS - 1] + "…"
    named = ChatSession.objects.filter(
        pk=session.pk, title_by_user=False, title="New chat"
    ).update(title=line)
    if named:
        session.title = line
        _announce_on_commit(
            session.owner_id, "session", {"action": "updated", "session_id": session.pk}
        )


def _check_retry(session: ChatSession, run_id: str) -> None:
    runs = Run.objects.filter(turn__session=session)
    if not runs.filter(id=run_id).exists():
        raise RetryRefused(f"retry_of: {run_id!r} is not a run of this session", 400)
    latest = branch_last_run(session_id=session.pk)
    if latest != run_id:
        raise RetryRefused(
            f"retry_of: only the active branch's latest run ({latest}) can be "
            "retried (`regenerate` answers any question again)",
            409,
        )


def _user_message(session: ChatSession, pk: int, name: str) -> Message:
    message = Message.objects.filter(
        pk=pk, session=session, role=Message.Role.USER
    ).first()
    if message is None:
        raise RetryRefused(f"{name}: {pk} is not a user message of this session", 400)
    return message


def _question_of(run_id: str) -> int:
    """The user message a run answered: its turn's `reply_to`, else (a run
    from before branches that kept no message) the session's last user
    message made before the run."""
    turn = Turn.objects.select_related("run").get(run_id=run_id)
    if turn.reply_to_id is not None:
        return turn.reply_to_id
    question = (
        Message.objects.filter(
            session_id=turn.session_id,
            role=Message.Role.USER,
            created_at__lte=turn.run.created_at,
        )
        .order_by("-id")
        .values_list("id", flat=True)
        .first()
    )
    if question is None:
        raise RetryRefused(f"retry_of: {run_id!r} answered no question", 400)
    return question


def _idempotent_replay(owner_id: int, key: str, request_hash: str) -> Run | None:
    existing = (
        Turn.objects.select_related("run")
        .filter(owner_id=owner_id, idempotency_key=key)
        .first()
    )
    if existing is None:
        return None
    if existing.idempotency_hash != request_hash:
        raise IdempotencyMismatch(existing.run_id)
    return existing.run


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
    # Queued or waiting for a decision: no worker holds it.
    idle = (Run.Status.QUEUED, Run.Status.WAITING)
    if not Run.objects.filter(id=run_id, status__in=idle).exists():
        return []
    return run_settle(
        run_id=run_id,
        status=Run.Status.CANCELLED,
        terminal_state="cancelled-by-user",
        by="cancel",
        only_if_lost=False,
    )


def journal_text(*, run_id: str) -> str:
    """The assistant text a run streamed: its journal folded (`journal.fold`).

    Only `token` events carry answer text, so only they are read.
    """
    fold = Fold()
    payloads = (
        Event.objects.filter(run_id=run_id, type="token")
        .order_by("seq")
        .values_list("payload", flat=True)
    )
    for payload in payloads.iterator(chunk_size=2000):
        fold.add("token", json.loads(payload))
    return fold.text


def unkept_tail(*, run_id: str, text: str, committed: str) -> str:
    """What of the journal's `text` the `committed` fragments do not hold yet.

    They should be a prefix of it. When they are not (a fragment was stored
    otherwise than it streamed), nothing of the journal is dropped: the tail
    starts where the two first differ, and the mismatch is logged.
    """
    if text.startswith(committed):
        return text[len(committed) :]
    same = len(os.path.commonprefix([text, committed]))
    log.warning(
        "kept fragments of run_id=%s differ from its journal at char %d "
        "(journal %d chars, kept %d): keeping the journal's text from there",
        run_id,
        same,
        len(text),
        len(committed),
    )
    return text[same:]


@receiver(run_settling)
def keep_partial(sender, *, run_id: str, status: str, **kwargs) -> int | None:
    """Keep the part of a settled run's answer not yet in the session, exactly once.

    Fragments the worker already committed (stream resumes, tool steps) are
    assistant messages of this run; what the journal holds beyond them is the
    tail nobody kept yet (`unkept_tail`).
    """
    run = Turn.objects.filter(run_id=run_id).values("session_id").first()
    if not run:
        return None
    committed = "".join(
        Message.objects.filter(run_id=run_id, role=Message.Role.ASSISTANT)
        .order_by("id")
        .values_list("content", flat=True)
    )
    # Journals from before sanitising may hold NUL; kept fragments never do.
    text = storable(journal_text(run_id=run_id))
    tail = unkept_tail(run_id=run_id, text=text, committed=committed)
    if not tail:
        return None
    message = Message.objects.create(
        session_id=run["session_id"],
        role=Message.Role.ASSISTANT,
        content=tail,
        run_id=run_id,
        complete=False,
        parent_id=run_leaf(run_id=run_id),
    )
    return message.id


@receiver(pre_delete, sender=ChatSession)
def _delete_runs_of_session(sender, instance: ChatSession, **kwargs) -> None:
    """A session's runs and their journals go with it, however it is deleted.

    The journal's runs do not point at sessions (their turns do), so the
    cascade from the session reaches the turns but not the runs.
    """
    Run.objects.filter(turn__session=instance).delete()
    # Its title run (`chat.titles`) has no turn; it is found by its subject.
    Run.objects.filter(subject=f"chat.title:{instance.pk}").delete()
