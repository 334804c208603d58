"""Replay, then live: the one reading core of SSE, WebSocket and `replay_run --follow`.

docs/architecture.md §5, in five lines:
1. join the run's channel-layer group first (one membership per process: the hub);
2. replay the journal after the cursor in pages;
3. then follow the hub's in-memory window, dropping every seq already emitted;
4. a live seq that skips ahead, or a quiet spell, makes the hub read the journal;
5. stop after `end`; leave the group when the last reader of the process goes.

Readers hold no thread and no connection: journal reads go through
`dbpool.readers`, and readers at the same position share one query.
"""

import asyncio
import functools
import logging
import time
from collections import deque
from collections.abc import AsyncGenerator, Callable, Iterator

from channels.layers import get_channel_layer
from django.conf import settings
from django.db import connection

from . import dbpool, metrics, wire
from .events import TERMINAL
from .leases import run_settle
from .models import Run
from .outages import CHANNEL_LAYER, DATABASE, DATABASE_ERRORS, Backoff, outage
from .publish import group_name, publish
from .store import READ_PAGE, FramePage, Record, read_after, read_frames, run_state

log = logging.getLogger(__name__)

# Recent events each hub keeps for its live readers; readers further behind read
# the journal in pages. Bounds a hub's memory whatever the run's length.
WINDOW = 4096
WINDOW_BYTES = 4 * 1024 * 1024  # and about this many payload bytes, at most twice
# A reader behind the window reads pages of about this many bytes (one being
# sent and `READ_AHEAD` read ahead at most), so it costs well under 1 MiB.
PAGE_BYTES = 64 * 1024
# A page the database writes out as frames (`_JournalPages`): the more records
# it holds, the less each costs the serving process (docs/benchmarks.md,
# finding 36). It goes out in writes of about `PART_BYTES`, like any batch.
FRAME_PAGE_BYTES = 128 * 1024
# Pages a replaying reader has read ahead of the one being sent, by database.
# PostgreSQL makes pages in processes of its own: two read at once keep both
# of a small machine's cores at it while the serving process sends (a replay
# 20-25 % faster). SQLite makes them in the serving process: a second read at
# once doubled its CPU per event (docs/benchmarks.md, finding 40).
READ_AHEAD = {"postgresql": 2}
PAGE_FIRST_ROWS = 256  # before a reader has seen how large this run's events are
HUB_RETRY_S = 1.0  # before replacing a hub whose follow task failed (a bug: logged)
DB_RETRY_CAP_S = 2.0  # journal reads retried at least this often while the DB is down
LAYER_RETRY_CAP_S = 5.0  # rejoins of the group at least this often while Redis is down
# `subscribe_frames` encodes a batch in parts of about this many payload bytes:
# the server's backpressure acts between them, so a reader never holds a whole
# page's frames at once.
PART_BYTES = 32 * 1024
# A hub keeps the writes of its latest few parts for readers that take the same
# part (all readers at the tail do).
SHARED_PARTS = 4


