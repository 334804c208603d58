"""Tool approval gates (docs/architecture.md, "Tool approval").

1. Every tool has a policy: ``allow`` (runs), ``ask`` (waits for a person) or
   ``deny`` (not offered; a call is answered an error). ``HERMES_TOOL_APPROVAL``
   names it per tool; otherwise an MCP tool follows its server's
   ``tool_approval`` or ``approval`` and a built-in is allowed. A tool a
   person chose to "always allow" in a session runs there unasked, unless its
   policy is ``deny``.
2. A call that must ask is journaled (``tool`` then ``approval_request``) and
   its run is released into ``waiting`` (``journal.waits.run_wait``): no worker
   slot, no provider connection, until a decision or the deadline.
3. ``approval_decide`` journals the decision (``approval``) and queues the run
   again in one transaction; whichever worker claims it answers the call (runs
   it, or answers the model the denial) and the turn goes on.
4. A run still waiting after ``HERMES_APPROVAL_TIMEOUT_S`` ends ``failed`` /
   ``approval-timeout`` (the worker's reaper, ``journal.waits``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Final

from django.conf import settings
from django.db import transaction

from journal.models import Event, Run
from journal.publish import publish_on_commit
from journal.waits import run_resume

from . import mcp_tools
from .mcp_servers import configured_servers
from .models import ChatSession, Turn
from .services import workers_nudge_on_commit

ALLOW: Final = "allow"
ASK: Final = "ask"
DENY: Final = "deny"
POLICIES: Final = (ALLOW, ASK, DENY)
APPROVE: Final = "approve"
TIMEOUT_STATE: Final = "approval-timeout"
MAX_NOTE_CHARS = 2000  # a note is for the model and the page, not a document


class NotWaiting(Exception):
    """The run has no pending approval request (decided, ended or never asked)."""


def policy(name: str) -> str:
    """The configured policy of tool ``name`` (module doc, rule 1)."""
    configured = settings.HERMES.get("TOOL_APPROVAL") or {}
    if configured.get(name) in POLICIES:
        return configured[name]
    if mcp_tools.owns(name):
        server_name, _, tool = name.partition(mcp_tools.SEPARATOR)
        for server in configured_servers():
            if server.name == server_name:
                return server.policy(tool)
    return ALLOW


def offered(schema: list[dict]) -> list[dict]:
    """The tool schema entries whose tools are not denied."""
    return [e for e in schema if policy(e["function"]["name"]) != DENY]


@dataclass
class Gate:
    """A run's view of approvals: the session's always-allowed tools and the
    decisions journaled for this run, by tool call id."""

    always: set[str] = field(default_factory=set)
    decisions: dict[str, dict] = field(default_factory=dict)

    def verdict(self, call_id: str, name: str) -> tuple[str, str]:
        """``(allow|ask|deny, note)`` for one call about to run."""
        rule = policy(name)
        if rule == DENY:
            return DENY, ""
        decision = self.decisions.get(call_id)
        if decision is not None:
            kind = ALLOW if decision["decision"] == APPROVE else DENY
            return kind, decision.get("note", "")
        if rule == ASK and name not in self.always:
            return ASK, ""
        return ALLOW, ""


def gate_load(*, run_id: str, session: ChatSession) -> Gate:
    """The gate of a run being (re)started: its decisions so far."""
    gate = Gate(always=set(session.always_allowed_tools))
    for payload in _payloads(run_id, "approval"):
        gate.decisions[payload["tool_call_id"]] = payload
        if payload.get("always"):
            gate.always.add(payload["name"])
    return gate


def approval_pending(*, run_id: str) -> dict | None:
    """The run's request still waiting for a decision, or None."""
    decided = {p["tool_call_id"] for p in _payloads(run_id, "approval")}
    waiting = [
        p
        for p in _payloads(run_id, "approval_request")
        if p["tool_call_id"] not in decided
    ]
    return waiting[-1] if waiting else None


def timeout_error() -> dict:
    """The error a run still waiting at its deadline ends with."""
    limit = settings.HERMES["APPROVAL_TIMEOUT_S"]
    return {
        "category": TIMEOUT_STATE,
        "message": f"no approval decision within {limit:g} s",
    }


def _payloads(run_id: str, event_type: str) -> list[dict]:
    rows = Event.objects.filter(run_id=run_id, type=event_type).order_by("seq")
    return [json.loads(p) for p in rows.values_list("payload", flat=True)]


def approval_decide(
    *, run: Run, approve: bool, note: str = "", always: bool = False
) -> dict:
    """Journal a person's decision on the pending call and queue the run again.

    ``always`` (with ``approve``) also lets the tool run unasked in the run's
    session from now on. Raises ``NotWaiting`` if nothing waits for a decision.
    Returns the journaled decision.
    """
    with transaction.atomic():
        if (
            not Run.objects.select_for_update()
            .filter(id=run.id, status=Run.Status.WAITING)
            .exists()
        ):
            raise NotWaiting(run.id)
        pending = approval_pending(run_id=run.id)
        if pending is None:
            raise NotWaiting(run.id)
        decision: dict = {
            "tool_call_id": pending["tool_call_id"],
            "name": pending["name"],
            "decision": APPROVE if approve else "deny",
        }
        if note:
            decision["note"] = note[:MAX_NOTE_CHARS]
        if approve and always:
            decision["always"] = True
            _always_allow(run.id, pending["name"])
        records = run_resume(
            run_id=run.id, events=[("approval", decision)], by="approval"
        )
        if not records:
            raise NotWaiting(run.id)
        publish_on_commit(run.id, records)
        workers_nudge_on_commit()
    return decision


def _always_allow(run_id: str, name: str) -> None:
    """Add ``name`` to the always-allowed tools of the run's session (locked)."""
    session_id = Turn.objects.values_list("session_id", flat=True).get(run_id=run_id)
    session = ChatSession.objects.select_for_update().get(pk=session_id)
    if name not in session.always_allowed_tools:
        session.always_allowed_tools = [*session.always_allowed_tools, name]
        session.save(update_fields=["always_allowed_tools"])
