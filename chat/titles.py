"""Titles generated after a chat's first answer (docs/architecture.md §2).

A title is a run of its own, journaled like any other: a `journal.Run` whose
subject is `chat.title:<session_id>`. It has no `chat.Turn`, so no transcript
and no session's active run ever shows it. `title_queue` queues it in the
transaction that ends a session's first completed answer; any worker claims
it, and `execute_title_run` asks the chat's model (without tools) for a short
title and journals `start`, the title as one `token`, and `end`. The title is
saved in the transaction of that `end`, and only while the user has not named
the chat (`ChatSession.title_by_user`): a rename always wins. The owner's tabs
hear "session updated" and refetch their sidebar.
"""

import logging

from django.conf import settings
from django.db import transaction

from journal import dbpool
from journal.leases import Claim
from journal.models import Run
from journal.publish import publish
from journal.store import append

from .models import ChatSession, Message, Turn
from .providers import registry
from .providers.base import TITLE_INSTRUCTION, ContentDelta, ProviderError
from .services import _announce_on_commit, _signal_workers

log = logging.getLogger(__name__)

SUBJECT_PREFIX = "chat.title:"
TITLE_MAX_CHARS = 80  # a sidebar line; the model is asked for six words
PROMPT_CHARS = 2000  # of the question and of the answer: enough to name a chat


def title_subject(session_id: int) -> str:
    return f"{SUBJECT_PREFIX}{session_id}"


def is_title_subject(subject: str) -> bool:
    return subject.startswith(SUBJECT_PREFIX)


def title_queue(*, session_id: int) -> Run | None:
    """Inside the transaction of a chat run's completed `end`: queue the title
    run if the user has not named the chat and it has none yet (and titles
    are on: `HERMES_TITLES`)."""
    if not settings.HERMES["TITLES"]:
        return None
    session = (
        ChatSession.objects.filter(pk=session_id, title_by_user=False)
        .values("owner_id")
        .first()
    )
    subject = title_subject(session_id)
    if session is None or Run.objects.filter(subject=subject).exists():
        return None
    run = Run.objects.create(owner_id=session["owner_id"], subject=subject)
    _signal_workers({"type": "worker.nudge"})
    return run


def clean_title(text: str) -> str:
    """The model's answer as a sidebar title: one line, no quotes or final
    period, at most TITLE_MAX_CHARS."""
    line = next((part for part in text.strip().splitlines() if part.strip()), "")
    line = line.strip().strip("\"'“”‘’*#").strip().rstrip(".").strip()
    if len(line) > TITLE_MAX_CHARS:
        line = line[: TITLE_MAX_CHARS - 1].rstrip() + "…"
    return line


def _prompt(run_id: str) -> tuple[int, str, str, list[dict]]:
    """(session id, model, its provider now, messages) of a title run."""
    run = Run.objects.get(id=run_id)
    session_id = int(run.subject[len(SUBJECT_PREFIX) :])
    turn = Turn.objects.filter(session_id=session_id).order_by("run_id").first()
    session = ChatSession.objects.get(pk=session_id)
    model = (turn.model if turn else "") or session.model or registry.default_model()
    messages = Message.objects.filter(session_id=session_id).order_by("id")
    question = messages.filter(role=Message.Role.USER).first()
    answer = messages.filter(role=Message.Role.ASSISTANT, complete=True).first()
    text = (
        f"Question:\n{question.content[:PROMPT_CHARS] if question else ''}\n\n"
        f"Answer:\n{answer.content[:PROMPT_CHARS] if answer else ''}"
    )
    return (
        session_id,
        model,
        registry.provider_name_for(model),  # reads the admin's routes
        [
            {"role": "system", "content": TITLE_INSTRUCTION},
            {"role": "user", "content": text},
        ],
    )


async def execute_title_run(claim: Claim, control) -> str:
    """Run a claimed title run to its `end`; returns the status written."""
    session_id, model, provider_name, messages = await dbpool.readers.run(
        _prompt, claim.run_id
    )
    provider = registry.get_provider(provider_name)
    pieces: list[str] = []
    error = None
    try:
        async for item in provider.stream(model, messages):
            if isinstance(item, ContentDelta):
                pieces.append(item.text)
            if control.stop.is_set():
                break
    except ProviderError as exc:
        error = {"category": exc.category, "message": exc.message}
    title = "" if error else clean_title("".join(pieces))
    end: dict
    if control.stop.is_set():
        end = {"status": Run.Status.INTERRUPTED, "terminal_state": "worker-shutdown"}
        title = ""
    elif error or not title:
        error = error or {"category": "provider", "message": "the title was empty"}
        end = {
            "status": Run.Status.FAILED,
            "terminal_state": "provider-error",
            "error": error,
        }
    else:
        end = {"status": Run.Status.COMPLETED, "terminal_state": "completed"}
    events: list = [("start", {"model": model, "provider": provider.name})]
    if title:
        events.append(("token", {"text": title}))
    events.append(("end", end))
    records = await dbpool.writers.run(_finish, claim, session_id, events, title)
    await publish(claim.run_id, records)
    log.info("title run ended run_id=%s status=%s", claim.run_id, end["status"])
    return end["status"]


def _finish(claim: Claim, session_id: int, events: list, title: str):
    """The title run's journal and the chat's new title, in one transaction;
    a chat the user named keeps its name."""
    with transaction.atomic():
        records = append(run_id=claim.run_id, token=claim.token, events=events)
        if title:
            sessions = ChatSession.objects.filter(pk=session_id, title_by_user=False)
            owner_id = sessions.values_list("owner_id", flat=True).first()
            if owner_id is not None and sessions.update(title=title):
                _announce_on_commit(
                    owner_id, "session", {"action": "updated", "session_id": session_id}
                )
    return records
