"""Process-local metrics in the Prometheus text format, served at `/metrics`.

Counted where things happen: events appended (`journal.store.append`), readers
inside `journal.subscribe.subscribe`, and how long a reader waits for its first
replayed batch. `hermes_site.health` adds what is read at scrape time (runs by
status, live workers, provider requests in flight).

Written here rather than with prometheus-client: three metric kinds and the
text format fit in this module, and nothing else is pulled in (a default
registry with process collectors, multiprocess mode files). No label ever
carries a user, a session or a run: `/metrics` needs no login.
"""

import math
import threading

_lock = threading.Lock()  # appends count on pool threads, readers on event loops


def _number(value: float) -> str:
    if value == math.inf:
        return "+Inf"
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def sample(name: str, value: float, labels: dict[str, str] | None = None) -> str:
    """One exposition line; label values are escaped as the format requires."""
    if labels:
        inner = ",".join(f'{k}="{_escape(str(v))}"' for k, v in labels.items())
        return f"{name}{{{inner}}} {_number(value)}"
    return f"{name} {_number(value)}"


def family(name: str, kind: str, help_text: str, lines: list[str]) -> str:
    return "\n".join([f"# HELP {name} {help_text}", f"# TYPE {name} {kind}", *lines])


class Counter:
    def __init__(self, name: str, help_text: str):
        self.name, self.help = name, help_text
        self.value = 0

    def inc(self, amount: int = 1) -> None:
        with _lock:
            self.value += amount

    def render(self) -> str:
        return family(self.name, "counter", self.help, [sample(self.name, self.value)])


class Gauge(Counter):
    def dec(self, amount: int = 1) -> None:
        self.inc(-amount)

    def render(self) -> str:
        return family(self.name, "gauge", self.help, [sample(self.name, self.value)])


class Histogram:
    def __init__(self, name: str, help_text: str, buckets: tuple[float, ...]):
        self.name, self.help = name, help_text
        self.bounds = (*sorted(buckets), math.inf)
        self.counts = [0] * len(self.bounds)
        self.total = 0.0

    def observe(self, value: float) -> None:
        with _lock:
            self.total += value
            for i, bound in enumerate(self.bounds):
                if value <= bound:
                    self.counts[i] += 1
                    break

    def render(self) -> str:
        with _lock:
            counts, total = list(self.counts), self.total
        lines, running = [], 0
        for bound, count in zip(self.bounds, counts, strict=True):
            running += count
            lines.append(sample(f"{self.name}_bucket", running, {"le": _number(bound)}))
        lines += [
            sample(f"{self.name}_sum", total),
            sample(f"{self.name}_count", running),
        ]
        return family(self.name, "histogram", self.help, lines)


EVENTS_APPENDED = Counter(
    "hermes_journal_events_appended_total", "Journal events appended by this process."
)
SUBSCRIPTIONS = Gauge(
    "hermes_subscriptions_active",
    "Readers (SSE, WebSocket, replay_run --follow) inside journal.subscribe here.",
)
# From 1 ms to 10 s: the replay budget is a first event under 30 ms (DESIGN §9).
REPLAY_FIRST_BATCH_S = Histogram(
    "hermes_replay_first_batch_seconds",
    "Time from a reader subscribing to its first batch of already journaled events.",
    (0.001, 0.005, 0.01, 0.03, 0.1, 0.3, 1.0, 3.0, 10.0),
)

# From 10 ms to 60 s: how long a model keeps a user waiting for its first token.
FIRST_TOKEN_S = Histogram(
    "hermes_model_first_token_seconds",
    "Time from a model request to its first streamed token (turns run here).",
    (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0),
)

PROCESS_METRICS = (EVENTS_APPENDED, SUBSCRIPTIONS, REPLAY_FIRST_BATCH_S, FIRST_TOKEN_S)


def render_process_metrics() -> str:
    return "\n".join(metric.render() for metric in PROCESS_METRICS)
