"""A real loopback OpenAI Responses server in background mode, with faults.

``POST /v1/responses`` (``stream: true, background: true``) creates a response
that runs on the server's clock whether or not anyone reads it: its events
(each with a ``sequence_number``) become ready at the scripted pace from the
moment of the POST. A client reads them on the POST's stream and, after a
cut, re-attaches with ``GET /v1/responses/{id}?stream=true&starting_after=<n>``
to get every event after ``n``: those generated meanwhile at once, the rest
as they are generated. ``POST /v1/responses/{id}/cancel`` stops a response
(later events are never generated); ``expire_after_s`` makes the server forget
it (a re-attach answers 404, as for a background response past its retention).

Scripting is ``FakeLLM``'s (``push``, ``route``, :class:`ResponsesReply`);
faults count visible characters as in ``fake_wire`` and strike the POST's
stream only: ``cut_after_chars`` (the chunked body ends without its last
chunk), ``stall_after_chars`` (nothing more on that connection until the
client closes it; the response goes on upstream), ``malformed_after_chars``
(a frame that is not JSON, then a clean end); ``status`` 429 with
``retry_after`` refuses the POST before any response exists. Every request is
recorded (``method``, ``query``), re-attaches and cancels included.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs

from hermes_testing.fake_events import (
    SSE_HEADERS,
    Event,
    PeerStream,
    chunks,
    fault_of,
    malformed,
    schedule,
    sse,
    visible_prefix,
)
from hermes_testing.fake_llm import Conn, FakeLLM, RecordedRequest
from hermes_testing.fake_wire import (
    Reply,
    Request,
    normalise_tool_calls,
    response_head,
)

__all__ = ["FakeResponses", "ResponsesReply"]


def _default_usage() -> dict[str, Any]:
    return {
        "input_tokens": 12,
        "output_tokens": 34,
        "total_tokens": 46,
        "output_tokens_details": {"reasoning_tokens": 0},
    }


@dataclass
class ResponsesReply(Reply):
    """A scripted response; ``usage`` in the Responses shape."""

    usage: dict[str, Any] | None = field(default_factory=_default_usage)
    #: The server forgets the response this long after its POST (None: never).
    expire_after_s: float | None = None
    #: End with ``response.failed`` instead of ``response.completed``.
    fail: bool = False


@dataclass
class StoredResponse:
    """One background response: its events, when each is ready, its fate."""

    id: str
    events: list[Event]
    ready_at: list[float]
    created_at: float
    expire_after_s: float | None
    cancelled_at: float | None = None
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    def expired(self, now: float) -> bool:
        return (
            self.expire_after_s is not None
            and now > self.created_at + self.expire_after_s
        )

    def state(self, now: float) -> dict[str, Any]:
        """What a GET without ``stream`` and a cancel answer."""
        return {"id": self.id, "object": "response", "status": self.status(now)}

    def status(self, now: float) -> str:
        if self.cancelled_at is not None:
            return "cancelled"
        if self.ready_at and now >= self.ready_at[-1]:
            return (
                "failed" if self.events[-1].name == "response.failed" else "completed"
            )
        return "in_progress"


def build_events(reply: Reply, body: dict[str, Any], response_id: str) -> list[Event]:
    """The response's events in order, ``sequence_number`` 0, 1, 2 …"""
    base = {
        "id": response_id,
        "object": "response",
        "created_at": int(time.time()),
        "model": body.get("model", "fake-model"),
        "background": True,
        "output": [],
    }
    events: list[Event] = []

    def add(name: str, data: dict[str, Any], text: str = "", slot=(), terminal=False):
        data = {"type": name, **data, "sequence_number": len(events)}
        events.append(Event(name, data, text, slot, terminal))

    add("response.created", {"response": {**base, "status": "queued"}})
    add("response.in_progress", {"response": {**base, "status": "in_progress"}})
    index = 0
    if reply.reasoning:
        item = {"id": f"rs_{secrets.token_hex(4)}", "type": "reasoning", "summary": []}
        add("response.output_item.added", {"output_index": index, "item": item})
        for piece in chunks(reply.reasoning, reply.chunk_chars):
            delta = {"item_id": item["id"], "output_index": index, "summary_index": 0}
            add(
                "response.reasoning_summary_text.delta",
                {**delta, "delta": piece},
                piece,
                ("delta",),
            )
        add("response.output_item.done", {"output_index": index, "item": item})
        index += 1
    if reply.text:
        item = {
            "id": f"msg_{secrets.token_hex(4)}",
            "type": "message",
            "role": "assistant",
        }
        add("response.output_item.added", {"output_index": index, "item": item})
        where = {"item_id": item["id"], "output_index": index, "content_index": 0}
        add(
            "response.content_part.added",
            {**where, "part": {"type": "output_text", "text": ""}},
        )
        for piece in chunks(reply.text, reply.chunk_chars):
            add(
                "response.output_text.delta",
                {**where, "delta": piece},
                piece,
                ("delta",),
            )
        add("response.output_text.done", {**where, "text": reply.text})
        add("response.output_item.done", {"output_index": index, "item": item})
        index += 1
    for call in normalise_tool_calls(reply.tool_calls):
        item = {
            "id": f"fc_{secrets.token_hex(4)}",
            "type": "function_call",
            "call_id": call["id"],
            "name": call["name"],
            "arguments": "",
        }
        add("response.output_item.added", {"output_index": index, "item": item})
        for piece in chunks(call["arguments"], reply.chunk_chars):
            delta = {"item_id": item["id"], "output_index": index, "delta": piece}
            add("response.function_call_arguments.delta", delta, piece, ("delta",))
        add("response.output_item.done", {"output_index": index, "item": item})
        index += 1
    if getattr(reply, "fail", False):
        error = {"code": "server_error", "message": "The model failed."}
        add(
            "response.failed",
            {"response": {**base, "status": "failed", "error": error}},
            terminal=True,
        )
    else:
        done = {**base, "status": "completed", "usage": reply.usage}
        add("response.completed", {"response": done}, terminal=True)
    return events


