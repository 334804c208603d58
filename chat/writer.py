"""The batching journal writers of a process's runs (docs/architecture.md §3, §4).

The provider read loop hands deltas to `BatchWriter.add()`, a plain function
call that never waits on the database or the broker. One committer per event
loop gathers what every run has pending, coalesces it (consecutive text of one
kind becomes one event, at most `TEXT_EVENT_CHARS` long, so no event exceeds
64 KiB) and appends it all in a single transaction, each run fenced on its own;
then it publishes each run's records. Ticks start at most every 30 ms
(`tick_interval`): what is added after a pause is committed at once, and while
events keep coming each tick starts one interval after the one before. With
hundreds of runs streaming, one commit per tick instead of one per run is what
keeps the worker's write path cheap, and the interval stretches to 50 ms for
them, so that each event carries more text (docs/benchmarks.md, finding 23).
From `COHORT_RUNS` runs streaming, the runs tick in cohorts (writers take
turns joining them), each cohort once per interval and the cohorts' ticks
evenly spaced: a statement carries a share of the runs, so what it adds to a
token's latency is a share of what one statement for all would, and the loop
publishes to a share of the streams at a time (findings 38 and 41). On
PostgreSQL a crowd ticks in four cohorts, on SQLite in two (`COHORTS`): a
statement that closely follows the last costs the client and the database
server about half what one after a pause does; SQLite's statement makes no
round trip, and more ticks would only cost CPU (finding 44).

Faults, and what each costs:

- **The database is out of reach** (a connection error): every run's events
  stay buffered, in order, and the committer tries again with backoff (up to
  `BACKOFF_MAX_S`); the model keeps streaming into the buffer. Whether the
  failed transaction committed is unknown, so before appending again the
  committer reads each run's `last_seq` under its token (`run_positions`): it
  moved by exactly the batch → the batch landed (its records are rebuilt and
  published); it did not move → append again; the token changed → the run was
  taken over and this writer writes nothing more. Nothing is written twice.
  A run whose events could not be written for `DB_OUTAGE_MAX_S`, or whose
  buffer outgrew `BUFFER_MAX_CHARS` during the outage, is told so through
  `on_trouble("database")`; the runner then stops the model and settles the
  run as `failed`, category `database`, as soon as the database answers
  (chat.runner). A buffer that outgrows the bound while the database answers
  (the model outran the journal's writes) is `on_trouble(OVERFLOW)`: the run
  fails the same way, its error naming that cause (category `limit`).
- **A run's events cannot be stored** (a wrong shape, or data the database
  refuses): that run alone fails (`EventsNotStored`, and `on_trouble("journal")`);
  if the shared transaction failed, each run of it is written on its own, so
  one run's bad batch never rolls back another's.
- **Fenced out** (`AppendRejected`): the run's writes stop, `on_trouble("fenced")`
  stops its model; the runner logs it once.
"""

import asyncio
import contextvars
import logging
import time
from collections import deque
from collections.abc import Callable

from django.conf import settings
from django.db import connection

from journal import dbpool, metrics
from journal.events import TEXT_EVENT_CHARS, storable
from journal.models import Run
from journal.publish import publish, publish_many
from journal.store import AppendRejected, Record, append_many, encode, run_positions

log = logging.getLogger(__name__)

INTERVAL_S = 0.03  # 25–50 ms: one row carries a chunk of text, latency stays low
INTERVAL_MAX_S = 0.05  # with many runs streaming (tick_interval)
CROWD_RUNS = (80, 160)  # the interval stretches between these runs in a tick
COHORT_RUNS = 20  # from this many runs streaming, they tick in cohorts
# A crowd's cohorts, by database: their ticks evenly spaced within the interval.
COHORTS = {"postgresql": 4, "sqlite": 2}
MAX_BYTES = 2048  # commit early once a run has this much text waiting
BACKOFF_MAX_S = 1.0  # retry an unreachable database at least this often
OVERFLOW = "overflow"  # on_trouble: the model outran the journal, not an outage
BUFFER_MAX_CHARS = 8 * 2**20  # per run, while its appends cannot land
_TEXT = ("token", "reasoning")


class EventsNotStored(Exception):
    """The database refused a run's events for what they are, not for an outage."""

    def __init__(self, run_id: str, reason: str):
        super().__init__(f"events of this run could not be stored: {reason}")
        self.run_id = run_id


