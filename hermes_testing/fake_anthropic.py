"""A real loopback Anthropic Messages server (``POST /v1/messages``), with faults.

It shares ``FakeLLM``'s scripting, records and lifecycle (push, route,
``requests``, ``wait_closed`` …) and speaks the Messages streaming protocol:
``message_start``, ``ping``, ``content_block_start/delta/stop`` for thinking,
text and ``tool_use`` (with ``input_json_delta``), ``message_delta`` with the
stop reason and cumulative usage, ``message_stop``. Like the real API it
refuses, with a 400 ``invalid_request_error``, the requests it would refuse:
roles that do not alternate, a conversation that starts with the assistant, a
``system`` role inside ``messages``, empty text blocks, a final assistant
message ending in whitespace, a ``tool_result`` without its ``tool_use``, no
``max_tokens`` or no ``anthropic-version`` header.

Faults, by visible characters as in ``fake_wire``: ``cut_after_chars``,
``stall_after_chars``, ``malformed_after_chars``, and ``error_after_chars``
(an ``error`` event such as ``overloaded_error``, then the stream ends);
``status`` 429/529 with ``retry_after`` answer before any byte of a stream.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from hermes_testing.fake_events import (
    Event,
    chunks,
    cut_events,
    fault_of,
    malformed,
    planned,
    sse,
)
from hermes_testing.fake_llm import Conn, FakeLLM, _StreamWriter
from hermes_testing.fake_wire import Reply, Request, normalise_tool_calls

__all__ = ["AnthropicReply", "FakeAnthropic", "request_problems"]

ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    529: "overloaded_error",
}
STOP_REASONS = {"stop": "end_turn", "tool_calls": "tool_use", "length": "max_tokens"}


def _default_usage() -> dict[str, int]:
    return {"input_tokens": 12, "output_tokens": 34}


@dataclass
class AnthropicReply(Reply):
    """A scripted Messages reply; ``usage`` is in Anthropic's own shape."""

    usage: dict[str, Any] | None = field(default_factory=_default_usage)
    #: Send this many chars, then an ``error`` event of ``error_type``, then end.
    error_after_chars: int | None = None
    error_type: str = "overloaded_error"


def anthropic_error(status: int, message: str) -> dict[str, Any]:
    kind = ERROR_TYPES.get(status, "api_error")
    return {"type": "error", "error": {"type": kind, "message": message}}


def build_events(reply: Reply, body: dict[str, Any]) -> list[Event]:
    """The reply as Messages stream events, in the order the API sends them."""
    usage = reply.usage
    message = {
        "id": f"msg_fake_{secrets.token_hex(6)}",
        "type": "message",
        "role": "assistant",
        "content": [],
        "model": body.get("model", "fake-model"),
        "stop_reason": None,
        "stop_sequence": None,
    }
    if usage is not None:
        message["usage"] = {"input_tokens": usage.get("input_tokens", 0)}
        message["usage"]["output_tokens"] = 1
    events = [
        Event("message_start", {"type": "message_start", "message": message}),
        Event("ping", {"type": "ping"}),
    ]
    index = 0

    def block(start: dict[str, Any], kind: str, key: str, text: str) -> None:
        nonlocal index
        head = {"type": "content_block_start", "index": index, "content_block": start}
        events.append(Event("content_block_start", head))
        for piece in chunks(text, reply.chunk_chars):
            delta = {"type": "content_block_delta", "index": index}
            delta["delta"] = {"type": kind, key: piece}
            events.append(Event("content_block_delta", delta, piece, ("delta", key)))
        if kind == "thinking_delta":
            sig = {"type": "signature_delta", "signature": secrets.token_hex(16)}
            delta = {"type": "content_block_delta", "index": index, "delta": sig}
            events.append(Event("content_block_delta", delta))
        stop = {"type": "content_block_stop", "index": index}
        events.append(Event("content_block_stop", stop))
        index += 1

    if reply.reasoning:
        block(
            {"type": "thinking", "thinking": ""},
            "thinking_delta",
            "thinking",
            reply.reasoning,
        )
    if reply.text:
        block({"type": "text", "text": ""}, "text_delta", "text", reply.text)
    calls = normalise_tool_calls(reply.tool_calls)
    for call in calls:
        start = {
            "type": "tool_use",
            "id": call["id"],
            "name": call["name"],
            "input": {},
        }
        block(start, "input_json_delta", "partial_json", call["arguments"])
    finish = reply.finish_reason or ("tool_calls" if calls else "stop")
    delta: dict[str, Any] = {
        "type": "message_delta",
        "delta": {
            "stop_reason": STOP_REASONS.get(finish, finish),
            "stop_sequence": None,
        },
    }
    if usage is not None:
        delta["usage"] = {"output_tokens": usage.get("output_tokens", 0)}
    events.append(Event("message_delta", delta, terminal=True))
    events.append(Event("message_stop", {"type": "message_stop"}, terminal=True))
    return events


