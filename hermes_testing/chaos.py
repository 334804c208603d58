"""The fault-injection harness behind `pytest -m chaos` (docs/operating.md).

A scale-out deployment of real processes on private servers: a PostgreSQL
cluster and a redis-server of their own (`hermes_testing.private_servers`), two
daphne processes and two `manage.py worker` processes, and the loopback model
server (`hermes_testing.fake_llm`, in the test process, so tests script each
run's reply). Tests stop, kill and pause any of them while readers follow the
runs, then check every reader and every run against the journal:

- `Deployment` starts, kills, pauses and heals the Hermes processes;
- `JournalDB` reads the journal and the kept messages straight from the
  database (and makes users), independent of the code under test;
- `Stack` puts the servers and the deployment together and heals them;
- `hermes_testing.chaos_readers` has the readers, which reconnect at random
  across the live web servers with every cursor form, and `verify`, which
  compares what they got with the journal.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psycopg

from hermes_testing.private_servers import PrivatePostgres, PrivateRedis, free_port

BASE_DIR = Path(__file__).resolve().parents[1]
READY_TIMEOUT_S = 90.0  # a process start on a loaded 2-core machine

#: The deployment's settings: short leases so that a dead worker is noticed in
#: seconds, readers that check the journal often and keep streams alive.
DEFAULT_ENV = {
    "HERMES_LEASE_S": "5",
    # Lease : heartbeat as in production (15 : 3): a few renewals per lease,
    # and a lease long enough that a loaded machine does not lose live runs.
    "HERMES_HEARTBEAT_S": "1",
    "HERMES_READER_IDLE_CHECK_S": "0.5",
    "HERMES_SSE_KEEPALIVE_S": "1",
    "HERMES_SSE_RETRY_MS": "300",
    "HERMES_DEFAULT_MODEL": "fake-model",
    "HERMES_WORKER_CONCURRENCY": "16",
    # No title runs: each would take a scripted model reply meant for a chat.
    "HERMES_TITLES": "0",
}


def wait_for(predicate, *, timeout: float, what: str, interval: float = 0.05):
    """Poll `predicate` until it returns something truthy; return that."""
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if result:
            return result
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not reached within {timeout:g} s")
        time.sleep(interval)


# --- processes ------------------------------------------------------------------


class Child:
    """One Hermes process, its output appended to a log file across restarts."""

    def __init__(
        self,
        name: str,
        args: list[str],
        env: dict,
        ready_text: str,
        logdir: Path,
        url: str = "",
    ) -> None:
        self.name, self.args, self.env, self.ready_text = name, args, env, ready_text
        self.url = url  # where a web server answers
        self.log_path = logdir / f"{name}.log"
        self.proc: subprocess.Popen | None = None
        self.stopped = False  # SIGSTOPped
        self._log_from = 0

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self) -> Child:
        self._log_from = self.log_path.stat().st_size if self.log_path.exists() else 0
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, *self.args],
                cwd=BASE_DIR,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        self.stopped = False
        wait_for(self._ready, timeout=READY_TIMEOUT_S, what=f"{self.name} ready")
        return self

    def _ready(self) -> bool:
        if not self.alive:
            raise RuntimeError(f"{self.name} exited:\n{self.log()[-3000:]}")
        return self.ready_text in self.log()

    def log(self) -> str:
        """What this process printed since its latest start."""
        with open(self.log_path, "rb") as log:
            log.seek(self._log_from)
            return log.read().decode("utf-8", "replace")

    def send(self, sig: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)
        if sig == signal.SIGSTOP:
            self.stopped = True
        elif sig == signal.SIGCONT:
            self.stopped = False

    def kill(self) -> None:
        """SIGKILL, and wait until the process is gone."""
        if self.alive:
            self.send(signal.SIGKILL)
        if self.proc is not None:
            self.proc.wait(30)

    def stop(self) -> None:
        """SIGTERM (after SIGCONT if paused); SIGKILL if it does not go in time."""
        if self.proc is None or not self.alive:
            return
        self.send(signal.SIGCONT)
        self.send(signal.SIGTERM)
        try:
            self.proc.wait(40)
        except subprocess.TimeoutExpired:
            self.kill()


def hermes_env(
    *, database_url: str, redis_url: str, model_url: str, **overrides: str
) -> dict:
    """The environment of a deployment process: private servers, fake model."""
    inherited = ("PYTEST", "HERMES_", "DATABASE_URL", "REDIS_URL", "OPENAI_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(inherited)}
    env.update(DEFAULT_ENV)
    env.update(
        DATABASE_URL=database_url,
        REDIS_URL=redis_url,
        OPENAI_BASE_URL=model_url,
        DJANGO_SETTINGS_MODULE="hermes_site.settings",
        PYTHONUNBUFFERED="1",
    )
    env.update(overrides)
    return env


class Deployment:
    """K daphne processes and M workers on one database, one Redis, one model."""

    def __init__(
        self,
        *,
        logdir: Path,
        env: dict,
        webs: int = 2,
        workers: int = 2,
    ) -> None:
        self.env = env
        self.webs = [
            Child(
                f"web{i}",
                ["-m", "daphne", "-b", "127.0.0.1", "-p", str(port)]
                + ["hermes_site.asgi:application"],
                env,
                "Listening on TCP address",
                logdir,
                url=f"http://127.0.0.1:{port}",
            )
            for i, port in enumerate(free_port() for _ in range(webs))
        ]
        self.workers = [
            Child(f"worker{i}", ["manage.py", "worker"], env, "running", logdir)
            for i in range(workers)
        ]

    @property
    def children(self) -> list[Child]:
        return [*self.webs, *self.workers]

    def live_webs(self) -> list[Child]:
        """The web servers up and not paused (they have a `url`)."""
        return [w for w in self.webs if w.alive and not w.stopped]

    def migrate(self) -> None:
        subprocess.run(
            [sys.executable, "manage.py", "migrate", "--noinput"],
            cwd=BASE_DIR,
            env=self.env,
            check=True,
            capture_output=True,
            timeout=READY_TIMEOUT_S * 2,
        )

    def start(self) -> Deployment:
        self.migrate()
        for child in self.children:
            child.start()
        return self

    def heal(self) -> None:
        """Every process running again: paused ones resumed, dead ones restarted."""
        for child in self.children:
            if child.alive and child.stopped:
                child.send(signal.SIGCONT)
            if not child.alive:
                child.start()

    def worker_holding(self, lease_owner: str) -> Child:
        """The worker whose id (`host:pid:ulid`) is `lease_owner`."""
        pid = int(lease_owner.split(":")[1])
        return next(w for w in self.workers if w.alive and w.pid == pid)

    def close(self) -> None:
        for child in self.children:
            child.stop()


def rss_bytes(pid: int) -> int:
    """Resident memory of a process, from /proc."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for {pid}")