class BatchWriter:
    def __init__(
        self,
        *,
        run_id: str,
        token: int,
        last_seq: int = 0,
        on_trouble: Callable[[str], None] | None = None,
    ):
        self.run_id = run_id
        self.token = token
        # Why appends stopped: fenced out (AppendRejected) or refused events.
        self.failure: Exception | None = None
        self.rows_written = 0
        self.last_seq = last_seq  # the run's last seq this writer knows committed
        self.on_trouble = on_trouble
        self._pending: list[list] = []  # [type, payload] in order
        self.pending_bytes = 0  # text characters added since the last take()
        self.buffered_chars = 0  # text characters not yet committed
        self._inflight: list[tuple[str, dict]] | None = None  # being written
        self._inflight_chars = 0
        self.unsure = False  # the last attempt's commit outcome is unknown
        self.stalled_since: float | None = None
        self._troubled = False
        self._idle = asyncio.Event()
        self._idle.set()
        self._committer = _committer()
        self.cohort = self._committer.enlist()

    def add(self, event_type: str, payload: dict) -> None:
        """Queue an event; text deltas of the same kind merge with the last one."""
        if self.failure is not None:
            return
        if event_type in _TEXT:
            self._add_text(event_type, storable(payload["text"]))
        else:
            self._pending.append([event_type, storable(payload)])
        self._idle.clear()
        self._committer.want(self)

    def _add_text(self, event_type: str, text: str) -> None:
        self.pending_bytes += len(text)
        self.buffered_chars += len(text)
        last = self._pending[-1] if self._pending else None
        if last is not None and last[0] == event_type:
            room = TEXT_EVENT_CHARS - len(last[1]["text"])
            if room > 0:
                last[1] = {"text": last[1]["text"] + text[:room]}
                text = text[room:]
        for i in range(0, len(text), TEXT_EVENT_CHARS):
            self._pending.append([event_type, {"text": text[i : i + TEXT_EVENT_CHARS]}])
        if self.buffered_chars > BUFFER_MAX_CHARS:
            # In an outage the database is the cause; else the model outran
            # the journal's writes (the runner names each in the run's error).
            self._trouble("database" if self.stalled_since is not None else OVERFLOW)

    async def flush(self) -> None:
        """Wait until everything added so far is committed (and published).

        While the database is away this waits for it; it raises the writer's
        failure (fenced out, or events refused).
        """
        await self._idle.wait()
        if self.failure is not None:
            raise self.failure

    def close(self) -> None:
        """Forget what is still pending (the run is over); never raises."""
        self._pending = []
        self.pending_bytes = 0

    # --- the committer's side -------------------------------------------------
    def take(self) -> list[tuple[str, dict]]:
        """The batch to write now: the one that failed last time, else the pending."""
        if self.failure is not None:
            self._pending, self._inflight = [], None
        if self._inflight is None and self._pending:
            self._inflight = [(t, p) for t, p in self._pending]
            self._inflight_chars = self.pending_bytes
            self._pending, self.pending_bytes = [], 0
        return self._inflight or []

    def stalled(self) -> None:
        """The last attempt met a connection error: its outcome is unknown."""
        self.unsure = True
        now = time.monotonic()
        if self.stalled_since is None:
            self.stalled_since = now
        elif now - self.stalled_since > settings.HERMES["DB_OUTAGE_MAX_S"]:
            self._trouble("database")

    def reconcile(self, position: tuple[int, int, str] | None) -> list[Record]:
        """After an unknown outcome: did the batch land? Returns its records if so."""
        self.unsure = False
        batch = self._inflight or []
        if position is None:
            self._fail(AppendRejected(self.run_id, "no such run"))
            return []
        last_seq, token, status = position
        if token != self.token or status not in Run.ACTIVE:
            self._fail(AppendRejected(self.run_id, f"taken over ({status})"))
            return []
        if last_seq == self.last_seq:
            return []  # it did not commit: write it again
        if last_seq != self.last_seq + len(batch):
            self._fail(
                EventsNotStored(
                    self.run_id,
                    f"journal at seq {last_seq}, expected {self.last_seq}"
                    f" or {self.last_seq + len(batch)}",
                )
            )
            return []
        first = self.last_seq + 1
        return [Record(first + i, t, encode(p)) for i, (t, p) in enumerate(batch)]

    def landed(self, result: list[Record] | Exception) -> None:
        """The committer wrote (or failed to write) what `take()` returned."""
        if isinstance(result, Exception):
            self._fail(result)
        elif result:
            self.rows_written += len(result)
            self.last_seq = result[-1].seq
            self.buffered_chars -= self._inflight_chars
            self._inflight, self._inflight_chars = None, 0
            self.stalled_since = None
        self.settle()

    def settle(self) -> None:
        if self._pending or self._inflight:
            self._committer.want(self)
        else:
            self._idle.set()

    def _fail(self, exc: Exception) -> None:
        self.failure = self.failure or exc
        self._pending, self._inflight = [], None
        self.buffered_chars = 0
        self._trouble("fenced" if isinstance(exc, AppendRejected) else "journal")

    def _trouble(self, what: str) -> None:
        if not self._troubled and self.on_trouble is not None:
            self._troubled = True
            self.on_trouble(what)


