"""Queue and steer (chat.pending) end to end over real sockets: a steer lands
in the running turn at its next model-call boundary and the model's next
request ends with it; a queued message starts exactly one next turn when the
run ends, however it ends. The journal is the judge.
"""

from __future__ import annotations

import asyncio
import io
import json
import signal

import httpx
import pytest
from django.core.management import call_command

from chat import tools
from chat.models import ChatSession, Message, PendingMessage, Turn
from chat.snapshot import run_snapshot
from chat.worker import Worker
from hermes_testing import tool_doubles
from hermes_testing.api import (
    decide,
    event_types,
    new_session,
    start_run,
    stream,
    text_of,
    waiting_at_tool,
)
from hermes_testing.fake_llm import Reply
from hermes_testing.harness import read_sse, read_ws, wait_until
from hermes_testing.workers import spawn_worker, start_slow_run
from journal.fold import Fold
from journal.models import Run


def _pending_url(server, session_id, pending_id=None) -> str:
    tail = f"{pending_id}/" if pending_id is not None else ""
    return f"{server.url}/api/sessions/{session_id}/pending/{tail}"


def _add(server, who, session_id, content, **body) -> httpx.Response:
    return httpx.post(
        _pending_url(server, session_id),
        json={"content": content, **body},
        headers=who[1],
    )


def _approve(server, alice, run_id: str) -> None:
    decided = decide(server, alice[1], run_id, decision="approve")
    assert decided.status_code == 202, decided.text


def _next_run(session_id: int, after: str) -> Run:
    runs = Run.objects.filter(turn__session_id=session_id).exclude(id=after)
    wait_until(runs.exists, timeout=15)
    (run,) = runs
    return run


def _question(run: Run) -> str:
    question = Turn.objects.select_related("reply_to").get(run=run).reply_to
    assert question is not None
    return question.content


def test_steer_lands_after_the_tool_step_and_every_reader_sees_it_once(
    server, alice, fake_llm, live_worker, asking
):
    session_id, run_id = waiting_at_tool(
        server, alice[1], fake_llm, Reply(text="42, in French: quarante-deux.")
    )
    steered = _add(
        server, alice, session_id, "Answer in French.", kind="steer", run_id=run_id
    )
    assert steered.status_code == 201, steered.text
    item = steered.json()
    assert (item["kind"], item["state"], item["run_id"]) == ("steer", "pending", run_id)
    listed = httpx.get(_pending_url(server, session_id), headers=alice[1]).json()
    assert [p["id"] for p in listed["results"]] == [item["id"]]
    detail = httpx.get(f"{server.url}/api/sessions/{session_id}/", headers=alice[1])
    assert [p["content"] for p in detail.json()["pending_messages"]] == [
        "Answer in French."
    ]

    _approve(server, alice, run_id)
    events = stream(server, alice[1], run_id)
    assert event_types(events) == [
        "start",
        "tool",
        "approval_request",
        "approval",
        "tool_complete",
        "steer",
        "token",
        "end",
    ]
    assert text_of(events) == "42, in French: quarante-deux."
    (steer,) = [data for _, kind, data in events if kind == "steer"]
    assert steer["text"] == "Answer in French." and steer["pending_id"] == item["id"]
    assert events[-1][2]["status"] == "completed"
    # The model's next request: the tool's result, then the steer.
    sent = fake_llm.requests[1].messages
    assert sent[-2] == {"role": "tool", "tool_call_id": "call_1", "content": "42"}
    assert sent[-1] == {"role": "user", "content": "Answer in French."}

    # Every reader, the same journal: SSE from a cursor, events.json, replay_run.
    steer_seq = next(int(i.rsplit(":", 1)[1]) for i, k, _ in events if k == "steer")
    tail = read_sse(
        f"{server.url}/api/runs/{run_id}/events/?after_seq={steer_seq - 1}",
        headers=alice[1],
    ).events
    assert [kind for _, kind, _ in tail][0] == "steer"
    page = httpx.get(
        f"{server.url}/api/runs/{run_id}/events.json", headers=alice[1]
    ).json()
    assert [(e["seq"], e["event"]) for e in page["events"]] == [
        (int(i.rsplit(":", 1)[1]), k) for i, k, _ in events
    ]
    frames, code = asyncio.run(
        read_ws(f"{server.ws_url}/ws/runs/{run_id}/", headers=alice[1])
    )
    assert code == 1000
    assert [(f["seq"], f["event"]) for f in frames] == [
        (e["seq"], e["event"]) for e in page["events"]
    ]
    # A reloaded page's snapshot folds it in the same place.
    parts = run_snapshot(Run.objects.get(id=run_id))["parts"]
    assert [p["kind"] for p in parts] == ["tool", "steer", "text"]
    out = io.StringIO()
    call_command("replay_run", run_id, "--format", "jsonl", stdout=out)
    replayed = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [(r["seq"], r["event"]) for r in replayed] == [
        (e["seq"], e["event"]) for e in page["events"]
    ]
    assert [r["seq"] for r in replayed if r["event"] == "steer"] == [steer_seq]
    fold = Fold()
    for r in replayed:
        fold.add(r["event"], r["data"], r["seq"])
    kinds = [p["kind"] for p in fold.parts]
    assert kinds == ["tool", "steer", "text"]

    # Kept in the session where it landed, sent again with the next turn.
    roles = list(
        Message.objects.filter(session_id=session_id)
        .order_by("id")
        .values_list("role", "steer", "content")
    )
    assert roles[-2][:2] == ("user", True) and roles[-2][2] == "Answer in French."
    assert roles[-1][0] == "assistant"
    pending = PendingMessage.objects.get(pk=item["id"])
    assert (pending.state, pending.delivered_run_id) == ("landed", run_id)
    listed = httpx.get(_pending_url(server, session_id), headers=alice[1]).json()
    assert listed["results"] == []
    messages = httpx.get(
        f"{server.url}/api/sessions/{session_id}/messages/", headers=alice[1]
    ).json()["results"]
    assert [m["steer"] for m in messages if m["role"] == "user"] == [False, True]


