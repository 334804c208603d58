"""Titles generated after a chat's first answer (docs/architecture.md §2).

A title is a run of its own, journaled like any other: a `journal.Run` whose
subject is `chat.title:<session_id>`. It has no `chat.Turn`, so no transcript
and no session's active run ever shows it. `title_queue` queues it in the
transaction that ends a session's first completed answer; any worker claims
it, and `execute_title_run` asks the chat's model (without tools) for a short
title and journals `start`, the title as one `token`, and `end` (with a
`status` before the token when the title is the question's first words: the
model gave none that `clean_title` keeps, failed or took too long). The title is
saved in the transaction of that `end`, and only while the user has not named
the chat (`ChatSession.title_by_user`): a rename always wins. The owner's tabs
hear "session updated" and refetch their sidebar.
"""

import asyncio
import contextlib
import logging
import re

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


# What a title run asks for, reads, and how long it waits. It asks for at most
# TITLE_MAX_TOKENS, and also bounds what it reads (a server may not honour the
# limit): it stops once a title line has come (a line, then a newline) or
# after READ_MAX_CHARS, and gives up after TIME_LIMIT_S. Small local models
# answer the conversation instead of naming it: a 1,215-character "title"
# took 17.7 s.
TITLE_MAX_TOKENS = 32  # six words in any language, with room for a lead-in
READ_MAX_CHARS = 240
TIME_LIMIT_S = 20.0
TITLE_MAX_CHARS = 60  # a sidebar line; longer titles are cut on a word boundary
REJECT_CHARS = 100  # a first line longer than this is an answer, not a title
REJECT_WORDS = 12  # the model is asked for six words
FALLBACK_WORDS = 6  # of the question, when the model gave no usable title

# An answer that declines ("I'm sorry, …", "I cannot …") is not a title.
_REFUSAL = re.compile(
    r"^(?:i\s*(?:'m|am)\s+(?:sorry|afraid|unable|not able)|sorry\b|"
    r"i\s+(?:cannot|can\s*not|can't|won't|will not|do not|don't)\b|"
    r"i\s+apologi[sz]e|as an ai\b|unfortunately\b)",
    re.IGNORECASE,
)
# Nor is an answer to the question, or a chat with the reader, which is what
# small models write instead ("The answer to the question above is …",
# "You can answer that, I'm here to help you with anything!").
_NOT_A_TITLE = re.compile(
    r"^(?:the\s+)?(?:correct\s+|short\s+|final\s+)?answer\b|"
    r"\b(?:i'm|i am|i can|i'll|i will|i'd|let me|you can|you could|you should"
    r"|here to help|happy to help|hope this helps)\b",
    re.IGNORECASE,
)
# Two sentences are an answer too ("Same answer. No additional context …");
# an abbreviation ("Dr. Who", "U.S. Politics") is not a sentence's end.
_TWO_SENTENCES = re.compile(r"[a-z]{3,}[.!?]\s+[A-Z]")
# A lead-in before the title itself: "Title:", "Sure! Here is a title: …".
_LEAD_IN = re.compile(
    r"^(?:(?:sure|okay|ok|certainly|of course)\b[!,.]?\s*)?"
    r"(?:here(?:'s| is)\s+(?:a|the|your|my)\s+(?:short\s+|possible\s+)?)?"
    r"(?:the\s+)?(?:suggested\s+)?title(?:\s+(?:of|for)\s+[^:\"“”]*?)?"
    r"(?:\s*[:\-–—]|\s+(?:is|would be|could be)\b:?)\s*",
    re.IGNORECASE,
)
_LIST_MARK = re.compile(r"^(?:[#>*+\-]+|\d+[.)])\s+")
_INLINE_MARKUP = re.compile(r"(\*\*|__|`+|~~)")
_QUOTES = "\"'“”‘’«»„`"
_TRAILING = ".,:;…-–—/|\\ \t"
LEAD_IN_WORDS = 6  # "Sure! Here are some ideas:" before the title's own line
_ANNOUNCING = re.compile(
    r"\b(?:title|here|sure|certainly|suggest\w*|ideas?|options?)\b", re.IGNORECASE
)


def _unmark(line: str) -> str:
    """One line without Markdown markers (headings, list marks, emphasis,
    code ticks), lead-ins ("Title:"), surrounding quotes or a trailing
    '.', ',', ':', ';' or dash."""
    line = line.strip()
    for _ in range(3):  # "## **Title:** "x"" unwraps in a few passes
        before = line
        line = _LIST_MARK.sub("", line)
        line = _INLINE_MARKUP.sub("", line).strip()
        line = line.strip("*_#").strip()
        line = _LEAD_IN.sub("", line).strip()
        if len(line) >= 2 and line[0] in _QUOTES and line[-1] in _QUOTES:
            line = line[1:-1].strip()
        line = line.rstrip(_TRAILING).lstrip(_QUOTES).rstrip(_QUOTES).strip()
        line = line.rstrip(_TRAILING)
        if line == before:
            break
    for opening, closing in (("“", "”"), ("«", "»")):
        if line.count(opening) != line.count(closing):  # unpaired: dropped
            line = line.replace(opening, "").replace(closing, "")
    if line.count('"') % 2:
        line = line.replace('"', "")
    return " ".join(line.split())


