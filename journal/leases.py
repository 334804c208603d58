"""Leases and fencing: who may write a run, and settling runs nobody holds (DESIGN §4, §6).

A claim sets a lease and bumps the fencing token; the holder renews the lease
while it works. Anyone may take over a run whose lease expired: the takeover
bumps the token again, so the old holder's appends are rejected from then on.
"""

import logging
from dataclasses import dataclass
from datetime import timedelta

from django.db import connection, transaction
from django.db.models import F, Q
from django.utils import timezone

from .models import Run
from .signals import run_settling
from .store import AppendRejected, Record, append

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Claim:
    run_id: str
    token: int


def run_claim_next(*, worker_id: str, lease_s: float) -> Claim | None:
    """Claim the oldest queued run, or None.

    PostgreSQL: `SELECT … FOR UPDATE SKIP LOCKED`, so concurrent workers never
    wait on each other. SQLite: the IMMEDIATE transaction serialises writers,
    and the conditional UPDATE below decides.
    """
    with transaction.atomic():
        queued = Run.objects.filter(status=Run.Status.QUEUED).order_by("created_at")
        if connection.features.has_select_for_update_skip_locked:
            queued = queued.select_for_update(skip_locked=True)
        run_id = queued.values_list("id", flat=True).first()
        if run_id is None:
            return None
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


def lease_renew(*, claims: list[Claim], lease_s: float) -> set[str]:
    """Extend the leases still held; return the ids of runs whose lease was lost."""
    expires = timezone.now() + timedelta(seconds=lease_s)
    lost = set()
    for claim in claims:
        renewed = Run.objects.filter(
            id=claim.run_id, fencing_token=claim.token, status=Run.Status.RUNNING
        ).update(lease_expires_at=expires)
        if not renewed:
            lost.add(claim.run_id)
    return lost


def cancel_requested(*, run_ids: list[str]) -> set[str]:
    return set(
        Run.objects.filter(
            id__in=run_ids, cancel_requested_at__isnull=False
        ).values_list("id", flat=True)
    )


def _take_over(*, run_id: str, by: str, only_if_lost: bool) -> int | None:
    """Bump the token of an active run so its holder can no longer write."""
    now = timezone.now()
    active = Q(id=run_id, status__in=Run.ACTIVE)
    if only_if_lost:
        active &= Q(status=Run.Status.RUNNING, lease_expires_at__lt=now)
    taken = Run.objects.filter(active).update(
        fencing_token=F("fencing_token") + 1, lease_owner=by, lease_expires_at=None
    )
    if not taken:
        return None
    return Run.objects.values_list("fencing_token", flat=True).get(id=run_id)


def run_settle(
    *,
    run_id: str,
    status: str,
    terminal_state: str,
    by: str,
    only_if_lost: bool = True,
    error: dict | None = None,
) -> list[Record]:
    """Settle a run nobody may be writing, with exactly one `end`.

    With `only_if_lost` the run is settled only if its lease has expired (the
    reaper, a waiting reader). Receivers of `run_settling` keep what the run
    produced (the chat app keeps the partial answer) in the same transaction.
    Returns the records to publish, or [] if the run was not settled here.
    """
    with transaction.atomic():
        token = _take_over(run_id=run_id, by=by, only_if_lost=only_if_lost)
        if token is None:
            return []
        message_id = None
        for _receiver, result in run_settling.send(
            sender=Run, run_id=run_id, status=status
        ):
            message_id = result if result is not None else message_id
        payload = {
            "status": status,
            "terminal_state": terminal_state,
            "message_id": message_id,
        }
        if error:
            payload["error"] = error
        try:
            records = append(run_id=run_id, token=token, events=[("end", payload)])
        except AppendRejected:  # settled by someone else in between
            return []
    log.info(
        "run settled run_id=%s status=%s state=%s by=%s",
        run_id,
        status,
        terminal_state,
        by,
    )
    return records


def runs_lost(*, limit: int = 100) -> list[str]:
    """Ids of running runs whose lease has expired."""
    return list(
        Run.objects.filter(
            status=Run.Status.RUNNING, lease_expires_at__lt=timezone.now()
        ).values_list("id", flat=True)[:limit]
    )


def reap_lost_runs() -> list[tuple[str, list[Record]]]:
    """Settle every run whose worker is gone: `interrupted` / `lost-worker`."""
    settled = []
    for run_id in runs_lost():
        records = run_settle(
            run_id=run_id,
            status=Run.Status.INTERRUPTED,
            terminal_state="lost-worker",
            by="reaper",
        )
        if records:
            settled.append((run_id, records))
    return settled
