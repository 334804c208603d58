"""Tool approval gates end to end (chat.approvals, journal.waits): a run over
the loopback model calls a tool whose policy is `ask`, waits released from
its worker, and a decision from the API resumes it; the journal is the judge.
"""

from __future__ import annotations

import io
import json
import signal
from datetime import timedelta

import httpx
import pytest
from django.core.management import call_command
from django.urls import reverse
from django.utils import timezone

from chat import approvals
from chat.models import ChatSession, Message
from chat.providers import registry
from hermes_testing.api import (
    CALCULATOR_STEP,
    decide,
    event_types,
    new_session,
    start_run,
    stream,
    text_of,
    waiting_at_tool,
)
from hermes_testing.fake_llm import Reply
from hermes_testing.harness import spawn, subprocess_env, wait_until
from hermes_testing.turns import running_turn
from journal.leases import Claim
from journal.models import Event, Run
from journal.waits import run_wait


def _waiting(run_id: str) -> bool:
    return Run.objects.filter(id=run_id, status=Run.Status.WAITING).exists()


def _start_waiting(server, alice, fake_llm, answer: str = "It is 42.") -> str:
    _, run_id = waiting_at_tool(server, alice[1], fake_llm, Reply(text=answer))
    return run_id


def _one(events: list, kind: str) -> dict:
    (data,) = [data for _, k, data in events if k == kind]
    return data


def _ids_in_order(events: list) -> None:
    seqs = [int(event_id.rsplit(":", 1)[1]) for event_id, _, _ in events]
    assert seqs == list(range(1, len(seqs) + 1))


@pytest.mark.slow
def test_approve_runs_the_tool_and_the_answer_goes_on(
    server, alice, fake_llm, live_worker, asking
):
    run_id = _start_waiting(server, alice, fake_llm)
    # Released: no worker slot, no provider connection while it waits.
    wait_until(lambda: run_id not in live_worker.held, timeout=10)
    assert registry.active_requests() == 0
    assert fake_llm.post_count == 1
    status = httpx.get(f"{server.url}/api/runs/{run_id}/", headers=alice[1]).json()
    assert status["status"] == "waiting" and not status["terminal"]
    pending = status["pending_approval"]
    assert (pending["tool_call_id"], pending["name"]) == ("call_1", "calculator")
    assert pending["args"] == '{"expression": "6*7"}' and pending["expires_at"]

    decided = decide(server, alice[1], run_id, decision="approve")
    assert decided.status_code == 202, decided.text
    assert decided.json()["decision"] == "approve"
    events = stream(server, alice[1], run_id)
    _ids_in_order(events)
    assert event_types(events) == [
        "start",
        "tool",
        "approval_request",
        "approval",
        "tool_complete",
        "token",
        "end",
    ]
    done = _one(events, "tool_complete")
    assert (done["result"], done["is_error"]) == ("42", False)
    assert events[-1][2]["status"] == "completed"
    assert text_of(events) == "It is 42."
    second = fake_llm.requests[1].messages
    assert second[-1] == {"role": "tool", "tool_call_id": "call_1", "content": "42"}
    # A second decision finds nothing waiting.
    again = decide(server, alice[1], run_id, decision="deny")
    assert again.status_code == 409


def test_deny_answers_the_model_the_denial_with_the_note(
    server, alice, fake_llm, live_worker, asking
):
    run_id = _start_waiting(server, alice, fake_llm, answer="Fine, no maths.")
    decided = decide(server, alice[1], run_id, decision="deny", note="not today")
    assert decided.status_code == 202, decided.text
    events = stream(server, alice[1], run_id)
    (done,) = [data for _, kind, data in events if kind == "tool_complete"]
    assert done["is_error"] is True
    assert "a person denied this call of calculator" in done["result"]
    assert "not today" in done["result"]
    (decision,) = [data for _, kind, data in events if kind == "approval"]
    assert (decision["decision"], decision["note"]) == ("deny", "not today")
    sent = fake_llm.requests[1].messages[-1]
    assert sent["role"] == "tool" and sent["content"] == done["result"]
    assert events[-1][2]["status"] == "completed"


