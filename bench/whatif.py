"""Proposed product fixes, patched in at start-up, so the benchmarks can measure them.

NOT product code. `HERMES_WHATIF` is a comma list of:

- `bounded-read`: `journal.store.read_after` with an upper bound on the seq range
  (`seq <= after_seq + limit`; a run's seqs are dense), so PostgreSQL never
  plans a scan of the run's whole journal.
- `writer-threads:N`: N threads in the journal's writer pool (PostgreSQL only).
- `switch-interval:S`: `sys.setswitchinterval(S)` (CPython's default is 0.005 s):
  how long a thread that waited on I/O (the writer, after each database round
  trip) may wait for the event loop's thread to hand the GIL back.
- `interval:S`: the journal committer's ticks at most every S seconds, however
  many runs they carry (`chat.writer.tick_interval`: 30 ms, stretching to 50
  ms from 80 to 160 runs in a tick).
- `cohorts:N` or `cohorts:N/K`: the journal committer's runs tick in cohorts
  from N runs streaming (`chat.writer.COHORT_RUNS`, 20), K of them on either
  database (`chat.writer.COHORTS`: 4 on PostgreSQL, 2 on SQLite).
- `gc-threshold:N`: the collector's young generation collected after N net
  allocations of container objects instead of CPython's 700;
  `gc-threshold:N/M/K` sets the three thresholds (CPython's 700, 10, 10).
- `committer-thread`: the journal's committer (`chat.writer`) on a writer
  thread and connection of its own, so a tick never waits behind another
  write (a run's start or end, a lease renewal). PostgreSQL only: SQLite
  takes one writer at a time.
- `async-commit`: the committer's tick statement (`journal.store`'s
  PostgreSQL `append_many`) awaited on the event loop over an asynchronous
  psycopg connection, not run on the writer thread: no hand-off to a thread
  and no wait to win the GIL back after the round trip. PostgreSQL only; a
  sketch for measuring (no validation, no fencing errors, no reconnection);
  prepared on the server, as the product's statement is.
  Not applied with `pass-through`.
- `loop-commit`: the committer's statements (`append_many`, `run_positions`)
  run on the event loop's own thread and connection, blocking the loop while
  they run, instead of on the writer thread: no hand-off, no wait for the GIL.
  A sketch for measuring (SQLite; the loop blocks on the database's lock).
- `bg-checkpoint:S`: SQLite's WAL checkpoints taken off the commits (every
  connection of the process at `wal_autocheckpoint=0`) and run by a thread of
  their own every S seconds (`PRAGMA wal_checkpoint(PASSIVE)`).
- `tick-steps`: the committer's SQLite tick as it was before finding 24: three
  statements in a transaction (`journal.store._take_and_insert`), not the one
  statement of `_take_and_insert_following` (the runs' last seqs not passed).
- `tick-probe`: records each tick of the committer (its whole time, its
  `append_many` call, its publish, its events) into
  `var/bench/tick-probe-<role>-<pid>.json`, rewritten every second.
- `bare-end`: NOT a change the product could take, a bound on what one
  could win: a run's end (`chat.runner._finish`) appends its events and
  nothing else (no message, no turn update, no queued follow-up).
- `batched-ends`: runs' ends (`chat.runner._finish`) go to the writer thread
  together: every end waiting while the last group ran is one job, each end
  still its own transaction. A sketch for measuring (SQLite and PostgreSQL).
- `end-gap:S`: NOT a change the product could take as it is: the writer
  thread sleeps S seconds after each run's end (`chat.runner._finish`),
  whatever else waits; with `unpaced-writes`, what finding 34 started from.
- `rest-per-cpu:K`: the writer pool's paced rests K times the CPU of the
  job before them (`journal.dbpool.REST_PER_CPU`, 4).
- `unpaced-writes`: the writer pool's backlog of ordinary writes runs back
  to back, as before finding 34 (`journal.dbpool`'s pacing off).
- `pool-probe`: records each job of the database pools (its pool, its
  function, when it started, how long it ran, the CPU its thread spent in
  it and how long it waited in the queue) into
  `var/bench/pool-probe-<role>-<pid>.json`, rewritten every second.
- `stage-probe`: records, for each token of the fake model (" w0042"), when
  the worker read it from the model's stream and when the committer
  published the event holding it, into
  `var/bench/stage-probe-<role>-<pid>.json`, rewritten every second;
  `bench/latency_stages.py` joins it with the token samples of
  `bench_worker.py --samples`.
- `gc-probe`: records each collection of the garbage collector (its
  generation, when it started, how long it took and the CPU its thread spent
  in it, how many objects it freed, the thread it ran on) into
  `var/bench/gc-probe-<role>-<pid>.json`, rewritten every second, with the
  frozen objects' count, the thresholds, and after each full collection the
  oldest generation's objects by type.
- `stack-probe`: samples the stack of every thread of the process but its
  own (the event loop's, the writer's) every 2 ms, each sample's time on the
  clock of the other probes, into `var/bench/stack-probe-<role>-<pid>.jsonl`,
  appended every second; `bench/latency_stages.py` says where each thread
  was while the slowest 1 % of tokens waited.
- `loop-probe`: records each callback of the event loop that ran 0.5 ms
  or more (when it started on the clock of the other probes, how long it
  ran, the thread CPU it used, and what it was: a task's coroutine or the
  callback's name) into `var/bench/loop-probe-<role>-<pid>.json`, rewritten
  every second.
- `uvloop`: the event loop is uvloop's (its policy set before daphne installs
  its asyncio reactor). Only where `whatif.py` stands in for `manage.py`;
  uvloop is not among the requirements (`pip install uvloop` first).
- `no-event-fk`: journal_event's foreign key to journal_run dropped from the
  database (PostgreSQL; by the `worker` process as it starts): no check of
  each inserted row against its run at commit.
- `event-key-run-seq`: journal_event keyed by `(run_id, seq)` in the database
  (PostgreSQL; by the `worker` process as it starts): the surrogate `id`, its
  identity sequence and its index dropped (the column stays, NULL in new
  rows), the run-and-seq unique index becoming the primary key, so each
  inserted event costs one index insert, not two, and no `nextval`. The
  worker's tick and the readers never use the id.
- `sync-off`: PostgreSQL commits without waiting for their WAL to reach the
  disk (`synchronous_commit = off` on every connection of the process): what
  the flush costs a tick. Not a setting the product could take: a database
  crash would lose commits readers have already seen.
- `wait:S` (with `pass-through`): the pass-through's appends sleep S
  seconds, letting the GIL go as a statement's wait for the database does.
- `pass-through`: the build durability is measured against. The committer's
  appends (`append_many`) write nothing after a run's first batch (its
  `start`, stored): each run's seqs are counted in memory from there and the
  records are published as the product publishes committed ones, after the
  same hand-off to the writer thread.
  A run's `end` (`append`, in `chat.runner`) first sets the run's `last_seq`
  to where the counting got, so the end follows on; only the streamed
  events are not stored.

Used two ways: `python bench/whatif.py <manage.py arguments>` (a stand-in for
`manage.py`, see `HERMES_BENCH_MANAGE` in common.py) and
`daphne bench.whatif:application` (`bench_worker.py` starts its scale-out
daphne processes that way when `HERMES_BENCH_MANAGE` is set, so what-ifs and
probes reach them too). A probe's file names its process's role: `daphne`,
or the command this file stood in `manage.py` for (`serve`, `worker`).
"""

