"""Faults on the worker's side: bad provider data, a crashing executor, a fenced
worker, a dead worker nobody reads. Real worker, real model server, real sockets.
"""

import json
import signal
import subprocess
import sys
import threading
from datetime import timedelta

import pytest
from django.conf import settings
from django.utils import timezone

from chat.models import Message, Turn, session_subject
from chat.services import journal_text
from chat.worker import Worker
from hermes_testing.api import LONG, new_session, start_run, stream, text_of
from hermes_testing.fake_llm import Reply
from hermes_testing.harness import subprocess_env, wait_until
from hermes_testing.workers import LEASE_S, start_slow_run
from journal import dbpool
from journal.leases import reap_lost_runs
from journal.models import Event, Run


def kept_text(run_id: str) -> str:
    return "".join(
        Message.objects.filter(run_id=run_id, role="assistant")
        .order_by("id")
        .values_list("content", flat=True)
    )


def assert_whole(run_id: str) -> None:
    seqs = list(
        Event.objects.filter(run_id=run_id)
        .order_by("seq")
        .values_list("seq", flat=True)
    )
    assert seqs == list(range(1, len(seqs) + 1))
    assert Event.objects.filter(run_id=run_id, type="end").count() == 1
    assert Event.objects.get(run_id=run_id, seq=seqs[-1]).type == "end"


@pytest.mark.slow
def test_bad_provider_data_is_cleaned_and_other_users_runs_stream_on(
    server, alice, bob, fake_llm, live_worker
):
    fake_llm.push(
        Reply(text=LONG, tokens_per_s=200, chunk_chars=3),  # alice, streaming on
        Reply(  # bob: NUL, lone surrogates and a tool call of the wrong types
            text="bad\x00text\ud800end",
            reasoning="why\udfff",
            tool_calls=[{"id": 123, "name": "calc\ud800", "arguments": "{}"}],
        ),
        Reply(text="done"),
    )
    alices = start_run(server, alice[1], new_session(server, alice[1]), "long")
    fake_llm.wait_requests(1)
    bobs = start_run(server, bob[1], new_session(server, bob[1]), "bad")
    bob_events = stream(server, bob[1], bobs)
    alice_events = stream(server, alice[1], alices)

    assert (
        text_of(alice_events) == LONG and alice_events[-1][2]["status"] == "completed"
    )
    assert bob_events[-1][2]["status"] == "completed"
    assert text_of(bob_events) == "bad\ufffdtext\ufffdenddone"
    [tool] = [d for _, k, d in bob_events if k == "tool"]
    assert (tool["tool_call_id"], tool["name"]) == ("123", "calc\ufffd")
    step, answer = Message.objects.filter(run_id=bobs, role="assistant").order_by("id")
    assert (step.content, step.reasoning) == ("bad\ufffdtext\ufffdend", "why\ufffd")
    assert step.tool_calls[0]["id"] == "123" and answer.content == "done"
    # The model saw the cleaned call and the tool's answer to it.
    assert fake_llm.requests[2].messages[-1]["tool_call_id"] == "123"
    for run_id in (alices, bobs):
        assert_whole(run_id)
        assert kept_text(run_id) == journal_text(run_id=run_id)


@pytest.mark.slow
def test_a_run_whose_executor_raises_is_settled_at_once_as_worker_error(
    server, alice, fake_llm, live_worker
):
    session_id = new_session(server, alice[1])
    # Its provider was removed from the settings while the run waited.
    run = Run.objects.create(owner=alice[0], subject=session_subject(session_id))
    Turn.objects.create(
        run=run,
        owner=alice[0],
        session_id=session_id,
        provider="removed",
        model="gone",
    )
    Message.objects.create(session_id=session_id, role="user", content="hi", run=run)
    events = stream(server, alice[1], run.id)
    run.refresh_from_db()
    kinds = [k for _, k, _ in events]
    # The run's `start` is committed at once (chat.writer) unless the run
    # failed first: it may come before the error.
    assert kinds[-2:] == ["error", "end"] and kinds[:-2] in ([], ["start"])
    assert events[-2][2]["category"] == "worker-error"
    assert (run.status, run.terminal_state) == ("failed", "worker-error")
    # At once, not when a lease lapses.
    assert (run.ended_at - run.created_at).total_seconds() < settings.HERMES["LEASE_S"]
    fake_llm.push(Reply(text="works"))
    nxt = start_run(server, alice[1], session_id, "again")
    assert text_of(stream(server, alice[1], nxt)) == "works"


