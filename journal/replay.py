"""Printing a run's journal: the service behind `manage.py replay_run`.
See docs/architecture.md §5, §7.

Three renderings of the same records: `text` (the assistant text as streamed,
every other event as a `[type key=value …]` line), `jsonl` (one
`{id, seq, event, data}` object a line, as the WebSocket sends them) and `sse`
(the exact frames of `GET /api/runs/<id>/events/`), both from `journal.wire`.
Reading pages through `journal.store` (bounded memory for any run length);
following a live run goes through `journal.subscribe`, the core every reader
shares.
"""

import asyncio
import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import aclosing
from datetime import datetime

from . import wire
from .cursor import Cursor, Verdict, decide
from .fold import Fold
from .store import READ_PAGE, Record, RunState, read_after, read_timed, run_state
from .subscribe import subscribe

FORMATS = ("text", "jsonl", "sse")

Write = Callable[[list[Record]], None]


class ReplayError(Exception):
    """The run cannot be replayed: unknown, or its events were pruned."""


def replay_target(*, run_id: str, after_seq: int = 0) -> RunState:
    state = run_state(run_id=run_id)
    if state is None:
        raise ReplayError(f"no run {run_id}")
    outcome = decide(
        pruned=state.pruned,
        terminal=state.terminal,
        last_seq=state.last_seq,
        cursor=Cursor(after_seq),
    )
    if outcome.verdict is Verdict.GONE:
        about = f" (subject {state.subject})" if state.subject else ""
        raise ReplayError(f"the events of run {run_id}{about} were pruned by retention")
    return state


def jsonl_line(run_id: str, record: Record) -> str:
    """The WebSocket's frame for this record, on a line of its own."""
    return wire.json_frame(run_id, record) + "\n"


def _marker_value(value) -> str:
    if (
        isinstance(value, str)
        and value
        and not any(c.isspace() or c in '"[]' for c in value)
    ):
        return value
    return json.dumps(value, ensure_ascii=False)


class TextRenderer:
    """The assistant text as it streamed; other events as marker lines.

    Each record goes through the run's fold (`journal.fold`) as it arrives;
    the text and reasoning it adds to a part are printed as they are, and
    reasoning is framed by `[reasoning]` and `[/reasoning]` lines. A marker
    always starts on a line of its own, so the answer text between markers is
    exactly what the run streamed. Empty deltas print nothing.
    """

    def __init__(self):
        self.fold = Fold()
        self.in_reasoning = False
        self.at_line_start = True

    def __call__(self, record: Record) -> str:
        data = json.loads(record.payload)
        part = self.fold.add(record.type, data, record.seq)
        delta = record.type in ("token", "reasoning")
        if delta and part is None:
            return ""
        if part is not None and part["kind"] == "reasoning":
            out = "" if self.in_reasoning else self._line("[reasoning]")
            self.in_reasoning = True
            return out + self._text(data["text"])
        out = self._line("[/reasoning]") if self.in_reasoning else ""
        self.in_reasoning = False
        if delta:
            return out + self._text(data["text"])
        fields = "".join(f" {k}={_marker_value(v)}" for k, v in data.items())
        return out + self._line(f"[{record.type}{fields}]")

    def _text(self, text: str) -> str:
        if text:
            self.at_line_start = text.endswith("\n")
        return text

    def _line(self, line: str) -> str:
        out = ("" if self.at_line_start else "\n") + line + "\n"
        self.at_line_start = True
        return out


def renderer(fmt: str, run_id: str) -> Callable[[Record], str]:
    if fmt == "text":
        return TextRenderer()
    if fmt == "jsonl":
        return lambda record: jsonl_line(run_id, record)
    if fmt == "sse":
        return lambda record: wire.sse_frame(run_id, record)
    raise ValueError(f"unknown format {fmt!r}; one of {', '.join(FORMATS)}")


def journal_pages(*, run_id: str, after_seq: int) -> Iterator[list[Record]]:
    """The records journaled now after `after_seq`, a page at a time."""
    while True:
        page = read_after(run_id=run_id, after_seq=after_seq, limit=READ_PAGE)
        if page:
            yield page
            after_seq = page[-1].seq
        if len(page) < READ_PAGE:
            return


def replay(*, run_id: str, after_seq: int, write: Write) -> int:
    """Write what is journaled after `after_seq`; return the last seq written."""
    for page in journal_pages(run_id=run_id, after_seq=after_seq):
        write(page)
        after_seq = page[-1].seq
    return after_seq


def replay_paced(
    *,
    run_id: str,
    after_seq: int,
    speed: float,
    write: Write,
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    """Like `replay`, at the recorded pace: commit-time gaps divided by `speed`.

    Each event is due at its offset from the first one, so sleeping never drifts.
    """
    first: datetime | None = None
    began = time.monotonic()
    while True:
        page = read_timed(run_id=run_id, after_seq=after_seq, limit=READ_PAGE)
        for record, created_at in page:
            first = first or created_at
            due = began + (created_at - first).total_seconds() / speed
            delay = due - time.monotonic()
            if delay > 0:
                sleep(delay)
            write([record])
            after_seq = record.seq
        if len(page) < READ_PAGE:
            return after_seq


class _WakeableLoop(asyncio.SelectorEventLoop):
    """An event loop that other threads may wake by completing its futures.

    The in-memory channel layer is one object per process: when a follower runs
    beside a server in the same process (tests, `manage.py shell`), the server's
    loop completes this loop's futures from its own thread. A plain `call_soon`
    from another thread does not wake the loop (the event waits for the next
    timer) and, under asyncio debug, raises and strands the reader; here it goes
    through `call_soon_threadsafe`. A separate `replay_run` process never needs it.
    """

    _owner: int | None = None

    def run_forever(self) -> None:
        self._owner = threading.get_ident()
        try:
            super().run_forever()
        finally:
            self._owner = None

    def call_soon(self, callback, *args, context=None):
        if self._owner is not None and self._owner != threading.get_ident():
            return self.call_soon_threadsafe(callback, *args, context=context)
        return super().call_soon(callback, *args, context=context)


def follow_blocking(*, run_id: str, after_seq: int, write: Write) -> int:
    """`follow` from sync code: what `asyncio.run` does, on a `_WakeableLoop`."""
    with asyncio.Runner(loop_factory=_WakeableLoop) as runner:
        return runner.run(follow(run_id=run_id, after_seq=after_seq, write=write))


async def follow(*, run_id: str, after_seq: int, write: Write) -> int:
    """Replay, then follow the live run until its `end`; return the last seq written."""
    async with aclosing(subscribe(run_id, after_seq=after_seq)) as batches:
        async for batch in batches:  # ends after `end`: the core stops there
            if batch:
                write(batch)
                after_seq = batch[-1].seq
    return after_seq
