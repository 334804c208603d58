"""The batching journal writer of one run (DESIGN §3, §4).

The provider read loop hands deltas to `add()`, a plain function call that
never waits on the database or the broker. A background task coalesces them
(consecutive text of one kind becomes one event) and appends a batch every
`INTERVAL_S` or `MAX_BYTES`, committed before it is published.
"""

import asyncio
import logging

from journal.publish import append_and_publish
from journal.store import AppendRejected

log = logging.getLogger(__name__)

INTERVAL_S = 0.03  # 25–50 ms: one row carries a chunk of text, latency stays low
MAX_BYTES = 2048  # flush early once this much text waits
_TEXT = ("token", "reasoning")


class BatchWriter:
    def __init__(self, *, run_id: str, token: int):
        self.run_id = run_id
        self.token = token
        # Why appends stopped: fenced out (AppendRejected) or the database failed.
        self.failure: Exception | None = None
        self.rows_written = 0
        self._pending: list[list] = []  # [type, payload] in order
        self._pending_bytes = 0
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._closed = False
        self._task = asyncio.create_task(self._run(), name=f"writer {run_id}")

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
            self._pending_bytes += len(payload["text"])
        self._idle.clear()
        self._wake.set()

    async def flush(self) -> None:
        """Wait until everything added so far is committed (and published)."""
        if self._pending:
            self._wake.set()
        await self._idle.wait()
        if self.failure is not None:
            raise self.failure

    async def close(self) -> None:
        await self.flush()
        self._closed = True
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            if self._pending_bytes < MAX_BYTES:
                await asyncio.sleep(INTERVAL_S)  # let the batch fill
            batch, self._pending, self._pending_bytes = self._pending, [], 0
            if batch:
                try:
                    await append_and_publish(
                        run_id=self.run_id,
                        token=self.token,
                        events=[(t, p) for t, p in batch],
                    )
                    self.rows_written += len(batch)
                except AppendRejected as exc:
                    log.warning("writer fenced out run_id=%s: %s", self.run_id, exc.reason)
                    self.failure = exc
                except Exception as exc:  # surfaced to the run by flush()
                    log.exception("journal append failed run_id=%s", self.run_id)
                    self.failure = exc
            if not self._pending:
                self._idle.set()
