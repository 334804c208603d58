"""The only writer of the journal: append, read after a cursor, summarise.
See docs/architecture.md §4.

Appends are synchronous and transactional. The fencing token is checked in the
same UPDATE that takes the sequence numbers, so a writer whose lease was taken
over writes nothing. An `end` flips the run to its terminal status in that same
statement, so there is exactly one `end` per run whoever writes it. Publishing to
the channel layer happens after commit (`journal.publish`), never here.
"""

import json
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from itertools import repeat
from typing import NamedTuple

from django.db import IntegrityError, connection, transaction
from django.db.models import Field
from django.utils import timezone

from . import metrics
from .events import TERMINAL, InvalidEvent, validate
from .models import Event, Run

READ_PAGE = 2000  # rows per journal query: bounded memory for any run length


class AppendRejected(Exception):
    """The writer may not append: its fencing token is stale or the run has ended."""

    def __init__(self, run_id: str, reason: str):
        super().__init__(f"{run_id}: {reason}")
        self.run_id = run_id
        self.reason = reason


class RunNotFound(Exception):
    pass


class Record(NamedTuple):
    """One journaled event as readers see it; `payload` is JSON text.

    A tuple: replay builds hundreds of thousands of these a second.
    """

    seq: int
    type: str
    payload: str


def encode(payload: dict) -> str:
    return json.dumps(payload, separators=(",", ":"), ensure_ascii=False)


def append(
    *,
    run_id: str,
    token: int,
    events: list[tuple[str, dict]],
    run_fields: dict | None = None,
) -> list[Record]:
    """Append `events` to the run in one transaction and return their records.

    `token` must be the run's current fencing token and the run must be active,
    else `AppendRejected` and nothing is written. An `end` may only be the last
    event; it settles the run (status, terminal_state, ended_at, error).
    `run_fields` (other columns of the run) are saved in the same statement.
    """
    if not events:
        return []
    for i, (event_type, payload) in enumerate(events):
        validate(event_type, payload)
        if event_type == TERMINAL and i != len(events) - 1:
            raise ValueError("end must be the last event of a run")
    end_type, end_payload = events[-1]
    if end_type != TERMINAL and not run_fields:
        # The hot path (text, tool steps): `append_many` for one run, one
        # round trip on PostgreSQL instead of BEGIN, UPDATE, INSERT and COMMIT.
        [result] = append_many([(run_id, token, events)])
        if isinstance(result, Exception):
            raise result
        return result
    now = timezone.now()
    # No savepoint: a rejected fence writes nothing, and is raised outside the
    # block; any other error leaves the caller's transaction to roll back.
    with transaction.atomic(savepoint=False):
        last_seq = _take_seqs_settling(
            run_id,
            token,
            len(events),
            end_payload if end_type == TERMINAL else None,
            run_fields,
            now,
        )
        if last_seq is not None:
            first = last_seq - len(events) + 1
            records = [
                Record(first + i, event_type, encode(payload))
                for i, (event_type, payload) in enumerate(events)
            ]
            created = connection.ops.adapt_datetimefield_value(now)
            with connection.cursor() as cursor:
                cursor.executemany(
                    "INSERT INTO journal_event"
                    " (run_id, seq, type, payload, created_at)"
                    " VALUES (%s, %s, %s, %s, %s)",
                    [(run_id, r.seq, r.type, r.payload, created) for r in records],
                )
    if last_seq is None:
        raise AppendRejected(run_id, _rejection_reason(run_id, token))
    metrics.EVENTS_APPENDED.inc(len(records))
    return records


_ACTIVE_IN = "(" + ", ".join(["%s"] * len(Run.ACTIVE)) + ")"