@pytest.mark.slow
def test_another_user_cannot_see_or_decide(
    server, alice, bob, fake_llm, live_worker, asking
):
    run_id = _start_waiting(server, alice, fake_llm)
    assert decide(server, bob[1], run_id, decision="approve").status_code == 404
    status = httpx.get(f"{server.url}/api/runs/{run_id}/", headers=bob[1])
    assert status.status_code == 404
    assert _waiting(run_id)
    assert not Event.objects.filter(run_id=run_id, type="approval").exists()
    bad = decide(server, alice[1], run_id, decision="maybe")
    assert bad.status_code == 400 and "decision" in bad.json()["error"]
    assert _waiting(run_id)


@pytest.mark.slow
def test_a_waiting_run_times_out_with_a_clear_end(
    server, alice, fake_llm, live_worker, asking, settings
):
    settings.HERMES = {**settings.HERMES, "APPROVAL_TIMEOUT_S": 1.0}
    run_id = _start_waiting(server, alice, fake_llm)
    events = stream(server, alice[1], run_id)
    end = events[-1][2]
    assert (end["status"], end["terminal_state"]) == ("failed", "approval-timeout")
    assert end["error"]["category"] == "approval-timeout"
    assert event_types(events)[-3:] == ["approval_request", "error", "end"]
    assert decide(server, alice[1], run_id, decision="approve").status_code == 409
    assert fake_llm.post_count == 1


def test_always_allow_is_kept_on_the_session(
    server, alice, fake_llm, live_worker, asking
):
    run_id = _start_waiting(server, alice, fake_llm)
    assert decide(server, alice[1], run_id, decision="always").status_code == 202
    events = stream(server, alice[1], run_id)
    assert events[-1][2]["status"] == "completed"
    session = ChatSession.objects.get(turns__run_id=run_id)
    assert session.always_allowed_tools == ["calculator"]
    # The next run of the session calls it without asking.
    fake_llm.push(CALCULATOR_STEP, Reply(text="Again 42."))
    nxt = start_run(server, alice[1], session.pk, "and again?")
    events = stream(server, alice[1], nxt)
    assert "approval_request" not in event_types(events)
    (done,) = [data for _, kind, data in events if kind == "tool_complete"]
    assert done["result"] == "42" and events[-1][2]["status"] == "completed"


def test_cancel_ends_a_waiting_run(server, alice, fake_llm, live_worker, asking):
    run_id = _start_waiting(server, alice, fake_llm)
    cancel = httpx.post(f"{server.url}/api/runs/{run_id}/cancel/", headers=alice[1])
    assert cancel.status_code == 202
    events = stream(server, alice[1], run_id)
    end = events[-1][2]
    assert (end["status"], end["terminal_state"]) == ("cancelled", "cancelled-by-user")


def test_replay_run_shows_the_pending_request(
    server, alice, fake_llm, live_worker, asking
):
    run_id = _start_waiting(server, alice, fake_llm)
    out = io.StringIO()
    call_command("replay_run", run_id, "--format", "jsonl", stdout=out)
    lines = [json.loads(line) for line in out.getvalue().splitlines() if line]
    assert [line["event"] for line in lines] == ["start", "tool", "approval_request"]
    assert lines[-1]["data"]["name"] == "calculator"