class RunHub:
    """One per process and active run: the group membership and a window of events."""

    def __init__(self, run_id: str):
        self.run_id = run_id
        self.readers = 0
        self.window: list[Record] = []  # contiguous: window[i].seq == base + 1 + i
        self.window_bytes = 0  # payload bytes in the window
        self.base = 0
        self.end_seq: int | None = None
        self.channel: str | None = None
        self.layer_ok = False
        self.ready = asyncio.Event()
        self._changed = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._idle_s = settings.HERMES["READER_IDLE_CHECK_S"]
        self._backoff = Backoff(first=0.2, cap=LAYER_RETRY_CAP_S)
        self._rejoin_at = 0.0
        # Per format: the frames of window records (seq -> frame), made on a
        # reader's first need and dropped with the window's head.
        self._frames: dict[str, dict[int, str]] = {}
        self._writes: dict[tuple[str, int, int], list] = {}  # recent batches'
        # Wakes waiting readers at the earliest of their keepalive deadlines:
        # one timer per hub, none per reader or wait (`wait_changed`).
        self._beat: asyncio.TimerHandle | None = None
        # Ends a receive after a quiet spell (`_receive_until_quiet`): one timer
        # per spell of `_idle_s`, armed again when it finds a message came.
        self._quiet: asyncio.TimerHandle | None = None
        self._listening_since = 0.0  # the loop's time the current receive began
        self._listener: asyncio.Task | None = None  # the task in that receive
        self._quiet_expired = False

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
        if self._beat is not None:
            self._beat.cancel()
            self._beat = None
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def wait_ready(self, timeout: float) -> bool:
        # asyncio.timeout, not wait_for: on Python 3.11 wait_for swallows a
        # cancellation that comes as the event is set, and a stream whose
        # client left would go on (a leaked stream slot; test_disconnects).
        try:
            async with asyncio.timeout(timeout):
                await self.ready.wait()
        except TimeoutError:
            return False
        return True

    async def wait_changed(self, deadline: float) -> None:
        """Until news, or until `deadline` (the loop's clock) or earlier.

        Every waiting reader wakes at the hub's one timer, set for the
        earliest deadline; one woken before its own deadline waits again.
        Readers that began waiting at the same news share a deadline, so an
        idle reader wakes about once per keepalive interval, as with a timer
        of its own, without one (a timer per reader and wait was a few
        microseconds of every token and 0.4 KiB of every idle stream,
        docs/benchmarks.md, finding 19).
        """
        if self._beat is None or self._beat.when() > deadline:
            if self._beat is not None:
                self._beat.cancel()
            self._beat = asyncio.get_running_loop().call_at(deadline, self._on_beat)
        await self._changed.wait()

    def _on_beat(self) -> None:
        self._beat = None
        self._notify()

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
            self.window_bytes += len(record.payload)
            added = True
            if record.type == TERMINAL:
                self.end_seq = record.seq
        if len(self.window) > 2 * WINDOW or self.window_bytes > 2 * WINDOW_BYTES:
            drop = 0
            while len(self.window) - drop > WINDOW or (
                self.window_bytes > WINDOW_BYTES and drop < len(self.window) - 1
            ):
                self.window_bytes -= len(self.window[drop].payload)
                drop += 1
            del self.window[:drop]
            for frames in self._frames.values():
                for seq in range(self.base + 1, self.base + drop + 1):
                    frames.pop(seq, None)
            self.base += drop
        if added:
            self._notify()

    def encode(self, fmt: wire.Format, batch: list[Record]) -> list:
        """The writes of `batch` (records of this hub's window) in `fmt`.

        Each record is encoded once per hub and format, and readers that take
        the same batch get the same write objects: the bytes are shared, not
        copied per reader.
        """
        key = (fmt.name, batch[0].seq, batch[-1].seq)
        writes = self._writes.get(key)
        if writes is not None:
            return writes
        frames = self._frames.setdefault(fmt.name, {})
        encoded = []
        for record in batch:
            frame = frames.get(record.seq)
            if frame is None:
                frame = frames[record.seq] = fmt.frame(self.run_id, record)
            encoded.append(frame)
        writes = fmt.writes(encoded)
        if len(self._writes) >= SHARED_PARTS:
            del self._writes[next(iter(self._writes))]  # the oldest
        self._writes[key] = writes
        return writes

    async def _read(self, fn, **kwargs):
        """A journal read that waits out a database outage (readers keep waiting).

        Readers send keepalives meanwhile: they wait on the hub with a timeout.
        """
        backoff = Backoff(first=0.2, cap=DB_RETRY_CAP_S)
        while True:
            try:
                result = await dbpool.readers.run(fn, run_id=self.run_id, **kwargs)
            except DATABASE_ERRORS as exc:
                if not dbpool.is_connection_error(exc):
                    raise
                outage(DATABASE).failed("journal read", exc)
                await asyncio.sleep(backoff.next_delay())
                continue
            outage(DATABASE).recovered()
            return result

    async def _fill(self) -> bool:
        """Read the journal after the tail into the window; True if anything came."""
        before = self.tail
        while self.end_seq is None:
            page = await self._read(read_after, after_seq=self.tail, limit=READ_PAGE)
            self._add(page)
            if len(page) < READ_PAGE:
                break
        return self.tail > before

    async def _join(self) -> None:
        """Join the run's group on a fresh channel (again after a layer outage)."""
        layer = get_channel_layer()
        self._rejoin_at = time.monotonic() + self._backoff.next_delay()
        try:
            self.channel = await layer.new_channel()
            await layer.group_add(group_name(self.run_id), self.channel)
        except Exception as exc:  # polled meanwhile; retried with backoff
            outage(CHANNEL_LAYER).failed("hub join", exc)
            return
        self.layer_ok = True
        self._backoff.reset()
        outage(CHANNEL_LAYER).recovered()

    async def _leave(self) -> None:
        if self.layer_ok:
            self.layer_ok = False
            try:
                await get_channel_layer().group_discard(
                    group_name(self.run_id), self.channel
                )
            except Exception as exc:  # the membership expires on its own
                outage(CHANNEL_LAYER).failed("group discard", exc)

    async def _follow(self) -> None:
        try:
            await self._join()  # first, so nothing committed from now on is missed
            state = await self._read(run_state)
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
            if self._quiet is not None:  # `stop` comes here too, by cancelling
                self._quiet.cancel()
                self._quiet = None
            await self._leave()
            self._notify()

    async def _receive(self) -> dict | None:
        """The next channel-layer message, or None after a quiet spell.

        While the layer is down the hub polls the journal and rejoins the group
        with backoff; a rejoin is followed by a journal read (the None), so
        nothing published while it was away is missed.
        """
        if not self.layer_ok:
            if time.monotonic() >= self._rejoin_at:
                await self._join()
                if self.layer_ok:
                    return None
            await asyncio.sleep(min(self._idle_s / 4, 1.0))
            return None
        try:
            message = await self._receive_until_quiet()
        except TimeoutError:
            return None
        except Exception as exc:
            outage(CHANNEL_LAYER).failed("hub receive", exc)
            self.layer_ok = False  # the old membership expires; a new one follows
            return None
        outage(CHANNEL_LAYER).recovered()
        return message

    async def _receive_until_quiet(self) -> dict:
        """The layer's next message; TimeoutError after `_idle_s` without one.

        What `asyncio.timeout(_idle_s)` around the receive would do, but with
        one loop timer per quiet spell instead of one per message: a timer
        made and cancelled for every message of every hub (thousands a second
        with a crowd streaming) grew the loop's heap of cancelled timers, and
        pushing onto it was about a tenth of a busy web process's CPU
        (docs/benchmarks.md, finding 39). The timer is armed once and, when
        it fires during a later receive, armed again for that receive's own
        deadline.
        """
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        assert task is not None
        self._listening_since = loop.time()
        self._listener, self._quiet_expired = task, False
        cancelling = task.cancelling()
        if self._quiet is None:
            self._quiet = loop.call_at(
                self._listening_since + self._idle_s, self._on_quiet
            )
        try:
            return await get_channel_layer().receive(self.channel)
        except asyncio.CancelledError:
            # Ours, and nobody else's: as asyncio.timeout tells them apart.
            if self._quiet_expired and task.uncancel() <= cancelling:
                raise TimeoutError from None
            raise
        finally:
            self._listener = None

    def _on_quiet(self) -> None:
        self._quiet = None
        if self._listener is None:
            return  # between receives: the next one arms its own
        loop = asyncio.get_running_loop()
        due = self._listening_since + self._idle_s
        # A loop may run a timer up to its clock's resolution early: a hair of
        # slack, so an early firing does not arm another for the same moment.
        if loop.time() < due - self._idle_s / 100:  # a later receive's deadline
            self._quiet = loop.call_at(due, self._on_quiet)
            return
        self._quiet_expired = True
        self._listener.cancel()

    async def _settle_if_lost(self) -> None:
        state = await self._read(run_state)
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
        self._pages: dict[tuple, asyncio.Future] = {}

    def __len__(self) -> int:
        return len(self._hubs)

    def __contains__(self, run_id: str) -> bool:
        return run_id in self._hubs

    def acquire_nowait(self, run_id: str) -> RunHub:
        """The run's hub, started if needed; the caller waits for `hub.ready`."""
        hub = self._hubs.get(run_id)
        if hub is None or hub.dead:
            hub = self._hubs[run_id] = RunHub(run_id)
            hub.start()
        hub.readers += 1
        return hub

    async def acquire(self, run_id: str) -> RunHub:
        hub = self.acquire_nowait(run_id)
        await hub.ready.wait()
        return hub

    async def release(self, hub: RunHub) -> None:
        hub.readers -= 1
        if hub.readers == 0:
            if self._hubs.get(hub.run_id) is hub:
                del self._hubs[hub.run_id]
            await hub.stop()

    async def page(
        self,
        run_id: str,
        after_seq: int,
        limit: int = READ_PAGE,
        template: str | None = None,
    ) -> list[Record] | FramePage:
        """One journal page, as records or (`template`) as the database's frames;
        concurrent readers at the same position share the query."""
        key = (run_id, after_seq, limit, template)
        future = self._pages.get(key)
        if future is None:
            read: Callable[..., list[Record] | FramePage] = read_after
            if template is not None:
                read = functools.partial(read_frames, template=template)
            future = asyncio.ensure_future(
                dbpool.readers.run(
                    read, run_id=run_id, after_seq=after_seq, limit=limit
                )
            )
            self._pages[key] = future
            future.add_done_callback(lambda _f: self._pages.pop(key, None))
        return await asyncio.shield(future)


