"""Leases and fencing: who may write a run, and settling runs nobody holds.
See docs/architecture.md §4, §6.

A claim sets a lease and bumps the fencing token; the holder renews the lease
while it works. Anyone may take over a run whose lease expired: the takeover
bumps the token again, so the old holder's appends are rejected from then on.

A lease must not lapse *because the database was away*: a worker cannot renew
while it cannot reach the database, so after an outage every lease may look
expired. Two rules keep live workers' runs (the "grace"):

- a worker renews its leases as soon as the database answers again (it tries
  every `RENEW_RETRY_S` during an outage, chat.worker);
- nobody takes a run over as lost (`runs_lost`, `run_settle(only_if_lost=True)`)
  within one lease of this process's own last trouble reaching the database
  (`dbpool.since_trouble()`), nor, during the first lease after the database
  (re)started (PostgreSQL's `pg_postmaster_start_time()`), a run whose lease
  was last renewed before that start (`lost_lease`).

So a worker has a whole lease after any outage to renew, exactly as after a
claim; a worker that is really gone is settled one lease later than usual.

A lost run whose journal ends in an open upstream stream (`open_upstream`: its
last event other than text and re-attach notices is an `upstream` cursor) is
not settled but queued again, at most `MAX_REQUEUES` times, with a status
saying so: the worker that claims it re-attaches to the response its provider
keeps upstream (docs/architecture.md, "Two cursors").
A worker asked to stop hands each run it holds over (`run_hand_over`): one
fenced transaction journals why, bumps the token and queues the run again, and
another worker claims it and resumes it from the journal, as it would a lost
worker's run; only a worker that sees no other alive (`other_workers_alive`)
ends its runs instead (chat.worker).
Lease times are the processes' clocks (keep them in sync with NTP); the
fencing token, not the clock, is what guarantees a taken-over worker writes
nothing.
"""

import json
import logging
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Case, Count, F, IntegerField, Min, Q, Value, When
from django.utils import timezone

from . import dbpool
from .events import REATTACH_STATUS
from .models import Event, Run, WorkerHeartbeat
from .signals import run_settled, run_settling
from .store import AppendRejected, Record, append

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Claim:
    run_id: str
    token: int


def _busy_owners() -> dict[int, int]:
    """Running runs per owner (few rows: at most every worker's concurrency)."""
    return dict(
        Run.objects.filter(status=Run.Status.RUNNING)
        .order_by()
        .values_list("owner_id")
        .annotate(n=Count("id"))
        .values_list("owner_id", "n")
    )


_CLAIM_LOCKS = 0x4845  # advisory lock space of per-owner claims ("HE")
CLAIM_TRIES = 4  # owners passed over (at the limit, or being claimed) per claim


def _queued_fairly(busy: dict[int, int], skip: set[int]):
    """Queued runs, fewest running runs of their owner first, then oldest."""
    queued = Run.objects.filter(status=Run.Status.QUEUED).exclude(owner_id__in=skip)
    if not busy:
        return queued.order_by("created_at")
    load = Case(
        *(When(owner_id=owner, then=Value(n)) for owner, n in busy.items()),
        default=Value(0),
        output_field=IntegerField(),
    )
    return queued.annotate(load=load).order_by("load", "created_at")


def _owner_has_room(owner_id: int, limit: int) -> bool:
    """PostgreSQL: whether this transaction may start another run of the owner.

    Concurrent claims see the same committed counts, so each would take one
    more of the owner's runs. A transaction-scoped advisory lock per owner
    makes them take turns: the holder recounts, and a claim that finds the lock
    taken passes the owner over (no waiting, so no deadlock between claims).
    """
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_try_advisory_xact_lock(%s, %s)",
            [_CLAIM_LOCKS, owner_id % 2**31],
        )
        if not cursor.fetchone()[0]:
            return False
    running = Run.objects.filter(owner_id=owner_id, status=Run.Status.RUNNING)
    return running.count() < limit


