"""Real processes: a worker killed or paused mid-run; a reader moving servers."""

import json
import os
import signal
import socket
import threading
import time

import httpx
import pytest
from asgiref.sync import async_to_sync
from django.utils import timezone

from chat.models import Message
from chat.runner import HANDED_OVER
from chat.services import journal_text
from chat.worker import Worker
from hermes_testing.api import LONG, new_session, start_run, stream, text_of
from hermes_testing.fake_llm import Reply
from hermes_testing.fake_responses import ResponsesReply, responses_provider
from hermes_testing.harness import (
    read_sse,
    running_run,
    spawn,
    spawn_logged,
    subprocess_env,
    wait_until,
)
from hermes_testing.workers import LEASE_S, _worker_env, spawn_worker, start_slow_run
from journal.leases import reap_lost_runs
from journal.models import Event, Run
from journal.publish import append_and_publish


@pytest.mark.slow
def test_worker_killed_mid_run_is_settled_as_lost_and_the_next_turn_works(
    server, alice, fake_llm, fast_readers
):
    proc = spawn_worker(fake_llm)
    try:
        session_id, run_id = start_slow_run(server, alice, fake_llm)
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        killed = time.monotonic()
        events = stream(server, alice[1], run_id)
        assert time.monotonic() - killed < LEASE_S + 3
    finally:
        proc.kill()
    end = events[-1][2]
    assert (end["status"], end["terminal_state"]) == ("interrupted", "lost-worker")
    partial = text_of(events)
    assert partial and LONG.startswith(partial)
    kept = list(
        Message.objects.filter(session_id=session_id, role="assistant").values_list(
            "content", flat=True
        )
    )
    assert kept == [partial] and end["message_id"] is not None

    worker = Worker(concurrency=2)
    server.call(worker.start())
    try:
        fake_llm.push(Reply(text="Fresh start."))
        nxt = start_run(server, alice[1], session_id, "again")
        assert text_of(stream(server, alice[1], nxt)) == "Fresh start."
        sent = [(m["role"], m["content"]) for m in fake_llm.requests[-1].messages]
        assert sent == [
            ("user", "talk slowly"),
            ("assistant", partial),
            ("user", "again"),
        ]
    finally:
        server.call(worker.stop(grace_s=5))


@pytest.mark.slow
def test_sigterm_stops_claiming_and_settles_what_outlives_the_grace_period(
    server, alice, fake_llm
):
    proc = spawn_worker(fake_llm, "--grace", "0.5")
    try:
        session_id, run_id = start_slow_run(server, alice, fake_llm)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(15) == 0
    finally:
        proc.kill()
    events = stream(server, alice[1], run_id)
    end = events[-1][2]
    assert (end["status"], end["terminal_state"]) == ("interrupted", "worker-shutdown")
    kept = list(
        Message.objects.filter(session_id=session_id, role="assistant").values_list(
            "content", flat=True
        )
    )
    assert kept == [text_of(events)]


HANDOVER_TEXT = "".join(f"w{i} naïve 🙂 " for i in range(200))


