"""Runs and their append-only event journals (docs/architecture.md §2).

Only `journal.store` writes `Event` rows and the journal fields of `Run`.
"""

from django.conf import settings
from django.db import connections, models
from django.db.models.signals import pre_delete
from django.dispatch import receiver
from ulid import ULID


def new_run_id() -> str:
    return f"run_{ULID()}"


class Run(models.Model):
    class Status(models.TextChoices):
        QUEUED = "queued"
        RUNNING = "running"
        COMPLETED = "completed"
        FAILED = "failed"
        CANCELLED = "cancelled"
        INTERRUPTED = "interrupted"
        # Released by its worker until an outside decision puts it back in the
        # queue (`journal.leases.run_wait`, `run_resume`): no lease, no slot.
        WAITING = "waiting"

    ACTIVE = (Status.QUEUED, Status.RUNNING, Status.WAITING)

    id = models.CharField(primary_key=True, max_length=40, default=new_run_id)
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="runs"
    )
    # What the run is about, opaque to the journal ("chat.session:12"): the
    # app that starts runs names it and keeps its own row for the rest.
    subject = models.CharField(max_length=200, blank=True, db_index=True)
    status = models.CharField(
        max_length=16, choices=Status.choices, default=Status.QUEUED, db_index=True
    )
    terminal_state = models.CharField(max_length=40, blank=True, db_index=True)
    last_seq = models.PositiveIntegerField(default=0)
    lease_owner = models.CharField(max_length=120, blank=True)
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    # Grows on every claim; every append names the token it holds.
    fencing_token = models.PositiveBigIntegerField(default=0)
    cancel_requested_at = models.DateTimeField(null=True, blank=True)
    # A waiting run not resumed by then is settled (`reap_expired_waits`).
    wait_expires_at = models.DateTimeField(null=True, blank=True)
    # How the run ended, when it failed: written with its `end`.
    error_category = models.CharField(max_length=32, blank=True)
    error_message = models.TextField(blank=True)
    pruned_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    started_at = models.DateTimeField(null=True, blank=True)
    ended_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        indexes = [models.Index(fields=["status", "created_at"])]

    def __str__(self) -> str:
        return self.id

    @property
    def is_terminal(self) -> bool:
        return self.status not in self.ACTIVE


class Event(models.Model):
    """One journaled event. `payload` is JSON text, written to the wire as is."""

    id = models.BigAutoField(primary_key=True)
    # No index of its own: `event_unique_run_seq` leads with the run and
    # serves every lookup by run; a second index on it only doubled what each
    # append writes (docs/benchmarks.md). No constraint in the database
    # either: its check of every inserted row against its run was up to a
    # quarter of PostgreSQL's work on a tick (docs/benchmarks.md, findings 25
    # and 27). Rows are inserted only under their run's fenced UPDATE of its
    # row (`journal.store`), and a run's row is locked before anything of it
    # is deleted (`_lock_run_before_delete`): no event outlives its run.
    run = models.ForeignKey(
        Run,
        on_delete=models.CASCADE,
        related_name="events",
        db_index=False,
        db_constraint=False,
    )
    seq = models.PositiveIntegerField()
    type = models.CharField(max_length=24)
    payload = models.TextField()
    created_at = models.DateTimeField()

    class Meta:
        ordering = ["run", "seq"]
        constraints = [
            models.UniqueConstraint(fields=["run", "seq"], name="event_unique_run_seq"),
            models.CheckConstraint(
                condition=models.Q(seq__gte=1), name="event_seq_gte_1"
            ),
            # Exactly one terminal event per run, whoever writes it.
            models.UniqueConstraint(
                fields=["run"],
                condition=models.Q(type="end"),
                name="event_one_end_per_run",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.run_id}:{self.seq}"


@receiver(pre_delete, sender=Run, dispatch_uid="journal-run-locked-before-delete")
def _lock_run_before_delete(sender, instance: Run, using: str, **kwargs) -> None:
    """Lock a run's row for the rest of the deleting transaction, before its
    events are deleted (Django sends `pre_delete` inside that transaction,
    before it deletes anything).

    With no constraint between events and runs in the database, a tick that
    took the run's seqs between the deletion of its events and that of its
    row would leave events behind. A tick takes its seqs with an UPDATE of
    the row, so it now waits for the deletion, then finds no run and writes
    nothing (`AppendRejected`). SQLite's transactions here begin IMMEDIATE:
    a deletion holds the only write lock from its start anyway, and there is
    nothing to lock (no query).
    """
    if not connections[using].features.has_select_for_update:
        return
    list(
        Run.objects.using(using)
        .select_for_update()
        .filter(pk=instance.pk)
        .values_list("pk", flat=True)
    )


class WorkerHeartbeat(models.Model):
    """The last beat of each turn worker: how `/healthz` knows runs get executed.

    Written by `journal.heartbeats.worker_beat` on every lease heartbeat; a row
    not renewed for a few heartbeats is a worker that is gone.
    """

    worker_id = models.CharField(primary_key=True, max_length=200)
    seen_at = models.DateTimeField(db_index=True)
    active_runs = models.PositiveIntegerField(default=0)

    def __str__(self) -> str:
        return self.worker_id