def _take_seqs_settling(
    run_id: str, token: int, count: int, end: dict | None, run_fields: dict | None, now
) -> int | None:
    """Take `count` seqs under the fence, saving `run_fields` (plain values);
    with an `end`, settle the run. Returns the run's new last seq, or None
    if the fence does not hold (then nothing changed).

    One statement, `UPDATE … RETURNING`: a run's end is on the worker's path
    for every run, and the ORM's update and read back cost several times its
    work (docs/benchmarks.md, finding 21).
    """
    updates: dict = dict(run_fields or {})
    if end is not None:
        error = end.get("error") or {}
        updates.update(
            status=end["status"],
            terminal_state=end["terminal_state"],
            ended_at=now,
            lease_expires_at=None,
            error_category=error.get("category", ""),
            error_message=error.get("message", ""),
        )
    columns, values = ["last_seq = last_seq + %s"], [count]
    for name, value in updates.items():
        field = Run._meta.get_field(name)
        assert isinstance(field, Field), name  # a column of the run
        columns.append(connection.ops.quote_name(field.column) + " = %s")
        values.append(field.get_db_prep_save(value, connection))
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE journal_run SET "
            + ", ".join(columns)
            + " WHERE id = %s AND fencing_token = %s AND status IN "
            + _ACTIVE_IN
            + " RETURNING last_seq",
            [*values, run_id, token, *Run.ACTIVE],
        )
        row = cursor.fetchone()
    return None if row is None else row[0]


def _rejection_reason(run_id: str, token: int) -> str:
    row = Run.objects.filter(id=run_id).values("status", "fencing_token").first()
    if row is None:
        return "no such run"
    if row["status"] not in Run.ACTIVE:
        return f"run already ended ({row['status']})"
    return f"stale fencing token {token}, current {row['fencing_token']}"


def read_after(*, run_id: str, after_seq: int, limit: int = READ_PAGE) -> list[Record]:
    """Up to `limit` records with seq > `after_seq`, in order (one indexed query)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT seq, type, payload FROM journal_event"
            " WHERE run_id = %s AND seq > %s AND seq <= %s ORDER BY seq LIMIT %s",
            # The upper bound (seqs have no holes) keeps PostgreSQL on an index
            # range scan even before the table has statistics.
            [run_id, after_seq, after_seq + limit, limit],
        )
        # Rows made Records in C: `Record._make` is a Python call per row,
        # and a replay reads hundreds of thousands of rows a second. The
        # query's three columns are the Record's three fields.
        return list(map(tuple.__new__, repeat(Record), cursor.fetchall()))


class FramePage(NamedTuple):
    """A journal page as the database wrote it out: its records' frames, joined."""

    rows: int  # records in the page; 0: nothing after the cursor
    last_seq: int
    data: bytes  # each record's frame (the template filled in), in seq order, UTF-8
    ended: bool  # the page holds the run's `end`


# One row per page: the database fills in each record's frame and joins them
# in seq order, as bytes. A frame is the template's five literal parts with
# the run id, seq, type and payload between them, joined with `||`, which
# costs the database less than `printf` or `format` of the whole template
# (docs/benchmarks.md, finding 37). SQLite aggregates the rows in the order
# its ordered subquery yields them (a subquery with LIMIT is never flattened
# into an aggregate); PostgreSQL is told the order.
_FRAME_SQL = "%s || %s || %s || seq || %s || type || %s || payload || %s"
_FRAMES_SQL = {
    "sqlite": (
        "SELECT count(*), coalesce(max(seq), 0),"
        f" CAST(coalesce(group_concat({_FRAME_SQL}, ''), '') AS BLOB),"
        " coalesce(max(type = %s), 0)"
    ),
    "postgresql": (
        "SELECT count(*), coalesce(max(seq), 0),"
        " convert_to(coalesce(string_agg("
        + _FRAME_SQL.replace("%s", "%s::text")
        + ", '' ORDER BY seq), ''), 'UTF8'), coalesce(bool_or(type = %s), false)"
    ),
}


def read_frames(
    *, run_id: str, after_seq: int, template: str, limit: int = READ_PAGE
) -> FramePage:
    """The records `read_after` would return, written out by the database:
    `template % (run_id, seq, type, payload)` of each, joined (`template`
    holds four `%s` and no other `%`).

    The serving process makes no object per record, which is what a replay's
    events cost it most of (docs/benchmarks.md, finding 36).
    """
    before_run, before_seq, before_type, before_payload, tail = template.split("%s")
    with connection.cursor() as cursor:
        cursor.execute(
            _FRAMES_SQL[connection.vendor]
            + " FROM (SELECT seq, type, payload FROM journal_event"
            " WHERE run_id = %s AND seq > %s AND seq <= %s ORDER BY seq LIMIT %s)"
            " AS page",
            [
                before_run,
                run_id,
                before_seq,
                before_type,
                before_payload,
                tail,
                TERMINAL,
                run_id,
                after_seq,
                after_seq + limit,
                limit,
            ],
        )
        rows, last_seq, data, ended = cursor.fetchone()
    return FramePage(rows, last_seq, bytes(data), bool(ended))