@pytest.fixture
def gated_tool(settings, tmp_path):
    """A built-in tool `gated` that runs until the test lets it answer:
    (the file it writes when it runs, the file that lets it answer)."""
    tools.register(
        tools.Tool(name="gated", description="", func=tool_doubles.wait_for_release)
    )
    settings.HERMES = {
        **settings.HERMES,
        "TOOLS": ["calculator", "gated"],
        "TOOL_TIMEOUT_S": 300.0,  # only the test ends the call
    }
    yield tmp_path / "running", tmp_path / "release"
    tools.unregister("gated")


@pytest.mark.slow
def test_a_steer_sent_while_a_tool_runs_lands_before_the_next_model_call(
    server, alice, fake_llm, live_worker, gated_tool
):
    """No approval parks this run: it streams freely, and the steer typed
    while its tool step runs lands at the boundary after that step."""
    running, release = gated_tool
    args = json.dumps({"marker": str(running), "release": str(release)})
    fake_llm.push(
        Reply(tool_calls=[{"id": "call_1", "name": "gated", "arguments": args}]),
        Reply(text="Fini."),
    )
    session_id = new_session(server, alice[1])
    run_id = start_run(server, alice[1], session_id, "use the tool")
    wait_until(running.exists, timeout=60)
    steered = _add(server, alice, session_id, "In French.", kind="steer", run_id=run_id)
    assert steered.status_code == 201, steered.text
    release.write_text("go")

    events = stream(server, alice[1], run_id)
    types = event_types(events)
    assert types[:4] == ["start", "tool", "tool_complete", "steer"]
    assert set(types[4:-1]) == {"token"} and types[-1] == "end"
    assert events[-1][2]["status"] == "completed"
    assert text_of(events) == "Fini."
    (steer,) = [data for _, kind, data in events if kind == "steer"]
    assert steer["pending_id"] == steered.json()["id"]
    sent = fake_llm.requests[1].messages
    assert sent[-2] == {"role": "tool", "tool_call_id": "call_1", "content": "released"}
    assert sent[-1] == {"role": "user", "content": "In French."}
    assert PendingMessage.objects.get(pk=steer["pending_id"]).state == "landed"


