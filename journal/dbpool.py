"""Small bounded thread pools for database work from async code (DESIGN §5).

Under daphne each request's `sync_to_async` runs on a thread of its own, so a
streaming reader that touched the ORM that way would hold a thread and, on
PostgreSQL, a connection for as long as it streams. Readers and writers go
through these pools instead: a fixed number of threads, each with its own
connection, however many readers there are.
"""

import asyncio
import contextvars
import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from django.db import close_old_connections, connections

T = TypeVar("T")

READ_THREADS = 4
# One writer thread: SQLite takes one writer at a time anyway, and a single
# writer keeps each run's appends in order.
WRITE_THREADS = 1

_STOP = object()


class DBPool:
    def __init__(self, name: str, size: int):
        self.name = name
        self.size = size
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()

    def _start(self) -> None:
        with self._lock:
            if self._threads:
                return
            for i in range(self.size):
                thread = threading.Thread(
                    target=self._work, name=f"hermes-db-{self.name}-{i}", daemon=True
                )
                thread.start()
                self._threads.append(thread)

    def _work(self) -> None:
        while True:
            item = self._queue.get()
            if item is _STOP:
                connections.close_all()
                return
            fn, args, kwargs, future, loop, context = item
            if future.cancelled():
                continue
            try:
                result = context.run(fn, *args, **kwargs)
            except BaseException as exc:  # handed to the awaiting coroutine
                close_old_connections()
                loop.call_soon_threadsafe(_settle, future, None, exc)
            else:
                loop.call_soon_threadsafe(_settle, future, result, None)

    async def run(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run `fn(*args, **kwargs)` on a pool thread and await its result."""
        self._start()
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        # The caller's context travels along, so log lines name the run.
        self._queue.put((fn, args, kwargs, future, loop, contextvars.copy_context()))
        return await future

    def shutdown(self) -> None:
        """Stop the threads, closing their connections (tests, process exit)."""
        with self._lock:
            threads, self._threads = self._threads, []
            for _ in threads:
                self._queue.put(_STOP)
        for thread in threads:
            thread.join(timeout=10)


def _settle(future: asyncio.Future, result: Any, exc: BaseException | None) -> None:
    if future.cancelled():
        return
    if exc is not None:
        future.set_exception(exc)
    else:
        future.set_result(result)


readers = DBPool("read", READ_THREADS)
writers = DBPool("write", WRITE_THREADS)


def shutdown() -> None:
    readers.shutdown()
    writers.shutdown()