import os
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "hermes_site.settings")


def wanted() -> set[str]:
    return {
        w.strip() for w in os.environ.get("HERMES_WHATIF", "").split(",") if w.strip()
    }


def bounded_read_after(*, run_id: str, after_seq: int, limit: int = 2000):
    from django.db import connection

    from journal.store import Record

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT seq, type, payload FROM journal_event"
            " WHERE run_id = %s AND seq > %s AND seq <= %s ORDER BY seq LIMIT %s",
            [run_id, after_seq, after_seq + limit, limit],
        )
        return [Record(*row) for row in cursor.fetchall()]


def pass_through() -> None:
    import time

    import chat.runner
    import chat.writer
    from journal.models import Run
    from journal.store import Record, append, encode

    stored_append_many = chat.writer.append_many
    wait_s = next(
        (float(w.split(":", 1)[1]) for w in wanted() if w.startswith("wait:")), 0.0
    )
    seqs: dict[str, int] = {}  # run id -> its last seq, counted here

    def append_many(batches, **_known):
        # A run's first batch (its `start`) is stored: readers attached before
        # it fill their gap from the journal.
        first = [b for b in batches if b[0] not in seqs]
        stored = (
            dict(zip([b[0] for b in first], stored_append_many(first), strict=True))
            if first
            else {}
        )
        if wait_s:
            time.sleep(wait_s)  # lets the GIL go, as a statement's wait does
        out = []
        for run_id, _token, events in batches:
            if run_id in stored:
                result = stored[run_id]
                if isinstance(result, list):
                    seqs[run_id] = result[-1].seq
                out.append(result)
                continue
            last = seqs[run_id]
            out.append(
                [
                    Record(last + i, kind, encode(payload))
                    for i, (kind, payload) in enumerate(events, start=1)
                ]
            )
            seqs[run_id] = last + len(events)
        return out

    def append_following_on(*, run_id, token, events, run_fields=None):
        if run_id in seqs:
            Run.objects.filter(id=run_id).update(last_seq=seqs.pop(run_id))
        return append(run_id=run_id, token=token, events=events, run_fields=run_fields)

    chat.writer.append_many = append_many
    chat.runner.append = append_following_on
    # A doorbell dropped at a full channel leaves a hole the journal cannot
    # fill here (the product fills it from the journal): never drop one.
    from channels.layers import get_channel_layer

    layer = get_channel_layer()
    if layer is not None:
        layer.capacity = 10**9
        layer.channel_capacity = []


