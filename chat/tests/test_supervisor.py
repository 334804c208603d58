"""`manage.py worker --processes N` with real processes: a killed child is
replaced, and SIGTERM reaches every child, whose runs settle as on shutdown."""

import os
import signal
from pathlib import Path

import pytest

from hermes_testing.api import stream
from hermes_testing.harness import process_alive, wait_until
from hermes_testing.workers import spawn_worker, start_slow_run
from journal.models import Run, WorkerHeartbeat

STARTUP_S = 60  # a Django process starting on a loaded machine


def children_of(pid: int) -> set[int]:
    """Live (not zombie) processes whose parent is `pid`."""
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue  # gone meanwhile
        state, ppid = stat.rsplit(")", 1)[1].split()[:2]
        if int(ppid) == pid and state != "Z":
            found.add(int(entry.name))
    return found


def beating(pid: int) -> bool:
    """The worker in process `pid` has announced itself (worker ids hold the pid)."""
    return WorkerHeartbeat.objects.filter(worker_id__contains=f":{pid}:").exists()


@pytest.mark.slow
def test_a_killed_worker_process_is_replaced_and_sigterm_stops_them_all(
    server, alice, fake_llm
):
    proc = spawn_worker(
        fake_llm, "--processes", "2", "--grace", "0.5", ready="supervising 2"
    )
    try:
        wait_until(lambda: len(children_of(proc.pid)) == 2, timeout=STARTUP_S)
        first = children_of(proc.pid)
        wait_until(lambda: all(beating(pid) for pid in first), timeout=STARTUP_S)

        victim = min(first)
        os.kill(victim, signal.SIGKILL)

        def replaced() -> set[int]:  # one look at the children, not two
            now = children_of(proc.pid)
            return now - first if len(now) == 2 and victim not in now else set()

        wait_until(replaced, timeout=STARTUP_S)
        (replacement,) = replaced()
        wait_until(lambda: beating(replacement), timeout=STARTUP_S)

        session_id, run_id = start_slow_run(server, alice, fake_llm)
        holder = Run.objects.get(id=run_id).lease_owner
        survivors = children_of(proc.pid)
        assert any(f":{pid}:" in holder for pid in survivors), (holder, survivors)
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(60)
        assert code == 0, code
    finally:
        for pid in children_of(proc.pid):
            os.kill(pid, signal.SIGKILL)
        proc.kill()
    for pid in survivors:  # every child exited, none was left behind
        assert not process_alive(pid)
    end = stream(server, alice[1], run_id)[-1][2]
    assert (end["status"], end["terminal_state"]) == ("interrupted", "worker-shutdown")
