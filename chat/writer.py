"""The batching journal writers of a process's runs (DESIGN §3, §4).

The provider read loop hands deltas to `BatchWriter.add()`, a plain function
call that never waits on the database or the broker. One committer per event
loop gathers what every run has pending, coalesces it (consecutive text of one
kind becomes one event) and appends it all every `INTERVAL_S` in a single
transaction, each run fenced on its own; then it publishes each run's records.
With hundreds of runs streaming, one commit per tick instead of one per run is
what keeps the worker's write path cheap (docs/benchmarks.md).
"""

import asyncio
import logging

from journal import dbpool
from journal.publish import publish
from journal.store import append_many

log = logging.getLogger(__name__)

INTERVAL_S = 0.03  # 25–50 ms: one row carries a chunk of text, latency stays low
MAX_BYTES = 2048  # commit early once a run has this much text waiting
_TEXT = ("token", "reasoning")


class BatchWriter:
    def __init__(self, *, run_id: str, token: int):
        self.run_id = run_id
        self.token = token
        # Why appends stopped: fenced out (AppendRejected) or the database failed.
        self.failure: Exception | None = None
        self.rows_written = 0
        self._pending: list[list] = []  # [type, payload] in order
        self.pending_bytes = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._committer = _committer()

    def add(self, event_type: str, payload: dict) -> None:
        """Queue an event; text deltas of the same kind merge with the last one."""
        if self.failure is not None:
            return
        last = self._pending[-1] if self._pending else None
        if event_type in _TEXT and last is not None and last[0] == event_type:
            last[1] = {"text": last[1]["text"] + payload["text"]}
        else:
            self._pending.append([event_type, payload])
        if event_type in _TEXT:
            self.pending_bytes += len(payload["text"])
        self._idle.clear()
        self._committer.want(self)

    async def flush(self) -> None:
        """Wait until everything added so far is committed (and published)."""
        await self._idle.wait()
        if self.failure is not None:
            raise self.failure

    async def close(self) -> None:
        try:
            await self.flush()
        finally:
            self._pending = []

    def take(self) -> list[tuple[str, dict]]:
        batch, self._pending, self.pending_bytes = self._pending, [], 0
        return [(t, p) for t, p in batch]

    def landed(self, rows: int, failure: Exception | None) -> None:
        """The committer wrote (or failed to write) what `take()` returned."""
        self.rows_written += rows
        if failure is not None:
            self.failure = self.failure or failure
            self._pending = []
        if self._pending:
            self._committer.want(self)
        else:
            self._idle.set()


class _Committer:
    """Commits every run's pending events of one event loop, a tick at a time."""

    def __init__(self):
        self._waiting: dict[BatchWriter, None] = {}  # an ordered set
        self._wake = asyncio.Event()
        self._task = asyncio.create_task(self._run(), name="journal committer")

    def want(self, writer: BatchWriter) -> None:
        self._waiting[writer] = None
        self._wake.set()

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            if all(w.pending_bytes < MAX_BYTES for w in self._waiting):
                await asyncio.sleep(INTERVAL_S)  # let the batches fill
            waiting = list(self._waiting)
            self._waiting.clear()
            writers, batches = [], []
            for writer in waiting:
                events = writer.take()
                if events:
                    writers.append(writer)
                    batches.append((writer.run_id, writer.token, events))
                else:
                    writer.landed(0, None)
            if not batches:
                continue
            try:
                results = await dbpool.writers.run(append_many, batches)
            except Exception as exc:  # surfaced to every run by flush()
                log.exception("journal append failed for %d run(s)", len(writers))
                results = [exc] * len(writers)
            for writer, result in zip(writers, results, strict=True):
                if isinstance(result, Exception):
                    writer.landed(0, result)
                else:
                    await publish(writer.run_id, result)
                    writer.landed(len(result), None)


_committers: dict[asyncio.AbstractEventLoop, _Committer] = {}


def _committer() -> _Committer:
    loop = asyncio.get_running_loop()
    committer = _committers.get(loop)
    if committer is None or committer._task.done():
        committer = _committers[loop] = _Committer()
    return committer
