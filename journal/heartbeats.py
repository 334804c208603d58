"""Worker heartbeats: which turn workers are alive, for `/healthz` and `/metrics`.

Each worker records a beat on every lease heartbeat (`chat.worker`), so a worker
in any process or on any machine is seen through the database alone.
"""

from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db.models import Count, Sum
from django.utils import timezone

from .models import WorkerHeartbeat


def worker_beat(*, worker_id: str, active_runs: int) -> None:
    """Record that `worker_id` is alive and holds `active_runs` runs (one upsert)."""
    WorkerHeartbeat.objects.update_or_create(
        worker_id=worker_id,
        defaults={"seen_at": timezone.now(), "active_runs": active_runs},
    )


@dataclass(frozen=True)
class WorkersSeen:
    alive: int
    active_runs: int
    last_seen_at: datetime | None


def workers_seen(*, max_age_s: float) -> WorkersSeen:
    """Workers that beat within `max_age_s` seconds, and the runs they hold."""
    recent = WorkerHeartbeat.objects.filter(
        seen_at__gte=timezone.now() - timedelta(seconds=max_age_s)
    )
    totals = recent.aggregate(alive=Count("worker_id"), runs=Sum("active_runs"))
    last = (
        WorkerHeartbeat.objects.order_by("-seen_at")
        .values_list("seen_at", flat=True)
        .first()
    )
    return WorkersSeen(totals["alive"] or 0, totals["runs"] or 0, last)


def heartbeats_prune(*, before: datetime) -> int:
    """Forget workers not seen since `before` (every process start adds a row)."""
    deleted, _ = WorkerHeartbeat.objects.filter(seen_at__lt=before).delete()
    return deleted