@pytest.mark.slow
def test_sigterm_hands_a_run_over_to_the_other_worker_which_finishes_it_once(
    server, alice, fake_llm, tmp_path
):
    """A worker asked to stop while another is alive hands its run over at
    once: the other resumes it from the journal (no second `start`), the
    model is sent the text shown so far, and the answer is whole and once."""
    hold = threading.Event()  # never set: the first stream stays open
    chunks = 40  # the role frame, then 39 chunks of 4 characters
    shown = HANDOVER_TEXT[: 4 * (chunks - 1)]
    fake_llm.push(
        Reply(text=HANDOVER_TEXT, chunk_chars=4, hold_after_chunks=chunks, hold=hold),
        Reply(text=HANDOVER_TEXT[len(shown) :], chunk_chars=4, tokens_per_s=200),
    )
    stopping = spawn_logged(
        ["manage.py", "worker", "--concurrency", "2", "--grace", "30"],
        _worker_env(fake_llm),
        tmp_path / "stopping.log",
        "running",
    )
    other = None
    try:
        session_id = new_session(server, alice[1])
        run_id = start_run(server, alice[1], session_id, "talk at length")
        fake_llm.wait_held(0, timeout=90)
        wait_until(lambda: journal_text(run_id=run_id) == shown, timeout=60)
        other = spawn_worker(fake_llm)
        signalled = time.monotonic()
        stopping.send_signal(signal.SIGTERM)
        assert stopping.wait(30) == 0
        assert time.monotonic() - signalled < 10  # at once, not after the grace
        events = stream(server, alice[1], run_id)
    finally:
        stopping.kill()
        if other is not None:
            other.send_signal(signal.SIGTERM)
            other.wait(30)
    end = events[-1][2]
    assert (end["status"], end["terminal_state"]) == ("completed", "completed")
    assert text_of(events) == HANDOVER_TEXT == journal_text(run_id=run_id)
    assert [kind for _, kind, _ in events].count("start") == 1
    notes = [data["message"] for _, kind, data in events if kind == "status"]
    assert notes == [HANDED_OVER]
    resumed = [(m["role"], m["content"]) for m in fake_llm.requests[1].messages]
    assert resumed == [("user", "talk at length"), ("assistant", shown)]
    kept = "".join(
        Message.objects.filter(session_id=session_id, role="assistant")
        .order_by("id")
        .values_list("content", flat=True)
    )
    assert kept == HANDOVER_TEXT
    log = (tmp_path / "stopping.log").read_text()
    assert "handing 1 run(s) over" in log
    assert "Unclosed" not in log  # the model clients were closed (issue 41.9)


@pytest.mark.slow
def test_sigterm_with_no_other_worker_ends_the_run_resumable_keeping_its_text(
    server, alice, fake_llm, tmp_path
):
    """The last worker does not hand over (nobody would take the run): after
    its grace the run ends `interrupted` / `worker-shutdown`, text kept once."""
    hold = threading.Event()
    fake_llm.push(Reply(text=LONG, chunk_chars=2, hold_after_chunks=10, hold=hold))
    proc = spawn_logged(
        ["manage.py", "worker", "--concurrency", "2", "--grace", "0.5"],
        _worker_env(fake_llm),
        tmp_path / "last.log",
        "running",
    )
    try:
        session_id = new_session(server, alice[1])
        run_id = start_run(server, alice[1], session_id, "talk slowly")
        fake_llm.wait_held(0, timeout=90)
        wait_until(lambda: journal_text(run_id=run_id) == LONG[:18], timeout=60)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    finally:
        proc.kill()
    run = Run.objects.get(id=run_id)
    assert (run.status, run.terminal_state) == ("interrupted", "worker-shutdown")
    kept = list(
        Message.objects.filter(session_id=session_id, role="assistant").values_list(
            "content", flat=True
        )
    )
    assert kept == [LONG[:18]]
    assert "Unclosed" not in (tmp_path / "last.log").read_text()