def run_claim_next(
    *, worker_id: str, lease_s: float, per_owner_limit: int | None = None
) -> Claim | None:
    """Claim the next queued run fairly, or None.

    The next run is the oldest queued run of the owners with the fewest running
    runs, among owners under `per_owner_limit` running runs (None: no limit):
    one owner's backlog never delays another owner's first run by more than
    one claim, and an owner at the limit waits while others go first.

    PostgreSQL: `SELECT … FOR UPDATE SKIP LOCKED`, so concurrent workers never
    wait on each other, and a per-owner advisory lock keeps concurrent claims
    from passing the limit together (`_owner_has_room`). SQLite: the IMMEDIATE
    transaction serialises writers, and the conditional UPDATE below decides.
    """
    postgres = connection.vendor == "postgresql"
    with transaction.atomic():
        busy = _busy_owners()
        skip: set[int] = set()
        if per_owner_limit is not None:
            skip = {owner for owner, n in busy.items() if n >= per_owner_limit}
        for _attempt in range(CLAIM_TRIES):
            queued = _queued_fairly(busy, skip)
            if connection.features.has_select_for_update_skip_locked:
                queued = queued.select_for_update(skip_locked=True, of=("self",))
            pick = queued.values_list("id", "owner_id").first()
            if pick is None:
                return None
            run_id, owner_id = pick
            if per_owner_limit is None or not postgres:
                break
            if _owner_has_room(owner_id, per_owner_limit):
                break
            skip.add(owner_id)
        else:
            return None  # the next poll or nudge tries again
        now = timezone.now()
        taken = Run.objects.filter(id=run_id, status=Run.Status.QUEUED).update(
            status=Run.Status.RUNNING,
            fencing_token=F("fencing_token") + 1,
            lease_owner=worker_id,
            lease_expires_at=now + timedelta(seconds=lease_s),
            started_at=now,
        )
        if not taken:
            return None
        token = Run.objects.values_list("fencing_token", flat=True).get(id=run_id)
    return Claim(run_id, token)


def claims_held_by(*, worker_id: str) -> list[Claim]:
    """The running runs this worker claimed (after a claim whose answer was lost)."""
    rows = Run.objects.filter(
        status=Run.Status.RUNNING, lease_owner=worker_id
    ).values_list("id", "fencing_token")
    return [Claim(run_id, token) for run_id, token in rows]


RENEW_BATCH = 200  # claims per UPDATE (two parameters each)


def lease_renew(*, claims: list[Claim], lease_s: float) -> set[str]:
    """Extend the leases still held; return the ids of runs whose lease was lost.

    One UPDATE per `RENEW_BATCH` claims, each run fenced by its own token; only
    when fewer rows than claims were renewed does a read say which were lost.
    """
    expires = timezone.now() + timedelta(seconds=lease_s)
    lost: set[str] = set()
    for i in range(0, len(claims), RENEW_BATCH):
        batch = claims[i : i + RENEW_BATCH]
        held = Q()
        for claim in batch:
            held |= Q(id=claim.run_id, fencing_token=claim.token)
        mine = Run.objects.filter(held, status=Run.Status.RUNNING)
        if mine.update(lease_expires_at=expires) < len(batch):
            still = set(mine.values_list("id", flat=True))
            lost |= {c.run_id for c in batch if c.run_id not in still}
    return lost


def run_hand_over(*, run_id: str, token: int, events: list) -> list[Record]:
    """Give a running run back to the queue, journal position and all.

    A worker that is stopping calls this for each run it holds instead of
    ending it: `events` (a status saying why) are appended under `token`, the
    token is bumped (nothing of the old claim can write again) and the run is
    queued with no holder, so the next worker's claim resumes it from its
    journal (chat.runner: no second `start`; the text shown so far stays).
    AppendRejected if the claim no longer holds the run.
    """
    with transaction.atomic():
        records = append(run_id=run_id, token=token, events=events)
        moved = Run.objects.filter(
            id=run_id, fencing_token=token, status=Run.Status.RUNNING
        ).update(
            status=Run.Status.QUEUED,
            fencing_token=F("fencing_token") + 1,
            lease_owner="",
            lease_expires_at=None,
        )
        if not moved:
            raise AppendRejected(run_id, "lease lost")
    log.info("run handed over run_id=%s", run_id)
    return records


