"""Worker processes for tests: one started with a short lease, and a run slow
enough to kill, pause or stop its worker in the middle of.
"""

import re

from hermes_testing.api import LONG, new_session, start_run
from hermes_testing.fake_llm import Reply
from hermes_testing.harness import spawn, spawn_logged, subprocess_env, wait_until
from journal.models import Event

LEASE_S = 1.5  # short, so a lost worker is noticed within a test's patience


def _worker_env(fake_llm) -> dict:
    return subprocess_env(
        OPENAI_BASE_URL=fake_llm.base_url,
        HERMES_DEFAULT_MODEL="fake-model",
        HERMES_LEASE_S=str(LEASE_S),
        HERMES_HEARTBEAT_S="0.3",
    )


def spawn_worker(fake_llm, *extra: str, ready: str = "running"):
    """`manage.py worker` in a process of its own, with a `LEASE_S` lease."""
    args = ["manage.py", "worker", "--concurrency", "2", *extra]
    return spawn(args, _worker_env(fake_llm), ready)


def spawn_worker_with_metrics(fake_llm, log_path):
    """`spawn_worker` serving its metrics on a free port: (process, metrics URL)."""
    args = ["manage.py", "worker", "--concurrency", "2", "--metrics-port", "0"]
    proc = spawn_logged(args, _worker_env(fake_llm), log_path, "running")
    found = re.search(r"metrics at (http://\S+)", log_path.read_text())
    assert found, log_path.read_text()
    return proc, found.group(1)


def start_slow_run(server, alice, fake_llm) -> tuple[int, str]:
    """A run streaming slowly from the model, with a few tokens journaled already."""
    fake_llm.push(Reply(text=LONG, tokens_per_s=40, chunk_chars=2))
    session_id = new_session(server, alice[1])
    run_id = start_run(server, alice[1], session_id, "talk slowly")
    wait_until(
        lambda: Event.objects.filter(run_id=run_id, type="token").count() >= 3,
        timeout=15,
    )
    return session_id, run_id
