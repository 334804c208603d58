"""The batching writer against the real database: event size, isolation, reconciling.

Each test drives `BatchWriter` in an event loop of its own; the appends go
through the real writer pool and database (transactional tests: the pool's
threads have connections of their own).
"""

import asyncio
import json

import pytest
from django.db import connection

from chat import writer as writer_module
from chat.writer import BatchWriter, EventsNotStored, tick_interval
from hermes_testing.fake_llm import Reply
from hermes_testing.harness import running_run
from journal import dbpool
from journal.events import MAX_EVENT_BYTES, InvalidEvent
from journal.models import Event, Run
from journal.store import AppendRejected, append_many


@pytest.fixture
def committer_sleeps(monkeypatch) -> list[float]:
    """The delays the committer sleeps for, noted and not slept: tests of its
    pacing see the same whatever the machine's pace."""
    waits: list[float] = []
    real_sleep = asyncio.sleep

    async def noted_sleep(delay, *args):
        # `asyncio.sleep` is one function for the whole process: note the
        # committer's sleeps only, not those of other threads' event loops.
        task = asyncio.current_task()
        if task is not None and task.get_name() == "journal committer":
            waits.append(delay)
        await real_sleep(0)

    monkeypatch.setattr(writer_module.asyncio, "sleep", noted_sleep)
    return waits


def _rows(run):
    return list(
        Event.objects.filter(run=run).order_by("seq").values_list("seq", "payload")
    )


def test_no_text_event_exceeds_64_kib_and_the_text_is_whole(alice):
    run = running_run(alice[0])
    # Worst cases: one huge delta, a burst of small ones, text JSON must escape.
    huge = "é" * 150_000
    small = ["ab" * 50] * 2000
    escaped = "\x01" * 40_000

    async def write():
        writer = BatchWriter(run_id=run.id, token=1)
        writer.add("token", {"text": huge})
        for piece in small:
            writer.add("token", {"text": piece})
        writer.add("reasoning", {"text": escaped})
        await writer.flush()
        return writer

    writer = asyncio.run(write())
    rows = _rows(run)
    assert [seq for seq, _ in rows] == list(range(1, len(rows) + 1))
    assert max(len(payload.encode()) for _, payload in rows) <= MAX_EVENT_BYTES
    events = [
        (e.type, json.loads(e.payload)["text"])
        for e in Event.objects.filter(run=run).order_by("seq")
    ]
    assert "".join(t for k, t in events if k == "token") == huge + "".join(small)
    assert "".join(t for k, t in events if k == "reasoning") == escaped
    assert writer.rows_written == len(rows) == Run.objects.get(id=run.id).last_seq


def test_each_tick_gives_the_store_every_runs_last_committed_seq(alice, monkeypatch):
    """The committer passes each run's last seq as its writer knows it, so the
    store can write the tick as one statement (`journal.store.append_many`)."""
    runs = [running_run(alice[0]) for _ in range(2)]
    given: list[dict] = []
    store_append_many = writer_module.append_many

    def spy(batches, **kwargs):
        given.append(dict(kwargs["last_seqs"]))
        return store_append_many(batches, **kwargs)

    monkeypatch.setattr(writer_module, "append_many", spy)

    async def write():
        one = BatchWriter(run_id=runs[0].id, token=1)
        two = BatchWriter(run_id=runs[1].id, token=1, last_seq=0)
        one.add("start", {})
        one.add("token", {"text": "a"})
        await one.flush()
        one.add("token", {"text": "b"})
        two.add("token", {"text": "c"})
        await asyncio.gather(one.flush(), two.flush())

    asyncio.run(write())
    assert given == [{runs[0].id: 0}, {runs[0].id: 2, runs[1].id: 0}]
    assert [seq for seq, _ in _rows(runs[0])] == [1, 2, 3]
    assert _rows(runs[1]) == [(1, '{"text":"c"}')]


def test_what_is_added_after_a_pause_is_committed_without_waiting_a_tick(
    alice, monkeypatch
):
    """Ticks start at most every INTERVAL_S, counted from the last one: the
    first event after a pause (a run's start, the first token after a tool
    call) is not held back for a whole tick."""
    monkeypatch.setattr("chat.writer.INTERVAL_S", 3600.0)
    run = running_run(alice[0])

    async def write():
        writer = BatchWriter(run_id=run.id, token=1)
        writer.add("token", {"text": "first"})
        # An hour's tick would time this out: the first tick starts at once.
        await asyncio.wait_for(writer.flush(), timeout=60)
        writer.close()

    asyncio.run(write())
    assert [json.loads(p) for _, p in _rows(run)] == [{"text": "first"}]


