"""A run's end (`chat.runner._finish`), written directly: one short
transaction, whatever is pending, and nothing of it when the fence fails."""

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from chat import pending, runner
from chat.models import ChatSession, Message, PendingMessage, Turn
from chat.pending import pending_add
from chat.services import run_start
from journal.leases import Claim
from journal.models import Event, Run
from journal.store import AppendRejected

END = {"status": Run.Status.COMPLETED, "terminal_state": "completed"}
ANSWER = {"role": Message.Role.ASSISTANT, "content": "Hi.", "complete": True}


def _running(owner) -> tuple[Run, ChatSession]:
    session = ChatSession.objects.create(owner=owner)
    run, _ = run_start(session=session, content="hello", model="demo", provider="demo")
    Run.objects.filter(pk=run.pk).update(status=Run.Status.RUNNING, fencing_token=1)
    return run, session


def _finish(run: Run, session: ChatSession, token: int = 1):
    return runner._finish(
        Claim(run.pk, token),
        session.pk,
        message=dict(ANSWER),
        events=[("usage", {"output_tokens": 2}), ("end", dict(END))],
        turn_fields={"usage": {"output_tokens": 2}, "diagnostics": {"steps": 1}},
    )


def test_an_end_with_nothing_pending_is_one_short_transaction(alice, settings):
    """Every run pays its end: the answer under the question, the journal's
    usage and end, the turn's figures and the pending look (in a savepoint
    of its own), in eleven statements, BEGIN and COMMIT included."""
    settings.HERMES = {**settings.HERMES, "TITLES": False}
    run, session = _running(alice[0])
    question = Message.objects.get(session=session, role=Message.Role.USER)
    with CaptureQueriesContext(connection) as statements:
        records = _finish(run, session)
    assert len(statements.captured_queries) <= 11, [
        q["sql"][:80] for q in statements.captured_queries
    ]
    answer = Message.objects.get(session=session, role=Message.Role.ASSISTANT)
    assert (answer.parent_id, answer.run_id, answer.content) == (
        question.pk,
        run.pk,
        "Hi.",
    )
    assert [(r.seq, r.type) for r in records] == [(1, "usage"), (2, "end")]
    assert f'"message_id":{answer.pk}' in records[-1].payload
    run.refresh_from_db()
    assert (run.status, run.last_seq, run.lease_expires_at) == ("completed", 2, None)
    assert Turn.objects.get(run=run).diagnostics == {"steps": 1}


def test_an_end_starts_the_queued_message(alice, settings):
    settings.HERMES = {**settings.HERMES, "TITLES": False}
    run, session = _running(alice[0])
    queued = pending_add(session=session, kind="queue", content="and then?")
    _finish(run, session)
    queued.refresh_from_db()
    assert queued.state == PendingMessage.State.STARTED
    nxt = Run.objects.get(pk=queued.delivered_run_id)
    assert nxt.status == Run.Status.QUEUED
    assert Turn.objects.get(run=nxt).session_id == session.pk


def test_a_fenced_out_end_keeps_nothing(alice):
    run, session = _running(alice[0])
    with pytest.raises(AppendRejected, match="stale fencing token"):
        _finish(run, session, token=0)
    assert not Message.objects.filter(role=Message.Role.ASSISTANT).exists()
    assert not Event.objects.filter(run=run).exists()
    run.refresh_from_db()
    assert (run.status, run.last_seq) == (Run.Status.RUNNING, 0)


def test_a_failed_pending_look_leaves_the_end_standing(alice, settings, monkeypatch):
    """The look for a queued message fails in the database (as a deadlock
    over the session's lock would): logged, and the answer and the end are
    kept all the same (on PostgreSQL a failed statement outside a savepoint
    would abort the whole transaction)."""
    settings.HERMES = {**settings.HERMES, "TITLES": False}
    run, session = _running(alice[0])

    def look_fails(session_id: int) -> bool:
        with connection.cursor() as cursor:
            cursor.execute("SELECT no_such_column FROM chat_pendingmessage")
        return True

    monkeypatch.setattr(pending, "_pending_locked", look_fails)
    records = _finish(run, session)
    assert records[-1].type == "end"
    run.refresh_from_db()
    assert run.status == Run.Status.COMPLETED
    assert Message.objects.filter(role=Message.Role.ASSISTANT, run=run).count() == 1