@pytest.mark.slow
def test_a_run_handed_to_a_worker_that_does_not_take_it_is_ended_not_stranded(
    server, alice, fake_llm
):
    """The other worker looked alive but never claims the run (it was stopping
    too, as a supervisor's children do, or here paused until its heartbeat
    is stale): the stopping worker ends the run resumable instead of leaving
    it queued with no worker."""
    hold = threading.Event()
    fake_llm.push(Reply(text=LONG, chunk_chars=2, hold_after_chunks=10, hold=hold))
    workers = [spawn_worker(fake_llm, "--grace", "0.5") for _ in range(2)]
    try:
        session_id = new_session(server, alice[1])
        run_id = start_run(server, alice[1], session_id, "talk slowly")
        fake_llm.wait_held(0, timeout=90)
        wait_until(lambda: journal_text(run_id=run_id) == LONG[:18], timeout=60)
        pid = int(Run.objects.get(id=run_id).lease_owner.split(":")[1])
        holder = next(p for p in workers if p.pid == pid)
        other = next(p for p in workers if p.pid != pid)
        other.send_signal(signal.SIGSTOP)  # its heartbeat is fresh for a lease
        holder.send_signal(signal.SIGTERM)
        assert holder.wait(30) == 0
    finally:
        for proc in workers:
            proc.send_signal(signal.SIGCONT)
            proc.kill()
    run = Run.objects.get(id=run_id)
    assert (run.status, run.terminal_state) == ("interrupted", "worker-shutdown")
    events = list(Event.objects.filter(run_id=run_id).values_list("type", flat=True))
    assert "status" in events and events.count("end") == 1  # handed, then ended
    kept = "".join(
        Message.objects.filter(session_id=session_id, role="assistant").values_list(
            "content", flat=True
        )
    )
    assert kept == LONG[:18] == journal_text(run_id=run_id)


@pytest.mark.slow
def test_serve_closes_the_model_clients_of_its_worker_on_sigterm(
    alice, fake_llm, tmp_path
):
    """`manage.py serve`'s in-process worker closes its providers' pooled
    connections when it stops: no `Unclosed client session` at exit."""
    port = _free_port()
    log_path = tmp_path / "serve.log"
    proc = spawn_logged(
        ["manage.py", "serve", "--port", str(port)],
        _worker_env(fake_llm),
        log_path,
        "Hermes at",
    )
    try:
        fake_llm.push(Reply(text="Served."))
        site = type("Site", (), {"url": f"http://127.0.0.1:{port}"})
        wait_until(lambda: _answers(site.url), timeout=60)
        session_id = new_session(site, alice[1])
        run_id = start_run(site, alice[1], session_id, "hello")
        wait_until(
            lambda: Run.objects.filter(id=run_id, status="completed").exists(),
            timeout=60,
        )
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
    finally:
        proc.kill()
    log = log_path.read_text()
    assert "worker stopped" in log
    assert "Unclosed" not in log, log[-2000:]


def _answers(url: str) -> bool:
    try:
        return httpx.get(f"{url}/healthz", timeout=5).status_code in (200, 503)
    except httpx.HTTPError:
        return False


@pytest.mark.slow
def test_sigterm_hands_a_responses_run_over_to_re_attach_not_regenerate(
    server, alice, fake_llm, fast_readers, settings
):
    """A run reading a response kept upstream is handed over with its cursor:
    the next worker re-attaches after it, nothing is asked or paid twice."""
    with responses_provider(settings) as responses:
        responses.push(ResponsesReply(text=LONG, chunk_chars=2, tokens_per_s=40))
        env = _worker_env(fake_llm)
        env["HERMES_PROVIDERS"] = json.dumps(settings.HERMES["PROVIDERS"])
        proc = spawn(["manage.py", "worker", "--concurrency", "2"], env, "running")
        worker = Worker(concurrency=2)
        try:
            session_id = new_session(server, alice[1])
            reply = httpx.post(
                f"{server.url}/api/sessions/{session_id}/runs/",
                json={"content": "tell me", "model": "gpt-bg"},
                headers=alice[1],
            )
            run_id = reply.json()["run_id"]
            wait_until(
                lambda: Event.objects.filter(run_id=run_id, type="token").count() >= 3,
                timeout=30,
            )
            server.call(worker.start())  # alive: the stopping worker hands over
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(30) == 0
            events = stream(server, alice[1], run_id)
        finally:
            proc.kill()
            server.call(worker.stop(grace_s=5))
        assert text_of(events) == LONG  # the one answer, each word once
        end = events[-1][2]
        assert (end["status"], end["terminal_state"]) == ("completed", "completed")
        notes = [data["message"] for _, kind, data in events if kind == "status"]
        assert notes == ["Retry attempt: re-attach after the worker stopped"]
        assert len(responses.of_kind("POST")) == 1  # re-attached, not asked again
        assert len(responses.of_kind("GET")) == 1


