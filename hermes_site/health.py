"""`GET /healthz` and `GET /metrics`: for load balancers and Prometheus (DESIGN §7).

Neither needs a login, so neither says anything about a user, a session or a
run: counts and latencies only, and errors by their class name (a message
could carry a host or a URL with credentials).
"""

import asyncio
import time

from channels.layers import get_channel_layer
from django.conf import settings
from django.db import connection
from django.db.models import Count
from django.http import HttpResponse, JsonResponse
from django.views.decorators.http import require_GET

from chat.providers import registry
from journal import dbpool, metrics
from journal.heartbeats import workers_seen
from journal.models import Run

CHECK_TIMEOUT_S = 3.0  # each check; a probe must answer well inside its own timeout


def worker_max_age_s() -> float:
    """A worker not seen for this long is gone: by then its leases have lapsed too."""
    hermes = settings.HERMES
    return hermes.get("HEALTH_WORKER_MAX_AGE_S") or max(
        hermes["LEASE_S"], 3 * hermes["HEARTBEAT_S"]
    )


def _database() -> dict:
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
        cursor.fetchone()
    return {}


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
    """A round trip: send to a fresh channel of this process and receive it."""
    layer = get_channel_layer()
    if layer is None:
        return {"ok": False, "error": "no channel layer configured"}
    # The default prefix: channels_redis pops every process-local channel of a
    # prefix through one shared receive loop, so another prefix would starve.
    channel = await layer.new_channel()
    await layer.send(channel, {"type": "health.ping"})
    message = await layer.receive(channel)
    return {"ok": message.get("type") == "health.ping"}


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


@require_GET
async def healthz(request):
    """200 when the database, the channel layer and a worker answer; else 503."""
    checks = {}
    for part in await asyncio.gather(
        _check("database", dbpool.readers.run(_database)),
        _check("channel_layer", _channel_layer()),
        _check("workers", dbpool.readers.run(_workers)),
    ):
        checks.update(part)
    healthy = all(check["ok"] for check in checks.values())
    return JsonResponse(
        {"status": "ok" if healthy else "unhealthy", "checks": checks},
        status=200 if healthy else 503,
        headers={"Cache-Control": "no-store"},
    )


def _scrape_time_metrics() -> str:
    by_status = dict(
        Run.objects.order_by().values_list("status").annotate(n=Count("id"))
    )
    seen = workers_seen(max_age_s=worker_max_age_s())
    return "\n".join(
        [
            metrics.family(
                "hermes_runs",
                "gauge",
                "Runs in the database by status.",
                [
                    metrics.sample("hermes_runs", by_status.get(s, 0), {"status": s})
                    for s in Run.Status.values
                ],
            ),
            metrics.family(
                "hermes_workers_alive",
                "gauge",
                "Turn workers whose heartbeat is recent (any process, any machine).",
                [metrics.sample("hermes_workers_alive", seen.alive)],
            ),
            metrics.family(
                "hermes_worker_runs_active",
                "gauge",
                "Runs held by the live workers, from their last heartbeat.",
                [metrics.sample("hermes_worker_runs_active", seen.active_runs)],
            ),
            metrics.family(
                "hermes_provider_requests_in_flight",
                "gauge",
                "Model requests open in this process (0 when idle).",
                [
                    metrics.sample(
                        "hermes_provider_requests_in_flight", registry.active_requests()
                    )
                ],
            ),
        ]
    )


@require_GET
def metrics_view(request):
    """Prometheus text format: this process's counters, then what the database says."""
    body = metrics.render_process_metrics() + "\n" + _scrape_time_metrics() + "\n"
    return HttpResponse(body, content_type="text/plain; version=0.0.4; charset=utf-8")
