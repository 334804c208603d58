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
3a. A decision is bound to the one call that was shown and is used once. Each
   call's journal id is unique within its run (``Gate.call_id``: the
   provider's id the first time the run sees it, another one made from it, the
   step and the call's place when the provider repeats an id, as some number
   theirs per response); the model is still answered under its own id. The
   decision applies only to the call with that journal id, tool name and
   arguments, and only until that call is answered; the API may name the call
   it showed (``tool_call_id``), and a decision naming another is refused.
4. A run still waiting after ``HERMES_APPROVAL_TIMEOUT_S`` ends ``failed`` /
   ``approval-timeout`` (the worker's reaper, ``journal.waits``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Final, NamedTuple

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


class NotShown(NotWaiting):
    """The call the run waits on is not the one the decision names."""


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


class Verdict(NamedTuple):
    """What to do with one call: ``rule`` (allow, ask or deny), a person's
    ``note``, and whether a person's decision on this very call says so."""

    rule: str
    note: str = ""
    decided: bool = False


@dataclass
class Gate:
    """A run's view of its tool calls and approvals (module doc, rule 3a): the
    session's always-allowed tools, the journal ids the run has given its
    calls, and the decisions not used yet, by journal id, each with the call
    it was shown (``name``, ``args``)."""

    always: set[str] = field(default_factory=set)
    decisions: dict[str, dict] = field(default_factory=dict)
    taken: set[str] = field(default_factory=set)  # every call's journal id
    waited: dict | None = None  # the call announced before the run waited

    def call_id(self, provider_id: str, *, step: int, index: int) -> str:
        """A journal id for a new call, never given before in this run: the
        provider's own id the first time, else one made from it, the step and
        the call's place in it."""
        call_id, n = provider_id, 1
        while call_id in self.taken:
            call_id = f"{provider_id}~{step}.{index}" + (f"~{n}" if n > 1 else "")
            n += 1
        self.taken.add(call_id)
        return call_id

    def resumed(self, name: str, args: str) -> str | None:
        """The journal id of the call the run waited on, if a resumed step's
        first unanswered call (``name``, ``args``) is that call; once."""
        waited, self.waited = self.waited, None
        if waited is None or (waited["name"], waited["args"]) != (name, args):
            return None
        return waited["tool_call_id"]

    def verdict(self, call_id: str, name: str, args: str) -> Verdict:
        """What to do with one call about to run (its journal id, tool, arguments)."""
        rule = policy(name)
        if rule == DENY:
            return Verdict(DENY)
        decision = self.decisions.get(call_id)
        if decision is not None and (decision["name"], decision["args"]) == (
            name,
            args,
        ):
            del self.decisions[call_id]  # used once
            kind = ALLOW if decision["decision"] == APPROVE else DENY
            return Verdict(kind, decision.get("note", ""), decided=True)
        if rule == ASK and name not in self.always:
            return Verdict(ASK)
        return Verdict(ALLOW)


def gate_load(*, run_id: str, session: ChatSession) -> Gate:
    """The gate of a run being (re)started: the journal ids its calls have,
    and the decisions on calls not answered yet, each bound to its request."""
    gate = Gate(always=set(session.always_allowed_tools))
    requests: dict[str, dict] = {}
    answered: set[str] = set()
    decided: list[dict] = []
    for event_type, payload in _events(
        run_id, ("tool", "tool_complete", "approval_request", "approval")
    ):
        call_id = payload["tool_call_id"]
        if event_type == "tool":
            gate.taken.add(call_id)
        elif event_type == "tool_complete":
            answered.add(call_id)
        elif event_type == "approval_request":
            requests[call_id] = payload
        else:
            decided.append(payload)
            if payload.get("always"):
                gate.always.add(payload["name"])
    for decision in decided:
        call_id = decision["tool_call_id"]
        request = requests.get(call_id)
        if request is None or call_id in answered:
            continue  # never shown, or already used
        gate.decisions[call_id] = {**decision, "args": request["args"]}
        gate.waited = request
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
    return [payload for _, payload in _events(run_id, (event_type,))]


def _events(run_id: str, types: tuple[str, ...]) -> list[tuple[str, dict]]:
    rows = Event.objects.filter(run_id=run_id, type__in=types).order_by("seq")
    return [(t, json.loads(p)) for t, p in rows.values_list("type", "payload")]


def approval_decide(
    *,
    run: Run,
    approve: bool,
    note: str = "",
    always: bool = False,
    tool_call_id: str | None = None,
) -> dict:
    """Journal a person's decision on the pending call and queue the run again.

    ``always`` (with ``approve``) also lets the tool run unasked in the run's
    session from now on. ``tool_call_id``, if given, is the call the person
    was shown: ``NotShown`` if another one waits. Raises ``NotWaiting`` if
    nothing waits for a decision. Returns the journaled decision.
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
        if tool_call_id is not None and tool_call_id != pending["tool_call_id"]:
            raise NotShown(run.id)
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