@pytest.mark.slow
def test_paused_worker_that_lost_its_lease_cannot_append_after_the_reaper(
    server, alice, fake_llm
):
    proc = spawn_worker(fake_llm)
    try:
        session_id, run_id = start_slow_run(server, alice, fake_llm)
        proc.send_signal(signal.SIGSTOP)
        wait_until(
            lambda: Run.objects.filter(
                id=run_id, lease_expires_at__lt=timezone.now()
            ).exists(),
            timeout=LEASE_S + 5,
        )
        settled = reap_lost_runs()
        assert [run for run, _ in settled] == [run_id]
        after_settle = Run.objects.get(id=run_id)
        messages_after_settle = Message.objects.filter(session_id=session_id).count()
        proc.send_signal(signal.SIGCONT)
        # The worker wakes, finds itself fenced out and drops the provider stream.
        fake_llm.wait_closed(0, timeout=10)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(15) == 0
    finally:
        proc.kill()
    run = Run.objects.get(id=run_id)
    assert run.last_seq == after_settle.last_seq
    assert (run.status, run.terminal_state) == ("interrupted", "lost-worker")
    assert Event.objects.filter(run_id=run_id).order_by("-seq").first().type == "end"
    assert Event.objects.filter(run_id=run_id, type="end").count() == 1
    assert (
        Message.objects.filter(session_id=session_id).count() == messages_after_settle
    )
    kept = "".join(
        Message.objects.filter(session_id=session_id, role="assistant").values_list(
            "content", flat=True
        )
    )
    assert kept == journal_text(run_id=run_id)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.scaleout
@pytest.mark.skipif(
    not (os.environ.get("DATABASE_URL") and os.environ.get("REDIS_URL")),
    reason="the scale-out deployment needs DATABASE_URL and REDIS_URL (CI sets them)",
)
def test_reader_switches_between_two_server_processes_with_last_event_id(alice):
    ports = [_free_port(), _free_port()]
    servers = [
        spawn(
            [
                "-m",
                "daphne",
                "-b",
                "127.0.0.1",
                "-p",
                str(port),
                "hermes_site.asgi:application",
            ],
            subprocess_env(),
            "Listening on TCP address",
        )
        for port in ports
    ]
    run = running_run(alice[0])
    total = 400
    try:

        def write():
            for i in range(0, total, 10):
                async_to_sync(append_and_publish)(
                    run_id=run.id,
                    token=1,
                    events=[("token", {"text": f"w{j} "}) for j in range(i, i + 10)],
                )
            async_to_sync(append_and_publish)(
                run_id=run.id,
                token=1,
                events=[
                    ("end", {"status": "completed", "terminal_state": "completed"})
                ],
            )

        writer = threading.Thread(target=write)
        writer.start()
        collected, last_id, hops = [], None, 0
        while not collected or collected[-1][1] != "end":
            port = ports[hops % 2]
            headers = {**alice[1], **({"Last-Event-ID": last_id} if last_id else {})}
            result = read_sse(
                f"http://127.0.0.1:{port}/api/runs/{run.id}/events/",
                headers=headers,
                max_events=37 if hops < 8 else None,
            )
            assert result.status == 200
            collected += result.events
            last_id = collected[-1][0]
            hops += 1
        writer.join(30)
    finally:
        for proc in servers:
            proc.terminate()
            proc.wait(10)
    assert hops >= 2
    assert [e[0] for e in collected] == [f"{run.id}:{n}" for n in range(1, total + 2)]
    assert "".join(e[2]["text"] for e in collected if e[1] == "token") == "".join(
        f"w{j} " for j in range(total)
    )
