"""`journal.subscribe`: replay then live, each seq once, one hub per run and loop.

Runs are written with `journal.store` and published with `journal.publish`,
the way any app's worker does; readers are `subscribe` generators on the same
event loop, as transports hold them. Nothing here knows what a run is about.
"""

import asyncio
import gc
import re
import threading
from collections import Counter
from contextlib import aclosing

import pytest
from django.db import OperationalError, connection

from hermes_testing.harness import group_size, running_run, wait_until_async
from journal import dbpool, wire
from journal import subscribe as subscribe_module
from journal.publish import append_and_publish, group_name
from journal.store import FramePage, append, read_after, read_frames
from journal.subscribe import hubs, subscribe, subscribe_frames

END = ("end", {"status": "completed", "terminal_state": "completed"})


def _tokens(n: int, start: int = 0) -> list[tuple[str, dict]]:
    return [("token", {"text": f"t{i}"}) for i in range(start, start + n)]


class Reader:
    """A subscriber on this loop that keeps every record it is given."""

    def __init__(self, run_id: str, after_seq: int = 0):
        self.seqs: list[int] = []
        self.types: list[str] = []
        self.gate = asyncio.Event()  # cleared: the reader stops taking batches
        self.gate.set()
        self._stream = subscribe(run_id, after_seq=after_seq, idle_s=0.2)
        self.task = asyncio.create_task(self._read())

    async def _read(self) -> None:
        async with aclosing(self._stream) as stream:
            async for batch in stream:
                await self.gate.wait()
                self.seqs += [r.seq for r in batch]
                self.types += [r.type for r in batch]

    async def close(self) -> None:
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)


async def _publish(run_id: str, events) -> None:
    await append_and_publish(run_id=run_id, token=1, events=events)


def _paged_run(owner, monkeypatch, read_ahead: int | None = None):
    """A running run of 300 journaled events, replayed in small pages: the
    first of 5 records, the next of about 2 KiB of frames; `read_ahead`
    pages read ahead, if given, whatever the database."""
    monkeypatch.setattr(subscribe_module, "PAGE_FIRST_ROWS", 5)
    monkeypatch.setattr(subscribe_module, "FRAME_PAGE_BYTES", 2048)
    if read_ahead is not None:
        monkeypatch.setattr(
            subscribe_module, "READ_AHEAD", {connection.vendor: read_ahead}
        )
    run = running_run(owner)
    for i in range(0, 300, 50):
        append(run_id=run.id, token=1, events=_tokens(50, start=i))
    return run


async def _replay_to_the_end(run_id: str, at_first_page) -> list[bytes]:
    """An SSE reader's writes from seq 0 through `end`. When its first page
    is out (a batch of frames, not a keepalive), `at_first_page()` is awaited,
    then four more tokens and the end are published."""
    writes: list[bytes] = []
    stream = subscribe_frames(run_id, wire.SSE, after_seq=0, idle_s=0.2)
    async with aclosing(stream) as batches:
        async for batch in batches:
            if batch and not writes:
                await at_first_page()
                await _publish(run_id, _tokens(4, start=300))
                await _publish(run_id, [END])
            writes += batch
    return writes


def _assert_sent_the_journal(run_id: str, writes: list[bytes]) -> None:
    """The 305 journaled events, each seq once, as this process encodes them."""
    journaled = read_after(run_id=run_id, after_seq=0, limit=1000)
    assert len(journaled) == 305
    assert b"".join(writes) == wire.sse_frames(run_id, journaled).encode()


def test_replay_then_live_has_no_gap_and_no_duplicate(alice, fast_readers):
    run = running_run(alice[0])
    append(run_id=run.id, token=1, events=_tokens(5))

    async def main() -> list[int]:
        reader = Reader(run.id)
        await wait_until_async(lambda: reader.seqs == [1, 2, 3, 4, 5])
        for i in range(5, 25, 4):  # live, in batches, while the reader follows
            await _publish(run.id, _tokens(4, start=i))
        await _publish(run.id, [END])
        await asyncio.wait_for(reader.task, 10)
        return reader.seqs

    assert asyncio.run(main()) == list(range(1, 27))


