"""Upgrading to messages as a tree (chat/0007, chat/0008): existing sessions
become one chain, and a retried answer becomes a branch beside the answer it replaced.

Migrates the test database back to chat/0006, writes sessions through the
historical models, migrates forward and reads them through today's models. On
SQLite and on PostgreSQL (`DATABASE_URL`).
"""

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from chat.models import Message, Turn
from chat.runner import session_history
from chat.tree import Tree

BEFORE = [
    ("chat", "0006_session_always_allowed_tools"),
    ("journal", "0005_run_generic"),
]


def _migrate(targets) -> MigrationExecutor:
    executor = MigrationExecutor(connection)
    executor.migrate(targets)
    return MigrationExecutor(connection)


@pytest.mark.django_db(transaction=True)
def test_linear_sessions_become_a_chain_and_retries_branches():
    executor = _migrate(BEFORE)
    try:
        old = executor.loader.project_state(BEFORE).apps
        user = old.get_model("auth", "User").objects.create(username="old")
        Session = old.get_model("chat", "ChatSession")
        OldMessage = old.get_model("chat", "Message")
        Run = old.get_model("journal", "Run")
        OldTurn = old.get_model("chat", "Turn")

        def run(name, session):
            made = Run.objects.create(id=f"run_{name}", owner=user, status="completed")
            OldTurn.objects.create(run=made, owner=user, session=session)
            return made

        def say(session, role, content, made=None):
            return OldMessage.objects.create(
                session=session, role=role, content=content, run=made
            ).pk

        plain, retried = (
            Session.objects.create(owner=user),
            Session.objects.create(owner=user),
        )
        r1, r2 = run("p1", plain), run("p2", plain)
        p = [
            say(plain, "user", "Q1", r1),
            say(plain, "assistant", "", r1),
            say(plain, "tool", "12:00", r1),
            say(plain, "assistant", "It is noon.", r1),
            say(plain, "user", "Q2", r2),
            say(plain, "assistant", "A2", r2),
        ]
        t1, t2, t3 = run("t1", retried), run("t2", retried), run("t3", retried)
        q = say(retried, "user", "Q", t1)
        old_answer = say(retried, "assistant", "cut", t1)
        new_answer = say(retried, "assistant", "whole", t2)  # a retry of t1
        q2 = say(retried, "user", "Q2", t3)
    finally:
        _migrate(MigrationExecutor(connection).loader.graph.leaf_nodes())

    parents = dict(Message.objects.values_list("id", "parent_id"))
    assert [parents[pk] for pk in p] == [None, *p[:-1]]
    assert Tree.of_session(plain.pk).active_path() == p
    assert [parents[pk] for pk in (q, old_answer, new_answer, q2)] == [
        None,
        q,
        q,
        new_answer,
    ]
    assert Tree.of_session(retried.pk).active_path() == [q, new_answer, q2]
    replies = dict(Turn.objects.values_list("run_id", "reply_to_id"))
    assert replies == {
        "run_p1": p[0],
        "run_p2": p[4],
        "run_t1": q,
        "run_t2": q,
        "run_t3": q2,
    }
    sent = session_history(session_id=retried.pk)
    assert [m["content"] for m in sent] == ["Q", "whole", "Q2"]
