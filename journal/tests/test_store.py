import json

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from hermes_testing.harness import running_run
from journal import wire
from journal.events import InvalidEvent
from journal.leases import run_claim_next, run_settle
from journal.models import Event, Run
from journal.store import (
    AppendRejected,
    FramePage,
    append,
    append_many,
    read_after,
    read_frames,
)


def _tokens(n, start=0):
    return [("token", {"text": f"t{i}"}) for i in range(start, start + n)]


def test_append_takes_consecutive_seqs_and_reads_in_pages(alice):
    run = running_run(alice[0])
    first = append(run_id=run.id, token=1, events=_tokens(3))
    second = append(run_id=run.id, token=1, events=_tokens(2, start=3))
    assert [r.seq for r in first + second] == [1, 2, 3, 4, 5]
    assert [r.seq for r in read_after(run_id=run.id, after_seq=0, limit=2)] == [1, 2]
    assert [r.payload for r in read_after(run_id=run.id, after_seq=3)] == [
        '{"text":"t3"}',
        '{"text":"t4"}',
    ]
    run.refresh_from_db()
    assert run.last_seq == 5


def test_stale_writer_writes_nothing(alice):
    run = running_run(alice[0])
    append(run_id=run.id, token=1, events=_tokens(1))
    Run.objects.filter(id=run.id).update(
        fencing_token=2
    )  # another process took it over
    with pytest.raises(AppendRejected, match="stale fencing token"):
        append(run_id=run.id, token=1, events=_tokens(5))
    assert Event.objects.filter(run=run).count() == 1
    assert Run.objects.get(id=run.id).last_seq == 1


def test_exactly_one_end(alice):
    run = running_run(alice[0])
    end = ("end", {"status": "completed", "terminal_state": "completed"})
    append(run_id=run.id, token=1, events=[*_tokens(2), end])
    with pytest.raises(AppendRejected, match="already ended"):
        append(run_id=run.id, token=1, events=[end])
    assert (
        run_settle(
            run_id=run.id,
            status="interrupted",
            terminal_state="lost-worker",
            by="t",
            only_if_lost=False,
        )
        == []
    )
    run.refresh_from_db()
    assert (run.status, run.terminal_state, run.last_seq) == (
        "completed",
        "completed",
        3,
    )
    assert Event.objects.filter(run=run, type="end").count() == 1


def test_end_must_be_last_and_payloads_are_validated(alice):
    run = running_run(alice[0])
    with pytest.raises(ValueError):
        append(
            run_id=run.id,
            token=1,
            events=[
                ("end", {"status": "completed", "terminal_state": "completed"}),
                *_tokens(1),
            ],
        )
    with pytest.raises(InvalidEvent):
        append(run_id=run.id, token=1, events=[("token", {"txt": "x"})])
    with pytest.raises(InvalidEvent):
        append(run_id=run.id, token=1, events=[("bogus", {})])
    assert Run.objects.get(id=run.id).last_seq == 0


def test_settling_a_lost_run_fences_out_its_old_writer(alice):
    run = running_run(alice[0], lease_s=-1)  # lease already expired
    append(run_id=run.id, token=1, events=_tokens(2))
    records = run_settle(
        run_id=run.id, status="interrupted", terminal_state="lost-worker", by="t"
    )
    assert [(r.seq, r.type) for r in records] == [(3, "end")]
    with pytest.raises(AppendRejected):
        append(run_id=run.id, token=1, events=_tokens(1))
    run.refresh_from_db()
    assert (run.status, run.terminal_state) == ("interrupted", "lost-worker")


def test_claim_bumps_the_fencing_token_once_per_claim(alice):
    queued = Run.objects.create(owner=alice[0])
    claim = run_claim_next(worker_id="w1", lease_s=30)
    assert claim.run_id == queued.id and claim.token == 1
    assert run_claim_next(worker_id="w2", lease_s=30) is None
    assert Run.objects.get(id=queued.id).status == "running"


