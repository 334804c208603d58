"""A server's start-up opens the database pools' connections (`dbpool.warm`),
so that no job, and no user's first request, pays for one."""

import asyncio
import threading

import pytest
from django.db import connection
from django.db.backends.signals import connection_created

from journal import dbpool


@pytest.fixture
def connects():
    """The names of the threads that open a database connection from here on."""
    names: list[str] = []

    def note(sender, **kwargs):
        names.append(threading.current_thread().name)

    connection_created.connect(note, weak=False)
    yield names
    connection_created.disconnect(note)


def _thread_name() -> str:
    return threading.current_thread().name


async def _every_thread(pool: dbpool.DBPool) -> set[str]:
    """Keep every thread of `pool` busy at once, so that each runs one job."""
    gate = threading.Barrier(pool.size, timeout=30)

    def meet() -> str:
        gate.wait()
        return _thread_name()

    return set(await asyncio.gather(*(pool.run(meet) for _ in range(pool.size))))


@pytest.mark.django_db(transaction=True)
def test_warming_opens_each_threads_connection_before_any_job(connects):
    dbpool.shutdown()  # threads, and connections, of their own
    reads: list[str] = []

    def first_reads() -> None:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        reads.append(_thread_name())

    assert dbpool.readers.warm(first_reads).wait(30)
    readers = {f"hermes-db-read-{i}" for i in range(dbpool.READ_THREADS)}
    assert sorted(connects) == sorted(readers)  # one each
    assert sorted(reads) == sorted(readers)  # the reads ran on every thread

    connects.clear()
    assert asyncio.run(_every_thread(dbpool.readers)) == readers
    assert connects == []  # the jobs found their connections open


@pytest.mark.django_db(transaction=True)
def test_a_failing_warm_up_leaves_the_pool_working(connects):
    dbpool.shutdown()

    def broken() -> None:
        raise ValueError("not a database error")

    assert dbpool.readers.warm(broken).wait(30)
    names = asyncio.run(_every_thread(dbpool.readers))
    assert names == {f"hermes-db-read-{i}" for i in range(dbpool.READ_THREADS)}