def apply() -> set[str]:
    """Patch the wanted changes into the loaded product modules (Django set up)."""
    names = wanted()
    if "bounded-read" in names:
        import chat.api
        import chat.snapshot
        import journal.admin
        import journal.replay
        import journal.store
        import journal.subscribe

        for module in (
            journal.store,
            journal.subscribe,
            journal.replay,
            journal.admin,
            chat.api,
            chat.snapshot,
        ):
            vars(module)["read_after"] = bounded_read_after
    if "tick-steps" in names:
        import chat.writer

        one_statement = chat.writer.append_many

        def three_statements(batches, **_known):
            return one_statement(batches)

        chat.writer.append_many = three_statements
    if "pass-through" in names:
        pass_through()
    if "unpaced-writes" in names:
        from journal import dbpool

        dbpool.writers.paced = False
    if "committer-thread" in names:
        from journal import dbpool

        _committer_writes_to(dbpool.DBPool("commit", 1))
    # Applied in this order (the probes wrap what the changes before them set).
    patches = {
        "loop-commit": _loop_commit,
        "tick-probe": _tick_probe,
        "gc-probe": _gc_probe,
        "bare-end": _bare_end,
        "pool-probe": _pool_probe,
        "batched-ends": _batched_ends,
        "stage-probe": _stage_probe,
        "stack-probe": _stack_probe,
        "loop-probe": _loop_probe,
        "sync-off": _sync_off,
    }
    for name, patch in patches.items():
        if name in names:
            patch()
    if "async-commit" in names and "pass-through" not in names:
        _async_commit()
    for name in names:
        if name.startswith("interval:"):
            import chat.writer

            seconds = float(name.split(":", 1)[1])
            chat.writer.INTERVAL_S = chat.writer.INTERVAL_MAX_S = seconds
        if name.startswith("cohorts:"):
            import chat.writer

            runs, _, count = name.split(":", 1)[1].partition("/")
            chat.writer.COHORT_RUNS = int(runs)
            if count:
                chat.writer.COHORTS = dict.fromkeys(chat.writer.COHORTS, int(count))
        if name.startswith("rest-per-cpu:"):
            from journal import dbpool

            dbpool.REST_PER_CPU = float(name.split(":", 1)[1])
        if name.startswith("end-gap:"):
            _end_gap(float(name.split(":", 1)[1]))
        if name.startswith("bg-checkpoint:"):
            _bg_checkpoint(float(name.split(":", 1)[1]))
        if name.startswith("switch-interval:"):
            sys.setswitchinterval(float(name.split(":")[1]))
        if name.startswith("gc-threshold:"):
            import gc

            # `gc-threshold:N` the young generation's; `gc-threshold:N/M/K` all three.
            given = [int(n) for n in name.split(":")[1].split("/")]
            gc.set_threshold(*given, *gc.get_threshold()[len(given) :])
        if name.startswith("writer-threads:"):
            from journal import dbpool

            dbpool.writers = dbpool.DBPool("write", int(name.split(":")[1]), paced=True)
    return names


