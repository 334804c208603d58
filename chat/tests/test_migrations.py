"""Upgrading a database made before chat's turns: every run keeps its meaning.

Migrates the test database back to the last nodes before the reshape, writes
runs the old way through the historical models (a chat run, with its session
and chat fields; a run without a session), migrates forward again and reads the
result through today's models. On SQLite and on PostgreSQL (`DATABASE_URL`);
on PostgreSQL the old foreign key constraint from runs to sessions is put back
first, as databases made before the reshape have it.
"""

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from chat.models import ChatSession, Message, Turn
from journal.models import Event, Run

BEFORE = [("journal", "0003_run_idempotency_hash"), ("chat", "0002_initial")]


def _migrate(targets) -> MigrationExecutor:
    executor = MigrationExecutor(connection)
    executor.migrate(targets)
    return MigrationExecutor(connection)  # a fresh loader sees what is applied


def _leaves() -> list[tuple[str, str]]:
    return MigrationExecutor(connection).loader.graph.leaf_nodes()


def _old_session_constraint() -> None:
    """What databases made before the reshape have on PostgreSQL."""
    with connection.cursor() as cursor:
        cursor.execute(
            "ALTER TABLE journal_run ADD CONSTRAINT journal_run_session_fk"
            " FOREIGN KEY (session_id) REFERENCES chat_chatsession (id)"
            " DEFERRABLE INITIALLY DEFERRED"
        )


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_upgrade_moves_chat_fields_into_turns_and_names_the_subject():
    executor = _migrate(BEFORE)
    try:
        if connection.vendor == "postgresql":
            _old_session_constraint()
        old = executor.loader.project_state(BEFORE).apps
        user = old.get_model("auth", "User").objects.create(username="old")
        session = old.get_model("chat", "ChatSession").objects.create(owner=user)
        OldRun = old.get_model("journal", "Run")
        chat_run = OldRun.objects.create(
            id="run_old_chat",
            owner=user,
            legacy_session_id=session.pk,
            status="completed",
            last_seq=1,
            model="fake-model",
            provider="openai",
            usage={"total_tokens": 46},
            diagnostics={"model_requests_started": 1},
            idempotency_key="key-1",
            idempotency_hash="a" * 64,
        )
        OldRun.objects.create(id="run_old_bare", owner=user, provider="openai")
        old.get_model("journal", "Event").objects.create(
            run=chat_run,
            seq=1,
            type="token",
            payload='{"text":"hi"}',
            created_at=(chat_run.created_at),
        )
        old.get_model("chat", "Message").objects.create(
            session=session, role="user", content="hello", run=chat_run
        )
    finally:
        _migrate(_leaves())

    run = Run.objects.select_related("turn").get(id="run_old_chat")
    assert run.subject == f"chat.session:{session.pk}"
    assert (run.status, run.last_seq) == ("completed", 1)
    turn = run.turn
    assert (turn.session_id, turn.owner_id) == (session.pk, user.pk)
    assert (turn.model, turn.provider) == ("fake-model", "openai")
    assert turn.usage == {"total_tokens": 46}
    assert turn.diagnostics == {"model_requests_started": 1}
    assert (turn.idempotency_key, turn.idempotency_hash) == ("key-1", "a" * 64)
    bare = Run.objects.get(id="run_old_bare")
    assert bare.subject == "" and not Turn.objects.filter(run_id=bare.id).exists()
    assert Event.objects.filter(run_id=run.id).count() == 1
    assert Message.objects.get(run_id=run.id).content == "hello"
    # The old column and its constraint are gone: deleting the session takes
    # its runs and journals with it (chat.services), nothing else refuses.
    ChatSession.objects.get(pk=session.pk).delete()
    assert not Run.objects.filter(id=run.id).exists()
    assert not Event.objects.filter(run_id=run.id).exists()
    assert Run.objects.filter(id=bare.id).exists()


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_downgrade_puts_the_chat_fields_back_on_the_run():
    user_model = ChatSession._meta.get_field("owner").related_model
    user = user_model.objects.create(username="new")
    session = ChatSession.objects.create(owner=user)
    run = Run.objects.create(owner=user, subject=session.subject)
    Turn.objects.create(
        run=run, owner=user, session=session, model="m", provider="p", usage={"n": 1}
    )
    try:
        executor = _migrate(BEFORE)
        old = executor.loader.project_state(BEFORE).apps
        back = old.get_model("journal", "Run").objects.get(id=run.id)
        assert (back.legacy_session_id, back.model, back.provider, back.usage) == (
            session.pk,
            "m",
            "p",
            {"n": 1},
        )
    finally:
        _migrate(_leaves())
    assert Turn.objects.get(run_id=run.id).model == "m"
