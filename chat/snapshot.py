"""The live snapshot of a session's active run, rebuilt from the journal.
See docs/architecture.md §5.

A reloaded page draws its parts in journal order (text, reasoning and tool
cards as they streamed), then attaches after `last_seq`. It is bounded
whatever the model did, and reading it changes nothing.

Beside it, `tool_outcomes`: how the tool calls of the session's active branch
ended where the saved messages cannot say (a tool message keeps the result's
text only), so that a page drawing finished answers from their messages
shows a failed call as failed and a denied one as denied, as it did live.
"""

import json

from django.db.models import Q

from journal.fold import Fold, Part
from journal.models import Event, Run
from journal.store import READ_PAGE, read_after

from .models import Message
from .tree import IDS_PER_QUERY, Tree

MAX_ITEMS = 64  # parts (text, reasoning, tool cards) and status lines kept
MAX_FIELD = 8 * 1024  # per tool argument or result string
MAX_TEXT = 150 * 1024  # text + reasoning; beyond it the page replays from seq 0
MAX_TOTAL = 190 * 1024  # everything, leaving room for the session fields (< 200 KB)


def _clip(value: str, limit: int = MAX_FIELD) -> str:
    return value if len(value) <= limit else value[:limit] + "…"


def _bound(fold: Fold) -> bool:
    """Clip the fold to the snapshot's limits, in place, between pages: tool
    fields clipped, the oldest tool cards dropped while there are too many
    parts, the newest statuses kept. False if it cannot fit (too much text,
    or too many text segments even without tool cards)."""
    for part in fold.parts:
        if part["kind"] == "tool":
            part["args"] = _clip(part["args"])
            part["result"] = part["result"] and _clip(part["result"])
    fold.statuses[:] = [_clip(m) for m in fold.statuses[-MAX_ITEMS:]]
    while len(fold.parts) > MAX_ITEMS:
        oldest = next((p for p in fold.parts if p["kind"] == "tool"), None)
        if oldest is None:
            return False
        fold.forget_tool(oldest)
    return _text_size(fold.parts) <= MAX_TEXT


def _text_size(parts: list[Part]) -> int:
    return sum(len(p["text"]) for p in parts if p["kind"] != "tool")


def _fit_tools(parts: list[Part], budget: int) -> list[Part]:
    """Clip tool arguments and results further so that all of them fit `budget`."""
    tools = [p for p in parts if p["kind"] == "tool"]
    used = sum(len(t["args"]) + len(t["result"] or "") for t in tools)
    if used <= budget or not tools:
        return parts
    per_field = max(64, budget // (2 * len(tools)))
    return [
        {
            **p,
            "args": _clip(p["args"], per_field),
            "result": p["result"] and _clip(p["result"], per_field),
        }
        if p["kind"] == "tool"
        else p
        for p in parts
    ]


def run_snapshot(run: Run) -> dict:
    """The run's folded turn so far (`journal.fold`), bounded for the page."""
    fold = Fold()
    after = 0
    while True:
        page = read_after(run_id=run.id, after_seq=after, limit=READ_PAGE)
        for record in page:
            fold.feed(record)
        if not _bound(fold):
            return {
                "run_id": run.id,
                "status": run.status,
                "too_large": True,
                "last_seq": 0,
            }
        if len(page) < READ_PAGE:
            break
        after = page[-1].seq
    turn = fold.turn()
    budget = MAX_TOTAL - _text_size(turn["parts"]) - sum(map(len, turn["statuses"]))
    return {
        "run_id": run.id,
        "status": run.status,
        "too_large": False,
        "parts": _fit_tools(turn["parts"], budget),
        "statuses": turn["statuses"],
        "last_seq": turn["last_seq"],
    }


MAX_TOOL_OUTCOMES = 1000  # calls listed; the newest runs' first


def tool_outcomes(session) -> dict[str, dict[str, dict]]:
    """`{run_id: {tool_call_id: {"is_error": true, "approval": {"decision",
    "note"}}}}` for the calls of the session's active branch that failed or
    that a person decided on, from their runs' journals (`tool_complete`,
    `approval`); calls that simply ran are left out. A run whose journal was
    pruned has none."""
    path = set(Tree.of_session(session.pk).active_path())
    tool_messages = Message.objects.filter(
        session=session, role=Message.Role.TOOL, run__isnull=False
    ).values_list("pk", "run_id")
    runs = sorted({run_id for pk, run_id in tool_messages if pk in path}, reverse=True)
    outcomes: dict[str, dict[str, dict]] = {}
    listed = 0
    # Newest runs first, a bounded number of ids a statement (`chat.tree`).
    for start in range(0, len(runs), IDS_PER_QUERY):
        for run_id, kind, data in _decisive_events(runs[start : start + IDS_PER_QUERY]):
            call_id = data.get("tool_call_id")
            if not isinstance(call_id, str):
                continue
            calls = outcomes.setdefault(run_id, {})
            if call_id not in calls:
                if listed >= MAX_TOOL_OUTCOMES:
                    return outcomes
                listed += 1
            call = calls.setdefault(call_id, {})
            if kind == "tool_complete":
                call["is_error"] = True
            else:
                call["approval"] = {
                    "decision": data.get("decision", ""),
                    "note": _clip(str(data.get("note") or "")),
                }
    return outcomes


def _decisive_events(run_ids: list[str]):
    """`(run_id, type, payload)` of the runs' `approval` events and of their
    `tool_complete` events of failed calls, newest run first, in order.

    Payloads are compact JSON (`journal.store`): a failed call's holds
    `"is_error":true` as written, never inside a string (quotes are escaped
    there), so the database returns only those; each is parsed to be sure."""
    rows = (
        Event.objects.filter(run_id__in=run_ids)
        .filter(
            Q(type="approval")
            | Q(type="tool_complete", payload__contains='"is_error":true')
        )
        .order_by("-run_id", "seq")
        .values_list("run_id", "type", "payload")
    )
    for run_id, kind, payload in rows.iterator(chunk_size=500):
        data = json.loads(payload)
        if not isinstance(data, dict):
            continue
        if kind == "tool_complete" and data.get("is_error") is not True:
            continue
        yield run_id, kind, data


def session_live(session) -> dict:
    """`active_run` (a snapshot) for a session with a queued or running run,
    and `tool_outcomes` of its active branch."""
    run = (
        Run.objects.filter(turn__session=session, status__in=Run.ACTIVE)
        .order_by("-created_at")
        .first()
    )
    return {
        "active_run": run_snapshot(run) if run else None,
        "tool_outcomes": tool_outcomes(session),
    }