class _JournalPages:
    """One reader's journal pages, the next ones read while this one is sent.

    Pages are bounded in bytes as well as rows (`PAGE_BYTES`, from the sizes
    the previous page had), so a reader far behind the hub's window holds at
    most `1 + READ_AHEAD` pages of its own whatever the events weigh. With a
    `template` (a format the database can write out, `wire.Format.template`)
    a page is a `FramePage` of about `FRAME_PAGE_BYTES`, made by the database.

    A page of `limit` records read after seq `n` is full only if it holds
    every seq up to `n + limit` (the page queries of `journal.store` bound
    the range so), so the pages after a full one start at known seqs and
    are read before the one ahead of them has come back.
    """

    def __init__(self, registry: HubRegistry, run_id: str, template: str | None):
        self.registry, self.run_id, self.template = registry, run_id, template
        # What ends each frame the database writes out: what follows the
        # template's last field (SSE: the blank line). Pages are cut there.
        self.frame_end = (
            template[template.rindex("%s") + 2 :].encode() if template else b""
        )
        # The pages read ahead, in order: (after which seq, limit, the read).
        self._ahead: deque[tuple[int, int, asyncio.Future]] = deque()
        self.depth = READ_AHEAD.get(connection.vendor, 1)
        self.limit = PAGE_FIRST_ROWS

    async def after(
        self, cursor: int, *, prefetch_below: int
    ) -> list[Record] | FramePage:
        if self._ahead and self._ahead[0][0] == cursor:
            _after, limit, future = self._ahead.popleft()
        else:
            self.close()
            limit, future = self.limit, self._read(cursor, self.limit)
        page = await future
        if isinstance(page, FramePage):
            count, last, size = page.rows, page.last_seq, len(page.data)
            goal = FRAME_PAGE_BYTES
        else:
            count, last, goal = len(page), page[-1].seq if page else 0, PAGE_BYTES
            size = sum(len(r.payload) for r in page) + 64 * count
        full = count == limit
        if count:
            self.limit = max(1, min(READ_PAGE, int(goal * count / size)))
        if not full:
            self.close()  # pages read after a seq this one did not reach
            return page
        after = last
        if self._ahead:  # the next page begins where the last one read ahead ends
            start, rows, _read = self._ahead[-1]
            after = start + rows
        while len(self._ahead) < self.depth and after < prefetch_below:
            self._ahead.append((after, self.limit, self._read(after, self.limit)))
            after += self.limit
        return page

    def _read(self, after: int, limit: int) -> asyncio.Future:
        return asyncio.ensure_future(
            self.registry.page(self.run_id, after, limit, self.template)
        )

    def close(self) -> None:
        while self._ahead:
            # Cancelling a read that already failed also marks its exception
            # seen: asyncio does not report it as never retrieved.
            self._ahead.pop()[2].cancel()