def plan_messages(reply: Reply, body: dict[str, Any]) -> tuple[list[bytes], int]:
    """Frames for ``reply`` and the Content-Length to declare
    (``fake_events.planned``)."""
    events = build_events(reply, body)
    error_type = getattr(reply, "error_type", "overloaded_error")
    error = {"type": "error", "error": {"type": error_type, "message": "Overloaded"}}
    return planned(
        [sse(e.name, e.data) for e in events],
        fault_of(reply),
        lambda limit: [sse(e.name, e.data) for e in cut_events(events, limit)],
        {"malformed": malformed("content_block_delta"), "error": sse("error", error)},
    )


def request_problems(body: Any, headers: dict[str, str]) -> list[str]:
    """Why the real Messages API would answer 400 (empty: it would accept it)."""
    if not headers.get("anthropic-version"):
        return ["anthropic-version: header is required"]
    if not isinstance(body, dict):
        return ["body: must be a JSON object"]
    problems = []
    if not isinstance(body.get("model"), str):
        problems.append("model: Field required")
    max_tokens = body.get("max_tokens")
    if not isinstance(max_tokens, int) or max_tokens < 1:
        problems.append("max_tokens: Field required")
    system = body.get("system")
    if system is not None and not isinstance(system, str | list):
        problems.append("system: Input should be a valid string")
    for i, tool in enumerate(body.get("tools") or []):
        if (
            not isinstance(tool, dict)
            or "name" not in tool
            or "input_schema" not in tool
        ):
            problems.append(f"tools.{i}: needs name and input_schema")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return [*problems, "messages: at least one message is required"]
    return problems + _message_problems(messages)


def _message_problems(messages: list[Any]) -> list[str]:
    problems: list[str] = []
    previous_role, tool_uses = None, set()
    for i, message in enumerate(messages):
        role = message.get("role") if isinstance(message, dict) else None
        if role not in ("user", "assistant"):
            problems.append(f"messages.{i}.role: Unexpected role {role!r}")
            continue
        if i == 0 and role != "user":
            problems.append('messages: first message must use the "user" role')
        if role == previous_role:
            problems.append(
                f"messages.{i}: roles must alternate between user and assistant"
            )
        content = message.get("content")
        blocks = (
            [{"type": "text", "text": content}] if isinstance(content, str) else content
        )
        if not isinstance(blocks, list) or not blocks:
            problems.append(f"messages.{i}.content: must not be empty")
            blocks = []
        uses = set()
        for j, blk in enumerate(blocks):
            kind = blk.get("type") if isinstance(blk, dict) else None
            if kind == "text" and not blk.get("text"):
                problems.append(
                    f"messages.{i}.content.{j}: text content blocks must be non-empty"
                )
            elif kind == "tool_use" and role == "assistant":
                uses.add(blk.get("id"))
                if not isinstance(blk.get("input"), dict):
                    problems.append(
                        f"messages.{i}.content.{j}.input: must be an object"
                    )
            elif kind == "tool_result" and role == "user":
                if blk.get("tool_use_id") not in tool_uses:
                    problems.append(
                        f"messages.{i}.content.{j}: tool_result without its tool_use"
                    )
            elif kind not in ("text", "tool_use", "tool_result", "thinking", "image"):
                problems.append(f"messages.{i}.content.{j}.type: unknown {kind!r}")
        last = i == len(messages) - 1
        if last and role == "assistant" and blocks and blocks[-1].get("type") == "text":
            if blocks[-1].get("text", "") != blocks[-1].get("text", "").rstrip():
                problems.append(
                    "final assistant content cannot end with trailing whitespace"
                )
        tool_uses = uses
        previous_role = role
    return problems


