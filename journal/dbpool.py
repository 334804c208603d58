"""Small bounded thread pools for database work from async code.
See docs/architecture.md §5.

Under daphne each request's `sync_to_async` runs on a thread of its own, so a
streaming reader that touched the ORM that way would hold a thread and, on
PostgreSQL, a connection for as long as it streams. Readers and writers go
through these pools instead: a fixed number of threads, each with its own
connection, however many readers there are.

Connections die with their server (a restart, a failover, an idle timeout in a
proxy). Before each job a thread closes its connection if it failed or, after
`PING_IDLE_S` of rest, if it no longer answers; the job then connects afresh.
A read that still meets a connection error is run once more on a new
connection. A write never is: whether it committed is unknown, and only the
caller, which knows how to check that under its fencing token, may retry it
(`chat.writer`, `chat.runner`).

The writer pool paces a backlog of ordinary writes while runs stream. When many
runs end at once, their ends queue up on the one writer thread, and back to
back they would take the GIL and a core from the event loop, whose streams
still going wait for the committer's next tick (docs/benchmarks.md, finding
34). So while the committer ticks (a `first` job came in the last
`STREAMING_S`) and jobs wait behind it, each ordinary job is followed by a
rest of `REST_PER_CPU` times the CPU it used, at most `REST_MAX_S`, in which
the thread holds neither the GIL nor a core. The tick never waits for a rest;
a write with nothing behind it never rests, and once the streams are over
what is left of a backlog runs back to back.

The pools also note when the database was last out of reach
(`since_trouble()`): reapers hold off for a lease after that, so a lease that
lapsed only because the database was away is renewed before anyone may take
the run over (`journal.leases`).
"""

import asyncio
import contextvars
import itertools
import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from django.db import connections

from .outages import DATABASE_ERRORS

log = logging.getLogger(__name__)

T = TypeVar("T")

READ_THREADS = 4
# One writer thread: SQLite takes one writer at a time anyway, and a single
# writer keeps each run's appends in order.
WRITE_THREADS = 1

PING_IDLE_S = 1.0  # a connection idle this long is checked before it is used
WARM_GATE_S = 5.0  # how long a thread that warmed up waits for the others
SLOW_JOB_S = 5.0  # a job this slow counts as trouble too (a frozen server)
STREAMING_S = 0.1  # a `first` job this recent: the runs' streams are going
REST_PER_CPU = 4.0  # a paced backlog's rest after a job, per second of its CPU
REST_MAX_S = 0.005  # the longest rest after a job of a paced backlog

_STOP = object()
_FIRST, _RUN, _LAST = 0, 1, 2  # ranks of a pool's queue
_trouble_at: float | None = None  # time.monotonic() of the last trouble


def is_connection_error(exc: BaseException) -> bool:
    """Whether `exc` says the database was out of reach (not that the query was bad).

    Django wraps the driver's connection and server-state errors (connection
    refused or lost, admin shutdown, a serialisation conflict, SQLite's
    "database is locked") as `OperationalError`/`InterfaceError`; bad data is a
    `DataError`/`IntegrityError` and is never retried. PostgreSQL files a few
    errors about the request itself under `OperationalError` too (a limit of
    the server's exceeded, e.g. a tsvector past 1 MiB): their SQLSTATE class
    says so, and retrying them would only repeat them.
    """
    if not isinstance(exc, DATABASE_ERRORS):
        return False
    sqlstate = getattr(exc, "sqlstate", None) or getattr(
        exc.__cause__, "sqlstate", None
    )
    return not (isinstance(sqlstate, str) and sqlstate[:2] in REQUEST_ERROR_CLASSES)


# SQLSTATE classes of errors in the request, not in reaching the server: data
# exception, integrity, syntax or access rule, program limit exceeded.
REQUEST_ERROR_CLASSES = frozenset({"22", "23", "42", "54"})


def note_trouble() -> None:
    global _trouble_at
    _trouble_at = time.monotonic()


