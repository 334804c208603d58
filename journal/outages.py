"""Outages of a dependency (Redis, the database), logged once each, and backoff.

A Redis restart makes every publish and every listener of a process fail at
once, hundreds of times a second. An `Outage` turns that into two lines per
process: a warning when the first failure comes (with its traceback once) and
an info line when the next success comes, with how many failures there were
and how long it lasted. `/healthz` reads `Outage.current()` too.
"""

import logging
import random
import threading
import time

from django.db import InterfaceError, OperationalError
from django.db.backends.signals import connection_created
from django.dispatch import receiver

log = logging.getLogger(__name__)


class Outage:
    """One dependency's state in this process: up, or down since a moment."""

    _all: dict[str, "Outage"] = {}
    _lock = threading.Lock()

    def __init__(self, name: str):
        self.name = name
        self.failures = 0
        self.since: float | None = None  # monotonic start of the current outage
        self.last_error = ""

    @classmethod
    def named(cls, name: str) -> "Outage":
        with cls._lock:
            outage = cls._all.get(name)
            if outage is None:
                outage = cls._all[name] = cls(name)
            return outage

    @classmethod
    def current(cls) -> dict[str, dict]:
        """The dependencies failing now: name → failures so far and seconds down."""
        now = time.monotonic()
        return {
            o.name: {
                "failures": o.failures,
                "down_s": round(now - o.since, 1),
                "error": o.last_error,
            }
            for o in list(cls._all.values())
            if o.since is not None
        }

    @property
    def down(self) -> bool:
        return self.since is not None

    def failed(self, what: str, exc: BaseException) -> None:
        """Count a failure; the first of an outage is logged with its traceback."""
        with self._lock:
            self.failures += 1
            self.last_error = type(exc).__name__
            first = self.since is None
            if first:
                self.since = time.monotonic()
        if first:
            log.warning(
                "%s unavailable (%s: %s); logging once until it recovers",
                self.name,
                what,
                type(exc).__name__,
                exc_info=exc,
            )

    def recovered(self) -> None:
        """A success: if an outage was on, log its end with the count."""
        if self.since is None:
            return
        with self._lock:
            if self.since is None:
                return
            lasted = time.monotonic() - self.since
            failures, self.failures, self.since = self.failures, 0, None
        log.info(
            "%s recovered after %.1f s; %d failures during the outage",
            self.name,
            lasted,
            failures,
        )


# The process-wide outages every module reports to.
CHANNEL_LAYER = "channel layer"
DATABASE = "database"


def outage(name: str) -> Outage:
    return Outage.named(name)


class Backoff:
    """Exponential delays with jitter: 0.1 s, 0.2 s … up to `cap` seconds."""

    def __init__(self, *, first: float = 0.1, cap: float = 5.0):
        self.first, self.cap = first, cap
        self.attempt = 0

    def next_delay(self) -> float:
        delay = min(self.cap, self.first * (2**self.attempt))
        self.attempt += 1
        return delay * random.uniform(0.5, 1.0)

    def reset(self) -> None:
        self.attempt = 0


def _database_errors() -> tuple[type[BaseException], ...]:
    errors: list[type[BaseException]] = [OperationalError, InterfaceError]
    try:
        import psycopg
    except ImportError:  # SQLite deployments need not install the driver
        pass
    else:
        errors += [psycopg.OperationalError, psycopg.InterfaceError]
    return tuple(errors)


# What a database that is down or restarting raises (Django's wrappers and, for
# a connection opened outside Django's cursor wrapper, the driver's own).
DATABASE_ERRORS = _database_errors()


@receiver(connection_created, dispatch_uid="hermes-database-outage-recovered")
def _database_reachable(sender, connection, **kwargs) -> None:
    """A new connection opened: the database answers again (ends an outage)."""
    outage(DATABASE).recovered()