# --- the database, read directly --------------------------------------------------


class JournalDB:
    """Reads runs, journals and kept messages with plain SQL; makes users."""

    def __init__(self, url: str) -> None:
        self.url = url

    def query(self, sql: str, params: tuple = ()) -> list[tuple]:
        with psycopg.connect(self.url, autocommit=True, connect_timeout=5) as conn:
            return conn.execute(sql, params).fetchall()

    def try_query(self, sql: str, params: tuple = ()) -> list[tuple] | None:
        """None while the database is away (tests poll through outages)."""
        try:
            return self.query(sql, params)
        except psycopg.OperationalError:
            return None

    def create_users(self, count: int) -> list[dict]:
        """Users with API tokens; the `Authorization` headers to act as them."""
        headers = []
        with psycopg.connect(self.url, autocommit=True) as conn:
            for _ in range(count):
                name = f"chaos-{secrets.token_hex(6)}"
                row = conn.execute(
                    "INSERT INTO auth_user (password, is_superuser, username,"
                    " first_name, last_name, email, is_staff, is_active, date_joined)"
                    " VALUES ('!', false, %s, '', '', '', false, true, now())"
                    " RETURNING id",
                    (name,),
                ).fetchone()
                assert row is not None
                user_id = row[0]
                key = secrets.token_hex(20)
                conn.execute(
                    "INSERT INTO authtoken_token (key, user_id, created)"
                    " VALUES (%s, %s, now())",
                    (key, user_id),
                )
                headers.append({"Authorization": f"Token {key}"})
        return headers

    def run(self, run_id: str) -> dict:
        (row,) = self.query(
            "SELECT status, terminal_state, last_seq, lease_owner, error_category,"
            " session_id FROM journal_run LEFT JOIN chat_turn ON run_id = id"
            " WHERE id = %s",
            (run_id,),
        )
        keys = ("status", "terminal_state", "last_seq", "lease_owner")
        return dict(zip((*keys, "error_category", "session_id"), row, strict=True))

    def statuses(self, run_ids: list[str]) -> dict[str, str] | None:
        rows = self.try_query(
            "SELECT id, status FROM journal_run WHERE id = ANY(%s)", (run_ids,)
        )
        return None if rows is None else dict(rows)

    def token_counts(self, run_ids: list[str]) -> dict[str, int] | None:
        rows = self.try_query(
            "SELECT run_id, count(*) FROM journal_event"
            " WHERE run_id = ANY(%s) AND type = 'token' GROUP BY run_id",
            (run_ids,),
        )
        return None if rows is None else {r: 0 for r in run_ids} | dict(rows)

    def events(self, run_id: str) -> list[tuple[int, str, Any]]:
        rows = self.query(
            "SELECT seq, type, payload FROM journal_event WHERE run_id = %s"
            " ORDER BY seq",
            (run_id,),
        )
        return [(seq, kind, json.loads(payload)) for seq, kind, payload in rows]

    def kept_text(self, run_id: str) -> str:
        rows = self.query(
            "SELECT content FROM chat_message WHERE run_id = %s"
            " AND role = 'assistant' ORDER BY id",
            (run_id,),
        )
        return "".join(content for (content,) in rows)

    def message_count(self, session_id: int) -> int:
        (row,) = self.query(
            "SELECT count(*) FROM chat_message WHERE session_id = %s", (session_id,)
        )
        return row[0]


# --- the whole stack --------------------------------------------------------------


class Stack:
    """Private PostgreSQL and Redis, the deployment on them, the journal reader."""

    def __init__(self, *, logdir: Path, model_url: str, **env: str) -> None:
        self.pg = PrivatePostgres()
        self.redis = PrivateRedis()
        self.logdir = logdir
        self.model_url = model_url
        self.deployment = Deployment(
            logdir=logdir,
            env=hermes_env(
                database_url=self.pg.url,
                redis_url=self.redis.url,
                model_url=model_url,
                **env,
            ),
        )
        self.db = JournalDB(self.pg.url)

    def __enter__(self) -> Stack:
        try:
            self.pg.start()
            self.redis.start()
            self.deployment.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def heal(self) -> None:
        """Servers and processes all up again, whatever the last test did."""
        if not self.pg.running:
            self.pg.start()
        if not self.redis.running:
            self.redis.start()
        self.deployment.heal()

    def close(self) -> None:
        self.deployment.close()
        self.redis.cleanup()
        self.pg.cleanup()