def test_queued_messages_start_one_turn_each_after_the_run_ends(
    server, alice, fake_llm, live_worker, asking
):
    session_id, run_id = waiting_at_tool(server, alice[1], fake_llm, Reply(text="42."))
    first = _add(server, alice, session_id, "And 7*8?")
    second = _add(server, alice, session_id, "Thanks!")
    assert first.status_code == second.status_code == 201
    assert first.json()["kind"] == "queue"
    assert fake_llm.post_count == 1
    fake_llm.push(Reply(text="56."), Reply(text="You are welcome."))

    _approve(server, alice, run_id)
    assert stream(server, alice[1], run_id)[-1][2]["status"] == "completed"
    runs = Run.objects.filter(turn__session_id=session_id)
    wait_until(
        lambda: runs.count() == 3 and not runs.filter(status__in=Run.ACTIVE).exists(),
        timeout=30,
    )
    ordered = list(runs.order_by("created_at"))
    assert [_question(r) for r in ordered[1:]] == ["And 7*8?", "Thanks!"]
    assert [text_of(stream(server, alice[1], r.id)) for r in ordered[1:]] == [
        "56.",
        "You are welcome.",
    ]
    # The second started only after the first ended: one active run at a time.
    assert ordered[2].created_at >= ordered[1].ended_at
    states = PendingMessage.objects.filter(session_id=session_id).order_by("id")
    assert [(p.state, p.delivered_run_id) for p in states] == [
        ("started", ordered[1].id),
        ("started", ordered[2].id),
    ]
    # The model saw the whole conversation, the queued message last.
    assert fake_llm.requests[-1].messages[-1] == {"role": "user", "content": "Thanks!"}
    assert fake_llm.post_count == 4


def test_queue_then_stop_starts_the_queued_message(
    server, alice, fake_llm, live_worker
):
    fake_llm.push(Reply(text="A long answer that stalls", stall_after_chars=8))
    session_id = new_session(server, alice[1])
    run_id = start_run(server, alice[1], session_id, "talk")
    fake_llm.wait_stalled(0, timeout=15)
    assert _add(server, alice, session_id, "Shorter, please.").status_code == 201
    fake_llm.push(Reply(text="Short."))
    stop = httpx.post(f"{server.url}/api/runs/{run_id}/cancel/", headers=alice[1])
    assert stop.status_code == 202
    end = stream(server, alice[1], run_id)[-1][2]
    assert (end["status"], end["terminal_state"]) == ("cancelled", "cancelled-by-user")
    nxt = _next_run(session_id, run_id)
    assert _question(nxt) == "Shorter, please."
    assert text_of(stream(server, alice[1], nxt.id)) == "Short."


def test_a_steer_the_run_never_reached_starts_the_next_turn(
    server, alice, fake_llm, live_worker
):
    fake_llm.push(Reply(text="Going on and on", stall_after_chars=6))
    session_id = new_session(server, alice[1])
    run_id = start_run(server, alice[1], session_id, "talk")
    fake_llm.wait_stalled(0, timeout=15)
    steer = _add(server, alice, session_id, "Stop rambling.", kind="steer")
    assert steer.status_code == 201
    fake_llm.push(Reply(text="Sorry."))
    httpx.post(f"{server.url}/api/runs/{run_id}/cancel/", headers=alice[1])
    events = stream(server, alice[1], run_id)
    assert "steer" not in event_types(events)  # never reached a model-call boundary
    nxt = _next_run(session_id, run_id)
    assert _question(nxt) == "Stop rambling."
    assert text_of(stream(server, alice[1], nxt.id)) == "Sorry."
    item = PendingMessage.objects.get(pk=steer.json()["id"])
    assert (item.kind, item.state, item.delivered_run_id) == (
        "queue",
        "started",
        nxt.id,
    )


@pytest.mark.slow
def test_cancel_a_queued_message_and_what_others_and_bad_input_get(
    server, alice, bob, fake_llm, live_worker, asking
):
    session_id, run_id = waiting_at_tool(server, alice[1], fake_llm, Reply(text="42."))
    queued = _add(server, alice, session_id, "Never mind this one.").json()
    url = _pending_url(server, session_id, queued["id"])
    # Another user: every path answers 404, and nothing changes.
    assert httpx.delete(url, headers=bob[1]).status_code == 404
    assert _add(server, bob, session_id, "mine?").status_code == 404
    listed = httpx.get(_pending_url(server, session_id), headers=bob[1])
    assert listed.status_code == 404
    # Bad input: 4xx naming the problem.
    assert _add(server, alice, session_id, "   ").status_code == 400
    assert _add(server, alice, session_id, "x", kind="later").status_code == 400
    too_long = _add(server, alice, session_id, "x" * 100_001)
    assert too_long.status_code == 400 and "longer" in too_long.text
    wrong_run = _add(server, alice, session_id, "x", kind="steer", run_id="run_nope")
    assert wrong_run.status_code == 409
    assert (
        httpx.delete(
            _pending_url(server, session_id, "abc"), headers=alice[1]
        ).status_code
        == 404
    )

    assert httpx.delete(url, headers=alice[1]).status_code == 204
    again = httpx.delete(url, headers=alice[1])
    assert again.status_code == 409 and again.json()["state"] == "cancelled"
    _approve(server, alice, run_id)
    assert stream(server, alice[1], run_id)[-1][2]["status"] == "completed"
    # Nothing starts after the run: the only queued message was cancelled.
    assert Run.objects.filter(turn__session_id=session_id).count() == 1
    assert fake_llm.post_count == 2
    ended = _add(server, alice, session_id, "too late")
    assert ended.status_code == 409 and "no run in progress" in ended.json()["error"]