class FakeAnthropic(FakeLLM):
    """Loopback Anthropic Messages server; scripting as :class:`FakeLLM`."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("default", AnthropicReply(text="Hello from the fake model."))
        super().__init__(**kwargs)

    async def _dispatch(self, request: Request, conn: Conn) -> tuple[bool, bool]:
        method, path, route = request.method, request.path, request.route
        headers, writer = request.headers, conn.writer
        authorised = not self.api_key or headers.get("x-api-key") == self.api_key
        if method == "POST" and route == "/v1/messages":
            rec, reply = self._record(request, authorised, conn)
            if not authorised:
                await self._send_error(writer, rec, 401, "invalid x-api-key")
            elif reply is None:
                await self._send_error(writer, rec, 400, "body is not JSON")
            elif problems := request_problems(rec.body, headers):
                await self._send_error(writer, rec, 400, "; ".join(problems))
            elif reply.status != 200:
                extra = {}
                if reply.retry_after is not None:
                    extra["retry-after"] = f"{reply.retry_after:g}"
                body = reply.error_body or anthropic_error(reply.status, "fake error")
                await self._send_json(writer, reply.status, body, rec, extra)
            elif not rec.body.get("stream"):
                await self._send_error(
                    writer, rec, 400, "the fake answers stream: true only"
                )
            else:
                streamer = _MessagesStream(self, rec, reply, conn.reader, writer)
                return False, await streamer.run()
            return True, False
        if method == "GET" and route == "/v1/models":
            if not authorised:
                await self._send_json(
                    writer, 401, anthropic_error(401, "invalid x-api-key")
                )
            else:
                data = [
                    {
                        "type": "model",
                        "id": m,
                        "display_name": m,
                        "created_at": "2025-01-01T00:00:00Z",
                    }
                    for m in self.models
                ]
                await self._send_json(writer, 200, {"data": data, "has_more": False})
            return True, False
        await self._send_json(
            writer, 404, anthropic_error(404, f"no route {method} {path}")
        )
        return True, False

    def _error_body(self, status: int, message: str, code: str | None) -> dict:
        return anthropic_error(status, message)


class _MessagesStream(_StreamWriter):
    def plan(self) -> tuple[list[bytes], int]:
        return plan_messages(self.reply, self.rec.body)

    def paced(self, frame: bytes) -> bool:
        return frame.startswith(b"event: content_block_delta")


@contextmanager
def anthropic_provider(settings, monkeypatch, **entry: Any) -> Iterator[FakeAnthropic]:
    """The fake, configured as the `anthropic` provider `claude` serving
    `claude-x` (`entry` adds to or overrides its HERMES_PROVIDERS entry)."""
    from chat.providers import registry

    server = FakeAnthropic(api_key="key-a", models=["claude-x"])
    with server:
        monkeypatch.setenv("HERMES_TEST_ANTHROPIC_KEY", "key-a")
        provider = {
            "name": "claude",
            "kind": "anthropic",
            "base_url": server.base_url,
            "api_key_env": "HERMES_TEST_ANTHROPIC_KEY",
            "models": ["claude-x"],
            **entry,
        }
        settings.HERMES = {**settings.HERMES, "PROVIDERS": [provider]}
        registry.reset()
        yield server
        registry.reset()
