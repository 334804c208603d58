"""What a settled run keeps of its answer (`chat.services.keep_partial`): the
journal's text not yet in the session, once, and never less when the kept
fragments disagree with the journal."""

import logging

import pytest

from chat.models import ChatSession, Message
from hermes_testing.turns import running_turn
from journal.leases import run_settle
from journal.models import Run
from journal.store import append


@pytest.fixture
def run(alice):
    session = ChatSession.objects.create(owner=alice[0], title="t")
    return running_turn(alice[0], session=session)


def _stream(run, *texts: str) -> None:
    append(run_id=run.id, token=1, events=[("token", {"text": t}) for t in texts])


def _assistant(run, content: str) -> Message:
    return Message.objects.create(
        session_id=run.turn.session_id,
        role="assistant",
        content=content,
        run_id=run.id,
    )


def _settle(run) -> None:
    run_settle(
        run_id=run.id,
        status=Run.Status.INTERRUPTED,
        terminal_state="lost-worker",
        by="test",
        only_if_lost=False,
    )


def _kept(run) -> list[str]:
    return list(
        Message.objects.filter(run_id=run.id, role="assistant")
        .order_by("id")
        .values_list("content", flat=True)
    )


def test_the_tail_beyond_the_kept_fragments_is_kept_once(run, caplog):
    _stream(run, "Hello ", "wide ", "world")
    _assistant(run, "Hello ")
    with caplog.at_level(logging.WARNING, logger="chat.services"):
        _settle(run)
    assert _kept(run) == ["Hello ", "wide world"]
    assert "differ from its journal" not in caplog.text
    end = Run.objects.get(pk=run.pk)
    assert end.status == Run.Status.INTERRUPTED


def test_kept_fragments_that_disagree_with_the_journal_drop_nothing(run, caplog):
    """A fragment stored otherwise than it streamed: the journal's text from the
    first difference on is kept (nothing of it is lost), and it is logged."""
    _stream(run, "Hello ", "wide ", "world")
    _assistant(run, "Hello narrow")
    with caplog.at_level(logging.WARNING, logger="chat.services"):
        _settle(run)
    assert _kept(run) == ["Hello narrow", "wide world"]
    assert f"kept fragments of run_id={run.id} differ from its journal at char 6" in (
        caplog.text
    )


def test_nothing_is_added_when_the_fragments_hold_it_all(run):
    _stream(run, "All ", "said.")
    _assistant(run, "All said.")
    _settle(run)
    assert _kept(run) == ["All said."]