@pytest.mark.slow
def test_a_worker_killed_while_the_run_waits_does_not_matter(
    server, alice, fake_llm, asking
):
    """The run waits in the database: the worker that asked is SIGKILLed, and
    the decision resumes the turn on a new worker process."""
    env = subprocess_env(
        OPENAI_BASE_URL=fake_llm.base_url,
        HERMES_DEFAULT_MODEL="fake-model",
        HERMES_LEASE_S="1.5",
        HERMES_HEARTBEAT_S="0.3",
        HERMES_TOOL_APPROVAL=json.dumps({"calculator": "ask"}),
    )
    args = ["manage.py", "worker", "--concurrency", "2"]
    first = spawn(args, env, "running")
    try:
        run_id = _start_waiting(server, alice, fake_llm)
        first.send_signal(signal.SIGKILL)
        first.wait(10)
    finally:
        first.kill()
    assert _waiting(run_id)
    assert decide(server, alice[1], run_id, decision="approve").status_code == 202
    second = spawn(args, env, "running")
    try:
        events = stream(server, alice[1], run_id, timeout=60)
    finally:
        second.kill()
        second.wait(10)
    assert event_types(events) == [
        "start",
        "tool",
        "approval_request",
        "approval",
        "tool_complete",
        "token",
        "end",
    ]
    assert events[-1][2]["status"] == "completed"
    kept = (
        Message.objects.filter(run_id=run_id)
        .exclude(role="user")
        .values_list("role", "content")
    )
    assert list(kept) == [("assistant", ""), ("tool", "42"), ("assistant", "It is 42.")]


def _waiting_turn(owner) -> Run:
    """A chat run whose worker released it waiting on a calculator call."""
    session = ChatSession.objects.create(owner=owner)
    run = running_turn(owner, session=session)
    call = {"tool_call_id": "call_9", "name": "calculator", "args": "{}"}
    run_wait(
        claim=Claim(run.id, 1),
        events=[("start", {}), ("tool", call), ("approval_request", call)],
        until=timezone.now() + timedelta(hours=1),
    )
    return run


@pytest.mark.parametrize(
    ("action", "decision"), [("approve_pending", "approve"), ("deny_pending", "deny")]
)
@pytest.mark.slow
def test_the_admin_decides_a_waiting_run(client, root, alice, action, decision):
    run = _waiting_turn(alice[0])
    page = client.get(reverse("admin:journal_run_change", args=[run.id]))
    shown = page.content.decode()
    assert "Pending approval" in shown
    assert "&quot;tool_call_id&quot;: &quot;call_9&quot;" in shown
    other = running_turn(alice[0], session=ChatSession.objects.create(owner=alice[0]))
    client.post(
        reverse("admin:journal_run_changelist"),
        {"action": action, "_selected_action": [run.id, other.id]},
    )
    run.refresh_from_db()
    assert run.status == Run.Status.QUEUED and run.wait_expires_at is None
    (payload,) = Event.objects.filter(run=run, type="approval").values_list(
        "payload", flat=True
    )
    assert json.loads(payload) == {
        "tool_call_id": "call_9",
        "name": "calculator",
        "decision": decision,
    }
    assert Run.objects.get(id=other.id).status == Run.Status.RUNNING
    assert not Event.objects.filter(run=other, type="approval").exists()


def test_policies_per_tool_win_over_the_servers_and_deny_is_not_offered(settings):
    settings.HERMES = {
        **settings.HERMES,
        "TOOL_APPROVAL": {"calculator": "deny", "files__read": "allow"},
        "MCP_SERVERS": [
            {"name": "files", "command": "true", "approval": "ask"},
            {"name": "web", "url": "http://127.0.0.1:9/mcp", "approval": "deny"},
        ],
    }
    assert approvals.policy("current_time") == "allow"  # a built-in not named
    assert approvals.policy("calculator") == "deny"
    assert approvals.policy("files__read") == "allow"  # named: over its server's
    assert approvals.policy("files__write") == "ask"
    assert approvals.policy("web__fetch") == "deny"
    schema = [
        {"type": "function", "function": {"name": name}}
        for name in ("current_time", "calculator", "files__write", "web__fetch")
    ]
    offered = [entry["function"]["name"] for entry in approvals.offered(schema)]
    assert offered == ["current_time", "files__write"]
    gate = approvals.Gate(always={"files__write"})
    assert gate.verdict("c1", "files__write", "{}")[:2] == ("allow", "")
    # deny wins over always
    assert gate.verdict("c2", "calculator", "{}")[:2] == ("deny", "")
    denied = {"tool_call_id": "c3", "name": "files__write", "args": "{}"}
    gate = approvals.Gate(
        decisions={"c3": {**denied, "decision": "deny", "note": "no"}}
    )
    assert gate.verdict("c3", "files__write", "{}") == ("deny", "no", True)
    assert gate.verdict("c4", "files__write", "{}") == ("ask", "", False)


