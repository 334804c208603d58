"""Wire format of the fake model server: scripted replies, SSE frames, HTTP/1.1.

Kept apart from ``fake_llm`` (the server, its records and its lifecycle) so
that each stays short; nothing here does I/O except ``read_request``.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from hermes_testing.fake_events import fault_of, planned, visible_prefix

MAX_HEADER_BYTES = 64 * 1024  # more than any client of ours sends; bounds a bad peer
MAX_BODY_BYTES = 32 * 2**20  # long conversations, not unbounded ones
MALFORMED_FRAME = b"data: {not json\n\n"
DONE_FRAME = b"data: [DONE]\n\n"


def _default_usage() -> dict[str, int]:
    return {"prompt_tokens": 12, "completion_tokens": 34, "total_tokens": 46}


@dataclass
class Reply:
    """One scripted answer to one POST /v1/chat/completions.

    Fault fields count *visible characters*: reasoning, then content, then tool
    call argument text, in the order they are streamed. ``cut_after_chars=0``
    therefore dies before anything visible (only the role frame is sent).
    At most one of ``cut_after_chars``, ``stall_after_chars`` and
    ``malformed_after_chars`` is meant to be set. Faults apply to streaming
    requests only.
    """

    text: str = ""
    reasoning: str = ""
    #: Delta key of reasoning: ``reasoning_content`` (DeepSeek, vLLM) or
    #: ``reasoning`` (OpenRouter, Ollama).
    reasoning_key: str = "reasoning_content"
    #: ``{"name": str, "arguments": str | dict, "id": str (optional)}`` each.
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    #: Sent as the final ``choices: []`` frame if the request asked for it.
    usage: dict[str, Any] | None = field(default_factory=_default_usage)
    chunk_chars: int = 4
    #: Pace in chunks per second (a chunk stands for a token); None = no pause.
    tokens_per_s: float | None = None
    status: int = 200
    retry_after: float | None = None
    error_body: dict[str, Any] | None = None
    #: Declare the full Content-Length, send this many chars, then close.
    cut_after_chars: int | None = None
    #: Send this many chars, then nothing, until the client closes.
    stall_after_chars: int | None = None
    #: Send this many chars, then ``data: {not json``, then close.
    malformed_after_chars: int | None = None
    #: Send this many chars, then ``data: [DONE]`` with no finish reason, and
    #: end the body cleanly (what llama.cpp's Python server sends when it
    #: interrupts an answer for another request).
    done_after_chars: int | None = None
    finish_reason: str | None = None  # None: "tool_calls" if tool calls, else "stop"
    #: After this many chunks, send nothing more until ``hold`` is set (the
    #: test's "now go on"): a run that streams for as long as a test needs.
    hold_after_chunks: int | None = None
    hold: threading.Event | None = None


@dataclass(frozen=True)
class Piece:
    """One SSE frame before rendering.

    ``delta`` is the frame's delta with its visible ``text`` left out; ``slot``
    says where the text goes, so a fault can send a shortened copy.
    """

    delta: dict[str, Any] = field(default_factory=dict)
    text: str = ""
    slot: str = ""  # "reasoning_content" / "reasoning" / "content" / "arguments"
    finish: str | None = None
    usage: dict[str, Any] | None = None
    terminal: bool = False  # finish / usage frames: a fault strikes before them

    def with_text(self, text: str) -> dict[str, Any]:
        if self.slot == "arguments":
            (call,) = self.delta["tool_calls"]
            return {"tool_calls": [{**call, "function": {"arguments": text}}]}
        return {**self.delta, self.slot: text} if self.slot else self.delta


def build_pieces(reply: Reply) -> list[Piece]:
    """The reply as ordered frames: role, reasoning, content, tools, finish, usage."""
    n = max(1, reply.chunk_chars)
    pieces = [Piece({"role": "assistant", "content": ""})]
    for key, text in ((reply.reasoning_key, reply.reasoning), ("content", reply.text)):
        pieces += [
            Piece(text=text[i : i + n], slot=key) for i in range(0, len(text), n)
        ]
    for idx, call in enumerate(normalise_tool_calls(reply.tool_calls)):
        head = {"index": idx, "id": call["id"], "type": "function"}
        head["function"] = {"name": call["name"], "arguments": ""}
        pieces.append(Piece({"tool_calls": [head]}))
        args, arg_delta = call["arguments"], {"tool_calls": [{"index": idx}]}
        pieces += [
            Piece(arg_delta, args[i : i + n], "arguments")
            for i in range(0, len(args), n)
        ]
    finish = reply.finish_reason or ("tool_calls" if reply.tool_calls else "stop")
    pieces.append(Piece(finish=finish, terminal=True))
    if reply.usage is not None:
        pieces.append(Piece(usage=reply.usage, terminal=True))
    return pieces


class Renderer:
    """Turns pieces into ``data:`` frames for one request (id, model, usage)."""

    def __init__(self, body: dict[str, Any]) -> None:
        options = body.get("stream_options") or {}
        self.with_usage = bool(options.get("include_usage"))
        self.base = {
            "id": f"chatcmpl-fake-{secrets.token_hex(6)}",
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": body.get("model", "fake-model"),
        }

    def wanted(self, piece: Piece) -> bool:
        """A usage frame is sent only if the request asked for it."""
        return piece.usage is None or self.with_usage

    def __call__(self, piece: Piece, text: str | None = None) -> bytes:
        if piece.usage is not None:
            return frame({**self.base, "choices": [], "usage": piece.usage})
        delta = piece.with_text(piece.text if text is None else text)
        choice = {"index": 0, "delta": delta, "finish_reason": piece.finish}
        data: dict[str, Any] = {**self.base, "choices": [choice]}
        if self.with_usage:
            data["usage"] = None  # what OpenAI sends on every non-final chunk
        return frame(data)


def cut_frames(pieces: list[Piece], limit: int, render: Renderer) -> list[bytes]:
    """Render frames until ``limit`` visible chars were sent (split to land exactly)."""
    return [render(piece, text) for piece, text in visible_prefix(pieces, limit)]


def frame(data: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(data, separators=(",", ":")).encode() + b"\n\n"


def normalise_tool_calls(calls: list[dict[str, Any]]) -> list[dict[str, str]]:
    out = []
    for i, call in enumerate(calls):
        fn = call.get("function", call)  # accept the OpenAI shape too
        args = fn.get("arguments", "")
        out.append(
            {
                "id": call.get("id") or f"call_fake_{i}",
                "name": fn["name"],
                "arguments": args if isinstance(args, str) else json.dumps(args),
            }
        )
    return out


def completion(reply: Reply, body: dict[str, Any]) -> dict[str, Any]:
    """A non-streaming chat.completion for ``stream: false`` (no faults)."""
    message: dict[str, Any] = {"role": "assistant", "content": reply.text}
    if reply.reasoning:
        message[reply.reasoning_key] = reply.reasoning
    calls = normalise_tool_calls(reply.tool_calls)
    if calls:
        message["tool_calls"] = [
            {
                "id": c["id"],
                "type": "function",
                "function": {"name": c["name"], "arguments": c["arguments"]},
            }
            for c in calls
        ]
    finish = reply.finish_reason or ("tool_calls" if calls else "stop")
    data: dict[str, Any] = {
        "id": "chatcmpl-fake",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": body.get("model", "fake-model"),
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
    }
    if reply.usage is not None:
        data["usage"] = reply.usage
    return data


def error_payload(message: str, code: str | int) -> dict[str, Any]:
    return {"error": {"message": message, "type": "fake_error", "code": code}}


_REASONS = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 404: "Not Found"}
_REASONS |= {405: "Method Not Allowed", 429: "Too Many Requests", 500: "Server Error"}


def response_head(status: int, headers: dict[str, str]) -> bytes:
    lines = [f"HTTP/1.1 {status} {_REASONS.get(status, 'Status')}"]
    lines += [f"{name}: {value}" for name, value in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


@dataclass(frozen=True)
class Request:
    """One HTTP request as read; ``target`` keeps its query."""

    method: str
    target: str
    headers: dict[str, str]  # lower-cased names
    body: bytes

    @property
    def path(self) -> str:
        return self.target.partition("?")[0]

    @property
    def query(self) -> str:
        return self.target.partition("?")[2]

    @property
    def route(self) -> str:
        """The path without a trailing slash, as the fakes match it."""
        return self.path.rstrip("/")


async def read_request(reader: asyncio.StreamReader) -> Request | None:
    """Read one request; ``None`` on a clean EOF between requests."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError as exc:
        if not exc.partial:
            return None
        raise
    except asyncio.LimitOverrunError as exc:
        raise ValueError("request head too large") from exc
    if len(head) > MAX_HEADER_BYTES:
        raise ValueError("request head too large")
    request_line, *header_lines = head.decode("latin-1").split("\r\n")
    method, target, _version = request_line.split(" ", 2)
    headers = {}
    for line in header_lines:
        if line:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
    length = int(headers.get("content-length", "0"))
    if length > MAX_BODY_BYTES:
        raise ValueError("request body too large")
    body = await reader.readexactly(length) if length else b""
    return Request(method, target, headers, body)


def plan_stream(reply: Reply, body: dict[str, Any]) -> tuple[list[bytes], int]:
    """The SSE frames to send for ``reply`` and the Content-Length to declare
    (``fake_events.planned``: a malformed reply declares what it sends, a cut
    or a stall the whole reply)."""
    render = Renderer(body)
    pieces = [p for p in build_pieces(reply) if render.wanted(p)]
    full = [*map(render, pieces), DONE_FRAME]
    return planned(
        full,
        fault_of(reply),
        lambda limit: cut_frames(pieces, limit, render),
        {"malformed": MALFORMED_FRAME, "done": DONE_FRAME},
    )