def _probe_file(name: str) -> Path:
    """Where a probe of this process rewrites its JSON:
    var/bench/<name>-<role>-<pid>.json, the role `daphne` or the command
    this file stands in `manage.py` for (`serve`, `worker`)."""
    role = "daphne" if __name__ == "bench.whatif" else (sys.argv[1:2] or ["py"])[0]
    path = ROOT / "var" / "bench" / f"{name}-{role}-{os.getpid()}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def _gc_probe() -> None:
    import gc
    import threading
    import time
    from collections import Counter

    # One entry per collection: [generation, seconds, collected, thread name,
    # started (time.monotonic(), the clock of the other probes), the thread's
    # CPU seconds in it (less than its seconds when the thread was descheduled)].
    stats: dict[str, Any] = {
        "whatif": sorted(wanted()),
        "collections": [],
        "frozen": gc.get_freeze_count(),
        "threshold": gc.get_threshold(),
    }
    began = began_cpu = 0.0

    def probe(phase: str, info: dict) -> None:
        nonlocal began, began_cpu
        if phase == "start":
            began, began_cpu = time.monotonic(), time.thread_time()
            return
        stats["collections"].append(
            [
                info["generation"],
                time.monotonic() - began,
                info["collected"],
                threading.current_thread().name,
                began,
                time.thread_time() - began_cpu,
            ]
        )
        if info["generation"] == 2:
            # What a full collection walks: the oldest generation's objects
            # by type (counted after the collection, outside its time).
            kinds = Counter(
                type(obj).__qualname__ for obj in gc.get_objects(generation=2)
            )
            stats.setdefault("oldest", []).append(
                [kinds.total(), kinds.most_common(25)]
            )
            stats["frozen"] = gc.get_freeze_count()

    gc.callbacks.append(probe)
    _rewritten("gc-probe", stats)


def _bare_end() -> None:
    import chat.runner
    from journal.store import append

    def bare_finish(claim, session_id, *, message, events, turn_fields):
        end_type, end_payload = events[-1]
        events[-1] = (end_type, {**end_payload, "message_id": None})
        return append(run_id=claim.run_id, token=claim.token, events=events)

    chat.runner._finish = bare_finish


def _end_gap(seconds: float) -> None:
    import time

    import chat.runner

    finish = chat.runner._finish

    def spaced_finish(*args, **kwargs):
        try:
            return finish(*args, **kwargs)
        finally:
            time.sleep(seconds)  # the writer thread off the GIL and the CPU

    chat.runner._finish = spaced_finish


def _batched_ends() -> None:
    import asyncio
    import types

    import chat.runner
    from journal import dbpool

    finish = chat.runner._finish
    waiting: list = []  # (args, kwargs, future)
    busy = False
    draining: set[asyncio.Task] = set()  # held: the loop keeps weak references

    def run_all(group):
        outcomes = []
        for args, kwargs, _future in group:
            try:
                outcomes.append((finish(*args, **kwargs), None))
            except Exception as exc:
                outcomes.append((None, exc))
        return outcomes

    async def drain():
        nonlocal busy
        busy = True
        try:
            while waiting:
                group = waiting[:]
                del waiting[:]
                try:
                    outcomes = await dbpool.writers.run(run_all, group)
                except Exception as exc:
                    outcomes = [(None, exc)] * len(group)
                futures = [future for _args, _kwargs, future in group]
                for future, (result, error) in zip(futures, outcomes, strict=True):
                    if error is not None:
                        future.set_exception(error)
                    else:
                        future.set_result(result)
        finally:
            busy = False

    async def run(fn, *args, **kwargs):
        if fn is not finish:
            return await dbpool.writers.run(fn, *args, **kwargs)
        future = asyncio.get_running_loop().create_future()
        waiting.append((args, kwargs, future))
        if not busy:
            task = asyncio.create_task(drain())
            draining.add(task)
            task.add_done_callback(draining.discard)
        return await future

    writers = types.SimpleNamespace(run=run, first=dbpool.writers.first)
    chat.runner.dbpool = types.SimpleNamespace(  # type: ignore[assignment]
        writers=writers,
        readers=dbpool.readers,
        is_connection_error=dbpool.is_connection_error,
    )


