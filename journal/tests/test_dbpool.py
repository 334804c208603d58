"""Pool threads whose connections the server closed.

Reads go on; a write fails once and is not repeated; the next one reconnects.
"""

import asyncio

import pytest
from django.db import OperationalError, connection

from hermes_testing.harness import running_run, wait_until
from journal import dbpool
from journal.models import Run

pytestmark = pytest.mark.skipif(
    connection.vendor != "postgresql",
    reason="only a server closes connections (SQLite has none to lose)",
)


def _terminate_pool_connections() -> int:
    """Close every server connection of this test database but the test's own."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pid FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        pids = [pid for (pid,) in cursor.fetchall()]
        for pid in pids:
            cursor.execute("SELECT pg_terminate_backend(%s)", [pid])

    def gone() -> bool:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE pid = ANY(%s)", [pids]
            )
            return cursor.fetchone()[0] == 0

    wait_until(gone)
    return len(pids)


def _status(run_id: str) -> str:
    return Run.objects.values_list("status", flat=True).get(id=run_id)


def _mark(run_id: str) -> int:
    return Run.objects.filter(id=run_id).update(terminal_state="marked")


async def _all_readers(run_id: str) -> list[str]:
    return await asyncio.gather(
        *(dbpool.readers.run(_status, run_id) for _ in range(dbpool.READ_THREADS * 3))
    )


@pytest.mark.parametrize("ping_idle_s", [0.0, 3600.0])
def test_reads_survive_connections_the_server_closed(alice, monkeypatch, ping_idle_s):
    run = running_run(alice[0])
    assert asyncio.run(_all_readers(run.id)) == ["running"] * dbpool.READ_THREADS * 3
    monkeypatch.setattr(dbpool, "PING_IDLE_S", ping_idle_s)
    assert _terminate_pool_connections() >= 1
    # Checked before use (ping) or read again once on a new connection.
    assert asyncio.run(_all_readers(run.id)) == ["running"] * dbpool.READ_THREADS * 3


def test_a_write_on_a_dead_connection_fails_once_and_is_not_repeated(
    alice, monkeypatch
):
    run = running_run(alice[0])
    assert asyncio.run(dbpool.writers.run(_status, run.id)) == "running"
    monkeypatch.setattr(dbpool, "PING_IDLE_S", 3600.0)  # no check before use
    _terminate_pool_connections()
    dbpool.forget_trouble()
    with pytest.raises(OperationalError):
        asyncio.run(dbpool.writers.run(_mark, run.id))
    assert dbpool.since_trouble() < 60  # reapers now hold off for a lease
    assert Run.objects.get(id=run.id).terminal_state == ""
    # The dead connection was replaced: the next write lands.
    assert asyncio.run(dbpool.writers.run(_mark, run.id)) == 1
    dbpool.forget_trouble()


def test_idle_connections_are_checked_before_a_write(alice, monkeypatch):
    run = running_run(alice[0])
    assert asyncio.run(dbpool.writers.run(_status, run.id)) == "running"
    monkeypatch.setattr(dbpool, "PING_IDLE_S", 0.0)
    _terminate_pool_connections()
    assert asyncio.run(dbpool.writers.run(_mark, run.id)) == 1


@pytest.mark.django_db
def test_a_limit_of_the_server_exceeded_is_no_outage():
    """PostgreSQL files "program limit exceeded" under OperationalError; it is
    the request's fault, so nothing waits for the server to come back."""
    with pytest.raises(OperationalError) as refused:
        with connection.cursor() as cursor:
            cursor.execute("SELECT repeat('x', 1100000000)")
    assert not dbpool.is_connection_error(refused.value)
    # What a lost connection raises carries no SQLSTATE of the request's.
    lost = OperationalError("server closed the connection unexpectedly")
    assert dbpool.is_connection_error(lost)