def test_the_interval_stretches_with_the_runs_a_tick_carries():
    low, high = writer_module.CROWD_RUNS
    assert tick_interval(1) == tick_interval(low) == writer_module.INTERVAL_S
    longest = writer_module.INTERVAL_MAX_S
    assert tick_interval(high) == tick_interval(10 * high) == longest
    between = [tick_interval(n) for n in range(low, high + 1)]
    assert between == sorted(between)
    assert tick_interval((low + high) // 2) == pytest.approx(
        (writer_module.INTERVAL_S + writer_module.INTERVAL_MAX_S) / 2, rel=0.05
    )


def test_the_committer_waits_the_interval_of_its_last_ticks_runs(
    alice, bob, monkeypatch, committer_sleeps
):
    """The wait before a tick is the interval for as many runs as the tick
    before it carried: a crowded tick stretches the next wait, a lone run's
    does not. The intervals are long and the sleeps are noted, not slept, so
    the machine's pace cannot change what is seen."""
    monkeypatch.setattr(writer_module, "CROWD_RUNS", (1, 2))
    monkeypatch.setattr(writer_module, "INTERVAL_S", 100.0)
    monkeypatch.setattr(writer_module, "INTERVAL_MAX_S", 1000.0)
    waits = committer_sleeps
    runs = [running_run(alice[0]), running_run(bob[0])]

    async def write():
        one, two = (BatchWriter(run_id=r.id, token=1) for r in runs)
        one.add("token", {"text": "a"})
        two.add("token", {"text": "b"})
        await asyncio.gather(one.flush(), two.flush())  # the first: no wait
        assert waits == []
        one.add("token", {"text": "c"})
        await one.flush()  # after a tick of two runs
        one.add("token", {"text": "d"})
        await one.flush()  # after a tick of one
        one.close()
        two.close()

    asyncio.run(write())
    assert len(waits) == 2
    assert 100 < waits[0] <= 1000  # two runs: the longest interval
    assert 0 < waits[1] <= 100  # one run: the shortest
    texts = [json.loads(p)["text"] for _, p in _rows(runs[0])]
    assert "".join(texts) == "acd"


def test_nul_and_lone_surrogates_are_journaled_as_replacement_characters(alice):
    run = running_run(alice[0])

    async def write():
        writer = BatchWriter(run_id=run.id, token=1)
        writer.add("token", {"text": "a\x00b\ud800c"})
        writer.add("status", {"message": "s\udfff"})
        await writer.flush()

    asyncio.run(write())
    assert [json.loads(p) for _, p in _rows(run)] == [
        {"text": "a\ufffdb\ufffdc"},
        {"message": "s\ufffd"},
    ]


def test_a_run_whose_events_cannot_be_stored_fails_alone(alice, bob):
    good, wrong_type, unencodable = (running_run(u[0]) for u in (alice, bob, bob))
    troubles = []

    async def write():
        writers = [
            BatchWriter(run_id=r.id, token=1, on_trouble=troubles.append)
            for r in (good, wrong_type, unencodable)
        ]
        ok, typed, raw = writers
        # All three in the same committer tick, hence the same transaction.
        ok.add("token", {"text": "fine"})
        typed.add("tool", {"tool_call_id": 123, "name": "calc", "args": "{}"})
        # Past the writer's cleaning (only a bug could do this): the shared
        # transaction fails and each run is written on its own.
        raw._pending.append(["status", {"message": "\ud800"}])
        raw._idle.clear()
        raw._committer.want(raw)
        ok.add("token", {"text": " still fine"})
        outcomes = await asyncio.gather(
            *(w.flush() for w in writers), return_exceptions=True
        )
        ok.add("token", {"text": "!"})
        await ok.flush()
        return outcomes

    outcomes = asyncio.run(write())
    assert outcomes[0] is None
    assert isinstance(outcomes[1], InvalidEvent)
    assert isinstance(outcomes[2], EventsNotStored)
    assert troubles == ["journal", "journal"]
    assert [json.loads(p)["text"] for _, p in _rows(good)] == ["fine still fine", "!"]
    assert _rows(wrong_type) == [] and _rows(unencodable) == []
    assert Run.objects.get(id=unencodable.id).last_seq == 0


@pytest.mark.parametrize("landed", [True, False])
def test_a_batch_whose_commit_was_unknown_is_written_exactly_once(alice, landed):
    run = running_run(alice[0])
    batch = [("token", {"text": "abc"}), ("status", {"message": "m"})]

    async def write():
        if landed:  # the commit went through; the answer was lost with the connection
            await dbpool.writers.run(append_many, [(run.id, 1, batch)])
        writer = BatchWriter(run_id=run.id, token=1)
        for event_type, payload in batch:
            writer.add(event_type, payload)
        assert writer.take() == batch
        writer.stalled()  # what the committer does after a connection error
        writer.settle()
        await writer.flush()
        writer.add("token", {"text": "next"})
        await writer.flush()
        return writer

    writer = asyncio.run(write())
    assert [json.loads(p) for _, p in _rows(run)] == [
        {"text": "abc"},
        {"message": "m"},
        {"text": "next"},
    ]
    assert writer.last_seq == 3