# --- A decision is bound to the one call it was shown (issue 42, item 2) ---
#
# The fake model numbers its tool call ids per response (`call_fake_0` every
# step), as some providers do; a prompt injection needs no more than to reuse
# an id. A decision applies to the call that was shown and is used once.


def _calc(expression: str, call_id: str | None = None) -> dict:
    call = {"name": "calculator", "arguments": json.dumps({"expression": expression})}
    return {**call, "id": call_id} if call_id else call


def _requests(run_id: str) -> list[dict]:
    rows = Event.objects.filter(run_id=run_id, type="approval_request")
    return [
        json.loads(p) for p in rows.order_by("seq").values_list("payload", flat=True)
    ]


def _asked_or_ended(run_id: str, asked: int) -> Run:
    """The run once it waits on its `asked`-th request, or has ended (a call
    that ran unasked lets it end without waiting again)."""

    def there() -> bool:
        run = Run.objects.get(id=run_id)
        waits = run.status == Run.Status.WAITING and len(_requests(run_id)) >= asked
        return waits or run.is_terminal

    wait_until(there, timeout=30)
    return Run.objects.get(id=run_id)


def _each_call_announced_first(events: list) -> list[str]:
    """The ids of the run's `tool` events, after checking that every call has
    one id of its own and is announced as `tool` before it completes."""
    announced: list[str] = []
    for _, kind, data in events:
        if kind == "tool":
            assert data["tool_call_id"] not in announced, data
            announced.append(data["tool_call_id"])
        elif kind == "tool_complete":
            assert data["tool_call_id"] in announced, data
    completed = [d["tool_call_id"] for _, k, d in events if k == "tool_complete"]
    assert sorted(completed) == sorted(announced)
    return announced


@pytest.mark.parametrize(
    "again", ["6*7", "2**10"], ids=["the-same-call-again", "other-arguments"]
)
@pytest.mark.slow
def test_an_approval_does_not_carry_over_to_a_later_step_reusing_the_id(
    server, alice, fake_llm, live_worker, asking, again
):
    fake_llm.push(
        Reply(tool_calls=[_calc("6*7")]),  # call_fake_0
        Reply(tool_calls=[_calc(again)]),  # call_fake_0 again, a step later
        Reply(text="Done."),
    )
    run_id = start_run(server, alice[1], new_session(server, alice[1]), "sums")
    first = _asked_or_ended(run_id, 1)
    assert first.status == Run.Status.WAITING
    assert decide(server, alice[1], run_id, decision="approve").status_code == 202

    # The second step's call is asked about in its own right.
    second = _asked_or_ended(run_id, 2)
    assert second.status == Run.Status.WAITING, "a call ran on another's approval"
    shown, asked = _requests(run_id)
    assert asked["args"] == json.dumps({"expression": again})
    assert asked["tool_call_id"] != shown["tool_call_id"]
    denied = decide(server, alice[1], run_id, decision="deny", note="once was enough")
    assert denied.status_code == 202, denied.text

    events = stream(server, alice[1], run_id)
    assert events[-1][2]["status"] == "completed"
    ids = _each_call_announced_first(events)
    assert ids[0] == shown["tool_call_id"] and ids[1] == asked["tool_call_id"]
    results = [d["result"] for _, k, d in events if k == "tool_complete"]
    assert results[0] == "42"
    assert "a person denied this call of calculator" in results[1]
    # The model is answered with its own ids, each after the step that made it.
    sent = fake_llm.requests[2].messages
    tool_turns = [m for m in sent if m["role"] == "tool"]
    assert [m["tool_call_id"] for m in tool_turns] == ["call_fake_0", "call_fake_0"]
    assert tool_turns[1]["content"] == results[1]