def read_timed(*, run_id: str, after_seq: int, limit: int = READ_PAGE):
    """Like `read_after`, with each event's commit time: (Record, datetime) pairs."""
    rows = (
        Event.objects.filter(run_id=run_id, seq__gt=after_seq)
        .order_by("seq")
        .values_list("seq", "type", "payload", "created_at")[:limit]
    )
    return [(Record(seq, t, p), created) for seq, t, p, created in rows]


@dataclass(frozen=True)
class RunState:
    """What readers need to know of a run, read in one query."""

    id: str
    owner_id: int
    subject: str
    status: str
    terminal_state: str
    last_seq: int
    lease_expires_at: datetime | None
    pruned: bool

    @property
    def terminal(self) -> bool:
        return self.status not in Run.ACTIVE

    @property
    def lease_expired(self) -> bool:
        return (
            self.status == Run.Status.RUNNING
            and self.lease_expires_at is not None
            and self.lease_expires_at < timezone.now()
        )


_STATE_FIELDS = (
    "id",
    "owner_id",
    "subject",
    "status",
    "terminal_state",
    "last_seq",
    "lease_expires_at",
    "pruned_at",
)


def run_state(*, run_id: str) -> RunState | None:
    row = Run.objects.filter(id=run_id).values_list(*_STATE_FIELDS).first()
    if row is None:
        return None
    *head, pruned_at = row
    return RunState(*head, pruned=pruned_at is not None)  # type: ignore[misc]


def run_summary(*, run: Run, worker_alive: bool | None = None) -> dict:
    """What the journal knows of a run's state: the generic part of a status
    document (the app that owns the run's subject adds its own fields)."""
    terminal = run.is_terminal
    if worker_alive is None:
        worker_alive = (
            run.status == Run.Status.RUNNING
            and run.lease_expires_at is not None
            and run.lease_expires_at >= timezone.now()
        )
    return {
        "id": run.id,
        "subject": run.subject,
        "status": run.status,
        "terminal": terminal,
        "terminal_state": run.terminal_state,
        "last_seq": run.last_seq,
        "last_event_id": f"{run.id}:{run.last_seq}" if run.last_seq else None,
        "replay_available": run.pruned_at is None,
        "worker_alive": worker_alive,
        "error": (
            {"category": run.error_category, "message": run.error_message}
            if run.error_category
            else None
        ),
        "created_at": run.created_at.isoformat(),
        "ended_at": run.ended_at.isoformat() if run.ended_at else None,
    }