_registries: dict[asyncio.AbstractEventLoop, HubRegistry] = {}


def hubs() -> HubRegistry:
    loop = asyncio.get_running_loop()
    registry = _registries.get(loop)
    if registry is None:
        registry = _registries[loop] = HubRegistry()
    return registry


def subscribe(
    run_id: str, *, after_seq: int = 0, idle_s: float | None = None
) -> AsyncGenerator[list[Record]]:
    """Yield the run's records after `after_seq` in batches, each seq once, until `end`.

    Yields `[]` after `idle_s` seconds without news, so transports can send a
    heartbeat; a database outage is such a quiet spell (reads are retried with
    backoff), so an open stream stays open through it. Leaves the group on
    every exit path, a client disconnect included.
    """
    return _stream(run_id, after_seq, idle_s, None)


def subscribe_frames(
    run_id: str, fmt: wire.Format, *, after_seq: int = 0, idle_s: float | None = None
) -> AsyncGenerator[list]:
    """`subscribe`, as lists of writes in `fmt` (`[]`: a heartbeat).

    A batch comes in parts of about `PART_BYTES`, each encoded when it is
    reached. Live parts are from the hub's window, encoded once for all its
    readers (`RunHub.encode`); journal pages are a reader's own.
    """
    return _stream(run_id, after_seq, idle_s, fmt)


def _parts(batch: list[Record]) -> list[list[Record]]:
    """`batch` cut into runs of about `PART_BYTES` payload bytes, in order."""
    if len(batch) <= 4:  # a live tick's batch: one part, however its size
        return [batch]
    parts, start, size = [], 0, 0
    for i, record in enumerate(batch):
        size += len(record.payload) + 48  # and the frame around it, about
        if size >= PART_BYTES:
            parts.append(batch[start : i + 1])
            start, size = i + 1, 0
    if start < len(batch):
        parts.append(batch[start:])
    return parts