def test_append_many_commits_several_runs_and_fences_each(alice):
    first, second, stale = (running_run(alice[0]) for _ in range(3))
    append(run_id=first.id, token=1, events=_tokens(2))
    Run.objects.filter(id=stale.id).update(fencing_token=2)
    results = append_many(
        [
            (first.id, 1, _tokens(3, start=2)),
            (stale.id, 1, _tokens(4)),
            (second.id, 1, _tokens(1)),
        ]
    )
    assert [r.seq for r in results[0]] == [3, 4, 5]
    assert isinstance(results[1], AppendRejected)
    assert [r.seq for r in results[2]] == [1]
    assert [r.payload for r in read_after(run_id=first.id, after_seq=0)] == [
        f'{{"text":"t{i}"}}' for i in range(5)
    ]
    assert not Event.objects.filter(run=stale).exists()
    assert Run.objects.get(id=stale.id).last_seq == 0
    assert Run.objects.get(id=second.id).last_seq == 1


@pytest.mark.parametrize("known", [False, True], ids=["statements", "one-statement"])
def test_append_many_stores_any_text_exactly_and_numbers_each_run_on(alice, known):
    """What an array literal or a query's text would have to escape comes
    back as it went in; each of many runs numbers on from where it stood,
    with the runs' last seqs given (one statement on SQLite) or not."""
    awkward = [
        'quote " and \\ backslash',
        "{braces, commas}",
        "NULL",
        "",
        "line\nbreak\ttab",
        "ünïcödé 你好 🙂",
        "' OR 1=1 --",
        "%s %b %(x)s",
        '"]], [["run", 1, "end", "{}"',  # a JSON array's text, closed early
        "separators \u2028 \u2029, DEL \x7f, escapes written out: \\u0000 \\n",
    ]
    runs = [running_run(alice[0]) for _ in range(30)]
    append(run_id=runs[0].id, token=1, events=_tokens(2))
    last_seqs = {run.id: 2 if i == 0 else 0 for i, run in enumerate(runs)}
    with CaptureQueriesContext(connection) as captured:
        results = append_many(
            [
                (run.id, 1, [("token", {"text": f"{i}:{text}"}) for text in awkward])
                for i, run in enumerate(runs)
            ],
            last_seqs=last_seqs if known else None,
        )
    if known and connection.vendor == "sqlite":
        assert _statements(captured) == [["INSERT", "INTO", "journal_tick"]]
    assert [r.seq for r in results[0]] == list(range(3, 3 + len(awkward)))
    assert all(
        [r.seq for r in rs] == list(range(1, len(awkward) + 1)) for rs in results[1:]
    )
    for i, run in enumerate(runs):
        stored = [r.payload for r in read_after(run_id=run.id, after_seq=0)]
        assert stored[-len(awkward) :] == [r.payload for r in results[i]]
        assert [json.loads(p)["text"] for p in stored[-len(awkward) :]] == [
            f"{i}:{text}" for text in awkward
        ]
        assert Run.objects.get(id=run.id).last_seq == len(stored)


@pytest.mark.slow
def test_the_database_writes_a_page_out_as_the_frames_of_its_records(alice):
    """`read_frames` is `read_after` encoded by `wire.SSE`, byte for byte, in
    seq order, whatever the payloads hold; it says where the page ends and
    whether it holds the run's `end`."""
    run = running_run(alice[0])
    texts = [
        "plain",
        "%s %d %% %(x)s",  # what printf and format would read as directives
        "ünïcödé 你好 🙂",
        'quote " backslash \\ ',
        "line\nbreak \u2028",
        "",
    ]
    for i in range(0, 600, 60):  # rows written in batches, as a worker does
        append(
            run_id=run.id,
            token=1,
            events=[("token", {"text": f"{i + j}:{texts[j % 6]}"}) for j in range(60)],
        )
    end = {"status": "completed", "terminal_state": "completed"}
    append(run_id=run.id, token=1, events=[("end", end)])

    def page(after_seq, limit):
        return read_frames(
            run_id=run.id, after_seq=after_seq, limit=limit, template=wire.SSE_TEMPLATE
        )

    for after_seq, limit in [(0, 2000), (0, 7), (123, 250), (590, 20), (600, 5)]:
        records = read_after(run_id=run.id, after_seq=after_seq, limit=limit)
        assert page(after_seq, limit) == FramePage(
            rows=len(records),
            last_seq=records[-1].seq,
            data=wire.sse_frames(run.id, records).encode(),
            ended=records[-1].type == "end",
        )
    assert [page(590, 10).ended, page(590, 11).ended] == [False, True]
    assert page(601, 10) == FramePage(rows=0, last_seq=0, data=b"", ended=False)