def _title_line(text: str) -> str:
    """The line a title is taken from: the first with words in it (a code
    fence has none), skipping a short lead-in that ends with ':' ("Here is a
    title:") when a line follows it."""
    lines = [
        line
        for line in text.splitlines()
        if _unmark(line) and not line.lstrip().startswith("```")
    ]
    for index, line in enumerate(lines):
        if _lead_in(line) and index + 1 < len(lines):
            continue
        return line
    return ""


def _lead_in(line: str) -> bool:
    """A short line that announces what follows ("Here are some ideas:");
    other lines ending with ':' are titles with a ':' too many."""
    return (
        line.rstrip().rstrip("*_").endswith(":")
        and len(line.split()) <= LEAD_IN_WORDS
        and _ANNOUNCING.search(line) is not None
    )


def title_read_enough(text: str) -> bool:
    """Whether a title run has read enough of the answer to stop: a whole
    title line (not a lead-in ending with ':') or READ_MAX_CHARS."""
    if len(text) >= READ_MAX_CHARS:
        return True
    whole, newline, _ = text.rpartition("\n")
    if not newline:
        return False
    line = _title_line(whole)
    return bool(line) and not _lead_in(line)


def clean_title(text: str) -> str:
    """The model's answer as a sidebar title, or "" when it is none: one line,
    without quotes, Markdown or a trailing '.', ',' or ':', cut on a word
    boundary to TITLE_MAX_CHARS. A refusal ("I'm sorry, …"), an answer to
    the question or a word to the reader ("I'm here to help") or anything
    longer than a title (REJECT_CHARS, REJECT_WORDS) gives ""."""
    line = _unmark(_title_line(text))
    flat = line.replace("’", "'")
    if not line or _REFUSAL.match(flat) or _NOT_A_TITLE.search(flat):
        return ""
    if _TWO_SENTENCES.search(line):
        return ""
    if len(line) > REJECT_CHARS or len(line.split()) > REJECT_WORDS:
        return ""
    return _cut(line)


def _cut(line: str, limit: int = TITLE_MAX_CHARS) -> str:
    """`line` in at most `limit` characters, cut after a whole word."""
    if len(line) <= limit:
        return line
    head = line[: limit - 1]
    if line[limit - 1] != " " and " " in head:
        head = head.rsplit(" ", 1)[0]
    return head.rstrip(_TRAILING) + "…"


def fallback_title(question: str) -> str:
    """The first words of the question: the title when the model gave none."""
    words = _unmark(question.strip().split("\n")[0] if question.strip() else "")
    return _cut(" ".join(words.split()[:FALLBACK_WORDS]).rstrip(_TRAILING + "?!"))


def _prompt(run_id: str) -> tuple[int, str, str, list[dict], str]:
    """(session id, model, its provider now, messages, the question) of a
    title run."""
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
        question.content[:PROMPT_CHARS] if question else "",
    )


async def _read_title(provider, model: str, messages: list[dict], control) -> str:
    """The model's answer, read until a title line came, READ_MAX_CHARS or a
    stop; the stream is closed at once (the server sees the socket close)."""
    text = ""
    stream = provider.stream(model, messages, max_tokens=TITLE_MAX_TOKENS)
    async with contextlib.aclosing(stream), asyncio.timeout(TIME_LIMIT_S):
        async for item in stream:
            if isinstance(item, ContentDelta):
                text += item.text
                if title_read_enough(text):
                    break
            if control.stop.is_set():
                break
    return text


async def execute_title_run(claim: Claim, control) -> str:
    """Run a claimed title run to its `end`; returns the status written.

    The model's answer is cleaned (`clean_title`); when it gives no title
    (empty, a refusal, an answer longer than a title), or the model fails or
    takes longer than TIME_LIMIT_S, the chat is named after the first words
    of its question (`fallback_title`). An empty or unusable answer still
    completes the run; a failure or a timeout ends it `failed`, with its
    error, and the fallback title all the same."""
    session_id, model, provider_name, messages, question = await dbpool.readers.run(
        _prompt, claim.run_id
    )
    provider = registry.get_provider(provider_name)
    error = None
    text = ""
    try:
        text = await _read_title(provider, model, messages, control)
    except ProviderError as exc:
        error = {"category": exc.category, "message": exc.message}
    except TimeoutError:
        error = {
            "category": "timeout",
            "message": f"no title within {TIME_LIMIT_S:g} s",
        }
    title = "" if error else clean_title(text)
    events: list = [("start", {"model": model, "provider": provider.name})]
    end: dict
    if control.stop.is_set():
        end = {"status": Run.Status.INTERRUPTED, "terminal_state": "worker-shutdown"}
        title = ""
    else:
        if not title:
            why = (
                "the model failed"
                if error
                else "the model's answer was empty"
                if not text.strip()
                else "the model's answer was not a title"
            )
            events.append(("status", {"message": f"Title from the question: {why}"}))
            title = fallback_title(question)
        if error:
            end = {
                "status": Run.Status.FAILED,
                "terminal_state": "provider-error",
                "error": error,
            }
        else:
            end = {"status": Run.Status.COMPLETED, "terminal_state": "completed"}
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
