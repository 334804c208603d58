"""Log lines about a run carry `run_id=` and `session_id=` (journal.logcontext)."""

import asyncio
import logging

from journal.logcontext import RunContextFilter, RunContextFormatter, run_logging

FORMAT = "%(levelname)s %(name)s %(message)s"


def _handler(lines: list[str]) -> logging.Handler:
    class Keep(logging.Handler):
        def emit(self, record):
            lines.append(self.format(record))

    handler = Keep()
    handler.addFilter(RunContextFilter(fields=["session_id"]))
    handler.setFormatter(RunContextFormatter(FORMAT))
    return handler


def test_lines_inside_a_run_and_its_tasks_name_it_and_others_do_not():
    lines: list[str] = []
    log = logging.getLogger("hermes.test.run")
    log.addHandler(handler := _handler(lines))
    log.setLevel(logging.INFO)

    async def provider_call():
        await asyncio.sleep(0)
        log.info("stream opened")

    async def main():
        log.info("claiming")
        with run_logging(run_id="run_A", session_id=7):
            task = asyncio.create_task(provider_call())  # copies the context
            log.info("run ended run_id=run_A status=completed")
        other = asyncio.create_task(provider_call())  # created outside: no run
        await asyncio.gather(task, other)

    try:
        asyncio.run(main())
    finally:
        log.removeHandler(handler)
    assert lines == [
        "INFO hermes.test.run claiming",
        "INFO hermes.test.run run ended run_id=run_A status=completed session_id=7",
        "INFO hermes.test.run stream opened run_id=run_A session_id=7",
        "INFO hermes.test.run stream opened",
    ]


def test_the_filter_gives_every_record_the_fields_for_a_format_string():
    record = logging.LogRecord("x", logging.INFO, __file__, 1, "hello", None, None)
    RunContextFilter(fields=["session_id"]).filter(record)
    assert (record.run_id, record.session_id) == ("-", "-")
    with run_logging(run_id="run_B"):
        inside = logging.LogRecord("x", logging.INFO, __file__, 1, "hello", None, None)
        RunContextFilter(fields=["session_id"]).filter(inside)
    assert (inside.run_id, inside.session_id) == ("run_B", "-")
    plain = logging.Formatter("%(message)s run_id=%(run_id)s session_id=%(session_id)s")
    assert plain.format(inside) == "hello run_id=run_B session_id=-"