def test_append_many_refuses_an_ended_run_and_a_run_twice(alice):
    ended, live = running_run(alice[0]), running_run(alice[0])
    Run.objects.filter(id=ended.id).update(status="succeeded")
    results = append_many([(ended.id, 1, _tokens(1)), (live.id, 1, _tokens(2))])
    assert isinstance(results[0], AppendRejected)
    assert [r.seq for r in results[1]] == [1, 2]
    assert not Event.objects.filter(run=ended).exists()
    with pytest.raises(ValueError, match="at most once"):
        append_many([(live.id, 1, _tokens(1)), (live.id, 1, _tokens(1))])
    assert Run.objects.get(id=live.id).last_seq == 2


def test_append_many_is_all_or_nothing_and_committed_when_it_returns(alice):
    """One run's rows cannot be stored (a row already holds its next seq):
    no run of the tick keeps anything, seqs included. A tick that lands is
    committed when `append_many` returns (on PostgreSQL its one statement is
    its own transaction), seen at once by another connection."""
    from django.db import IntegrityError, connection
    from django.utils import timezone

    blocked, other = running_run(alice[0]), running_run(alice[0])
    Event.objects.create(
        run=blocked, seq=1, type="token", payload="{}", created_at=timezone.now()
    )
    with pytest.raises(IntegrityError):
        append_many([(other.id, 1, _tokens(2)), (blocked.id, 1, _tokens(1))])
    assert Run.objects.get(id=other.id).last_seq == 0
    assert not Event.objects.filter(run=other).exists()

    assert not connection.in_atomic_block
    [records] = append_many([(other.id, 1, _tokens(3))])
    assert [r.seq for r in records] == [1, 2, 3]
    if connection.vendor == "postgresql":
        import psycopg

        assert connection.connection.info.transaction_status.name == "IDLE"
        params = connection.get_connection_params()
        params.pop("cursor_factory", None)
        with psycopg.connect(**params) as elsewhere:
            seen = elsewhere.execute(
                "SELECT count(*) FROM journal_event WHERE run_id = %s", [other.id]
            ).fetchone()
        assert seen == (3,)


def _statements(captured) -> list[list[str]]:
    """Each statement's first words, past installing `journal_tick` (once a
    connection)."""
    words = [q["sql"].split(None, 3)[:3] for q in captured]
    return [w for w in words if w[:2] != ["CREATE", "TEMP"]]


def test_append_many_given_the_runs_last_seqs_is_one_statement(alice):
    """With each run's last seq known, a tick is one statement on SQLite too
    (`_take_and_insert_following`), committed by itself, and each run numbers
    on from where it stood."""
    runs = [running_run(alice[0]) for _ in range(3)]
    append(run_id=runs[0].id, token=1, events=_tokens(2))
    known = {runs[0].id: 2, runs[1].id: 0, runs[2].id: 0}
    append_many([(run.id, 1, _tokens(1, start=5)) for run in runs], last_seqs=known)
    assert not connection.in_atomic_block
    with CaptureQueriesContext(connection) as captured:
        results = append_many(
            [(run.id, 1, _tokens(i + 1, start=10)) for i, run in enumerate(runs)],
            last_seqs={runs[0].id: 3, runs[1].id: 1, runs[2].id: 1},
        )
    assert [[r.seq for r in rs] for rs in results] == [[4], [2, 3], [2, 3, 4]]
    for run, records in zip(runs, results, strict=True):
        stored = read_after(run_id=run.id, after_seq=records[0].seq - 1)
        assert stored == records
        assert Run.objects.get(id=run.id).last_seq == records[-1].seq
    assert read_after(run_id=runs[0].id, after_seq=0)[2].payload == '{"text":"t5"}'
    if connection.vendor == "sqlite":
        assert _statements(captured) == [["INSERT", "INTO", "journal_tick"]]