def tick_interval(runs: int) -> float:
    """How soon after a tick's start the next may start, when it carried `runs`.

    `INTERVAL_S` up to `CROWD_RUNS[0]` runs, `INTERVAL_MAX_S` from `CROWD_RUNS[1]`,
    in proportion between. Most of what a tick costs the process is paid per
    event, not per character: a row, a message through the channel layer, a
    wake-up and a socket write for each reader. With few runs there is CPU to
    spare and text reaches readers sooner; with many, a longer interval puts
    more of each run's text in one event, which is what keeps the process from
    falling behind (docs/benchmarks.md, finding 23).
    """
    low, high = CROWD_RUNS
    share = min(max((runs - low) / (high - low), 0.0), 1.0)
    return INTERVAL_S + share * (INTERVAL_MAX_S - INTERVAL_S)


class _Committer:
    """Commits every run's pending events of one event loop, a tick at a time."""

    def __init__(self):
        self._waiting: dict[BatchWriter, None] = {}  # an ordered set
        self._enlisted = 0  # writers made so far: the next one's cohort
        self._cohorts = COHORTS.get(connection.vendor, COHORTS["sqlite"])
        # The writers of the last cohorts' ticks (but the one due next): with
        # those waiting now, the runs streaming.
        self._recent: deque[set[BatchWriter]] = deque(maxlen=self._cohorts - 1)
        self._wake = asyncio.Event()
        self._backoff = 0.0  # > 0 while the database is out of reach
        self._outage_began: float | None = None
        self._failed_attempts = 0
        # A context of its own: not the log context of the run that started it.
        self._task = asyncio.create_task(
            self._run(), name="journal committer", context=contextvars.Context()
        )

    def want(self, writer: BatchWriter) -> None:
        self._waiting[writer] = None
        self._wake.set()

    def enlist(self) -> int:
        """A new writer's cohort: writers take turns, so cohorts stay even."""
        self._enlisted += 1
        return self._enlisted % self._cohorts

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        last_tick: float | None = None  # when the last tick started
        interval = INTERVAL_S  # after it, for as many runs as it carried
        turn = 0  # the cohort whose tick is next, while a crowd streams
        while True:
            await self._wake.wait()
            self._wake.clear()
            urgent = any(w.pending_bytes >= MAX_BYTES for w in self._waiting)
            if self._backoff:
                await asyncio.sleep(self._backoff)
            elif not urgent:
                # A tick at most every interval, counted from the last one's
                # start: the batches fill while it commits, and what comes
                # after a pause is committed at once (docs/benchmarks.md).
                if last_tick is not None:
                    delay = last_tick + interval - loop.time()
                    if delay > 0:
                        await asyncio.sleep(delay)
            last_tick = loop.time()
            crowd = len(set(self._waiting).union(*self._recent))
            if crowd >= COHORT_RUNS and not (urgent or self._backoff):
                # A crowd ticks a cohort at a time, each once per interval:
                # each statement carries a share of the runs, and the loop
                # publishes a share of them at once (docs/benchmarks.md,
                # findings 38 and 44).
                waiting, turn = self._cohort(turn)
                self._recent.append(set(waiting))
                interval = tick_interval(crowd) / self._cohorts
            else:
                waiting = list(self._waiting)
                self._waiting.clear()
                self._recent.clear()
                interval = tick_interval(crowd)
            try:
                await self._commit(waiting)
            except Exception:  # never lose the committer: the runs would hang
                log.exception("journal committer failed; retrying")
                self._retry(waiting, None)
                self._backoff = BACKOFF_MAX_S

    def _cohort(self, turn: int) -> tuple[list[BatchWriter], int]:
        """The waiting writers of the cohort whose turn it is (or of the next
        with any waiting), taken out of the waiting set; and the next turn."""
        for step in range(self._cohorts):
            cohort = (turn + step) % self._cohorts
            taken = [w for w in self._waiting if w.cohort == cohort]
            if taken:
                break
        for writer in taken:
            del self._waiting[writer]
        if self._waiting:
            self._wake.set()  # the other cohorts' turn comes next
        return taken, (cohort + 1) % self._cohorts

    async def _commit(self, waiting: list[BatchWriter]) -> None:
        began = time.perf_counter()
        writers = []
        for writer in waiting:
            if writer.take():
                writers.append(writer)
            else:
                writer.settle()
        if not writers:
            return
        try:
            await self._reconcile([w for w in writers if w.unsure])
            writers = [w for w in writers if w.take()]
            if not writers:
                self._recovered()
                return
            batches = [(w.run_id, w.token, w.take()) for w in writers]
            results = await dbpool.writers.first(
                append_many, batches, last_seqs={w.run_id: w.last_seq for w in writers}
            )
        except Exception as exc:
            if dbpool.is_connection_error(exc):
                self._retry(writers, exc)
                return
            results = await self._one_by_one(writers, exc)
        self._recovered()
        # Every run's doorbell of this tick in one batch: one after another,
        # each publish waited its round trips and a loop turn behind hundreds
        # of streams (docs/benchmarks.md).
        await publish_many(
            [
                (writer.run_id, result)
                for writer, result in zip(writers, results, strict=True)
                if isinstance(result, list)
            ]
        )
        for writer, result in zip(writers, results, strict=True):
            if result is None:  # a connection error on its own attempt
                self._retry([writer], None)
                continue
            if not isinstance(result, list | AppendRejected):  # fenced: runner says so
                log.warning(
                    "journal append refused run_id=%s: %s", writer.run_id, result
                )
            writer.landed(result)
        metrics.TICK_S.observe(time.perf_counter() - began)

    async def _reconcile(self, writers: list[BatchWriter]) -> None:
        if not writers:
            return
        positions = await dbpool.writers.run(
            run_positions, run_ids=[w.run_id for w in writers]
        )
        for writer in writers:
            records = writer.reconcile(positions.get(writer.run_id))
            if records:
                await publish(writer.run_id, records)
                writer.landed(records)
            elif writer.failure is not None:
                writer.settle()

    async def _one_by_one(self, writers: list[BatchWriter], exc: Exception) -> list:
        """The shared transaction failed on data: write each run alone."""
        if len(writers) == 1:
            return [EventsNotStored(writers[0].run_id, _reason(exc))]
        results: list = []
        for writer in writers:
            result: list[Record] | Exception | None
            try:
                [result] = await dbpool.writers.run(
                    append_many, [(writer.run_id, writer.token, writer.take())]
                )
            except Exception as alone:
                if dbpool.is_connection_error(alone):
                    writer.stalled()
                    result = None
                else:
                    result = EventsNotStored(writer.run_id, _reason(alone))
            results.append(result)
        return results

    def _retry(self, writers: list[BatchWriter], exc: Exception | None) -> None:
        """Keep every batch and try again after a backoff."""
        for writer in writers:
            writer.stalled()
            self._waiting[writer] = None
        self._wake.set()
        if exc is None:
            return
        self._failed_attempts += 1
        self._backoff = min(max(self._backoff * 2, 0.05), BACKOFF_MAX_S)
        if self._outage_began is None:
            self._outage_began = time.monotonic()
            log.warning(
                "database unreachable: holding the events of %d run(s) and "
                "retrying (%s)",
                len(writers),
                str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc),
            )

    def _recovered(self) -> None:
        if self._outage_began is not None:
            log.warning(
                "database reachable again: journal appends resumed after %.1f s "
                "and %d failed attempt(s)",
                time.monotonic() - self._outage_began,
                self._failed_attempts,
            )
        self._backoff = 0.0
        self._outage_began = None
        self._failed_attempts = 0


def _reason(exc: Exception) -> str:
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {first}"[:300]


_committers: dict[asyncio.AbstractEventLoop, _Committer] = {}


def _committer() -> _Committer:
    loop = asyncio.get_running_loop()
    committer = _committers.get(loop)
    if committer is None or committer._task.done():
        committer = _committers[loop] = _Committer()
    return committer
