"""A branch longer than the database's variable limit is read like any other
(issue 42, item 8).

Reads named every id of the active branch in one statement: past SQLite's
limit (32,766 in its default build, 999 in older ones) or PostgreSQL's
65,535 parameters the statement failed, and the session answered 503 on
every read as if the database were out. On SQLite the test lowers the
connection's limit to 999, the oldest default; on PostgreSQL it makes a
branch past 65,535 messages.
"""

import sqlite3

import pytest
from django.db import connection

from chat.models import Attachment, ChatSession, Message, Turn
from chat.runner import session_history
from chat.tree import Tree
from hermes_testing.harness import running_run

SQLITE_LIMIT = 999


def branch_length() -> int:
    return SQLITE_LIMIT + 300 if connection.vendor == "sqlite" else 65_535 + 500


@pytest.fixture
def low_sqlite_limit():
    """SQLite as built with its oldest default: 999 variables a statement."""
    if connection.vendor == "sqlite":
        connection.ensure_connection()
        raw = connection.connection
        before = raw.setlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER, SQLITE_LIMIT)
        yield
        raw.setlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER, before)
    else:
        yield


@pytest.fixture
def long_session(alice, low_sqlite_limit):
    """One chain of questions and answers, longer than the limit, the last
    question answered by a run, the first one with a file."""
    session = ChatSession.objects.create(owner=alice[0], title="long", model="demo")
    roles = ("user", "assistant")
    count = branch_length()
    Message.objects.bulk_create(
        (
            Message(session=session, role=roles[i % 2], content=f"m{i}")
            for i in range(count)
        ),
        batch_size=500,
    )
    # Each message under the one before it: one statement, no ids named.
    table = Message._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {table} SET parent_id = (SELECT MAX(p.id) FROM {table} p"
            f" WHERE p.session_id = {table}.session_id AND p.id < {table}.id)"
            f" WHERE session_id = %s",
            [session.pk],
        )
    ids = list(session.messages.order_by("id").values_list("id", flat=True))
    run = running_run(alice[0], subject=session.subject)
    Turn.objects.create(run=run, owner=alice[0], session=session, reply_to_id=ids[-1])
    Attachment.objects.create(
        owner=alice[0],
        message_id=ids[0],
        name="a.txt",
        kind="text",
        mime="text/plain",
        size=2,
        data=b"hi",
    )
    return session, ids, run


@pytest.mark.slow
def test_every_read_and_select_of_a_long_branch_answers(api, long_session):
    session, ids, run = long_session
    assert Tree.of_session(session.pk).active_path() == ids

    detail = api.get(f"/api/sessions/{session.pk}/")
    assert detail.status_code == 200, detail.content[:300]
    assert detail.json()["last_run_id"] == run.id

    page = api.get(f"/api/sessions/{session.pk}/messages/?branch=active")
    assert page.status_code == 200, page.content[:300]
    assert [m["id"] for m in page.json()["results"]] == ids[:100]
    assert all(m["active"] for m in page.json()["results"])

    everything = api.get(f"/api/sessions/{session.pk}/messages/")
    assert everything.status_code == 200

    # What the model is sent: the whole branch, the file with its message.
    history = session_history(session_id=session.pk, run_id=run.id)
    assert len(history) == len(ids)
    assert "a.txt" in history[0]["content"]

    # Selecting a version at the end selects the whole branch down to it.
    Message.objects.filter(pk=ids[-1]).update(parent_id=ids[-3])  # a version
    response = api.post(f"/api/sessions/{session.pk}/messages/{ids[-2]}/select/")
    assert response.status_code == 200, response.content[:300]
    assert response.json()["active"] == ids[:-1]
    selected = dict(session.messages.values_list("id", "selected_at"))
    assert selected[ids[0]] == selected[ids[-2]] > selected[ids[-1]]