class FakeResponses(FakeLLM):
    """Loopback Responses server; scripting as :class:`FakeLLM`."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("default", ResponsesReply(text="Hello from the fake model."))
        super().__init__(**kwargs)
        self.stored: dict[str, StoredResponse] = {}

    def _route_key(self, body: dict[str, Any]) -> str | None:
        for item in reversed(body.get("input") or []):
            if isinstance(item, dict) and item.get("role") == "user":
                content = item.get("content")
                if isinstance(content, list):
                    texts = [
                        part.get("text") or ""
                        for part in content
                        if isinstance(part, dict) and part.get("type") == "input_text"
                    ]
                    return "".join(texts) if texts else None
                return content if isinstance(content, str) else None
        return None

    def of_kind(self, method: str, suffix: str = "") -> list[RecordedRequest]:
        """Recorded requests of ``method`` whose path ends with ``suffix``."""
        return [
            r for r in self.requests if r.method == method and r.path.endswith(suffix)
        ]

    async def _dispatch(self, request: Request, conn: Conn) -> tuple[bool, bool]:
        method, route, writer = request.method, request.route, conn.writer
        authorised = self._bearer_ok(request)
        parts = route.split("/")  # "", "v1", "responses", id, "cancel"
        if method == "POST" and route == "/v1/responses":
            rec, reply = self._record(request, authorised, conn)
            return await self._create(rec, reply, authorised, conn)
        if (
            route == "/v1/models"
            or parts[:3] != ["", "v1", "responses"]
            or len(parts) < 4
        ):
            return await super()._dispatch(request, conn)
        rec = self._note(request, conn)
        stored = self.stored.get(parts[3])
        now = time.monotonic()
        if not authorised:
            await self._send_error(writer, rec, 401, "invalid api key", "auth")
        elif stored is None or stored.expired(now):
            message = f"Response with id '{parts[3]}' not found."
            await self._send_error(writer, rec, 404, message, "not_found")
        elif method == "POST" and parts[4:] == ["cancel"]:
            if stored.status(now) == "in_progress":
                stored.cancelled_at = now
                stored.changed.set()
            await self._send_json(writer, 200, stored.state(now), rec)
        elif method == "GET" and len(parts) == 4:
            args = parse_qs(request.query)
            if args.get("stream") != ["true"]:
                await self._send_json(writer, 200, stored.state(now), rec)
                return True, False
            after = int(args.get("starting_after", ["-1"])[0])
            stream = _Stream(self, rec, stored, conn.reader, writer)
            return False, await stream.run(after, None)
        else:
            await self._send_error(writer, rec, 405, "method not allowed")
        return True, False

    async def _create(
        self, rec: RecordedRequest, reply: Reply | None, authorised: bool, conn: Conn
    ) -> tuple[bool, bool]:
        body, writer = rec.body, conn.writer
        if not authorised:
            await self._send_error(writer, rec, 401, "invalid api key", "auth")
        elif reply is None or not isinstance(body.get("input"), list | str):
            await self._send_error(writer, rec, 400, "input is required")
        elif body.get("background") and body.get("store") is False:
            message = "background mode requires store=true"
            await self._send_error(writer, rec, 400, message)
        elif reply.status != 200:
            await self._send_scripted_error(writer, rec, reply)
        elif not body.get("stream"):
            await self._send_error(writer, rec, 400, "the fake streams only")
        else:
            stored = self._store(reply, body)
            fault = fault_of(reply)
            stream = _Stream(self, rec, stored, conn.reader, writer)
            return False, await stream.run(-1, fault)
        return True, False

    def _store(self, reply: Reply, body: dict[str, Any]) -> StoredResponse:
        response_id = f"resp_fake_{secrets.token_hex(8)}"
        events = build_events(reply, body, response_id)
        now = time.monotonic()
        ready = schedule((bool(e.text) for e in events), reply.tokens_per_s, now)
        stored = StoredResponse(
            response_id, events, ready, now, getattr(reply, "expire_after_s", None)
        )
        self.stored[response_id] = stored
        return stored


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


class _Stream(PeerStream):
    """Sends a stored response's events after a sequence number, chunked."""

    def __init__(
        self,
        fake: FakeResponses,
        rec: RecordedRequest,
        stored: StoredResponse,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> None:
        super().__init__(fake, rec, reader, writer)
        self.stored = stored

    async def run(self, after: int, fault: tuple[str, int] | None) -> bool:
        """Stream; returns whether the client closed the connection."""
        head = response_head(200, {**SSE_HEADERS, "Transfer-Encoding": "chunked"})
        return await self.stream(head, lambda: self._events(after, fault))

    async def _events(self, after: int, fault: tuple[str, int] | None) -> None:
        events = self.stored.events
        if fault is not None:  # a client dispatches whole events: none is split
            events = [e for e, _ in visible_prefix(events, fault[1], split=False)]
        for i in range(after + 1, len(events)):
            if not await self._ready(i):
                if not self.peer_closed.is_set():  # cancelled upstream: a clean end
                    await self._send(b"", last=True)
                return
            await self._send(sse(events[i].name, events[i].data))
        if fault is None:
            await self._send(b"", last=True)
        elif fault[0] == "cut":  # the chunked body ends without its last chunk
            self.fake._update(self.rec, last_byte_at=time.monotonic())
        elif fault[0] == "stall":
            await self.stall()
        else:
            await self._send(malformed("response.output_text.delta"))
            await self._send(b"", last=True)

    async def _ready(self, index: int) -> bool:
        """Wait until event ``index`` is generated; False if it never will be."""
        stored = self.stored
        while True:
            if self.peer_closed.is_set():
                return False
            due = stored.ready_at[index]
            if stored.cancelled_at is not None and due > stored.cancelled_at:
                return False
            wait = due - time.monotonic()
            if wait <= 0:
                return True
            stored.changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stored.changed.wait(), wait)

    async def _send(self, frame: bytes, *, last: bool = False) -> None:
        """One frame as a chunk; ``last`` ends the chunked body."""
        self.rec.last_byte_at = time.monotonic()
        data = _chunk(frame) if frame else b""
        self.writer.write(data + (b"0\r\n\r\n" if last else b""))
        await self.writer.drain()


@contextlib.contextmanager
def responses_provider(settings, **entry: Any) -> Iterator[FakeResponses]:
    """The fake, configured as the `responses` provider `bg` serving `gpt-bg`
    (`entry` adds to or overrides its HERMES_PROVIDERS entry)."""
    from chat.providers import registry

    server = FakeResponses(models=["gpt-bg"])
    with server:
        provider = {
            "name": "bg",
            "kind": "responses",
            "base_url": server.base_url,
            "models": ["gpt-bg"],
            **entry,
        }
        settings.HERMES = {**settings.HERMES, "PROVIDERS": [provider]}
        registry.reset()
        yield server
        registry.reset()
