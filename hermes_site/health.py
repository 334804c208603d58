"""`GET /healthz` and `GET /metrics`: for load balancers and Prometheus.
See docs/architecture.md §7.

Neither needs a login, so neither says anything about a user, a session or a
run: counts and latencies only, and errors by their class name (a message
could carry a host or a URL with credentials).

`/healthz` answers JSON with one entry per check and names the failing ones.
Only the database, the channel layer and a live worker decide the status; a
provider whose model listing fails is reported (`providers`) but does not take
this process out of a load balancer. Load alone must not flip it: the database
check has a thread of its own (not behind the readers' queries), each check
gets `CHECK_TIMEOUT_S`, and a worker counts as gone only after two leases.
"""

import asyncio
import logging
import time
import uuid

from channels.layers import get_channel_layer
from django.conf import settings
from django.db import connection
from django.db.models import Count
from django.http import HttpResponse, JsonResponse
from django.views.decorators.http import require_GET
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from chat.providers import registry
from journal import dbpool, metrics
from journal.heartbeats import workers_seen
from journal.models import Run
from journal.outages import CHANNEL_LAYER, Outage, outage

log = logging.getLogger(__name__)

CHECK_TIMEOUT_S = 8.0  # each check: slow under load is not down (probes allow ~10 s)
# The database check's own thread: behind the readers' pool it would wait for
# their queries, and a busy process would look like a dead database.
_health_pool = dbpool.DBPool("health", 1)


def worker_max_age_s() -> float:
    """A worker not seen for this long is gone: two leases (beats lag under load)."""
    hermes = settings.HERMES
    return hermes.get("HEALTH_WORKER_MAX_AGE_S") or max(
        2 * hermes["LEASE_S"], 6 * hermes["HEARTBEAT_S"]
    )


def _database() -> dict:
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
        cursor.fetchone()
    return {}


def _providers() -> dict:
    """Model listings: reported, never fatal (the last good list is served)."""
    listings = registry.listing_status()
    failing = sorted(
        name for name, st in listings.items() if st["listing"] == "failing"
    )
    return {
        "ok": not failing,
        "critical": False,
        "failing": failing,
        "providers": {
            name: {k: st[k] for k in ("listing", "error", "failing_since")}
            for name, st in listings.items()
        },
    }


def _outages() -> dict:
    """Dependencies this process currently counts as down (journal.outages)."""
    down = Outage.current()
    return {"ok": not down, "critical": False, "down": down}


def _workers() -> dict:
    seen = workers_seen(max_age_s=worker_max_age_s())
    return {
        "ok": seen.alive > 0,
        "alive": seen.alive,
        "active_runs": seen.active_runs,
        "max_age_s": worker_max_age_s(),
        "last_seen_at": seen.last_seen_at.isoformat() if seen.last_seen_at else None,
    }


async def _channel_layer() -> dict:
    """A round trip: send to a fresh channel of this check and receive it.

    A plain channel name, not `new_channel()`: channels_redis pops all of a
    process's `new_channel()` channels through one shared receive loop, so a
    check would wait behind (or, from another event loop, never see) it; a plain
    name is popped by this receive alone.
    """
    layer = get_channel_layer()
    if layer is None:
        return {"ok": False, "error": "no channel layer configured"}
    channel = f"hermes.health.{uuid.uuid4().hex}"
    await layer.send(channel, {"type": "health.ping"})
    message = await layer.receive(channel)
    ok = message.get("type") == "health.ping"
    if ok:  # a working round trip ends an outage even with nothing listening
        outage(CHANNEL_LAYER).recovered()
    return {"ok": ok}


async def _check(name: str, step) -> dict:
    began = time.monotonic()
    try:
        result = await asyncio.wait_for(step, CHECK_TIMEOUT_S)
    except TimeoutError:
        result = {"ok": False, "error": f"no answer in {CHECK_TIMEOUT_S:g} s"}
    except Exception as exc:  # reported, never raised: the probe must answer
        result = {"ok": False, "error": type(exc).__name__}
    result.setdefault("ok", True)
    result["ms"] = round((time.monotonic() - began) * 1000, 1)
    return {name: result}


async def _in_thread(fn) -> dict:
    return await asyncio.get_running_loop().run_in_executor(None, fn)


@require_GET
async def healthz(request):
    """200 when the database, the channel layer and a worker answer; else 503.

    `failed` names the critical checks that failed, `warnings` the others.
    """
    checks = {}
    for part in await asyncio.gather(
        _check("database", _health_pool.run(_database)),
        _check("channel_layer", _channel_layer()),
        _check("workers", _health_pool.run(_workers)),
        _check("providers", _in_thread(_providers)),
        _check("outages", _in_thread(_outages)),
    ):
        checks.update(part)
    failed = [n for n, c in checks.items() if not c["ok"] and c.get("critical", True)]
    warnings = [n for n, c in checks.items() if not c["ok"] and n not in failed]
    for check in checks.values():
        check.pop("critical", None)
    status = "unhealthy" if failed else "degraded" if warnings else "ok"
    response = JsonResponse(
        {"status": status, "failed": failed, "warnings": warnings, "checks": checks},
        status=503 if failed else 200,
        headers={"Cache-Control": "no-store"},
    )
    _unhealthy.seen(failed)
    # A 503 here is the probe's answer, not a server error: Django would log
    # each one as an ERROR (`django.request`); `_unhealthy` logs the spell.
    response._has_been_logged = True
    return response


class _Unhealthy:
    """Logs a spell of 503s once at its start and once at its end, with the
    count, as journal.outages logs a dependency's outage."""

    def __init__(self) -> None:
        self.since: float | None = None
        self.answers = 0
        self.failed: list[str] = []

    def seen(self, failed: list[str]) -> None:
        if failed:
            self.answers += 1
            if self.since is None or failed != self.failed:
                log.warning(
                    "healthz unhealthy (failed: %s); logging once until it is healthy",
                    ", ".join(failed),
                )
                self.since = self.since or time.monotonic()
                self.failed = failed
        elif self.since is not None:
            log.info(
                "healthz healthy again after %.1f s; %d unhealthy answers",
                time.monotonic() - self.since,
                self.answers,
            )
            self.since, self.answers, self.failed = None, 0, []


_unhealthy = _Unhealthy()


class DatabaseCollector(Collector):
    """What the database says at scrape time: the same on every process."""

    def collect(self):
        by_status = dict(
            Run.objects.order_by().values_list("status").annotate(n=Count("id"))
        )
        seen = workers_seen(max_age_s=worker_max_age_s())
        runs = GaugeMetricFamily(
            "hermes_runs", "Runs in the database by status.", labels=["status"]
        )
        for status in Run.Status.values:
            runs.add_metric([status], by_status.get(status, 0))
        yield runs
        yield GaugeMetricFamily(
            "hermes_workers_alive",
            "Turn workers whose heartbeat is recent (any process, any machine).",
            value=seen.alive,
        )
        yield GaugeMetricFamily(
            "hermes_worker_runs_active",
            "Runs held by the live workers, from their last heartbeat.",
            value=seen.active_runs,
        )


_database_metrics = CollectorRegistry()
_database_metrics.register(DatabaseCollector())


@require_GET
def metrics_view(request):
    """Prometheus text format: this process's families (`journal.metrics`), then
    what the database says."""
    body = metrics.render() + generate_latest(_database_metrics)
    return HttpResponse(body, content_type=metrics.CONTENT_TYPE)
