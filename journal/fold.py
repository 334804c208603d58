"""One fold of a run's journal: records in, one folded turn out.
See docs/architecture.md §3 ("The folded turn").

Every reader that turns events back into an answer folds them here: the
session snapshot (`chat.snapshot`), the partial kept when a run settles
(`chat.services.keep_partial`), `replay_run --format text` (`journal.replay`).
The page folds with `static/hermes/js/fold.js`, the same rules in JS; a browser
test feeds both the same journals and compares the results.

The rules:

1. `parts` keep journal order: `text` and `reasoning` segments (consecutive
   deltas of one kind join; empty deltas add nothing) and `tool` cards, each
   completed in place by its `tool_complete` (one for an unknown call adds a
   card with empty arguments; a repeated `tool` adds nothing), and `steer`
   parts, a person's message injected into the run where it landed (one per
   event; never joined with anything), and `resume` parts where the answer
   was cut and asked for again (a `status` that begins with
   `journal.events.RESUME_STATUS`): the text after it is a new segment, so a
   reader sees where the answer went on, or started over.
2. `statuses` are the `status` messages in order; `error` is the last `error`
   event, else the error the `end` carries; `end` is the `end` payload.
3. `usage` adds up every `usage` event (numbers add, nested objects merge,
   anything else takes the later value): each event reports tokens no earlier
   one did. None when the run reported none.
4. `model` is the `start` event's; `last_seq` the highest seq folded.

`Fold.add` takes one event at a time (`replay_run --follow` renders as it
goes) and returns the part it created or changed.
"""

import json
from typing import TYPE_CHECKING, Any

from .events import RESUME_STATUS

if TYPE_CHECKING:  # the fold itself needs no database
    from .store import Record

Part = dict[str, Any]
_JOINED = ("text", "reasoning")  # segments whose deltas join


def usage_sum(total: dict | None, more: dict | None) -> dict | None:
    """`total` with `more` added: numbers add, nested objects merge, others replace."""
    if more is None:
        return total
    out = dict(total or {})
    for key, value in more.items():
        old = out.get(key)
        if isinstance(value, dict) and isinstance(old, dict):
            out[key] = usage_sum(old, value)
        elif _is_number(value) and _is_number(old):
            out[key] = old + value
        elif value is not None or key not in out:
            out[key] = value
    return out


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


class Fold:
    """The folded turn of one run, built one event at a time."""

    def __init__(self) -> None:
        self.parts: list[Part] = []
        self.statuses: list[str] = []
        self.usage: dict | None = None
        self.error: dict | None = None
        self.model: str | None = None
        self.end: dict | None = None
        self.last_seq = 0
        self._tools: dict[str, Part] = {}
        self._error_event = False

    def feed(self, record: "Record") -> Part | None:
        return self.add(record.type, json.loads(record.payload), record.seq)

    def add(self, event_type: str, data: dict, seq: int = 0) -> Part | None:
        """Fold one event; the part it created or changed, if any."""
        self.last_seq = max(self.last_seq, seq)
        if event_type in ("token", "reasoning"):
            kind = "text" if event_type == "token" else "reasoning"
            return self._append(kind, data.get("text") or "")
        if event_type == "tool":
            return self._tool(data)
        if event_type == "tool_complete":
            return self._complete(data)
        if event_type in ("approval_request", "approval"):
            return self._approval(event_type, data)
        if event_type == "steer":
            part = {"kind": "steer", "text": data.get("text") or ""}
            self.parts.append(part)
            return part
        if event_type == "status":
            message = data.get("message", "")
            self.statuses.append(message)
            if message.startswith(RESUME_STATUS):
                part = {"kind": "resume", "text": message}
                self.parts.append(part)
                return part
        elif event_type == "usage":
            self.usage = usage_sum(self.usage, data)
        elif event_type == "error":
            self.error, self._error_event = data, True
        elif event_type == "end":
            self.end = data
            if not self._error_event and data.get("error"):
                self.error = data["error"]
        elif event_type == "start":
            self.model = data.get("model") or self.model
        return None

    @property
    def text(self) -> str:
        """The answer's text: every text segment, joined."""
        return "".join(p["text"] for p in self.parts if p["kind"] == "text")

    def turn(self) -> dict:
        """The folded turn as plain JSON-ready data (the shape the JS fold makes)."""
        return {
            "parts": [dict(p) for p in self.parts],
            "statuses": list(self.statuses),
            "usage": self.usage,
            "error": self.error,
            "model": self.model,
            "end": self.end,
            "last_seq": self.last_seq,
        }

    def _append(self, kind: str, text: str) -> Part | None:
        if not text:
            return None
        last = self.parts[-1] if self.parts else None
        if last is not None and last["kind"] == kind:
            last["text"] += text
            return last
        part = {"kind": kind, "text": text}
        self.parts.append(part)
        return part

    def _tool(self, data: dict) -> Part | None:
        call_id = data["tool_call_id"]
        if call_id in self._tools:
            return None
        part = {
            "kind": "tool",
            "tool_call_id": call_id,
            "name": data.get("name", ""),
            "args": data.get("args", ""),
            "result": None,
            "is_error": False,
            "duration_ms": None,
        }
        self._tools[call_id] = part
        self.parts.append(part)
        return part

    def _complete(self, data: dict) -> Part:
        part = self._tools.get(data["tool_call_id"])
        if part is None:
            part = self._tool({**data, "args": ""})
            assert part is not None
        part.update(
            result=data.get("result", ""),
            is_error=bool(data.get("is_error")),
            duration_ms=data.get("duration_ms"),
        )
        return part

    def _approval(self, event_type: str, data: dict) -> Part:
        """A tool card's approval: `pending`, then the decision with its note."""
        part = self._tools.get(data["tool_call_id"])
        if part is None:
            part = self._tool({**data, "args": data.get("args", "")})
            assert part is not None
        state = "pending" if event_type == "approval_request" else data["decision"]
        part["approval"] = {"state": state, "note": data.get("note", "")}
        return part

    def forget_tool(self, part: Part) -> None:
        """Drop a tool card (a bounded snapshot keeps the newest); the text
        segments around it join again."""
        index = next(i for i, p in enumerate(self.parts) if p is part)
        del self.parts[index]
        # Still known, so its late completion adds no card; kept small.
        part.update(args="", result=None)
        if 0 < index < len(self.parts):
            before, after = self.parts[index - 1], self.parts[index]
            if before["kind"] == after["kind"] and after["kind"] in _JOINED:
                before["text"] += after["text"]
                del self.parts[index]