def since_trouble() -> float:
    """Seconds since this process last met an unreachable or frozen database."""
    return float("inf") if _trouble_at is None else time.monotonic() - _trouble_at


def forget_trouble() -> None:
    """Tests: start from a process that never saw the database away."""
    global _trouble_at
    _trouble_at = None


def _drop_dead_connections(idle_s: float) -> None:
    """Close this thread's connections that failed, or that rested and do not answer."""
    for conn in connections.all(initialized_only=True):
        if conn.connection is None or conn.in_atomic_block:
            continue
        if (conn.errors_occurred or idle_s >= PING_IDLE_S) and not conn.is_usable():
            conn.close()
        conn.errors_occurred = False


class DBPool:
    def __init__(
        self, name: str, size: int, *, retry_once: bool = False, paced: bool = False
    ):
        self.name = name
        self.size = size
        # Run a job again on a fresh connection after a connection error:
        # only for pools whose jobs are reads.
        self.retry_once = retry_once
        # A backlog of `run` jobs rests between them (the module's doc).
        self.paced = paced
        self._urgent = threading.Event()  # a `first` job came: no rest now
        self._stopping = threading.Event()  # no rest while the threads stop
        self._first_at = -STREAMING_S  # time.monotonic() of the last `first` job
        # (rank, order, job): `first` jobs before queued `run` jobs, each in order.
        self._queue: queue.PriorityQueue = queue.PriorityQueue()
        self._order = itertools.count()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()

    def _start(self) -> None:
        with self._lock:
            if self._threads:
                return
            self._stopping.clear()
            for i in range(self.size):
                thread = threading.Thread(
                    target=self._work, name=f"hermes-db-{self.name}-{i}", daemon=True
                )
                thread.start()
                self._threads.append(thread)

    def _work(self) -> None:
        done_at = time.monotonic()
        while True:
            rank, _order, item = self._queue.get()
            if rank == _FIRST:
                self._urgent.clear()  # served: a rest after this may be kept
            if item is _STOP:
                connections.close_all()
                return
            if isinstance(item, _Warm):
                item.run()
                done_at = time.monotonic()
                continue
            cpu = time.thread_time()
            done_at = self._do(item, done_at)
            if (
                self.paced
                and rank != _FIRST
                and not self._queue.empty()
                and time.monotonic() - self._first_at < STREAMING_S
            ):
                self._rest(time.thread_time() - cpu)

    def _rest(self, cpu_s: float) -> None:
        """After a job with others waiting: leave the GIL and the core to the
        process's other threads for `REST_PER_CPU` times the CPU the job
        used (at most `REST_MAX_S`), unless a `first` job is waiting (it is
        the queue's next, and goes now)."""
        if not self._urgent.is_set() and not self._stopping.is_set():
            self._urgent.wait(min(cpu_s * REST_PER_CPU, REST_MAX_S))
        self._urgent.clear()

    def _do(self, item, done_at: float) -> float:
        """Run one job and hand its outcome back; when it finished.

        The thread lets go of the job's call (a request among its arguments,
        say) before the outcome wakes the caller: after that the caller's may
        be the last reference, and the thread holds nothing of the job while
        it waits for the next one."""
        fn, args, kwargs, future, loop, context = item
        item.clear()
        if future.cancelled():
            return done_at
        began = time.monotonic()
        exc: BaseException | None = None
        try:
            result = self._call(context, fn, args, kwargs, began - done_at)
        except BaseException as error:  # handed to the awaiting coroutine
            result, exc = None, error
        del fn, args, kwargs, context
        _hand_back(loop, future, result, exc)
        del result, exc
        done_at = time.monotonic()
        if done_at - began > SLOW_JOB_S:
            note_trouble()
        return done_at

    def _call(self, context, fn, args, kwargs, idle_s: float):
        attempts = 2 if self.retry_once else 1
        for attempt in range(1, attempts + 1):
            try:
                _drop_dead_connections(idle_s)
                return context.run(fn, *args, **kwargs)
            except BaseException as exc:
                if not is_connection_error(exc):
                    raise
                note_trouble()
                _drop_dead_connections(0.0)
                if attempt == attempts:
                    raise
                log.debug("database connection lost; reading again: %s", exc)

    async def run(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run `fn(*args, **kwargs)` on a pool thread and await its result."""
        return await self._submit(_RUN, fn, args, kwargs)

    async def first(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """`run`, ahead of the jobs queued by `run`: the journal's committer,
        whose one batch carries every streaming run's text, must not wait
        behind a queue of single runs' ends (docs/benchmarks.md)."""
        return await self._submit(_FIRST, fn, args, kwargs)

    async def _submit(self, rank: int, fn: Callable[..., T], args, kwargs) -> T:
        self._start()
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        # The caller's context travels along, so log lines name the run.
        job = [fn, args, kwargs, future, loop, contextvars.copy_context()]
        self._queue.put((rank, next(self._order), job))
        if rank == _FIRST:
            self._first_at = time.monotonic()
            self._urgent.set()
        return await future

    def warm(self, fn: Callable[[], object] | None = None) -> threading.Event:
        """Open every thread's connection now, ahead of any queued job, and
        run `fn` (say, the statements a first request makes) on each; return
        at once, with an event set when every thread has done so.

        A thread's first job otherwise pays for its connection: on PostgreSQL
        about 5 ms to connect and as much again for the connection's first
        statements, on each of the pool's threads in turn, so a server's
        first streams waited for them (docs/benchmarks.md). Best effort: a
        database out of reach now is met again, and handled, by the first
        job, which connects if the warm-up could not.
        """
        self._start()
        done = threading.Event()
        gate = threading.Barrier(self.size, action=done.set, timeout=WARM_GATE_S)
        for _ in range(self.size):
            self._queue.put((_FIRST, next(self._order), _Warm(gate, fn)))
        return done

    def shutdown(self) -> None:
        """Stop the threads, closing their connections (tests, process exit).

        The lock is held until they have stopped: a job submitted meanwhile
        starts the next threads only then, so none of those takes a stop
        meant for these (which would leave one of these running, with its
        connection, outside the pool's list).
        """
        with self._lock:
            threads, self._threads = self._threads, []
            for _ in threads:
                self._queue.put((_LAST, next(self._order), _STOP))
            self._stopping.set()  # a resting thread goes on to its stop
            self._urgent.set()
            for thread in threads:
                thread.join(timeout=10)


class _Warm:
    """`DBPool.warm`'s job: open this thread's connection, then wait at the
    gate until each thread has taken one such job, so that every thread
    opens its own (idle threads would otherwise take them in any order)."""

    def __init__(self, gate: threading.Barrier, fn: Callable[[], object] | None):
        self.gate = gate
        self.fn = fn

    def run(self) -> None:
        try:
            connections["default"].ensure_connection()
            if self.fn is not None:
                self.fn()
        except DATABASE_ERRORS as exc:  # the first job meets it again, and says so
            log.debug("database not reached while warming up: %s", exc)
            connections.close_all()
        except Exception:  # a thread of the pool must outlive its warm-up
            log.exception("warming up a database thread failed")
        try:
            self.gate.wait()
        except threading.BrokenBarrierError:  # a thread busy with a job: go on
            pass


def _hand_back(
    loop: asyncio.AbstractEventLoop,
    future: asyncio.Future,
    result: Any,
    exc: BaseException | None,
) -> None:
    """Give a job's outcome to its loop; a loop that has closed (a process or
    test shutting down while a job ran) has nobody left to tell."""
    try:
        loop.call_soon_threadsafe(_settle, future, result, exc)
    except RuntimeError:
        if not loop.is_closed():
            raise


def _settle(future: asyncio.Future, result: Any, exc: BaseException | None) -> None:
    if future.cancelled():
        return
    if exc is not None:
        future.set_exception(exc)
    else:
        future.set_result(result)


readers = DBPool("read", READ_THREADS, retry_once=True)
writers = DBPool("write", WRITE_THREADS, paced=True)


def shutdown() -> None:
    readers.shutdown()
    writers.shutdown()
