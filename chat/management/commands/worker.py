"""`manage.py worker`: a turn-worker process for the scale-out deployment.

It serves no web pages; with `--metrics-port` (or HERMES_WORKER_METRICS_PORT)
it serves its own Prometheus metrics (`journal.metrics`: events appended,
first-token latency, model requests) at `http://HOST:PORT/metrics`, on
127.0.0.1 unless `--metrics-host` (HERMES_WORKER_METRICS_HOST) says otherwise.
Port 0 takes a free port; the start line names it.

With `--processes N` (N > 1) it supervises N such processes instead
(chat.supervisor): starts a dead one again, passes SIGTERM/SIGINT through.
Child i of a supervisor serves its metrics on `--metrics-port` + i (each on a
free port if 0).
"""

import asyncio
import os
import signal
import sys

from django.conf import settings
from django.core.management.base import BaseCommand

from chat.supervisor import Supervisor
from chat.worker import Worker
from hermes_site.heap import freeze_startup_heap, pace_full_collections
from journal import dbpool, metrics


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
        parser.add_argument(
            "--metrics-port",
            type=int,
            default=settings.HERMES["WORKER_METRICS_PORT"],
            help="serve Prometheus metrics on this port (0: any free one)",
        )
        parser.add_argument(
            "--metrics-host",
            default=settings.HERMES["WORKER_METRICS_HOST"],
            help="address the metrics port listens on",
        )
        parser.add_argument(
            "--processes",
            type=int,
            default=1,
            help="worker processes to run and supervise (each on a core of its own)",
        )

    def handle(
        self, *args, concurrency, grace, metrics_port, metrics_host, processes, **opts
    ):
        if processes > 1:
            argvs = [
                _child_argv(i, concurrency, grace, metrics_port, metrics_host)
                for i in range(processes)
            ]
            code = Supervisor(argvs, grace_s=grace, out=self.stdout).run()
            if code:
                raise SystemExit(code)
            return
        if metrics_port is not None:
            port = metrics.serve(metrics_port, metrics_host)
            self.stdout.write(f"metrics at http://{metrics_host}:{port}/metrics")
        freeze_startup_heap()
        pace_full_collections()
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


def _child_argv(
    i: int, concurrency, grace: float, metrics_port, metrics_host
) -> list[str]:
    """The command line of a supervisor's child `i`: this one, minus `--processes`."""
    argv = [sys.executable, os.path.abspath(sys.argv[0]), "worker"]
    argv += ["--grace", str(grace)]
    if concurrency:
        argv += ["--concurrency", str(concurrency)]
    if metrics_port is not None:
        port = metrics_port + i if metrics_port else 0
        argv += ["--metrics-port", str(port), "--metrics-host", metrics_host]
    return argv