def test_append_many_given_a_wrong_last_seq_or_a_stale_token_falls_back(alice):
    """The one statement writes nothing when any run's fence or last seq
    differs from what it was given; the general path then stores each run
    where it really stands and rejects the stale one."""
    ahead, stale, fine = (running_run(alice[0]) for _ in range(3))
    append(run_id=ahead.id, token=1, events=_tokens(2))
    Run.objects.filter(id=stale.id).update(fencing_token=2)
    with CaptureQueriesContext(connection) as captured:
        results = append_many(
            [
                (ahead.id, 1, _tokens(1, start=2)),
                (stale.id, 1, _tokens(1)),
                (fine.id, 1, _tokens(2)),
            ],
            last_seqs={ahead.id: 0, stale.id: 0, fine.id: 0},
        )
    assert [r.seq for r in results[0]] == [3]
    assert isinstance(results[1], AppendRejected)
    assert [r.seq for r in results[2]] == [1, 2]
    assert [r.seq for r in read_after(run_id=ahead.id, after_seq=0)] == [1, 2, 3]
    assert not Event.objects.filter(run=stale).exists()
    assert Run.objects.get(id=stale.id).last_seq == 0
    assert Run.objects.get(id=fine.id).last_seq == 2
    if connection.vendor == "sqlite":
        tried, *rest = _statements(captured)
        assert tried == ["INSERT", "INTO", "journal_tick"]
        assert ["UPDATE", "journal_run", "SET"] in rest


class _Undone(Exception):
    pass


def _tick_rolled_back(run, *, last_seq: int, n: int):
    """A tick of `n` events inside a transaction that is then rolled back;
    the records the tick returned."""
    with pytest.raises(_Undone), transaction.atomic():
        [records] = append_many([(run.id, 1, _tokens(n))], last_seqs={run.id: last_seq})
        raise _Undone
    return records


def test_a_tick_inside_a_transaction_takes_the_three_statements(alice):
    """Inside a transaction the tick is the general path's, and a rollback
    there leaves the one statement working after it (its view and trigger
    are made outside transactions only)."""
    run = running_run(alice[0])
    connection.close()  # a connection that has made no view yet
    with CaptureQueriesContext(connection) as inside:
        records = _tick_rolled_back(run, last_seq=0, n=2)
    assert [r.seq for r in records] == [1, 2]
    assert ["INSERT", "INTO", "journal_tick"] not in _statements(inside)
    assert Run.objects.get(id=run.id).last_seq == 0
    with CaptureQueriesContext(connection) as outside:
        [records] = append_many([(run.id, 1, _tokens(1))], last_seqs={run.id: 0})
    assert [r.seq for r in records] == [1]
    assert [r.seq for r in read_after(run_id=run.id, after_seq=0)] == [1]
    if connection.vendor == "sqlite":
        assert _statements(outside) == [["INSERT", "INTO", "journal_tick"]]


def _prepared_statements() -> list[str]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement FROM pg_prepared_statements")
        return [statement for (statement,) in cursor.fetchall()]


def test_the_postgresql_tick_is_prepared_once_a_connection(alice):
    """On PostgreSQL the tick's statement is prepared on the server and
    reused; nothing else the connection runs is prepared, and a rollback
    (which drops what psycopg prepared) or a new connection leaves ticks
    working. On SQLite the same ticks go through its own path."""
    run = running_run(alice[0])
    seq = 0
    for _ in range(3):
        [records] = append_many([(run.id, 1, _tokens(1))], last_seqs={run.id: seq})
        seq = records[-1].seq
        assert Run.objects.get(id=run.id).last_seq == seq
    if connection.vendor == "postgresql":
        prepared = _prepared_statements()
        assert len(prepared) == 1
        assert "INSERT INTO journal_event" in prepared[0]

    _tick_rolled_back(run, last_seq=seq, n=2)
    [records] = append_many([(run.id, 1, _tokens(1))], last_seqs={run.id: seq})
    assert [r.seq for r in records] == [seq + 1]
    connection.close()
    [records] = append_many([(run.id, 1, _tokens(1))], last_seqs={run.id: seq + 1})
    assert [r.seq for r in records] == [seq + 2]
    assert [r.seq for r in read_after(run_id=run.id, after_seq=0)] == list(
        range(1, seq + 3)
    )
    if connection.vendor == "postgresql":
        assert len(_prepared_statements()) == 1