def _rewritten(name: str, stats: dict) -> None:
    """Rewrite `stats` as var/bench/<name>-<role>-<pid>.json every second,
    from a thread of its own: a server is stopped, not asked, so what it measured
    last is at most a second old."""
    import json
    import threading
    import time

    path = _probe_file(name)

    def rewrite() -> None:
        while True:
            time.sleep(1.0)
            try:
                text = json.dumps(stats)
            except RuntimeError:  # changed while encoded: the next second's
                continue
            part = path.with_suffix(".part")
            part.write_text(text)
            part.replace(path)  # whole: a server may be stopped mid-write

    threading.Thread(target=rewrite, name=f"{name} writer", daemon=True).start()


def _stage_probe() -> None:
    import re
    import time

    import chat.runner
    import chat.writer

    # {run id: {token index: ns}}: when the worker read each token from the
    # model's stream, and when the committer published the event holding it.
    stats: dict[str, Any] = {"whatif": sorted(wanted()), "read": {}, "published": {}}
    read, published = stats["read"], stats["published"]
    index = re.compile(r"w(\d+)")  # the fake model's token texts: " w0042"
    token, publish_many = chat.runner._Sink.token, chat.writer.publish_many

    def timed_token(self, text):
        now = time.monotonic_ns()
        for i in index.findall(text):
            read.setdefault(self.writer.run_id, {})[int(i)] = now
        return token(self, text)

    async def timed_publish(batches, **kwargs):
        now = time.monotonic_ns()
        for run_id, records in batches:
            for record in records:
                if record.type == "token":
                    for i in index.findall(record.payload):
                        published.setdefault(run_id, {})[int(i)] = now
        return await publish_many(batches, **kwargs)

    chat.runner._Sink.token = timed_token  # type: ignore[method-assign]
    chat.writer.publish_many = timed_publish
    _rewritten("stage-probe", stats)


def _stack_probe() -> None:
    import json
    import sys
    import threading
    import time
    import types

    # Appended to the file every second, one JSON line per sample:
    # [ns (time.monotonic_ns), thread name, stack id], and once per new stack
    # ["stack", id, frames from the outermost to the innermost, each
    # "folder/file.py:function"]. Appended, not rewritten: the samples of a
    # long process would make a rewrite the probe's own stall.
    path = _probe_file("stack-probe").with_suffix(".jsonl")
    lines: list[str] = []
    stacks: dict[tuple, int] = {}
    names: dict[Any, str] = {}  # code object → its frame's name

    def name_of(code) -> str:
        name = names.get(code)
        if name is None:
            where = "/".join(code.co_filename.rsplit("/", 2)[-2:])
            name = names[code] = f"{where}:{code.co_name}"
        return name

    def sample() -> None:
        me = threading.get_ident()
        while True:
            time.sleep(0.002)
            now = time.monotonic_ns()
            threads = {t.ident: t.name for t in threading.enumerate()}
            for ident, top in sys._current_frames().items():
                if ident == me:
                    continue
                frames: list[str] = []
                frame: types.FrameType | None = top
                while frame is not None and len(frames) < 60:
                    frames.append(name_of(frame.f_code))
                    frame = frame.f_back
                stack = tuple(reversed(frames))
                sid = stacks.get(stack)
                if sid is None:
                    sid = stacks[stack] = len(stacks)
                    lines.append(json.dumps(["stack", sid, stack]))
                lines.append(json.dumps([now, threads.get(ident, str(ident)), sid]))

    def append() -> None:
        with path.open("a") as out:
            while True:
                time.sleep(1.0)
                taken = len(lines)
                out.write("".join(line + "\n" for line in lines[:taken]))
                out.flush()
                del lines[:taken]

    threading.Thread(target=sample, name="stack probe", daemon=True).start()
    threading.Thread(target=append, name="stack-probe writer", daemon=True).start()


