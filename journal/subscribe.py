"""Replay, then live: the one reading core behind SSE, WebSocket and `replay_run --follow`.

DESIGN §5, in five lines:
1. join the run's channel-layer group first (one membership per process: the hub);
2. replay the journal after the cursor in pages;
3. then follow the hub's in-memory window, dropping every seq already emitted;
4. a live seq that skips ahead, or a quiet spell, makes the hub read the journal;
5. stop after `end`; leave the group when the last reader of the process goes.

Readers hold no thread and no connection: journal reads go through
`dbpool.readers`, and readers at the same position share one query.
"""

import asyncio
import logging
import time
from collections.abc import AsyncIterator

from channels.layers import get_channel_layer
from django.conf import settings

from . import dbpool, metrics
from .events import TERMINAL
from .leases import run_settle
from .models import Run
from .publish import group_name, publish
from .store import READ_PAGE, Record, read_after, run_state

log = logging.getLogger(__name__)

# Recent events each hub keeps for its live readers; readers further behind read
# the journal in pages. Bounds a hub's memory whatever the run's length.
WINDOW = 4096
HUB_RETRY_S = 1.0  # before replacing a hub whose follow task failed (database down?)


class RunHub:
    """One per process and active run: the group membership and a window of events."""

    def __init__(self, run_id: str):
        self.run_id = run_id
        self.readers = 0
        self.window: list[Record] = []  # contiguous: window[i].seq == base + 1 + i
        self.base = 0
        self.end_seq: int | None = None
        self.channel: str | None = None
        self.layer_ok = False
        self.ready = asyncio.Event()
        self._changed = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._idle_s = settings.HERMES["READER_IDLE_CHECK_S"]

    @property
    def tail(self) -> int:
        return self.base + len(self.window)

    @property
    def dead(self) -> bool:
        """The follow task ended without seeing `end` (it logged why)."""
        return self._task is not None and self._task.done() and self.end_seq is None

    def start(self) -> None:
        self._task = asyncio.create_task(self._follow(), name=f"hub {self.run_id}")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def wait_changed(self, timeout: float) -> None:
        try:
            await asyncio.wait_for(self._changed.wait(), timeout)
        except TimeoutError:
            pass

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    def _add(self, records: list[Record]) -> None:
        added = False
        for record in records:
            if record.seq <= self.tail:
                continue  # already known: never emit a seq twice
            if record.seq != self.tail + 1:
                break  # a hole: the caller fills it from the journal
            self.window.append(record)
            added = True
            if record.type == TERMINAL:
                self.end_seq = record.seq
        if len(self.window) > 2 * WINDOW:
            drop = len(self.window) - WINDOW
            del self.window[:drop]
            self.base += drop
        if added:
            self._notify()

    async def _fill(self) -> bool:
        """Read the journal after the tail into the window; True if anything came."""
        before = self.tail
        while self.end_seq is None:
            page = await dbpool.readers.run(
                read_after, run_id=self.run_id, after_seq=self.tail, limit=READ_PAGE
            )
            self._add(page)
            if len(page) < READ_PAGE:
                break
        return self.tail > before

    async def _join(self) -> None:
        layer = get_channel_layer()
        try:
            self.channel = await layer.new_channel()
            await layer.group_add(group_name(self.run_id), self.channel)
            self.layer_ok = True
        except Exception:
            log.warning(
                "channel layer unavailable, polling run_id=%s",
                self.run_id,
                exc_info=True,
            )

    async def _leave(self) -> None:
        if self.layer_ok:
            try:
                await get_channel_layer().group_discard(
                    group_name(self.run_id), self.channel
                )
            except Exception:
                log.warning(
                    "group_discard failed run_id=%s", self.run_id, exc_info=True
                )
            self.layer_ok = False

    async def _follow(self) -> None:
        try:
            await self._join()  # first, so nothing committed from now on is missed
            state = await dbpool.readers.run(run_state, run_id=self.run_id)
            self.base = state.last_seq if state else 0
            if state is None or state.terminal:
                self.end_seq = self.base
            self.ready.set()
            while self.end_seq is None:
                message = await self._receive()
                if message is not None:
                    self._add([Record(*e) for e in message.get("events", ())])
                    if message.get("events") and message["events"][-1][0] > self.tail:
                        await self._fill()  # live seqs skipped ahead: fill the hole
                elif not await self._fill():
                    await self._settle_if_lost()
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("hub failed run_id=%s", self.run_id)
            self.ready.set()
        finally:
            await self._leave()
            self._notify()

    async def _receive(self) -> dict | None:
        """The next channel-layer message, or None after a quiet spell."""
        if not self.layer_ok:
            await asyncio.sleep(self._idle_s / 4)
            return None
        try:
            return await asyncio.wait_for(
                get_channel_layer().receive(self.channel), self._idle_s
            )
        except TimeoutError:
            return None
        except Exception:
            log.warning(
                "channel layer failed, polling run_id=%s", self.run_id, exc_info=True
            )
            self.layer_ok = False
            return None

    async def _settle_if_lost(self) -> None:
        state = await dbpool.readers.run(run_state, run_id=self.run_id)
        if state is None or not state.lease_expired:
            return
        records = await dbpool.writers.run(
            run_settle,
            run_id=self.run_id,
            status=Run.Status.INTERRUPTED,
            terminal_state="lost-worker",
            by="reader",
        )
        await publish(self.run_id, records)
        await self._fill()