def append_many(
    batches: list[tuple[str, int, list[tuple[str, dict]]]],
    *,
    last_seqs: Mapping[str, int] | None = None,
) -> list[list[Record] | AppendRejected | InvalidEvent]:
    """Several runs' appends in one transaction: one commit for all.

    Each `(run_id, token, events)` is fenced on its own: seqs are taken only
    for runs whose token matches and that are active; a rejected run writes
    nothing and gets its `AppendRejected` back in place of its records, a run
    with an event of the wrong shape its `InvalidEvent`, so one run's bad batch
    never costs another run anything. Each run at most once; no `end` here:
    runs end through `append`.

    On PostgreSQL the whole tick is one statement (`_take_and_insert_postgresql`),
    committed by itself. On SQLite too when `last_seqs` gives every run's last
    seq as the caller knows it committed (`_take_and_insert_following`);
    otherwise, or when a run's fence or last seq differs, three statements of
    one step each, in a transaction (`_take_and_insert`). A statement, or a
    row, per run would be cheap for the database but not for the writer
    thread, which must win the GIL back from a busy event loop after each one
    (docs/benchmarks.md).
    """
    results: list[list[Record] | AppendRejected | InvalidEvent] = []
    valid: list[tuple[str, int, list[tuple[str, str]]]] = []
    for run_id, token, events in batches:
        if not events:
            raise ValueError("every batch of append_many needs events")
        try:
            for event_type, payload in events:
                validate(event_type, payload)
                if event_type == TERMINAL:
                    raise ValueError("append_many takes no end: use append")
        except InvalidEvent as exc:
            results.append(exc)
            continue
        results.append([])
        valid.append((run_id, token, [(t, encode(p)) for t, p in events]))
    if len({run_id for run_id, _t, _e in valid}) != len(valid):
        raise ValueError("append_many takes each run at most once")
    if not valid:
        return results
    taken = _take_and_insert_any(valid, timezone.now(), last_seqs)
    encoded = {run_id: events for run_id, _token, events in valid}
    appended = 0
    for i, (run_id, token, _events) in enumerate(batches):
        if isinstance(results[i], InvalidEvent):
            continue
        if run_id not in taken:
            results[i] = AppendRejected(run_id, _rejection_reason(run_id, token))
            continue
        stored = encoded[run_id]
        first = taken[run_id] - len(stored) + 1
        results[i] = [Record(first + j, t, p) for j, (t, p) in enumerate(stored)]
        appended += len(stored)
    metrics.EVENTS_APPENDED.inc(appended)
    return results


def _take_and_insert_any(
    valid: list[tuple[str, int, list[tuple[str, str]]]],
    now: datetime,
    last_seqs: Mapping[str, int] | None,
) -> dict[str, int]:
    if connection.vendor == "postgresql":
        # One statement is a transaction of its own: no BEGIN and COMMIT
        # round trips around it, each a wait for the GIL in the writer thread.
        return _take_and_insert_postgresql(valid, now)
    if (
        last_seqs is not None
        and not connection.in_atomic_block
        and all(run_id in last_seqs for run_id, _t, _e in valid)
    ):
        taken = _take_and_insert_following(valid, now, last_seqs)
        if taken is not None:
            return taken
    with transaction.atomic():
        return _take_and_insert(valid, now)


def _take_and_insert(
    valid: list[tuple[str, int, list[tuple[str, str]]]], now: datetime
) -> dict[str, int]:
    """Take each run's seqs (one fenced UPDATE), read the taken runs' new last
    seqs back (one row) and insert their rows (one statement over a JSON
    array); `{run_id: its new last seq}` for the runs taken.

    A step of a statement is a step whatever the tick's size: SQLite's Python
    module lets the GIL go around each, every row of an `executemany` or of a
    `RETURNING` included, and the writer thread must win it back from a busy
    event loop each time (docs/benchmarks.md, finding 17).
    """
    counts = [x for run_id, _t, events in valid for x in (run_id, len(events))]
    fences = [x for run_id, token, _e in valid for x in (run_id, token)]
    fenced = (
        " WHERE status IN "
        + _ACTIVE_IN
        + " AND ("
        + " OR ".join(["(id = %s AND fencing_token = %s)"] * len(valid))
        + ")"
    )
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE journal_run SET last_seq = last_seq + CASE id"
            + " WHEN %s THEN %s" * len(valid)
            + " END"
            + fenced,
            [*counts, *Run.ACTIVE, *fences],
        )
        # The rows just updated: the update changed no column of the fence.
        cursor.execute(
            "SELECT json_group_array(json_array(id, last_seq)) FROM journal_run"
            + fenced,
            [*Run.ACTIVE, *fences],
        )
        taken = dict(json.loads(cursor.fetchone()[0]))
        if rows := _numbered(valid, taken):
            cursor.execute(
                _INSERT_ROWS_SQLITE.format(created_at="%s", rows="%s"),
                [
                    connection.ops.adapt_datetimefield_value(now),
                    json.dumps(rows, ensure_ascii=False),
                ],
            )
    return taken


