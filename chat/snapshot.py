"""The live snapshot of a session's active run, rebuilt from the journal (DESIGN §5).

A reloaded page renders it, then attaches after `last_seq`. It is bounded
whatever the model did, and reading it changes nothing.
"""

import json

from journal.models import Run
from journal.store import READ_PAGE, read_after

MAX_ITEMS = 64  # tool cards and status lines kept
MAX_FIELD = 8 * 1024  # per tool argument or result string
MAX_TEXT = 150 * 1024  # text + reasoning; beyond it the page replays from seq 0
MAX_TOTAL = 190 * 1024  # everything, leaving room for the session fields (< 200 KB)


def _clip(value: str, limit: int = MAX_FIELD) -> str:
    return value if len(value) <= limit else value[:limit] + "…"


def _fit_tools(tools: list[dict], budget: int) -> list[dict]:
    """Clip tool arguments and results further so that all of them fit `budget`."""
    used = sum(len(t["args"]) + len(t["result"] or "") for t in tools)
    if used <= budget or not tools:
        return tools
    per_field = max(64, budget // (2 * len(tools)))
    return [
        {
            **t,
            "args": _clip(t["args"], per_field),
            "result": t["result"] and _clip(t["result"], per_field),
        }
        for t in tools
    ]


def run_snapshot(run: Run) -> dict:
    text: list[str] = []
    reasoning: list[str] = []
    tools: dict[str, dict] = {}
    statuses: list[str] = []
    size = 0
    after = 0
    last_seq = 0
    while True:
        page = read_after(run_id=run.id, after_seq=after, limit=READ_PAGE)
        for record in page:
            data = json.loads(record.payload)
            if record.type == "token":
                text.append(data["text"])
                size += len(data["text"])
            elif record.type == "reasoning":
                reasoning.append(data["text"])
                size += len(data["text"])
            elif record.type == "tool":
                if len(tools) >= MAX_ITEMS:  # keep the most recent cards
                    del tools[next(iter(tools))]
                tools[data["tool_call_id"]] = {
                    "tool_call_id": data["tool_call_id"],
                    "name": data["name"],
                    "args": _clip(data["args"]),
                    "result": None,
                    "is_error": False,
                }
            elif record.type == "tool_complete" and data["tool_call_id"] in tools:
                tools[data["tool_call_id"]].update(
                    result=_clip(data["result"]), is_error=data["is_error"]
                )
            elif record.type == "status":
                statuses = [*statuses[-(MAX_ITEMS - 1) :], _clip(data["message"])]
            last_seq = record.seq
        if size > MAX_TEXT:
            return {
                "run_id": run.id,
                "status": run.status,
                "too_large": True,
                "last_seq": 0,
            }
        if len(page) < READ_PAGE:
            break
        after = page[-1].seq
    budget = MAX_TOTAL - size - sum(len(m) for m in statuses)
    return {
        "run_id": run.id,
        "status": run.status,
        "too_large": False,
        "text": "".join(text),
        "reasoning": "".join(reasoning),
        "tools": _fit_tools(list(tools.values()), budget),
        "statuses": statuses,
        "last_seq": last_seq,
    }


def session_live(session) -> dict:
    """`active_run` (a snapshot) for a session with a queued or running run."""
    run = (
        Run.objects.filter(session=session, status__in=Run.ACTIVE)
        .order_by("-created_at")
        .first()
    )
    return {"active_run": run_snapshot(run) if run else None}
