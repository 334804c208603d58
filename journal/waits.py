"""Runs that wait for a decision from outside. See docs/architecture.md §6
("Waiting runs").

1. A worker that cannot go on without a decision (chat: a person approving a
   tool call) ends its attempt with `run_wait`: one fenced append journals what
   the run waits for and sets it `waiting`, with no lease and a deadline. The
   worker then lets go of it: no slot, no provider connection, no renewals.
2. Nobody holds a waiting run, so nothing can lapse: the lease reaper and the
   readers' lease checks only look at `running` runs.
3. `run_resume` takes the run over (its fencing token grows, so nothing the
   old claim held can write again), journals the decision and puts the run
   back in the queue, in one transaction; any worker claims it from there
   (the token grows again).
4. `reap_expired_waits` settles a run still waiting at its deadline, fenced by
   the token it read, so a decision landing at that moment wins or loses whole.
"""

from datetime import datetime

from django.db import transaction
from django.db.models import F, Min
from django.utils import timezone

from .leases import Claim, run_settle
from .models import Run
from .store import Record, append

WAIT_REAP_BATCH = 100  # expired waits settled per reaper pass


def run_wait(
    *, claim: Claim, events: list[tuple[str, dict]], until: datetime
) -> list[Record]:
    """Journal `events` and release the run into `waiting` until a decision.

    Raises `AppendRejected` (and writes nothing) if the claim no longer holds
    the run.
    """
    return append(
        run_id=claim.run_id,
        token=claim.token,
        events=events,
        run_fields={
            "status": Run.Status.WAITING,
            "lease_owner": "",
            "lease_expires_at": None,
            "wait_expires_at": until,
        },
    )


def run_resume(*, run_id: str, events: list[tuple[str, dict]], by: str) -> list[Record]:
    """Journal a decision and queue the waiting run again; [] if it was not waiting.

    Call it inside the caller's transaction when the decision has effects of
    its own (they then commit with it, or not at all).
    """
    with transaction.atomic():
        taken = Run.objects.filter(id=run_id, status=Run.Status.WAITING).update(
            fencing_token=F("fencing_token") + 1, lease_owner=by
        )
        if not taken:
            return []
        token = Run.objects.values_list("fencing_token", flat=True).get(id=run_id)
        return append(
            run_id=run_id,
            token=token,
            events=events,
            run_fields={"status": Run.Status.QUEUED, "wait_expires_at": None},
        )


def next_wait_expiry() -> datetime | None:
    """When the first waiting run's deadline passes (the reaper wakes then)."""
    return Run.objects.filter(
        status=Run.Status.WAITING, wait_expires_at__isnull=False
    ).aggregate(first=Min("wait_expires_at"))["first"]


def reap_expired_waits(
    *, terminal_state: str, error: dict
) -> list[tuple[str, list[Record]]]:
    """Settle every run still waiting past its deadline: `failed` with `error`."""
    expired = Run.objects.filter(
        status=Run.Status.WAITING, wait_expires_at__lt=timezone.now()
    ).values_list("id", "fencing_token")[:WAIT_REAP_BATCH]
    settled = []
    for run_id, token in list(expired):
        records = run_settle(
            run_id=run_id,
            status=Run.Status.FAILED,
            terminal_state=terminal_state,
            by="reaper",
            only_if_lost=False,
            token=token,
            error=error,
        )
        if records:
            settled.append((run_id, records))
    return settled