def test_a_reader_attaching_while_events_are_written_misses_none(alice, fast_readers):
    run = running_run(alice[0])

    async def main() -> list[int]:
        halfway = asyncio.Event()
        writing = asyncio.create_task(_write_many(run.id, halfway))
        await halfway.wait()
        reader = Reader(run.id)  # attaches mid-stream: part replay, part live
        await writing
        await asyncio.wait_for(reader.task, 10)
        return reader.seqs

    async def _write_many(run_id: str, halfway: asyncio.Event) -> None:
        for i in range(30):
            await _publish(run_id, _tokens(2, start=2 * i))
            if i == 10:
                halfway.set()
            await asyncio.sleep(0)  # let the reader run between commits
        await _publish(run_id, [END])

    assert asyncio.run(main()) == list(range(1, 62))


def test_several_readers_share_one_hub_and_one_group_membership(alice, fast_readers):
    run = running_run(alice[0])
    append(run_id=run.id, token=1, events=_tokens(6))

    async def main():
        readers = [Reader(run.id, after_seq=k) for k in (0, 2, 6)]
        await wait_until_async(lambda: all(r.seqs[-1:] == [6] for r in readers[:2]))
        shared = (len(hubs()), await group_size(group_name(run.id)))
        await _publish(run.id, [*_tokens(3, start=6), END])
        await asyncio.gather(*(asyncio.wait_for(r.task, 10) for r in readers))
        return shared, [r.seqs for r in readers]

    shared, seen = asyncio.run(main())
    assert shared == (1, 1)
    assert seen == [list(range(1, 11)), list(range(3, 11)), list(range(7, 11))]


def test_readers_of_one_hub_get_the_same_frames_each_encoded_once(alice, fast_readers):
    run = running_run(alice[0])
    encoded: Counter = Counter()

    def counting_frame(run_id, record):
        encoded[record.seq] += 1
        return wire.sse_frame(run_id, record)

    fmt = wire.Format("counting-sse", counting_frame, joined=True)

    async def read(gate: asyncio.Event) -> bytes:
        received = []
        async with aclosing(subscribe_frames(run.id, fmt, idle_s=0.2)) as stream:
            async for writes in stream:
                await gate.wait()
                received += writes
        return b"".join(received)

    async def main():
        open_gate, slow_gate = asyncio.Event(), asyncio.Event()
        open_gate.set()
        readers = [asyncio.create_task(read(open_gate)) for _ in range(3)]
        readers.append(asyncio.create_task(read(slow_gate)))  # takes larger batches
        await wait_until_async(
            lambda: run.id in hubs() and hubs()._hubs[run.id].ready.is_set()
        )
        for i in range(0, 40, 4):
            await _publish(run.id, _tokens(4, start=i))
        await _publish(run.id, [END])
        slow_gate.set()
        return await asyncio.wait_for(asyncio.gather(*readers), 10)

    streams = asyncio.run(main())
    assert len(set(streams)) == 1  # every reader got the same bytes
    seqs = [int(s) for s in re.findall(rb"^id: [^:]+:([0-9]+)$", streams[0], re.M)]
    assert seqs == list(range(1, 42))  # each seq once, in order
    journaled = read_after(run_id=run.id, after_seq=0, limit=100)
    assert streams[0] == wire.sse_frames(run.id, journaled).encode()
    assert set(encoded.values()) == {1}  # four readers, one encoding per seq
    assert sorted(encoded) == seqs


def test_a_reader_that_falls_behind_the_window_reads_the_journal(
    alice, fast_readers, monkeypatch
):
    monkeypatch.setattr(subscribe_module, "WINDOW", 8)
    monkeypatch.setattr(subscribe_module, "PAGE_FIRST_ROWS", 5)
    run = running_run(alice[0])

    async def main():
        keeping_up, slow = Reader(run.id), Reader(run.id)
        slow.gate.clear()  # takes its first batch, then stops reading
        for i in range(0, 60, 3):
            await _publish(run.id, _tokens(3, start=i))
        await _publish(run.id, [END])
        await asyncio.wait_for(keeping_up.task, 10)
        hub_base = max(hub.base for hub in hubs()._hubs.values())
        slow.gate.set()
        await asyncio.wait_for(slow.task, 10)
        return hub_base, keeping_up.seqs, slow.seqs

    hub_base, fast_seqs, slow_seqs = asyncio.run(main())
    assert hub_base > 8  # the window moved on past what the slow reader had
    assert fast_seqs == slow_seqs == list(range(1, 62))