def _loop_probe() -> None:
    import asyncio.events
    import time

    # One entry per slow callback: [started (time.monotonic()), seconds,
    # thread CPU seconds, what].
    stats: dict[str, Any] = {"whatif": sorted(wanted()), "callbacks": []}
    slow = stats["callbacks"]
    run = asyncio.events.Handle._run

    def what(handle) -> str:
        callback = handle._callback
        owner = getattr(callback, "__self__", None)
        if isinstance(owner, asyncio.Task):
            coro = owner.get_coro()
            return f"task {getattr(coro, '__qualname__', repr(coro))}"
        return getattr(callback, "__qualname__", repr(callback))

    def timed_run(self):
        began, cpu = time.monotonic(), time.thread_time()
        try:
            return run(self)
        finally:
            took = time.monotonic() - began
            if took >= 0.0005:
                slow.append([began, took, time.thread_time() - cpu, what(self)])

    asyncio.events.Handle._run = timed_run  # type: ignore[method-assign]
    _rewritten("loop-probe", stats)


def _pool_probe() -> None:
    import time

    from journal import dbpool

    # One entry per job: [pool, function, started (monotonic s), ran s, queued s,
    # the thread's CPU s while it ran].
    stats: dict[str, Any] = {"whatif": sorted(wanted()), "jobs": []}
    submit, call = dbpool.DBPool._submit, dbpool.DBPool._call

    async def stamped_submit(self, rank, fn, args, kwargs):
        kwargs = {**kwargs, "_queued_at": time.monotonic()}
        return await submit(self, rank, fn, args, kwargs)

    def timed_call(self, context, fn, args, kwargs, idle_s):
        began, cpu = time.monotonic(), time.thread_time()
        queued_at = kwargs.pop("_queued_at", began)  # submitted before the probe
        try:
            return call(self, context, fn, args, kwargs, idle_s)
        finally:
            name = getattr(fn, "__qualname__", repr(fn))
            ran = time.monotonic() - began
            cpu = time.thread_time() - cpu
            stats["jobs"].append([self.name, name, began, ran, began - queued_at, cpu])

    dbpool.DBPool._submit = stamped_submit  # type: ignore[method-assign]
    dbpool.DBPool._call = timed_call  # type: ignore[method-assign]
    _rewritten("pool-probe", stats)


def _tick_probe() -> None:
    import time

    import chat.writer

    # Seconds, one entry per tick: when it started (time.monotonic(), the
    # clock of the other probes), the whole tick (as
    # hermes_journal_tick_seconds), its append_many call on the writer thread,
    # its publish; events per tick.
    stats: dict[str, Any] = {
        "whatif": sorted(wanted()),
        "start": [],
        "tick": [],
        "append": [],
        "publish": [],
        "events": [],
    }
    commit, append_many = chat.writer._Committer._commit, chat.writer.append_many
    publish_many = chat.writer.publish_many

    def timed_append(batches, **kwargs):
        began = time.perf_counter()
        try:
            return append_many(batches, **kwargs)
        finally:
            stats["append"].append(time.perf_counter() - began)
            stats["events"].append(sum(len(events) for _r, _t, events in batches))

    async def timed_publish(batches, **kwargs):
        began = time.perf_counter()
        try:
            return await publish_many(batches, **kwargs)
        finally:
            stats["publish"].append(time.perf_counter() - began)

    async def timed_commit(self, waiting):
        stats["start"].append(time.monotonic())
        began = time.perf_counter()
        try:
            return await commit(self, waiting)
        finally:
            stats["tick"].append(time.perf_counter() - began)

    chat.writer.append_many = timed_append
    chat.writer.publish_many = timed_publish
    chat.writer._Committer._commit = timed_commit  # type: ignore[method-assign]
    _rewritten("tick-probe", stats)


def _committer_writes_to(writers) -> None:
    """The journal's committer (`chat.writer`) sends its jobs to `writers`
    (anything with the pool's `first` and `run`), not to the writer pool."""
    import types

    import chat.writer
    from journal import dbpool

    chat.writer.dbpool = types.SimpleNamespace(  # type: ignore[assignment]
        writers=writers, is_connection_error=dbpool.is_connection_error
    )


def _bg_checkpoint(every_s: float) -> None:
    import sqlite3
    import threading
    import time

    from django.conf import settings
    from django.db.backends.signals import connection_created

    def no_autocheckpoint(sender, connection, **kwargs):
        if connection.vendor == "sqlite":
            with connection.cursor() as cursor:
                cursor.execute("PRAGMA wal_autocheckpoint=0")

    connection_created.connect(no_autocheckpoint, weak=False)

    def checkpoints():
        db = sqlite3.connect(settings.DATABASES["default"]["NAME"], timeout=20)
        while True:
            time.sleep(every_s)
            db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()

    threading.Thread(target=checkpoints, daemon=True, name="checkpoints").start()