def test_approving_one_call_does_not_run_its_twin_in_the_same_step(
    server, alice, fake_llm, live_worker, asking
):
    twins = [_calc("6*7", call_id="dup"), _calc("2**10", call_id="dup")]
    fake_llm.push(Reply(tool_calls=twins), Reply(text="Done."))
    run_id = start_run(server, alice[1], new_session(server, alice[1]), "two sums")
    assert _asked_or_ended(run_id, 1).status == Run.Status.WAITING
    (shown,) = _requests(run_id)
    assert shown["args"] == twins[0]["arguments"]
    # The decision names the call that was shown.
    decided = decide(
        server, alice[1], run_id, decision="approve", tool_call_id=shown["tool_call_id"]
    )
    assert decided.status_code == 202, decided.text
    assert decided.json()["tool_call_id"] == shown["tool_call_id"]

    assert _asked_or_ended(run_id, 2).status == Run.Status.WAITING, (
        "the twin ran on its sibling's approval"
    )
    twin = _requests(run_id)[1]
    assert twin["args"] == twins[1]["arguments"]
    assert twin["tool_call_id"] != shown["tool_call_id"]
    # A decision naming the call decided before does not apply to the twin.
    stale = decide(
        server, alice[1], run_id, decision="approve", tool_call_id=shown["tool_call_id"]
    )
    assert stale.status_code == 409, stale.text
    assert _waiting(run_id)
    assert decide(server, alice[1], run_id, decision="deny").status_code == 202

    events = stream(server, alice[1], run_id)
    assert events[-1][2]["status"] == "completed"
    assert len(_each_call_announced_first(events)) == 2
    done = [d for _, k, d in events if k == "tool_complete"]
    assert done[0]["result"] == "42"
    assert done[1]["is_error"] and "a person denied" in done[1]["result"]
    decisions = [d for _, k, d in events if k == "approval"]
    assert [d["tool_call_id"] for d in decisions] == [
        shown["tool_call_id"],
        twin["tool_call_id"],
    ]
    # The model's next request answers both of its calls, in order.
    sent = fake_llm.requests[1].messages
    assert [m.get("tool_call_id") for m in sent[-2:]] == ["dup", "dup"]
    assert [m["content"] for m in sent[-2:]] == [d["result"] for d in done]


def test_a_decision_naming_another_call_is_refused(
    server, alice, fake_llm, live_worker, asking
):
    run_id = _start_waiting(server, alice, fake_llm)
    wrong = decide(server, alice[1], run_id, decision="approve", tool_call_id="nope")
    assert wrong.status_code == 409, wrong.text
    bad = decide(server, alice[1], run_id, decision="approve", tool_call_id=7)
    assert bad.status_code == 400, bad.text
    assert _waiting(run_id)
    assert not Event.objects.filter(run_id=run_id, type="approval").exists()


def test_a_gate_applies_a_decision_to_the_call_it_was_shown_once():
    shown = {"tool_call_id": "c1", "name": "calculator", "args": '{"x": 1}'}
    gate = approvals.Gate(decisions={"c1": {**shown, "decision": "approve"}})
    # Same id, another tool or other arguments: not the call shown.
    assert gate.verdict("c1", "current_time", '{"x": 1}').rule == "allow"
    assert gate.verdict("c1", "calculator", '{"x": 2}').decided is False
    verdict = gate.verdict("c1", "calculator", '{"x": 1}')
    assert (verdict.rule, verdict.decided) == ("allow", True)
    assert gate.verdict("c1", "calculator", '{"x": 1}').decided is False  # used once
    # Ids are unique within the run: a repeated provider id is given another.
    ids = [gate.call_id("call_fake_0", step=s, index=0) for s in (1, 2, 2)]
    assert len(set(ids)) == 3 and ids[0] == "call_fake_0"