class HubRegistry:
    """The hubs of one event loop, created on first reader and dropped on the last."""

    def __init__(self):
        self._hubs: dict[str, RunHub] = {}
        self._pages: dict[tuple[str, int], asyncio.Future] = {}

    def __len__(self) -> int:
        return len(self._hubs)

    async def acquire(self, run_id: str) -> RunHub:
        hub = self._hubs.get(run_id)
        if hub is None or hub.dead:
            hub = self._hubs[run_id] = RunHub(run_id)
            hub.start()
        hub.readers += 1
        await hub.ready.wait()
        return hub

    async def release(self, hub: RunHub) -> None:
        hub.readers -= 1
        if hub.readers == 0:
            if self._hubs.get(hub.run_id) is hub:
                del self._hubs[hub.run_id]
            await hub.stop()

    async def page(self, run_id: str, after_seq: int) -> list[Record]:
        """One journal page; concurrent readers at the same position share the query."""
        key = (run_id, after_seq)
        future = self._pages.get(key)
        if future is None:
            future = asyncio.ensure_future(
                dbpool.readers.run(read_after, run_id=run_id, after_seq=after_seq)
            )
            self._pages[key] = future
            future.add_done_callback(lambda _f: self._pages.pop(key, None))
        return await asyncio.shield(future)


class _JournalPages:
    """One reader's journal pages, the next one read while this one is sent."""

    def __init__(self, registry: HubRegistry, run_id: str):
        self.registry, self.run_id = registry, run_id
        self._next: tuple[int, asyncio.Future] | None = None

    async def after(self, cursor: int, *, prefetch_below: int) -> list[Record]:
        if self._next is not None and self._next[0] == cursor:
            future = self._next[1]
            self._next = None
        else:
            self.close()
            future = asyncio.ensure_future(self.registry.page(self.run_id, cursor))
        batch = await future
        if len(batch) == READ_PAGE and batch[-1].seq < prefetch_below:
            after = batch[-1].seq
            self._next = (
                after,
                asyncio.ensure_future(self.registry.page(self.run_id, after)),
            )
        return batch

    def close(self) -> None:
        if self._next is not None:
            self._next[1].cancel()
            self._next = None


_registries: dict[asyncio.AbstractEventLoop, HubRegistry] = {}


def hubs() -> HubRegistry:
    loop = asyncio.get_running_loop()
    registry = _registries.get(loop)
    if registry is None:
        registry = _registries[loop] = HubRegistry()
    return registry


async def subscribe(
    run_id: str, *, after_seq: int = 0, idle_s: float | None = None
) -> AsyncIterator[list[Record]]:
    """Yield the run's records after `after_seq` in batches, each seq once, until `end`.

    Yields `[]` after `idle_s` seconds without news, so transports can send a
    heartbeat. Leaves the group on every exit path, a client disconnect included.
    """
    registry = hubs()
    started = time.monotonic()  # replay latency: until the first journaled batch
    hub = await registry.acquire(run_id)
    metrics.SUBSCRIPTIONS.inc()
    pages = _JournalPages(registry, run_id)
    try:
        cursor = after_seq
        while hub.end_seq is None or cursor < hub.end_seq:
            if cursor < hub.base:
                batch = await pages.after(cursor, prefetch_below=hub.base)
            elif cursor < hub.tail:
                start = cursor - hub.base
                batch = hub.window[start : start + READ_PAGE]
            elif hub.end_seq is not None:
                break
            elif hub.dead:  # replace it (after a pause: it failed for a reason)
                await asyncio.sleep(HUB_RETRY_S)
                await registry.release(hub)
                hub = await registry.acquire(run_id)
                continue
            else:
                started = 0.0  # waiting for news: not a replay any more
                await hub.wait_changed(idle_s or 3600)
                if cursor >= hub.tail and (hub.end_seq is None or cursor < hub.end_seq):
                    yield []
                continue
            if not batch:  # the journal has less than the hub knew: pruned
                return
            cursor = batch[-1].seq
            if started:
                metrics.REPLAY_FIRST_BATCH_S.observe(time.monotonic() - started)
                started = 0.0
            yield batch
            if batch[-1].type == TERMINAL:
                return
    finally:
        pages.close()
        metrics.SUBSCRIPTIONS.dec()
        await registry.release(hub)