def test_an_sse_reader_behind_the_hub_gets_the_databases_pages_then_the_live_tail(
    alice, fast_readers, monkeypatch
):
    """The journal part of an SSE stream comes as pages the database wrote out
    (`read_frames`): the first of `PAGE_FIRST_ROWS` records, the next sized to
    `FRAME_PAGE_BYTES`, each sent in writes of about `PART_BYTES` cut where a
    frame ends; then the hub's live records follow, each seq once, and the
    bytes are those of encoding the journal here."""
    monkeypatch.setattr(subscribe_module, "PART_BYTES", 500)
    run = _paged_run(alice[0], monkeypatch)

    async def read(after_seq: int, started: asyncio.Event) -> list[bytes]:
        writes = []
        stream = subscribe_frames(run.id, wire.SSE, after_seq=after_seq, idle_s=0.2)
        async with aclosing(stream) as batches:
            async for batch in batches:
                started.set()
                writes += batch
        return writes

    async def main():
        started = [asyncio.Event(), asyncio.Event()]
        readers = [
            asyncio.create_task(read(cursor, event))
            for cursor, event in zip((0, 137), started, strict=True)
        ]
        for event in started:
            await event.wait()
        await _publish(run.id, _tokens(4, start=300))
        await _publish(run.id, [END])
        return await asyncio.wait_for(asyncio.gather(*readers), 10)

    from_start, from_137 = asyncio.run(main())
    journaled = read_after(run_id=run.id, after_seq=0, limit=1000)
    assert len(journaled) == 305
    assert b"".join(from_start) == wire.sse_frames(run.id, journaled).encode()
    assert b"".join(from_137) == wire.sse_frames(run.id, journaled[137:]).encode()
    assert from_start[0].count(b"\n\n") == 5  # the first page: PAGE_FIRST_ROWS
    assert len(from_start) > 300 * 60 // 500  # frames of 60 bytes or more
    for write in from_start + from_137:  # whole frames, a part and a frame at most
        assert write.startswith(b"id: ") and write.endswith(b"\n\n")
        assert len(write) <= 500 + 100
    # Pages of about FRAME_PAGE_BYTES, so most writes are cut at PART_BYTES.
    assert sum(len(write) > 500 for write in from_start) > len(from_start) / 2


@pytest.mark.parametrize("depth", [1, 2])
def test_a_reader_behind_the_hub_has_its_next_pages_read_ahead_each_once(
    alice, fast_readers, monkeypatch, depth
):
    """While a reader's page goes out, the next `READ_AHEAD` pages are read:
    a full page of `limit` records ends `limit` seqs on, so each next page's
    start is known before the page ahead of it comes back. No more are read
    than that, each page is read once, and the reader sends the journal as
    it is, each seq once, then the live tail."""
    run = _paged_run(alice[0], monkeypatch, read_ahead=depth)
    reads: list[tuple[int, int, int]] = []  # (after seq, limit, rows), as done

    def counted(**kwargs) -> FramePage:
        page = read_frames(**kwargs)
        reads.append((kwargs["after_seq"], kwargs["limit"], page.rows))
        return page

    monkeypatch.setattr(subscribe_module, "read_frames", counted)

    held: list[tuple[int, int, int]] = []

    async def at_first_page() -> None:
        # The reader reads nothing more until it is given the next page, so
        # once these reads are done, they are all it made.
        await wait_until_async(lambda: len(reads) == 1 + depth)
        held.extend(sorted(reads))

    writes = asyncio.run(
        asyncio.wait_for(_replay_to_the_end(run.id, at_first_page), 30)
    )
    first, second = held[0], held[1]
    assert first == (0, 5, 5)  # PAGE_FIRST_ROWS
    expected = [0, 5, 5 + second[1]][: 1 + depth]
    assert [after for after, _limit, _rows in held] == expected
    assert all(rows == limit for _after, limit, rows in held)  # full pages
    afters = [after for after, _limit, _rows in reads]
    assert len(afters) == len(set(afters))  # no page read twice
    _assert_sent_the_journal(run.id, writes)


