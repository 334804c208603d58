"""This process's metrics, in a Prometheus registry of its own (prometheus_client).

Counted where things happen: events appended (`journal.store.append`), readers
inside `journal.subscribe.subscribe`, how long a reader waits for its first
replayed batch, how long a model takes to its first token and how long a
worker's journal tick takes (`chat.writer`). Other apps add
collectors of their own to `REGISTRY` (the `chat` app: its model requests).
Web processes serve it at `/metrics` (`hermes_site.health`, which adds what the
database says); `manage.py worker --metrics-port` serves it from a worker
(`serve`).

`REGISTRY` is not prometheus_client's global one: nothing registers into it
behind our back (no process or platform collectors, no other library's
metrics), so `/metrics` shows exactly the families docs/operating.md lists. No
label ever carries a user, a session, a run or a secret: `/metrics` needs no
login.
"""

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
    start_http_server,
)
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4

# Counters and histograms without their `_created` series: the families stay
# the ones documented, and a scrape is not twice as long.
disable_created_metrics()

REGISTRY = CollectorRegistry()
CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4  # what `render` writes

EVENTS_APPENDED = Counter(
    "hermes_journal_events_appended",  # exposed with `_total`
    "Journal events appended by this process.",
    registry=REGISTRY,
)
SUBSCRIPTIONS = Gauge(
    "hermes_subscriptions_active",
    "Readers (SSE, WebSocket, replay_run --follow) inside journal.subscribe here.",
    registry=REGISTRY,
)
# From 1 ms to 10 s: the replay budget is a first event under 30 ms.
# See docs/architecture.md §9.
REPLAY_FIRST_BATCH_S = Histogram(
    "hermes_replay_first_batch_seconds",
    "Time from a reader subscribing to its first batch of already journaled events.",
    buckets=(0.001, 0.005, 0.01, 0.03, 0.1, 0.3, 1.0, 3.0, 10.0),
    registry=REGISTRY,
)

# From 10 ms to 60 s: how long a model keeps a user waiting for its first token.
FIRST_TOKEN_S = Histogram(
    "hermes_model_first_token_seconds",
    "Time from a model request to its first streamed token (turns run here).",
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0),
    registry=REGISTRY,
)


# From 1 ms to 1 s: a worker's journal tick, from taking its runs' pending
# events to their publishing. Ticks start every 30 ms while text streams
# (chat.writer), so a tick near that long means the journal is what the
# worker waits on. See docs/scaling.md.
TICK_S = Histogram(
    "hermes_journal_tick_seconds",
    "Time a journal tick takes to commit its runs' pending events and publish them.",
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.02, 0.03, 0.05, 0.1, 0.3, 1.0),
    registry=REGISTRY,
)


def subscriptions_active() -> int:
    """Readers inside `journal.subscribe` in this process right now."""
    return int(REGISTRY.get_sample_value("hermes_subscriptions_active") or 0)


def render() -> bytes:
    """This process's families in the Prometheus text format."""
    return generate_latest(REGISTRY)


def serve(port: int, host: str = "127.0.0.1") -> int:
    """Serve `REGISTRY` over HTTP from a daemon thread (for processes without a
    web server); port 0 takes a free one. Returns the port it listens on."""
    httpd, _thread = start_http_server(port, addr=host, registry=REGISTRY)
    return httpd.server_port
