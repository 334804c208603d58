"""Which run a log line is about: `run_id=` (and what the app binds) on every line.
See docs/architecture.md §7.

A worker binds the run it executes (`with run_logging(run_id=…, **context)`,
e.g. chat adds `session_id=…`) around the run's task; asyncio tasks copy the
context when they are created, so everything the run awaits (provider, writer,
tools) logs with it, and nothing else does. `RunContextFilter` puts the ids on
each record (`-` when unbound; `fields` names the context keys a format string
may use); `RunContextFormatter` appends them to lines about a run.

Settings (`LOGGING`):

    "filters": {"run": {
        "()": "journal.logcontext.RunContextFilter", "fields": ["session_id"],
    }},
    "formatters": {"plain": {
        "()": "journal.logcontext.RunContextFormatter",
        "format": "%(asctime)s %(levelname)s %(name)s %(message)s",
    }},
    "handlers": {"console": {..., "filters": ["run"], "formatter": "plain"}},
"""

import logging
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

Context = tuple[tuple[str, str], ...]

_run: ContextVar[tuple[str, Context] | None] = ContextVar("hermes_run", default=None)

UNBOUND = "-"


@contextmanager
def run_logging(*, run_id: str, **context: object) -> Iterator[None]:
    """Within this block (and tasks created in it) log lines name the run and
    each `context` value that is not None, in the order given."""
    bound = tuple((k, str(v)) for k, v in context.items() if v is not None)
    token = _run.set((run_id, bound))
    try:
        yield
    finally:
        _run.reset(token)


def current_run() -> tuple[str, Context] | None:
    return _run.get()


class RunContextFilter(logging.Filter):
    """Sets `record.run_id` and each of `fields` (`-` outside a run or unbound)."""

    def __init__(self, name: str = "", fields: Iterable[str] = ()):
        super().__init__(name)
        self.fields = tuple(fields)

    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "run_id"):
            run_id, context = _run.get() or (UNBOUND, ())
            record.run_id, record.run_context = run_id, context
            values = dict(context)
            for field in self.fields:
                setattr(record, field, values.get(field, UNBOUND))
        return True


class RunContextFormatter(logging.Formatter):
    """Appends ` run_id=… key=…` to lines about a run, unless already there."""

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        if hasattr(record, "run_context"):  # set by the filter with run_id
            run_id, context = getattr(record, "run_id", UNBOUND), record.run_context
        else:
            run_id, context = _run.get() or (UNBOUND, ())
        if run_id == UNBOUND:
            return line
        ids = (("run_id", run_id), *context)
        extra = [f"{k}={v}" for k, v in ids if f"{k}={v}" not in line]
        return " ".join([line, *extra])