def _loop_commit() -> None:
    """The committer's statements run on the event loop's thread, blocking it."""
    import types

    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"

    async def first(fn, *args, **kwargs):
        return fn(*args, **kwargs)

    _committer_writes_to(types.SimpleNamespace(first=first, run=first))


def _async_commit() -> None:
    import types

    import psycopg
    from django.db import connection
    from django.utils import timezone

    import chat.writer
    from journal import dbpool, store

    conn: list = [None]

    async def connected():
        if conn[0] is None or conn[0].closed:
            # Django's own parameters, but its cursor class is a blocking one.
            params = connection.get_connection_params()
            params.pop("cursor_factory", None)
            # Prepared on the server, as journal.store prepares the product's.
            conn[0] = await psycopg.AsyncConnection.connect(
                **params, autocommit=True, prepare_threshold=sys.maxsize
            )
        return conn[0]

    async def first(fn, batches, **_known):  # PostgreSQL: one statement anyway
        assert fn is chat.writer.append_many
        valid = [
            (run_id, token, [(t, store.encode(p)) for t, p in events])
            for run_id, token, events in batches
        ]
        params = store.append_many_postgresql_params(valid, timezone.now())
        c = await connected()
        async with c.cursor() as cur:
            await cur.execute(store._APPEND_MANY_POSTGRESQL, params, prepare=True)
            taken = dict(await cur.fetchall())
        out = []
        for run_id, _token, events in valid:
            first_seq = taken[run_id] - len(events) + 1
            out.append(
                [store.Record(first_seq + j, t, p) for j, (t, p) in enumerate(events)]
            )
        return out

    _committer_writes_to(types.SimpleNamespace(first=first, run=dbpool.writers.run))


def _sync_off() -> None:
    from django.db.backends.signals import connection_created

    def off(sender, connection, **kwargs):
        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute("SET synchronous_commit TO off")

    connection_created.connect(off, weak=False)


def _drop_event_fk() -> None:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT conname FROM pg_constraint"
            " WHERE conrelid = 'journal_event'::regclass AND contype = 'f'"
        )
        for (name,) in cursor.fetchall():
            cursor.execute(f'ALTER TABLE journal_event DROP CONSTRAINT "{name}"')


def _event_key_run_seq() -> None:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT conname FROM pg_constraint"
            " WHERE conrelid = 'journal_event'::regclass AND contype = 'p'"
        )
        (primary,) = cursor.fetchone()
        if primary == "journal_event_run_seq_key":  # an earlier worker did it
            return
        cursor.execute(f'ALTER TABLE journal_event DROP CONSTRAINT "{primary}"')
        cursor.execute("ALTER TABLE journal_event DROP CONSTRAINT event_unique_run_seq")
        # Kept as a column (the ORM selects it), filled no more.
        cursor.execute(
            "ALTER TABLE journal_event ALTER COLUMN id DROP IDENTITY IF EXISTS,"
            " ALTER COLUMN id DROP NOT NULL"
        )
        cursor.execute(
            "ALTER TABLE journal_event"
            " ADD CONSTRAINT journal_event_run_seq_key PRIMARY KEY (run_id, seq)"
        )


# What-ifs that change the database's schema, made by the `worker` as it starts.
_WORKER_SCHEMA = {
    "no-event-fk": _drop_event_fk,
    "event-key-run-seq": _event_key_run_seq,
}


def main() -> None:
    import django

    if "uvloop" in wanted():
        import asyncio
        import importlib

        # Not a requirement of the project: `pip install uvloop` to measure it.
        uvloop = importlib.import_module("uvloop")
        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())

    django.setup()
    if sys.argv[1:2] == ["worker"]:
        from django.db import connection

        for name, change in _WORKER_SCHEMA.items():
            if name in wanted():
                change()
        connection.close()  # the worker opens its own connections
    apply()
    from django.core.management import execute_from_command_line

    execute_from_command_line(["manage.py", *sys.argv[1:]])


if __name__ == "__main__":
    main()
else:  # imported as an ASGI module by daphne
    import hermes_site.asgi

    apply()
    application = hermes_site.asgi.application