@pytest.mark.slow
def test_a_queued_message_survives_its_worker_killed_mid_run(
    server, alice, fake_llm, fast_readers
):
    proc = spawn_worker(fake_llm)
    try:
        session_id, run_id = start_slow_run(server, alice, fake_llm)
        assert _add(server, alice, session_id, "Still there?").status_code == 201
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        end = stream(server, alice[1], run_id)[-1][2]
    finally:
        proc.kill()
    assert (end["status"], end["terminal_state"]) == ("interrupted", "lost-worker")
    nxt = _next_run(session_id, run_id)  # started by whoever settled the lost run
    assert _question(nxt) == "Still there?"
    worker = Worker(concurrency=2)
    server.call(worker.start())
    try:
        fake_llm.push(Reply(text="Yes."))
        assert text_of(stream(server, alice[1], nxt.id)) == "Yes."
    finally:
        server.call(worker.stop(grace_s=5))
    assert Run.objects.filter(turn__session_id=session_id).count() == 2


def test_the_admin_shows_a_sessions_pending_messages_and_the_steer_flag(root, client):
    session = ChatSession.objects.create(owner=root, title="busy")
    PendingMessage.objects.create(session=session, kind="queue", content="later, pls")
    PendingMessage.objects.create(
        session=session, kind="steer", content="gone", state="landed"
    )
    page = client.get(f"/admin/chat/chatsession/{session.pk}/change/")
    assert page.status_code == 200
    assert b"later, pls" in page.content and b"gone" not in page.content
    message = Message.objects.create(
        session=session, role="user", content="in French", steer=True
    )
    detail = client.get(f"/admin/chat/message/{message.pk}/change/")
    assert detail.status_code == 200 and b"Steer" in detail.content


def test_export_and_import_keep_which_messages_were_steers(alice):
    from chat.transfer import session_export, session_import

    session = ChatSession.objects.create(owner=alice[0], title="steered")
    question = Message.objects.create(session=session, role="user", content="q")
    steer = Message.objects.create(
        session=session, role="user", content="in French", steer=True, parent=question
    )
    Message.objects.create(
        session=session, role="assistant", content="oui", parent=steer
    )
    copy, count = session_import(owner=alice[0], lines=session_export(session=session))
    assert count == 3
    assert list(copy.messages.order_by("id").values_list("content", "steer")) == [
        ("q", False),
        ("in French", True),
        ("oui", False),
    ]


def test_a_queued_message_its_runs_end_could_not_start_is_started_by_the_reaper(
    alice, settings
):
    from datetime import timedelta

    from django.utils import timezone

    from chat import pending

    session = ChatSession.objects.create(owner=alice[0], title="stranded")
    busy = ChatSession.objects.create(owner=alice[0], title="busy")
    old = timezone.now() - timedelta(seconds=pending.STRANDED_AFTER_S + 1)
    for where in (session, busy):
        item = PendingMessage.objects.create(
            session=where, kind="queue", content="hello?", model="fake-model"
        )
        PendingMessage.objects.filter(pk=item.pk).update(created_at=old)
    active = Run.objects.create(owner=alice[0], subject=busy.subject)
    Turn.objects.create(run=active, owner=alice[0], session=busy, model="fake-model")
    fresh = PendingMessage.objects.create(session=session, kind="queue", content="2")

    (started,) = pending.deliver_stranded()
    run = Run.objects.get(id=started)
    assert _question(run) == "hello?" and run.status == Run.Status.QUEUED
    assert Turn.objects.get(run=run).session_id == session.pk
    # A session with a run in progress waits for its end; one run at a time.
    assert pending.deliver_stranded() == []
    assert PendingMessage.objects.get(pk=fresh.pk).state == "pending"
    assert PendingMessage.objects.filter(session=busy, state="pending").count() == 1