def test_a_writer_taken_over_during_an_outage_writes_nothing_more(alice):
    run = running_run(alice[0])
    troubles: list[str] = []

    async def write():
        writer = BatchWriter(run_id=run.id, token=1, on_trouble=troubles.append)
        writer.add("token", {"text": "before the outage"})
        await writer.flush()
        writer.add("token", {"text": "held during the outage"})
        writer.take()
        writer.stalled()
        # Meanwhile a reaper took the run over.
        await dbpool.writers.run(
            lambda: Run.objects.filter(id=run.id).update(fencing_token=2)
        )
        writer.settle()
        with pytest.raises(AppendRejected):
            await writer.flush()
        writer.add("token", {"text": "after"})  # ignored: the writer failed
        with pytest.raises(AppendRejected):
            await writer.flush()

    asyncio.run(write())
    assert [json.loads(p)["text"] for _, p in _rows(run)] == ["before the outage"]
    assert troubles == ["fenced"]  # the runner stops the model at once


def test_a_run_whose_buffer_outgrows_its_bound_is_told_once(alice, monkeypatch):
    import chat.writer

    run = running_run(alice[0])
    monkeypatch.setattr(chat.writer, "BUFFER_MAX_CHARS", 100)
    troubles: list[str] = []

    async def write():
        writer = BatchWriter(run_id=run.id, token=1, on_trouble=troubles.append)
        for _ in range(5):  # added faster than any commit: all of it is buffered
            writer.add("token", {"text": "x" * 40})
        await writer.flush()  # what was buffered is still written, whole
        assert writer.buffered_chars == 0

    asyncio.run(write())
    # The database answers: the model outran the journal, not an outage.
    assert troubles == [chat.writer.OVERFLOW]
    assert "".join(json.loads(p)["text"] for _, p in _rows(run)) == "x" * 200


def test_a_run_that_outruns_the_journal_fails_naming_that_cause(
    server, alice, fake_llm, live_worker, monkeypatch
):
    """Not "the database was out of reach" while it answers: the run's error
    says the model wrote faster than the journal could store it."""
    import chat.writer
    from hermes_testing.api import new_session, start_run, stream

    monkeypatch.setattr(chat.writer, "BUFFER_MAX_CHARS", 100)
    fake_llm.push(Reply(text="y" * 20000, chunk_chars=50))  # all at once
    run_id = start_run(server, alice[1], new_session(server, alice[1]), "flood")
    events = stream(server, alice[1], run_id)
    end = events[-1][2]
    assert (end["status"], end["terminal_state"]) == ("failed", "journal-backlog")
    assert end["error"]["category"] == "limit"
    assert "faster than the journal" in end["error"]["message"]
    assert "database" not in end["error"]["message"]


@pytest.mark.slow
@pytest.mark.parametrize("count", [2, 4])
def test_a_crowd_ticks_in_cohorts_each_once_per_interval(
    alice, bob, monkeypatch, committer_sleeps, count
):
    """From `COHORT_RUNS` runs streaming, a tick takes one cohort's runs and the
    next cohort's tick comes a share of the interval later; every run is
    still committed once per interval, each in its own cohort's ticks. The
    count is the one `COHORTS` gives this test's database. The sleeps are
    noted, not slept, so the machine's pace cannot change what is seen."""
    monkeypatch.setattr(writer_module, "COHORT_RUNS", 4)
    monkeypatch.setitem(writer_module.COHORTS, connection.vendor, count)
    monkeypatch.setattr(writer_module, "INTERVAL_S", 100.0)
    monkeypatch.setattr(writer_module, "INTERVAL_MAX_S", 100.0)
    waits = committer_sleeps
    ticks: list[set[str]] = []
    store_append_many = writer_module.append_many

    def spy(batches, **kwargs):
        ticks.append({run_id for run_id, _token, _events in batches})
        return store_append_many(batches, **kwargs)

    monkeypatch.setattr(writer_module, "append_many", spy)
    runs = [running_run(user[0]) for user in (alice, bob) * 4]

    async def write():
        writers = [BatchWriter(run_id=r.id, token=1) for r in runs]
        for round_ in range(2):
            for writer in writers:
                writer.add("token", {"text": f"{round_}"})
            await asyncio.gather(*(w.flush() for w in writers))
        for writer in writers:
            writer.close()
        return writers

    writers = asyncio.run(write())
    cohorts = [{w.run_id for w in writers if w.cohort == c} for c in range(count)]
    assert all(len(members) == len(runs) // count for members in cohorts)
    # The cohorts take turns, in the same order each round; the first tick
    # came at once, each later one a share of the interval after the last.
    assert len(ticks) == 2 * count
    assert ticks[:count] == ticks[count:]
    assert sorted(ticks[:count], key=min) == sorted(cohorts, key=min)
    assert len(waits) == 2 * count - 1
    assert all(0 < wait <= 100 / count for wait in waits)
    for run in runs:
        assert [json.loads(p)["text"] for _, p in _rows(run)] == ["0", "1"]
