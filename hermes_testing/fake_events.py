"""What every fake model server shares besides its wire format: the faults,
the pacing and the streamed response that watches its client.

- **Faults** (:func:`fault_of`, :func:`visible_prefix`, :func:`planned`) strike
  after a number of *visible characters* (reasoning, text, tool arguments, in
  the order they stream), so tests of every API say "after 12 characters" the
  same way; a faulty stream never reports how it finished.
- **Pacing** (:func:`schedule`): a scripted ``tokens_per_s`` makes each paced
  frame (a chunk, standing for a token) due one interval after the one before.
- **Streaming** (:class:`PeerStream`): a response head, a body, and the
  client's close noticed and recorded whenever it happens.

Both the Anthropic and the Responses APIs stream ``event: <name>`` /
``data: <json>`` frames: a scripted reply becomes a list of :class:`Event`.
The chat-completions frames of ``fake_wire`` use the same faults and pacing.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

if TYPE_CHECKING:
    from hermes_testing.fake_llm import FakeLLM, RecordedRequest

#: The fault fields of a scripted reply, in the order they are looked at.
FAULTS = ("cut", "stall", "malformed", "error", "done")
SSE_HEADERS = {
    "Content-Type": "text/event-stream",
    "Cache-Control": "no-cache",
    "Connection": "close",
}


@dataclass(frozen=True)
class Event:
    """One SSE event; ``text`` is the visible text at ``slot`` (a key path)."""

    name: str
    data: dict[str, Any]
    text: str = ""
    slot: tuple[str, ...] = ()
    #: Frames that report how the reply finished: a fault strikes before them.
    terminal: bool = False
    extra: dict[str, Any] = field(default_factory=dict)

    def with_text(self, text: str) -> Event:
        """The same event carrying only ``text`` (a fault's shortened copy)."""
        data = _replace(self.data, self.slot, text) if self.slot else self.data
        return Event(self.name, data, text, self.slot, self.terminal)


def _replace(data: dict[str, Any], path: tuple[str, ...], value: Any) -> dict[str, Any]:
    head, *rest = path
    inner = _replace(data[head], tuple(rest), value) if rest else value
    return {**data, head: inner}


def sse(name: str, data: dict[str, Any]) -> bytes:
    body = json.dumps(data, separators=(",", ":"))
    return f"event: {name}\ndata: {body}\n\n".encode()


def malformed(name: str) -> bytes:
    return f"event: {name}\ndata: {{not json\n\n".encode()


def chunks(text: str, size: int) -> list[str]:
    size = max(1, size)
    return [text[i : i + size] for i in range(0, len(text), size)]


# --- faults -------------------------------------------------------------------


def fault_of(reply: object) -> tuple[str, int] | None:
    """The reply's fault (``cut``, ``stall``, ``malformed``, ``error``) and the
    visible characters sent before it; None for a reply without one."""
    for kind in FAULTS:
        limit = getattr(reply, f"{kind}_after_chars", None)
        if limit is not None:
            return kind, limit
    return None


class Visible(Protocol):
    """A frame before rendering: its visible text, and whether it reports the
    finish (``fake_wire.Piece``, :class:`Event`)."""

    @property
    def text(self) -> str: ...

    @property
    def terminal(self) -> bool: ...


V = TypeVar("V", bound=Visible)


def visible_prefix(
    items: Sequence[V], limit: int, *, split: bool = True
) -> list[tuple[V, str | None]]:
    """The items sent before a fault after ``limit`` visible characters.

    Each comes with None, except a last one split to land exactly, which comes
    with its shortened text; with ``split=False`` that one is left out whole (a
    client dispatches only whole SSE events). Terminal items never come.
    """
    out: list[tuple[V, str | None]] = []
    sent = 0
    for item in items:
        if item.terminal:
            break
        if item.text:
            if sent >= limit:
                break
            if sent + len(item.text) > limit:
                if split:
                    out.append((item, item.text[: limit - sent]))
                break
            sent += len(item.text)
        out.append((item, None))
    return out


def cut_events(events: list[Event], limit: int) -> list[Event]:
    """Events until ``limit`` visible chars were sent (split to land exactly)."""
    return [
        event if text is None else event.with_text(text)
        for event, text in visible_prefix(events, limit)
    ]


def planned(
    full: list[bytes],
    fault: tuple[str, int] | None,
    before: Callable[[int], list[bytes]],
    endings: dict[str, bytes],
) -> tuple[list[bytes], int]:
    """The frames to send and the ``Content-Length`` to declare.

    Without a fault, ``full``. With one, the frames ``before(limit)`` gives;
    a fault in ``endings`` (a malformed frame, an error event) sends its frame
    and declares exactly what is sent (only the stream is broken, not the HTTP
    body), while a cut or a stall declares the whole reply and never meets it.
    """
    length = sum(map(len, full))
    if fault is None:
        return full, length
    kind, limit = fault
    frames = before(limit)
    if kind in endings:
        frames = [*frames, endings[kind]]
        return frames, sum(map(len, frames))
    return frames, length


# --- pacing -------------------------------------------------------------------


def schedule(
    paced: Iterable[bool], tokens_per_s: float | None, start: float
) -> list[float]:
    """When each frame is due (``time.monotonic()`` seconds): a paced one an
    interval of ``1 / tokens_per_s`` after the paced one before it, any other
    with the frame before it; all at ``start`` when unpaced."""
    interval = 1 / tokens_per_s if tokens_per_s else 0.0
    due, at = [], start
    for is_paced in paced:
        if interval and is_paced:
            at += interval
        due.append(at)
    return due


# --- streaming ----------------------------------------------------------------


class PeerStream:
    """One streamed response whose client may close the connection any time.

    :meth:`stream` writes the head, then the body a subclass sends; the
    client's close is noticed meanwhile (``peer_closed``) and recorded on the
    request (``closed_at``, ``closed_by="client"``), as is a stall's start.
    """

    def __init__(
        self,
        fake: FakeLLM,
        rec: RecordedRequest,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> None:
        self.fake, self.rec = fake, rec
        self.reader, self.writer = reader, writer
        self.peer_closed = asyncio.Event()

    async def stream(self, head: bytes, body: Callable[[], Awaitable[None]]) -> bool:
        """Send ``head``, then ``body()``; returns whether the client closed
        the connection."""
        watcher = asyncio.create_task(self._watch_eof())
        self.fake._update(self.rec, status=200)
        try:
            self.writer.write(head)
            await body()
        except ConnectionError:
            self._peer_gone()
        finally:
            watcher.cancel()
        return self.peer_closed.is_set()

    async def until_due(self, at: float) -> None:
        """Wait until ``at`` (a plain sleep: the EOF watcher records a close)."""
        wait = at - time.monotonic()
        if wait > 0:
            await asyncio.sleep(wait)

    async def stall(self) -> None:
        """Send nothing more until the client closes the connection."""
        if not self.peer_closed.is_set():
            self.fake._update(self.rec, stall_at=time.monotonic())
            await self.peer_closed.wait()

    async def _watch_eof(self) -> None:
        # HTTP/1.1 clients send nothing while a response is streaming, so the
        # only thing a read can return here is EOF: the client closed.
        with contextlib.suppress(ConnectionError):
            while await self.reader.read(4096):
                pass
        self._peer_gone()

    def _peer_gone(self) -> None:
        if not self.peer_closed.is_set():
            self.peer_closed.set()
            self.fake._update(self.rec, closed_at=time.monotonic(), closed_by="client")