def _numbered(
    valid: list[tuple[str, int, list[tuple[str, str]]]], taken: Mapping[str, int]
) -> list[tuple[str, int, str, str]]:
    """The rows `(run id, seq, type, payload)` of the runs in `taken`, each
    run's numbered back from its new last seq."""
    rows: list[tuple[str, int, str, str]] = []
    for run_id, _token, events in valid:
        if run_id in taken:
            first = taken[run_id] - len(events) + 1
            rows.extend(
                (run_id, first + j, t, payload) for j, (t, payload) in enumerate(events)
            )
    return rows


# SQLite: insert the rows of a JSON array of [run id, seq, type, payload], all
# created at `created_at` (both are filled in: parameters, or a trigger's NEW).
_INSERT_ROWS_SQLITE = (
    "INSERT INTO journal_event (run_id, seq, type, payload, created_at)"
    " SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]'),"
    " json_extract(value, '$[2]'), json_extract(value, '$[3]'), {created_at}"
    " FROM json_each({rows})"
)


def _take_and_insert_following(
    valid: list[tuple[str, int, list[tuple[str, str]]]],
    now: datetime,
    last_seqs: Mapping[str, int],
) -> dict[str, int] | None:
    """SQLite: the tick as one statement, when the caller knows where each run
    stands; `{run_id: its new last seq}`, or None when any run's fence or last
    seq differs from what it was given (then nothing was written).

    One insert into `journal_tick`, a view of this connection whose trigger
    (`SQLITE_TICK`) takes the seqs and inserts the rows: outside a transaction
    (the only place it is used) it commits by itself, in one step of SQLite's
    module. Three statements in a transaction are five steps, and after each
    the writer thread must win the GIL back from a busy event loop
    (docs/benchmarks.md, finding 24).
    """
    runs = [
        (run_id, token, last_seqs[run_id], len(events))
        for run_id, token, events in valid
    ]
    taken = {run_id: last + n for run_id, _token, last, n in runs}
    rows = _numbered(valid, taken)
    _sqlite_tick_installed()
    try:
        with connection.cursor() as cursor:
            cursor.execute(
                "INSERT INTO journal_tick (runs, events, created_at)"
                " VALUES (%s, %s, %s)",
                [
                    json.dumps(runs),
                    json.dumps(rows, ensure_ascii=False),
                    connection.ops.adapt_datetimefield_value(now),
                ],
            )
    except IntegrityError:
        # A fence or a seq moved, or a row cannot be stored: the statement
        # wrote nothing, and the general path finds out which.
        return None
    return taken


_ACTIVE_SQL = ", ".join(f"'{status}'" for status in Run.ACTIVE)

# `_take_and_insert_following`'s statement, installed on each SQLite connection
# that ticks (`_sqlite_tick_installed`). `runs` is a JSON array of [run id,
# token, last seq, count], `events` of [run id, seq, type, payload]. The update
# finds each run by its key alone (the `+` keeps the planner off the other
# columns' indexes), and the tick aborts unless every run's fence and last seq
# held.
SQLITE_TICK = [
    "CREATE TEMP VIEW IF NOT EXISTS journal_tick (runs, events, created_at)"
    " AS SELECT NULL, NULL, NULL WHERE 0",
    f"""CREATE TEMP TRIGGER IF NOT EXISTS journal_tick_insert
INSTEAD OF INSERT ON journal_tick
BEGIN
    UPDATE journal_run SET last_seq = last_seq + batch.n
    FROM (
        SELECT json_extract(value, '$[0]') AS id,
               json_extract(value, '$[1]') AS token,
               json_extract(value, '$[2]') AS last,
               json_extract(value, '$[3]') AS n
        FROM json_each(NEW.runs)
    ) AS batch
    WHERE journal_run.id = batch.id
      AND +journal_run.fencing_token = batch.token
      AND +journal_run.last_seq = batch.last
      AND +journal_run.status IN ({_ACTIVE_SQL});
    SELECT RAISE(ABORT, 'journal tick: a fence or a seq moved')
    WHERE changes() != json_array_length(NEW.runs);
    {_INSERT_ROWS_SQLITE.format(created_at="NEW.created_at", rows="NEW.events")};
END""",
]