def spawn_logged(fake_llm) -> tuple[subprocess.Popen, list[str]]:
    """A worker process whose every output line is kept (and drained)."""
    env = subprocess_env(
        OPENAI_BASE_URL=fake_llm.base_url,
        HERMES_DEFAULT_MODEL="fake-model",
        HERMES_LEASE_S=str(LEASE_S),
        HERMES_HEARTBEAT_S="0.3",
    )
    proc = subprocess.Popen(
        [sys.executable, "manage.py", "worker", "--concurrency", "2"],
        cwd=settings.BASE_DIR,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines: list[str] = []
    out = proc.stdout
    assert out is not None
    threading.Thread(target=lambda: lines.extend(out), daemon=True).start()
    wait_until(lambda: any("running" in line for line in lines), timeout=30)
    return proc, lines


@pytest.mark.slow
def test_a_fenced_worker_logs_one_warning_and_no_traceback(server, alice, fake_llm):
    proc, lines = spawn_logged(fake_llm)
    try:
        _session_id, run_id = start_slow_run(server, alice, fake_llm)
        proc.send_signal(signal.SIGSTOP)
        wait_until(
            lambda: Run.objects.filter(
                id=run_id, lease_expires_at__lt=timezone.now()
            ).exists(),
            timeout=LEASE_S + 5,
        )
        dbpool.forget_trouble()
        assert [run for run, _ in reap_lost_runs()] == [run_id]
        proc.send_signal(signal.SIGCONT)
        fake_llm.wait_closed(0, timeout=10)
        wait_until(lambda: any("fenced out" in line for line in lines), timeout=10)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(15) == 0
    finally:
        proc.kill()
    output = "".join(lines)
    assert output.count("fenced out") == 1, output
    assert [line for line in lines if " WARNING " in line or " ERROR " in line] == [
        line for line in lines if "fenced out" in line
    ], output
    assert "Traceback" not in output and "run crashed" not in output


@pytest.mark.slow
def test_a_dead_workers_run_is_settled_within_the_lease_with_no_reader(
    server, alice, fake_llm, settings
):
    settings.HERMES = {**settings.HERMES, "LEASE_S": LEASE_S}
    proc, _lines = spawn_logged(fake_llm)
    reaper = None
    try:
        session_id, run_id = start_slow_run(server, alice, fake_llm)
        reaper = Worker(concurrency=1)  # started after the claim: it only reaps
        server.call(reaper.start())
        dbpool.forget_trouble()
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        killed = timezone.now()
        wait_until(
            lambda: Run.objects.filter(id=run_id, ended_at__isnull=False).exists(),
            timeout=LEASE_S + 10,
        )
    finally:
        proc.kill()
        if reaper is not None:
            server.call(reaper.stop(grace_s=1))
    run = Run.objects.get(id=run_id)
    assert (run.status, run.terminal_state) == ("interrupted", "lost-worker")
    assert (run.ended_at - killed).total_seconds() <= LEASE_S + 2
    assert_whole(run_id)
    assert kept_text(run_id) == journal_text(run_id=run_id)
    assert (
        json.loads(Event.objects.get(run_id=run_id, type="end").payload)["message_id"]
        == Message.objects.get(session_id=session_id, role="assistant").id
    )


@pytest.mark.slow
def test_a_claim_whose_answer_was_lost_is_adopted_and_run(
    server, alice, fake_llm, live_worker
):
    session_id = new_session(server, alice[1])
    # The claim committed, but the connection broke before the worker heard so.
    run = Run.objects.create(
        owner=alice[0],
        subject=session_subject(session_id),
        status="running",
        fencing_token=1,
        lease_owner=live_worker.worker_id,
        lease_expires_at=timezone.now() + timedelta(seconds=60),
    )
    Turn.objects.create(
        run=run,
        owner=alice[0],
        session_id=session_id,
        provider="openai",
        model="fake-model",
    )
    Message.objects.create(session_id=session_id, role="user", content="hi", run=run)
    fake_llm.push(Reply(text="adopted"))
    live_worker.claim_unsure = True
    events = stream(server, alice[1], run.id)
    assert text_of(events) == "adopted" and events[-1][2]["status"] == "completed"
    assert live_worker.claim_unsure is False
    assert_whole(run.id)
