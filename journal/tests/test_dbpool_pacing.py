"""The writer pool's pacing of a backlog (`journal.dbpool`, the module's doc).

While `first` jobs come (the committer ticks while runs stream) and jobs wait
behind it, an ordinary job is followed by a rest of a multiple of its CPU; the
committer's `first` job never waits for that rest; a job with nothing behind
it, or a backlog when no `first` job came lately, never rests. The rests here
are set to 60 s, so a job that waited for one would hold its test far past
the bound it waits on.
"""

import asyncio
import sys
import threading
import time

import pytest

from hermes_testing.harness import wait_until
from journal import dbpool

LONG_REST_S = 60.0


@pytest.fixture
def long_rests(monkeypatch):
    """Every rest lasts `LONG_REST_S`, and the streams go for as long once a
    `first` job came."""
    monkeypatch.setattr(dbpool, "REST_MAX_S", LONG_REST_S)
    monkeypatch.setattr(dbpool, "REST_PER_CPU", 1e9)
    monkeypatch.setattr(dbpool, "STREAMING_S", LONG_REST_S)


@pytest.fixture
def pool(long_rests):
    """A paced pool of one thread."""
    pool = dbpool.DBPool("paced", 1, paced=True)
    yield pool
    pool.shutdown()


def _resting(pool: dbpool.DBPool) -> bool:
    """Whether the pool's one thread is in a rest now."""
    [thread] = pool._threads
    assert thread.ident is not None
    frame = sys._current_frames().get(thread.ident)
    while frame is not None:
        if frame.f_code is dbpool.DBPool._rest.__code__:
            return True
        frame = frame.f_back
    return False


def _busy(order: list[str], name: str, cpu_s: float = 0.005):
    """A job that uses `cpu_s` of its thread's CPU, then notes that it ran."""

    def job() -> str:
        began = time.thread_time()
        while time.thread_time() - began < cpu_s:
            pass
        order.append(name)
        return name

    return job


async def _resting_before(pool: dbpool.DBPool, order: list[str]) -> asyncio.Future:
    """A tick ("tick 1"), then "end 1" run with "end 2" queued behind it;
    returns once the thread rests after "end 1", with "end 2"'s future."""
    await pool.first(_busy(order, "tick 1"))  # the runs stream
    gate = threading.Event()

    def held() -> str:  # the thread is busy while the backlog queues
        gate.wait(30)
        return _busy(order, "end 1")()

    first = asyncio.ensure_future(pool.run(held))
    second = asyncio.ensure_future(pool.run(_busy(order, "end 2")))
    await asyncio.sleep(0)  # both submitted
    gate.set()
    await first
    wait_until(lambda: _resting(pool))  # "end 2" waits behind the rest
    return second


def test_a_backlog_rests_and_the_committers_job_goes_first(pool):
    order: list[str] = []

    async def main() -> None:
        second = await _resting_before(pool, order)
        assert order == ["tick 1", "end 1"]
        tick = pool.first(_busy(order, "tick 2"))
        assert await asyncio.wait_for(tick, 30) == "tick 2"
        await asyncio.wait_for(second, 30)

    asyncio.run(main())
    assert order == ["tick 1", "end 1", "tick 2", "end 2"]


def test_a_backlog_with_no_stream_going_runs_back_to_back(pool, monkeypatch):
    monkeypatch.setattr(dbpool, "STREAMING_S", 0.0)  # no `first` job counts
    order: list[str] = []

    async def main() -> None:
        await pool.first(_busy(order, "tick"))
        jobs = [pool.run(_busy(order, f"end {i}")) for i in range(3)]
        await asyncio.wait_for(asyncio.gather(*jobs), 30)

    asyncio.run(main())
    assert order == ["tick", "end 0", "end 1", "end 2"]


def test_a_job_with_nothing_behind_it_does_not_rest(pool):
    order: list[str] = []

    async def main() -> None:
        for name in ("start", "end"):
            await asyncio.wait_for(pool.run(_busy(order, name)), 30)

    asyncio.run(main())
    assert order == ["start", "end"]


def test_an_unpaced_pool_runs_its_backlog_back_to_back(long_rests):
    pool = dbpool.DBPool("unpaced", 1)
    order: list[str] = []

    async def main() -> None:
        jobs = [pool.run(_busy(order, f"end {i}")) for i in range(3)]
        await asyncio.wait_for(asyncio.gather(*jobs), 30)

    try:
        asyncio.run(main())
    finally:
        pool.shutdown()
    assert order == ["end 0", "end 1", "end 2"]


def test_stopping_a_resting_pool_does_not_wait_for_the_rest(pool):
    order: list[str] = []

    async def main() -> None:
        second = await _resting_before(pool, order)
        second.cancel()  # left waiting behind the rest

    asyncio.run(main())
    [thread] = pool._threads
    stopping = threading.Thread(target=pool.shutdown)
    stopping.start()
    wait_until(lambda: not thread.is_alive(), timeout=30)
    stopping.join(30)
    assert order == ["tick 1", "end 1"]