@pytest.mark.slow
def test_pages_read_ahead_in_an_outage_are_read_again_and_none_left_unretrieved(
    alice, fast_readers, monkeypatch
):
    """The database goes out of reach once a reader's first page is read:
    both pages read ahead fail. The reader waits the outage out and reads on
    from where it was, each seq once; the failed read it let go unawaited is
    not reported by asyncio as an exception never retrieved."""
    run = _paged_run(alice[0], monkeypatch, read_ahead=2)
    down = threading.Event()
    failed: list[int] = []  # the seq after which each failed read began

    def flaky(**kwargs) -> FramePage:
        if down.is_set():
            failed.append(kwargs["after_seq"])
            raise OperationalError("the database is out of reach")
        page = read_frames(**kwargs)
        if kwargs["after_seq"] == 0:
            down.set()
        return page

    monkeypatch.setattr(subscribe_module, "read_frames", flaky)
    reported: list[dict] = []

    async def at_first_page() -> None:  # both pages read ahead fail
        await wait_until_async(lambda: len(set(failed)) == 2)
        down.clear()

    async def main() -> list[bytes]:
        asyncio.get_running_loop().set_exception_handler(
            lambda _loop, context: reported.append(context)
        )
        writes = await _replay_to_the_end(run.id, at_first_page)
        gc.collect()
        await asyncio.sleep(0)  # callbacks the collection scheduled
        return writes

    writes = asyncio.run(asyncio.wait_for(main(), 30))
    _assert_sent_the_journal(run.id, writes)
    assert [c["message"] for c in reported] == []


@pytest.mark.slow
def test_a_hub_reads_the_journal_after_a_quiet_spell_with_one_timer_per_spell(
    alice, fast_readers
):
    """Doorbells that stop after a stream of them (events committed, none
    published): the hub reads the journal once `READER_IDLE_CHECK_S` passes
    without a message, counted from the last one. Its quiet timer is armed
    about once per spell, not once per message (a timer per message cost a
    busy web process a tenth of its CPU): the doorbells outlast three
    spells, so the timer fires during them and is armed again.

    The bound is one of time, whatever the machine's pace: each firing arms
    at most one timer, and firings come about a spell apart, so at most
    `spells_bound(t)` timers in `t` seconds; the doorbells go on until they
    are twice that many, so a timer per message could not pass."""
    idle_s = 0.3  # fast_readers

    def spells_bound(elapsed: float) -> float:
        return 2 + 2 * elapsed / idle_s

    run = running_run(alice[0])

    async def main():
        loop = asyncio.get_running_loop()
        armed = Counter()
        call_at = loop.call_at

        def counting_call_at(when, callback, *args, **kwargs):
            armed[getattr(callback, "__name__", "")] += 1
            return call_at(when, callback, *args, **kwargs)

        loop.call_at = counting_call_at
        reader = Reader(run.id)
        began, published = loop.time(), 0
        while loop.time() - began < 3 * idle_s or published < 2 * spells_bound(
            loop.time() - began
        ):
            await _publish(run.id, _tokens(1, start=published))
            published += 1
            await wait_until_async(lambda n=published: len(reader.seqs) == n)
        await dbpool.writers.run(
            append, run_id=run.id, token=1, events=[*_tokens(2, start=published), END]
        )
        await asyncio.wait_for(reader.task, 10)
        elapsed = loop.time() - began
        # The hub's timers for its receives: its own, or asyncio.timeout's.
        return (
            reader.seqs,
            published,
            armed["_on_quiet"] + armed["_on_timeout"],
            elapsed,
        )

    seqs, published, armed, elapsed = asyncio.run(main())
    assert seqs == list(range(1, published + 4))
    assert 2 <= armed <= spells_bound(elapsed) < published


def test_a_page_of_frames_is_cut_into_writes_only_where_a_frame_ends(monkeypatch):
    monkeypatch.setattr(subscribe_module, "PART_BYTES", 100)
    sizes = [10, 150, 40, 40, 40, 0, 300, 5]  # frames under, over and near a part
    frames = [
        f"id: r:{i}\nevent: token\ndata: {'x' * n}\n\n".encode()
        for i, n in enumerate(sizes)
    ]
    data = b"".join(frames)
    writes = list(subscribe_module._frame_parts(data, b"\n\n"))
    assert b"".join(writes) == data
    frame_ends = {sum(map(len, frames[: i + 1])) for i in range(len(frames))}
    write_ends = {sum(map(len, writes[: i + 1])) for i in range(len(writes))}
    assert write_ends <= frame_ends  # each write is whole frames
    assert len(writes) > 2
    assert all(len(w) < 100 + max(map(len, frames)) for w in writes)
    assert list(subscribe_module._frame_parts(frames[0], b"\n\n")) == [frames[0]]