def _sqlite_tick_installed() -> None:
    """Give this thread's SQLite connection `journal_tick`, once: temporary
    objects live as long as their connection, and a trigger is checked
    against the tables when it is made (so not when a connection opens: the
    first ever may come before the tables). Never inside a transaction: a
    rollback would take them away unseen."""
    connection.ensure_connection()
    raw = connection.connection
    if getattr(connection, "journal_tick_on", None) is raw:
        return
    with connection.cursor() as cursor:
        for statement in SQLITE_TICK:
            cursor.execute(statement)
    connection.journal_tick_on = raw  # type: ignore[attr-defined]


# One round trip for a whole tick: the runs' fenced seq ranges (`taken`) and
# their rows, each row's seq counted back from its run's new last seq.
_APPEND_MANY_POSTGRESQL = """
WITH batch AS (
    SELECT * FROM unnest(%b::text[], %b::int8[], %b::int4[]) AS b(id, token, n)
), taken AS (
    UPDATE journal_run AS r SET last_seq = r.last_seq + batch.n
    FROM batch
    WHERE r.id = batch.id AND r.fencing_token = batch.token
      AND r.status = ANY(%b::text[])
    RETURNING r.id, r.last_seq, batch.n
), inserted AS (
    INSERT INTO journal_event (run_id, seq, type, payload, created_at)
    SELECT e.run_id, taken.last_seq - taken.n + e.k, e.type, e.payload, %b
    FROM unnest(%b::text[], %b::int4[], %b::text[], %b::text[])
        AS e(run_id, k, type, payload)
    JOIN taken ON taken.id = e.run_id
)
SELECT id, last_seq FROM taken
"""


def _take_and_insert_postgresql(
    valid: list[tuple[str, int, list[tuple[str, str]]]], now: datetime
) -> dict[str, int]:
    """`_take_and_insert` as one statement whose arrays travel in binary.

    Django's PostgreSQL cursors bind parameters on the client, writing every
    value into the query's text; for a tick of hundreds of runs that quoting,
    and a row at a time in `executemany`, cost more than the database's work
    (docs/benchmarks.md). A server-binding cursor sends the arrays as they are.

    The statement is prepared on the server, once per connection: parsing and
    planning it each tick took a third of what the server spent on the tick
    (docs/benchmarks.md, finding 26). Django opens its connections with
    preparation off (`prepare_threshold` None); a threshold no count reaches
    turns it on for statements that ask for it, and for no other.
    """
    import psycopg

    connection.ensure_connection()
    raw = connection.connection
    if raw.prepare_threshold is None:
        raw.prepare_threshold = sys.maxsize
    with connection.wrap_database_errors, psycopg.Cursor(raw) as cur:
        cur.execute(
            _APPEND_MANY_POSTGRESQL,
            append_many_postgresql_params(valid, now),
            prepare=True,
        )
        return dict(cur.fetchall())


def append_many_postgresql_params(
    valid: list[tuple[str, int, list[tuple[str, str]]]], now: datetime
) -> list:
    """`_APPEND_MANY_POSTGRESQL`'s parameters: the runs' arrays, then the
    events' arrays (each event's run, its place in its run's batch, its type
    and its encoded payload)."""
    run_ids, k, types, payloads = [], [], [], []
    for run_id, _token, events in valid:
        for j, (t, payload) in enumerate(events, start=1):
            run_ids.append(run_id)
            k.append(j)
            types.append(t)
            payloads.append(payload)
    return [
        [run_id for run_id, _t, _e in valid],
        [token for _r, token, _e in valid],
        [len(events) for _r, _t, events in valid],
        list(Run.ACTIVE),
        now,
        run_ids,
        k,
        types,
        payloads,
    ]


def run_positions(*, run_ids: list[str]) -> dict[str, tuple[int, int, str]]:
    """`{run_id: (last_seq, fencing_token, status)}`: where each run's journal stands.

    A writer whose append met a connection error reads this before it tries
    again: the append committed if and only if `last_seq` moved by its batch
    under its token (seqs are taken in the same transaction as the rows).
    """
    rows = Run.objects.filter(id__in=run_ids).values_list(
        "id", "last_seq", "fencing_token", "status"
    )
    return {run_id: (seq, token, status) for run_id, seq, token, status in rows}
