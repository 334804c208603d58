"""`manage.py worker`: a turn-worker process for the scale-out deployment."""

import asyncio
import signal

from django.core.management.base import BaseCommand

from chat.worker import Worker
from journal import dbpool


class Command(BaseCommand):
    help = "Run model turns: claim queued runs and stream them into the journal."

    def add_arguments(self, parser):
        parser.add_argument(
            "--concurrency", type=int, default=None, help="runs at once"
        )
        parser.add_argument(
            "--grace",
            type=float,
            default=30.0,
            help="seconds runs may finish after SIGTERM",
        )

    def handle(self, *args, concurrency, grace, **options):
        asyncio.run(self._main(concurrency, grace))
        dbpool.shutdown()

    async def _main(self, concurrency, grace) -> None:
        worker = Worker(concurrency=concurrency)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await worker.start()
        self.stdout.write(
            f"worker {worker.worker_id} running ({worker.concurrency} at once)"
        )
        self.stdout.flush()
        await stop.wait()
        self.stdout.write("stopping: no new runs; finishing those in flight")
        await worker.stop(grace)
