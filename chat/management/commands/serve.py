"""`manage.py serve`: the embedded deployment in one process.

daphne serves HTTP and WebSockets; the turn worker runs in the same event loop
unless `--no-worker` (or HERMES_EMBEDDED_WORKER=false) is given.
"""

import asyncio
import logging

from daphne.server import Server  # first: daphne installs its asyncio reactor
from django.conf import settings
from django.core.management.base import BaseCommand
from twisted.internet import defer, reactor

from chat.providers import registry
from chat.worker import Worker
from hermes_site.asgi import application

log = logging.getLogger(__name__)

SHUTDOWN_GRACE_S = 20.0  # runs in flight may finish; the rest are settled


class Command(BaseCommand):
    help = "Run Hermes: web server and (by default) the turn worker, in one process."

    def add_arguments(self, parser):
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=8000)
        parser.add_argument("--no-worker", action="store_true", help="web server only")

    def handle(self, *args, host, port, no_worker, **options):
        embedded = settings.HERMES["EMBEDDED_WORKER"] and not no_worker
        worker = Worker() if embedded else None

        def ready() -> None:
            if worker is None:
                return
            loop = asyncio.get_event_loop()
            loop.call_soon(lambda: loop.create_task(worker.start()))
            # zope.interface methods have no `self`: mypy shifts the arguments.
            reactor.addSystemEventTrigger(
                "before",
                "shutdown",  # type: ignore[arg-type]
                lambda: defer.Deferred.fromFuture(
                    asyncio.ensure_future(worker.stop(SHUTDOWN_GRACE_S))
                ),
            )

        self.stdout.write(
            f"Hermes at http://{host}:{port}/ "
            f"(default model: {registry.default_model()}; "
            f"worker: {'in-process' if worker else 'none'})"
        )
        Server(
            application=application,
            endpoints=[f"tcp:port={port}:interface={host}"],
            ready_callable=ready,
        ).run()