def handed_unclaimed(*, claims: list[Claim]) -> list[Claim]:
    """Of runs handed over under `claims`, those no worker has claimed since:
    still queued with the token the hand-over gave them."""
    if not claims:
        return []
    held = Q()
    for claim in claims:
        held |= Q(id=claim.run_id, fencing_token=claim.token + 1)
    rows = Run.objects.filter(held, status=Run.Status.QUEUED).values_list(
        "id", "fencing_token"
    )
    return [Claim(run_id, token) for run_id, token in rows]


def other_workers_alive(*, worker_id: str, max_age_s: float) -> int:
    """Workers other than `worker_id` that beat within `max_age_s` seconds."""
    since = timezone.now() - timedelta(seconds=max_age_s)
    return (
        WorkerHeartbeat.objects.filter(seen_at__gte=since)
        .exclude(worker_id=worker_id)
        .count()
    )


def worker_leaves(*, worker_id: str) -> None:
    """Forget a stopping worker's heartbeat: no one hands it a run any more."""
    WorkerHeartbeat.objects.filter(worker_id=worker_id).delete()


def cancel_requested(*, run_ids: list[str]) -> set[str]:
    return set(
        Run.objects.filter(
            id__in=run_ids, cancel_requested_at__isnull=False
        ).values_list("id", flat=True)
    )


def lost_lease(now: datetime) -> Q | None:
    """Which running runs count as lost at `now`; None: none may (an outage grace).

    A lapsed lease, except within one lease of this process's own last trouble
    reaching the database, and except a lease renewed before the database
    (re)started while it has been up for less than one lease: its worker may
    not have had the chance to renew it yet.
    """
    lease = timedelta(seconds=settings.HERMES["LEASE_S"])
    if dbpool.since_trouble() < lease.total_seconds():
        return None
    lost = Q(status=Run.Status.RUNNING, lease_expires_at__lt=now)
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_postmaster_start_time()")
            (started,) = cursor.fetchone()
        if now < started + lease:  # leases end at renewal + one lease
            lost &= Q(lease_expires_at__gte=started + lease)
    return lost


def next_lease_expiry() -> datetime | None:
    """When the first lease of a running run lapses (the reaper sleeps until then)."""
    return Run.objects.filter(
        status=Run.Status.RUNNING, lease_expires_at__isnull=False
    ).aggregate(first=Min("lease_expires_at"))["first"]


def _take_over(
    *, run_id: str, by: str, only_if_lost: bool, token: int | None = None
) -> int | None:
    """Bump the token of an active run so its holder can no longer write.

    `token`: only if the run still has this fencing token (its holder settles).
    """
    now = timezone.now()
    active = Q(id=run_id, status__in=Run.ACTIVE)
    if token is not None:
        active &= Q(fencing_token=token)
    if only_if_lost:
        lost = lost_lease(now)
        if lost is None:
            return None
        active &= lost
    taken = Run.objects.filter(active).update(
        fencing_token=F("fencing_token") + 1, lease_owner=by, lease_expires_at=None
    )
    if not taken:
        return None
    return Run.objects.values_list("fencing_token", flat=True).get(id=run_id)


MAX_REQUEUES = 2  # takeovers that re-attach, per run; then a lost run is settled


def open_upstream(run_id: str) -> Event | None:
    """The run's last `upstream` event, if nothing but text and re-attach
    notices followed it (the stream it points at was still being read)."""
    later = (
        Event.objects.filter(run_id=run_id)
        .exclude(type__in=("token", "reasoning"))
        .order_by("-seq")
    )
    for event in later.iterator(chunk_size=16):
        if event.type == "upstream":
            return event
        if event.type != "status" or not _is_reattach_notice(event.payload):
            return None
    return None


def _is_reattach_notice(payload: str) -> bool:
    return json.loads(payload).get("message", "").startswith(REATTACH_STATUS)


