"""Starting and stopping the database pools' threads: a server's start-up
opens their connections (`DBPool.warm`), so that no job, and no user's first
request, pays for one; a pool stopped while a job wants it leaves no thread
of its own behind (`DBPool.shutdown`)."""

import asyncio
import threading

import pytest
from django.db import connection

from hermes_testing.harness import connections_opened, wait_until
from journal import dbpool


@pytest.fixture
def connects():
    """The names of the threads that open a database connection from here on."""
    with connections_opened() as names:
        yield names


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


class _NotedLock:
    """A lock that notes the threads that began to wait for it."""

    def __init__(self):
        self._lock = threading.Lock()
        self.waiters: set[str] = set()

    def __enter__(self):
        self.waiters.add(threading.current_thread().name)
        self._lock.acquire()

    def __exit__(self, *exc):
        self._lock.release()


def _alive(name: str) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith(f"hermes-db-{name}-")]


def test_threads_started_while_a_pool_stops_take_none_of_its_stops():
    """Stopping a pool whose thread is busy, while a job wants the pool:
    the new thread starts once the old one has stopped, and no thread of the
    old pool is left running outside it."""
    pool = dbpool.DBPool("stopping", 1)
    release, began = threading.Event(), threading.Event()

    def busy() -> None:
        began.set()
        release.wait(30)

    job = threading.Thread(target=asyncio.run, args=(pool.run(busy),))
    job.start()
    assert began.wait(30)
    pool._lock = lock = _NotedLock()
    stopper = threading.Thread(target=pool.shutdown)
    stopper.start()
    wait_until(lambda: pool._queue.qsize() == 1)  # its stop, queued
    starter = threading.Thread(target=pool._start, name="starter")  # wants the pool
    starter.start()
    wait_until(lambda: "starter" in lock.waiters or not starter.is_alive())
    release.set()
    for thread in (job, stopper, starter):
        thread.join(30)
    try:
        assert _alive("stopping") == pool._threads
        assert len(pool._threads) == 1
    finally:
        pool.shutdown()