def test_the_event_table_has_no_second_index_on_the_run(db):
    """`event_unique_run_seq` serves lookups by run (journal/0007)."""
    from django.db import connection

    with connection.cursor() as cursor:
        constraints = connection.introspection.get_constraints(cursor, "journal_event")
    on_run = sorted(
        name
        for name, c in constraints.items()
        if (c["index"] or c["unique"]) and c["columns"][:1] == ["run_id"]
    )
    assert on_run == ["event_one_end_per_run", "event_unique_run_seq"]


def test_a_rejected_end_leaves_the_callers_transaction_usable(alice):
    """A fence that fails writes nothing, so the caller's transaction goes on
    (`run_settle` commits its take-over when another settled first)."""
    from django.db import transaction

    run = running_run(alice[0])
    end = ("end", {"status": "completed", "terminal_state": "completed"})
    with transaction.atomic():
        with pytest.raises(AppendRejected, match="stale fencing token"):
            append(run_id=run.id, token=7, events=[*_tokens(1), end])
        Run.objects.filter(id=run.id).update(lease_owner="still-writable")
    run.refresh_from_db()
    assert (run.status, run.last_seq, run.lease_owner) == (
        "running",
        0,
        "still-writable",
    )
    assert not Event.objects.filter(run=run).exists()


def test_a_tick_during_a_runs_deletion_waits_for_it_and_leaves_no_event(alice):
    """The database holds no foreign key from events to runs (journal/0008):
    a run's row is locked from the start of its deletion, so a tick that
    comes meanwhile waits on it, then finds no run and writes nothing; no
    event outlives its run. On PostgreSQL the test sees the tick wait."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    from django.db import connections
    from django.db.models.signals import pre_delete

    run = running_run(alice[0])
    append_many([(run.id, 1, _tokens(1))], last_seqs={run.id: 0})
    deleting, go_on = threading.Event(), threading.Event()

    def paused(sender, instance, **kwargs):  # after the journal's own receiver
        deleting.set()
        go_on.wait(60)

    def in_thread(work):
        def job():
            try:
                return work()
            finally:
                connections.close_all()

        return job

    pre_delete.connect(paused, sender=Run, dispatch_uid="test-paused-deletion")
    try:
        with ThreadPoolExecutor(2) as threads:
            deleted = threads.submit(
                in_thread(lambda: Run.objects.filter(id=run.id).delete())
            )
            assert deleting.wait(60)
            tick = threads.submit(
                in_thread(
                    lambda: append_many(
                        [(run.id, 1, _tokens(2, start=1))], last_seqs={run.id: 1}
                    )
                )
            )
            waited = connection.vendor != "postgresql" or _waits_on_a_lock(tick)
            go_on.set()
            deleted.result(60)
            [result] = tick.result(60)
    finally:
        go_on.set()
        pre_delete.disconnect(sender=Run, dispatch_uid="test-paused-deletion")
    assert waited
    assert isinstance(result, AppendRejected)
    assert not Run.objects.filter(id=run.id).exists()
    assert not Event.objects.filter(run_id=run.id).exists()


def _waits_on_a_lock(job) -> bool:
    """Whether a backend of this database comes to wait on a row lock while
    `job` runs (False if the job ends first)."""
    import time

    deadline = time.monotonic() + 60
    while not job.done() and time.monotonic() < deadline:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity"
                " WHERE datname = current_database() AND wait_event_type = 'Lock'"
            )
            if cursor.fetchone()[0]:
                return True
        time.sleep(0.01)
    return False