def test_a_cursor_at_the_end_of_a_finished_run_yields_nothing(alice):
    run = running_run(alice[0])
    append(run_id=run.id, token=1, events=[*_tokens(3), END])

    async def read(after_seq: int) -> list[str]:
        reader = Reader(run.id, after_seq=after_seq)
        await asyncio.wait_for(reader.task, 10)
        return reader.types

    assert asyncio.run(read(4)) == []
    assert asyncio.run(read(3)) == ["end"]
    assert asyncio.run(read(0)) == ["token", "token", "token", "end"]


def test_the_hub_goes_when_its_last_reader_leaves(alice, fast_readers):
    run = running_run(alice[0])
    append(run_id=run.id, token=1, events=_tokens(2))
    group = group_name(run.id)

    async def main() -> list[tuple[int, int]]:
        first, second = Reader(run.id), Reader(run.id)
        await wait_until_async(lambda: first.seqs and second.seqs)
        seen = [(len(hubs()), await group_size(group))]
        await first.close()
        seen.append((len(hubs()), await group_size(group)))
        await second.close()
        seen.append((len(hubs()), await group_size(group)))
        return seen

    assert asyncio.run(main()) == [(1, 1), (1, 1), (0, 0)]


@pytest.mark.parametrize("after_seq", [0, 3])
def test_a_run_that_ends_while_read_is_followed_to_its_end(
    alice, fast_readers, after_seq
):
    run = running_run(alice[0])
    append(run_id=run.id, token=1, events=_tokens(4))

    async def main() -> list[int]:
        reader = Reader(run.id, after_seq=after_seq)
        await wait_until_async(lambda: reader.seqs[-1:] == [4])
        await _publish(run.id, [END])
        await asyncio.wait_for(reader.task, 10)
        return reader.seqs

    assert asyncio.run(main()) == list(range(after_seq + 1, 6))


@pytest.mark.slow
def test_idle_readers_keep_their_own_keepalive_interval_on_one_timer(
    alice, fast_readers
):
    """An idle reader yields `[]` each time its own interval passes without
    news, never sooner, whatever the intervals of the hub's other readers;
    and the loop holds no more timers for twenty waiting readers than for one."""
    run = running_run(alice[0])
    append(run_id=run.id, token=1, events=_tokens(2))

    async def read(idle_s: float, keepalives: int) -> list[float]:
        clock = asyncio.get_running_loop().time
        gaps: list[float] = []
        async with aclosing(subscribe(run.id, idle_s=idle_s)) as stream:
            since = clock()
            async for batch in stream:
                if batch:  # the replay: the interval counts from its end
                    since = clock()
                    continue
                gaps.append(clock() - since)
                since = clock()
                if len(gaps) == keepalives:
                    return gaps
        return gaps

    def timers(loop) -> int:
        return sum(not h.cancelled() for h in loop._scheduled)

    def waiters() -> int:  # readers waiting for news
        hub = hubs()._hubs.get(run.id)
        return len(hub._changed._waiters or ()) if hub else 0

    async def main():
        loop = asyncio.get_running_loop()
        slow = asyncio.create_task(read(3.0, 1))
        await wait_until_async(lambda: waiters() == 1)
        alone = timers(loop)
        fast = [asyncio.create_task(read(0.2, 5)) for _ in range(20)]
        await wait_until_async(lambda: waiters() == 21)
        many = timers(loop)
        return alone, many, await asyncio.wait_for(asyncio.gather(slow, *fast), 30)

    alone, many, (slow_gaps, *fast_gaps) = asyncio.run(main())
    assert many <= alone + 1  # the hub's one timer, not one per reader
    assert slow_gaps[0] >= 3.0
    assert all(gap >= 0.2 for gaps in fast_gaps for gap in gaps)
    assert all(len(gaps) == 5 for gaps in fast_gaps)
