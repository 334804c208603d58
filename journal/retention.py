"""Journal retention: delete the events of runs that ended long ago.
See docs/architecture.md §5, §7.

A pruned run keeps its row (status, `last_seq`, its subject) and gets
`pruned_at`; its readers get 410 Gone. What the app that started the run kept
of it (chat's turn and session transcript) is never touched here: those are not
journal rows. Only terminal runs are pruned: an active run's journal is never
cut.

Crash-safe order: a run's events are deleted in batches, and `pruned_at` is set
in the transaction that deletes the last batch, so an interrupted prune leaves
the run eligible and the next prune finishes it. Event counts come from
`last_seq` (seqs are 1..last_seq without holes): nothing counts the journal.
"""

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import transaction
from django.db.models import Sum
from django.utils import timezone

from .models import Event, Run

BATCH = 5000  # events deleted per transaction: short write locks on SQLite
RUN_PAGE = 500  # runs read per query when listing what to prune

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_duration(text: str) -> timedelta:
    """`30d`, `12h`, `90m`, `45s`, `2w` -> timedelta; ValueError otherwise."""
    match = _DURATION.match(text or "")
    if not match:
        raise ValueError(f"not a duration: {text!r} (use e.g. 30d, 12h, 90m, 45s, 2w)")
    return timedelta(seconds=float(match[1]) * _UNIT_S[match[2]])


def prunable(*, cutoff: datetime):
    """Terminal, not yet pruned runs that ended before `cutoff`."""
    return Run.objects.exclude(status__in=Run.ACTIVE).filter(
        ended_at__lt=cutoff, pruned_at__isnull=True
    )


@dataclass(frozen=True)
class PruneTotals:
    runs: int
    events: int


def prune_plan(*, cutoff: datetime) -> PruneTotals:
    """What a prune with this cutoff would delete (two aggregate queries on runs)."""
    totals = prunable(cutoff=cutoff).aggregate(events=Sum("last_seq"))
    return PruneTotals(prunable(cutoff=cutoff).count(), totals["events"] or 0)


def prunable_runs(*, cutoff: datetime) -> Iterator[tuple[str, datetime, int]]:
    """(run id, ended_at, events) of every prunable run, read in pages by id."""
    after = ""
    while True:
        page = list(
            prunable(cutoff=cutoff)
            .filter(id__gt=after)
            .order_by("id")
            .values_list("id", "ended_at", "last_seq")[:RUN_PAGE]
        )
        yield from page
        if len(page) < RUN_PAGE:
            return
        after = page[-1][0]


def run_prune(*, run_id: str, batch: int = BATCH) -> int | None:
    """Delete one terminal run's events in batches, then mark it pruned.

    Returns the number of events deleted, or None if the run was not prunable
    (active, or already pruned).
    """
    row = (
        Run.objects.filter(id=run_id).values("status", "last_seq", "pruned_at").first()
    )
    if row is None or row["status"] in Run.ACTIVE or row["pruned_at"] is not None:
        return None
    deleted, low = 0, 0
    while low + batch < row["last_seq"]:
        with transaction.atomic():
            deleted += Event.objects.filter(
                run_id=run_id, seq__gt=low, seq__lte=low + batch
            ).delete()[0]
        low += batch
    with transaction.atomic():
        deleted += Event.objects.filter(run_id=run_id, seq__gt=low).delete()[0]
        Run.objects.filter(id=run_id, pruned_at__isnull=True).update(
            pruned_at=timezone.now()
        )
    return deleted


def journal_prune(
    *,
    cutoff: datetime,
    batch: int = BATCH,
    on_run: Callable[[str, int], None] | None = None,
) -> PruneTotals:
    """Prune every run ended before `cutoff`; `on_run(run_id, events)` after each."""
    runs = events = 0
    for run_id, _ended_at, _last_seq in prunable_runs(cutoff=cutoff):
        deleted = run_prune(run_id=run_id, batch=batch)
        if deleted is None:
            continue
        runs += 1
        events += deleted
        if on_run is not None:
            on_run(run_id, deleted)
    return PruneTotals(runs, events)
