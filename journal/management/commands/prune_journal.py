"""`manage.py prune_journal --older-than 30d [--for-real]`: journal retention.

A thin shell over `journal.retention`. A dry run unless `--for-real`: it prints
what would go and changes nothing.
"""

from itertools import islice

from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from journal.heartbeats import heartbeats_prune
from journal.retention import (
    BATCH,
    journal_prune,
    parse_duration,
    prunable_runs,
    prune_plan,
)

SHOWN = 20  # runs listed by a dry run at the default verbosity


class Command(BaseCommand):
    help = (
        "Delete the journal events of runs that ended before a cutoff; the runs and "
        "the session transcripts stay. Dry run unless --for-real."
    )

    def add_arguments(self, parser):
        parser.add_argument(
            "--older-than",
            required=True,
            metavar="DURATION",
            help="prune runs that ended longer ago than this: 30d, 12h, 90m, 2w",
        )
        parser.add_argument(
            "--for-real", action="store_true", help="delete (default: dry run)"
        )
        parser.add_argument(
            "--batch-size",
            type=int,
            default=BATCH,
            help="events deleted per transaction",
        )

    def handle(self, *args, older_than, for_real, batch_size, verbosity, **options):
        try:
            age = parse_duration(older_than)
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        if age.total_seconds() <= 0:
            raise CommandError("--older-than must be longer than 0")
        if batch_size < 1:
            raise CommandError("--batch-size must be at least 1")
        cutoff = timezone.now() - age
        if not for_real:
            self._dry_run(cutoff, verbosity)
            return

        def report(run_id: str, events: int) -> None:
            if verbosity >= 2:
                self.stdout.write(f"pruned {run_id}: {events} event(s)")

        totals = journal_prune(cutoff=cutoff, batch=batch_size, on_run=report)
        forgotten = heartbeats_prune(before=cutoff)
        self.stdout.write(
            f"pruned {totals.runs} run(s), {totals.events} event(s) of runs ended "
            f"before {cutoff.isoformat()}; forgot {forgotten} old worker heartbeat(s)"
        )

    def _dry_run(self, cutoff, verbosity: int) -> None:
        plan = prune_plan(cutoff=cutoff)
        self.stdout.write(
            f"dry run: would prune {plan.runs} run(s), {plan.events} event(s) of runs "
            f"ended before {cutoff.isoformat()}"
        )
        shown = None if verbosity >= 2 else SHOWN
        for run_id, ended_at, events in islice(prunable_runs(cutoff=cutoff), shown):
            self.stdout.write(
                f"  {run_id}  ended {ended_at.isoformat()}  {events} event(s)"
            )
        if shown is not None and plan.runs > shown:
            self.stdout.write(f"  … and {plan.runs - shown} more (-v 2 lists them all)")
        if plan.runs:
            self.stdout.write("nothing was changed; run again with --for-real to prune")
        else:
            self.stdout.write("nothing to prune")
