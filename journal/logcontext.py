"""Which run a log line is about: `run_id=` and `session_id=` on every line (DESIGN §7).

The worker binds the run it executes (`with run_logging(run_id=…, session_id=…)`)
around the run's task; asyncio tasks copy the context when they are created, so
everything the run awaits (provider, writer, tools) logs with it, and nothing
else does. `RunContextFilter` puts the ids on each record (`-` when unbound);
`RunContextFormatter` appends them to lines about a run.

Settings (`LOGGING`):

    "filters": {"run": {"()": "journal.logcontext.RunContextFilter"}},
    "formatters": {"plain": {
        "()": "journal.logcontext.RunContextFormatter",
        "format": "%(asctime)s %(levelname)s %(name)s %(message)s",
    }},
    "handlers": {"console": {..., "filters": ["run"], "formatter": "plain"}},
"""

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

_run: ContextVar[tuple[str, str] | None] = ContextVar("hermes_run", default=None)

UNBOUND = "-"


@contextmanager
def run_logging(*, run_id: str, session_id: int | str | None = None) -> Iterator[None]:
    """Within this block (and tasks created in it) log lines name the run."""
    token = _run.set((run_id, UNBOUND if session_id is None else str(session_id)))
    try:
        yield
    finally:
        _run.reset(token)


def current_run() -> tuple[str, str] | None:
    return _run.get()


class RunContextFilter(logging.Filter):
    """Sets `record.run_id` and `record.session_id` (`-` outside a run)."""

    def filter(self, record: logging.LogRecord) -> bool:
        bound = _run.get()
        if not hasattr(record, "run_id"):
            record.run_id, record.session_id = bound or (UNBOUND, UNBOUND)
        return True


class RunContextFormatter(logging.Formatter):
    """Appends ` run_id=… session_id=…` to lines about a run, unless already there."""

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        if hasattr(record, "run_id"):
            ids = (("run_id", record.run_id), ("session_id", record.session_id))
        else:
            bound = _run.get() or (UNBOUND, UNBOUND)
            ids = (("run_id", bound[0]), ("session_id", bound[1]))
        if ids[0][1] == UNBOUND:
            return line
        extra = [f"{k}={v}" for k, v in ids if v != UNBOUND and f"{k}={v}" not in line]
        return " ".join([line, *extra])
