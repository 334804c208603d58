"""Tool processes: where sync tools run, so that a runaway one can be killed.

A tool computes on the model's say-so, and the model follows the user. A tool
that runs in the web process can hold the GIL (``round(1, -10**9)`` is one C
call) and freeze every stream and the worker with it; a thread cannot be
killed. So every sync tool runs in a small pool of child processes (pebble's
``ProcessPool``, which replaces a worker it had to kill), each:

1. started by ``spawn``, never forked from the threaded server;
2. limited by ``RLIMIT_AS`` (``HERMES_TOOL_MEMORY_MB``): an allocation past it
   fails with ``MemoryError`` inside the tool;
3. given ``RLIMIT_CPU`` seconds per call (the tool timeout, from the CPU the
   child has used so far): the kernel ends a child that spins past it even if
   the server that should kill it is stuck;
4. killed by the pool when a call outlives ``HERMES_TOOL_TIMEOUT_S`` of wall
   time or is cancelled (the run was cancelled).

The event loop only waits on a future, so the server keeps answering whatever
a tool does. Async tools are I/O by contract and stay on the loop.
"""

from __future__ import annotations

import asyncio
import atexit
import multiprocessing
import resource
import threading
from collections.abc import Callable
from typing import Any

from django.conf import settings
from pebble import ProcessExpired, ProcessPool

_MIB = 1024 * 1024


class ToolKilled(Exception):
    """The tool's process was ended (timeout, CPU or memory limit, a crash)."""


_pool: ProcessPool | None = None
_pool_lock = threading.Lock()


def _limit_child(memory_bytes: int) -> None:
    """In each new tool process, before any call: cap its address space."""
    if memory_bytes > 0:
        resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))


def _call(func: Callable[[dict[str, Any]], Any], args: dict, cpu_s: float) -> Any:
    """In a tool process: run one call with ``cpu_s`` more seconds of CPU."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    used = usage.ru_utime + usage.ru_stime
    _soft, hard = resource.getrlimit(resource.RLIMIT_CPU)
    resource.setrlimit(resource.RLIMIT_CPU, (int(used + cpu_s) + 1, hard))
    return func(args)


def _get_pool() -> ProcessPool:
    global _pool
    with _pool_lock:
        if _pool is None or not _pool.active:
            hermes = settings.HERMES
            _pool = ProcessPool(
                max_workers=hermes["TOOL_PROCESSES"],
                initializer=_limit_child,
                initargs=(int(hermes["TOOL_MEMORY_MB"] * _MIB),),
                context=multiprocessing.get_context("spawn"),
            )
        return _pool


def shutdown() -> None:
    """Stop the tool processes (at exit; tests call it to start afresh)."""
    global _pool
    with _pool_lock:
        pool, _pool = _pool, None
    if pool is not None:
        pool.stop()
        pool.join(timeout=10)


atexit.register(shutdown)


async def run_isolated(
    func: Callable[[dict[str, Any]], Any], args: dict, *, timeout: float
) -> Any:
    """``func(args)`` in a tool process, killed after ``timeout`` s of wall time.

    Returns what the tool returned or raises what it raised (``ToolError``,
    ``MemoryError`` …); ``TimeoutError`` when it was killed for time;
    ``ToolKilled`` when its process died otherwise. Cancelling the awaiting
    task kills the process too.
    """
    future = _get_pool().schedule(_call, args=(func, args, timeout), timeout=timeout)
    try:
        return await asyncio.wrap_future(future)
    except ProcessExpired as exc:
        raise ToolKilled(f"the tool process ended ({exc})") from None