def _frame_parts(data: bytes, frame_end: bytes) -> Iterator[bytes]:
    """A page of frames, each ending in `frame_end`, in writes of about
    `PART_BYTES` cut where a frame ends (as `_parts` cuts records), each
    copied out when it is reached."""
    start = 0
    while len(data) - start > PART_BYTES:
        cut = data.find(frame_end, start + PART_BYTES - len(frame_end))
        if cut < 0:
            break
        yield data[start : cut + len(frame_end)]
        start = cut + len(frame_end)
    if start < len(data):
        yield data[start:]


def _replayed(started: float) -> float:
    """A batch is out: the first after `started` (if set) is the replay's latency."""
    if started:
        metrics.REPLAY_FIRST_BATCH_S.observe(time.monotonic() - started)
    return 0.0


async def _stream(
    run_id: str, after_seq: int, idle_s: float | None, fmt: wire.Format | None
) -> AsyncGenerator[list]:
    """`subscribe` (`fmt` None) and `subscribe_frames`: one generator per
    reader, not one wrapping another (an idle stream's memory counts)."""
    registry = hubs()
    started = time.monotonic()  # replay latency: until the first journaled batch
    idle_s = idle_s or 3600
    hub = registry.acquire_nowait(run_id)
    clock = asyncio.get_running_loop().time
    keepalive_at: float | None = None  # while waiting: when to yield `[]`
    metrics.SUBSCRIPTIONS.inc()
    pages: _JournalPages | None = None  # while the reader is behind the window
    template = fmt.template if fmt else None
    backoff = Backoff(first=0.2, cap=DB_RETRY_CAP_S)
    shared: RunHub | None
    page: list[Record] | FramePage | None
    batch: list[Record] | None
    part: list[Record] | None
    chunk: bytes | None
    try:
        while not await hub.wait_ready(idle_s):
            yield []  # the hub waits out a database outage
        cursor = after_seq
        while hub.end_seq is None or cursor < hub.end_seq:
            if cursor < hub.base:
                pages = pages or _JournalPages(registry, run_id, template)
                try:
                    page = await pages.after(cursor, prefetch_below=hub.base)
                except DATABASE_ERRORS as exc:
                    if not dbpool.is_connection_error(exc):
                        raise
                    outage(DATABASE).failed("journal page", exc)
                    yield []  # a keepalive, then the same page again
                    await asyncio.sleep(backoff.next_delay())
                    continue
                backoff.reset()
                if isinstance(page, FramePage):  # the frames, made by the database
                    if not page.rows:  # the journal has less than the hub knew
                        return
                    cursor = page.last_seq
                    keepalive_at = None
                    started = _replayed(started)
                    for chunk in _frame_parts(page.data, pages.frame_end):
                        yield [chunk]
                    if page.ended:
                        return
                    continue
                batch, shared = page, None
            elif cursor < hub.tail:
                start = cursor - hub.base
                batch = hub.window[start : start + READ_PAGE]
                shared = hub
            elif hub.end_seq is not None:
                break
            elif hub.dead:  # replace it (after a pause: it failed for a reason)
                await asyncio.sleep(HUB_RETRY_S)
                await registry.release(hub)
                hub = registry.acquire_nowait(run_id)
                while not await hub.wait_ready(idle_s):
                    yield []
                continue
            else:
                started = 0.0  # waiting for news: not a replay any more
                # An idle reader holds no page and no batch of its own.
                if pages is not None:
                    pages.close()
                    pages = None
                page = batch = part = chunk = None
                if keepalive_at is None:
                    keepalive_at = clock() + idle_s
                elif clock() >= keepalive_at:
                    keepalive_at = None
                    yield []
                    continue
                await hub.wait_changed(keepalive_at)
                continue
            if not batch:  # the journal has less than the hub knew: pruned
                return
            cursor = batch[-1].seq
            keepalive_at = None
            started = _replayed(started)
            if fmt is None:
                yield batch
            else:
                for part in _parts(batch):
                    if shared is not None:
                        yield shared.encode(fmt, part)
                    else:
                        yield fmt.encode(run_id, part)
            if batch[-1].type == TERMINAL:
                return
    finally:
        if pages is not None:
            pages.close()
        metrics.SUBSCRIPTIONS.dec()
        await registry.release(hub)
