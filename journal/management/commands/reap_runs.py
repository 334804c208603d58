"""`manage.py reap_runs`: settle runs whose worker is gone (interrupted/lost-worker)."""

from asgiref.sync import async_to_sync
from django.core.management.base import BaseCommand

from journal.leases import reap_lost_runs
from journal.publish import publish


class Command(BaseCommand):
    help = "Settle every running run whose lease has expired."

    def handle(self, *args, **options):
        settled = reap_lost_runs()
        for run_id, records in settled:
            async_to_sync(publish)(run_id, records)
            if records and records[-1].type == "end":
                self.stdout.write(f"settled {run_id}: interrupted / lost-worker")
            else:
                self.stdout.write(f"queued {run_id} again: another worker re-attaches")
        self.stdout.write(f"{len(settled)} run(s) settled")