def _requeue_to_reattach(run_id: str, token: int, by: str) -> list[Record] | None:
    """Queue a lost run again for another worker to re-attach, if it can be."""
    if open_upstream(run_id) is None:
        return None
    notices = Event.objects.filter(
        run_id=run_id, type="status", payload__contains="after the worker was lost"
    ).count()
    if notices >= MAX_REQUEUES:
        return None
    message = (
        f"{REATTACH_STATUS} after the worker was lost ({notices + 1}/{MAX_REQUEUES})"
    )
    records = append(
        run_id=run_id, token=token, events=[("status", {"message": message})]
    )
    Run.objects.filter(id=run_id, fencing_token=token).update(
        status=Run.Status.QUEUED, lease_owner="", lease_expires_at=None
    )
    log.info("lost run queued again to re-attach run_id=%s by=%s", run_id, by)
    return records


def run_settle(
    *,
    run_id: str,
    status: str,
    terminal_state: str,
    by: str,
    only_if_lost: bool = True,
    error: dict | None = None,
    token: int | None = None,
    retryable: bool = False,
) -> list[Record]:
    """Settle a run nobody may be writing, with exactly one `end`.

    With `only_if_lost` the run is settled only if its lease has expired (the
    reaper, a waiting reader) and no outage grace applies. With `token`, only
    if the run still has that fencing token (its own worker gives up on it).
    Receivers of `run_settling` keep what the run produced (the chat app keeps
    the partial answer) in the same transaction; one that fails is logged and
    skipped, so a run can always be settled; receivers of `run_settled` hear
    of the end in the same transaction, after it. With `error`, an `error` event
    (`retryable` as given) precedes the `end`.
    A lost run (`only_if_lost`, `interrupted`) whose journal ends in an open
    upstream stream is queued again instead (`_requeue_to_reattach`).
    Returns the records to publish, or [] if the run was not settled here.
    """
    with transaction.atomic():
        token = _take_over(run_id=run_id, by=by, only_if_lost=only_if_lost, token=token)
        if token is None:
            return []
        if only_if_lost and status == Run.Status.INTERRUPTED:
            requeued = _requeue_to_reattach(run_id, token, by)
            if requeued is not None:
                return requeued
        message_id = _keep_what_was_shown(run_id, status)
        payload: dict = {
            "status": status,
            "terminal_state": terminal_state,
            "message_id": message_id,
        }
        events = []
        if error:
            payload["error"] = error
            events.append(("error", {**error, "retryable": retryable}))
        events.append(("end", payload))
        try:
            records = append(run_id=run_id, token=token, events=events)
        except AppendRejected:  # settled by someone else in between
            return []
        _tell_settled(run_id, status)
    log.info(
        "run settled run_id=%s status=%s state=%s by=%s",
        run_id,
        status,
        terminal_state,
        by,
    )
    return records


def _keep_what_was_shown(run_id: str, status: str) -> int | None:
    message_id: int | None = None
    try:
        with transaction.atomic():  # a savepoint: a failing receiver undoes only itself
            for _receiver, result in run_settling.send(
                sender=Run, run_id=run_id, status=status
            ):
                if isinstance(result, int):
                    message_id = result
    except Exception:
        log.exception("keeping the answer of a settled run failed run_id=%s", run_id)
        return None
    return message_id


def _tell_settled(run_id: str, status: str) -> None:
    try:
        with transaction.atomic():  # a savepoint, as for `run_settling`
            run_settled.send(sender=Run, run_id=run_id, status=status)
    except Exception:
        log.exception("a run_settled receiver failed run_id=%s", run_id)


def runs_lost(*, limit: int = 100) -> list[str]:
    """Ids of running runs whose lease has expired (see `lost_lease`)."""
    lost = lost_lease(timezone.now())
    if lost is None:
        return []
    return list(Run.objects.filter(lost).values_list("id", flat=True)[:limit])


def reap_lost_runs() -> list[tuple[str, list[Record]]]:
    """Settle every run whose worker is gone: `interrupted` / `lost-worker`."""
    settled = []
    for run_id in runs_lost():
        try:
            records = run_settle(
                run_id=run_id,
                status=Run.Status.INTERRUPTED,
                terminal_state="lost-worker",
                by="reaper",
            )
        except Exception as exc:  # one run must not stop the others being reaped
            if dbpool.is_connection_error(exc):
                raise
            log.exception("settling a lost run failed run_id=%s", run_id)
            continue
        if records:
            settled.append((run_id, records))
    return settled
