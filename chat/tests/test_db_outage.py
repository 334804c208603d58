"""A worker process riding through a PostgreSQL outage (docs/operating.md).

Each test starts its own PostgreSQL cluster (hermes_testing.private_servers), a
`manage.py worker` on it and the loopback model server, then stops or kills
the database mid-stream. The journal is checked afterwards: dense, one `end`,
the model's whole answer journaled and kept once.
"""

import asyncio
import json
import os
import socket
import subprocess
import sys
import threading
import time

import psycopg
import pytest
import websockets
from django.conf import settings
from websockets.typing import Origin

from hermes_testing.fake_llm import FakeLLM, Reply
from hermes_testing.harness import daphne_args, spawn_logged, wait_until
from hermes_testing.private_servers import PrivatePostgres

pytestmark = pytest.mark.skipif(
    not PrivatePostgres.available(), reason="needs the PostgreSQL server binaries"
)

LEASE_S = 2.0
ANSWER = "".join(f"word{i} " for i in range(120))  # 720 characters


@pytest.fixture
def pg():
    with PrivatePostgres() as server:
        manage(server, "migrate", "--noinput")
        yield server


def env_for(pg: PrivatePostgres, **extra: str) -> dict:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("PYTEST") and k not in ("REDIS_URL", "HERMES_SQLITE_PATH")
    }
    return {**env, "DATABASE_URL": pg.url, **extra}


def manage(pg: PrivatePostgres, *args: str, **extra: str) -> str:
    done = subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=settings.BASE_DIR,
        env=env_for(pg, **extra),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


CREATE_RUNS = """
import json, sys
from django.contrib.auth import get_user_model
from chat.models import ChatSession
from chat.services import run_start
ids = []
for i in range(int(sys.argv[-1])):
    user = get_user_model().objects.create_user(username=f"u{i}", password="x")
    session = ChatSession.objects.create(owner=user)
    run, _ = run_start(session=session, content="go", model="fake-model",
                       provider="openai")
    ids.append(run.id)
print(json.dumps(ids))
"""


def create_runs(pg: PrivatePostgres, count: int) -> list[str]:
    out = manage(pg, "shell", "-c", CREATE_RUNS.replace("sys.argv[-1]", str(count)))
    return json.loads(out.strip().splitlines()[-1])


class WorkerProcess:
    def __init__(self, pg: PrivatePostgres, fake: FakeLLM, **env: str):
        self.proc = subprocess.Popen(
            [sys.executable, "manage.py", "worker", "--concurrency", "8"],
            cwd=settings.BASE_DIR,
            env=env_for(
                pg,
                OPENAI_BASE_URL=fake.base_url,
                HERMES_DEFAULT_MODEL="fake-model",
                HERMES_LEASE_S=str(LEASE_S),
                HERMES_HEARTBEAT_S="0.5",
                **env,
            ),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.lines: list[str] = []
        out = self.proc.stdout
        assert out is not None
        threading.Thread(target=lambda: self.lines.extend(out), daemon=True).start()
        wait_until(lambda: any("running (" in line for line in self.lines), 30)

    @property
    def output(self) -> str:
        return "".join(self.lines)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        finally:
            self.proc.kill()


def query(pg: PrivatePostgres, sql: str, *params):
    """One query on a fresh connection (the server may have restarted)."""
    with psycopg.connect(pg.url, autocommit=True, connect_timeout=5) as conn:
        return conn.execute(sql, params).fetchall()


def tokens_of(pg, run_id: str) -> int:
    return query(
        pg,
        "SELECT count(*) FROM journal_event WHERE run_id = %s AND type = 'token'",
        run_id,
    )[0][0]


def ended(pg, run_ids) -> bool:
    try:
        rows = query(
            pg,
            "SELECT count(*) FROM journal_run WHERE id = ANY(%s) AND status NOT IN"
            " ('queued', 'running')",
            list(run_ids),
        )
    except psycopg.OperationalError:
        return False
    return rows[0][0] == len(run_ids)


def journal(pg, run_id: str) -> list[tuple[int, str, dict]]:
    rows = query(
        pg,
        "SELECT seq, type, payload FROM journal_event WHERE run_id = %s ORDER BY seq",
        run_id,
    )
    return [(seq, kind, json.loads(payload)) for seq, kind, payload in rows]


def check_whole(pg, run_id: str) -> tuple[list, dict]:
    """The journal is dense with one `end`; the kept text is the journal's."""
    events = journal(pg, run_id)
    assert [seq for seq, _, _ in events] == list(range(1, len(events) + 1))
    assert [kind for _, kind, _ in events].count("end") == 1
    assert events[-1][1] == "end"
    text = "".join(p["text"] for _, kind, p in events if kind == "token")
    kept = query(
        pg,
        "SELECT content FROM chat_message WHERE run_id = %s AND role = 'assistant'"
        " ORDER BY id",
        run_id,
    )
    assert "".join(c for (c,) in kept) == text
    return events, events[-1][2]


def run_outage(pg, fake, runs: int, down_s: float, how: str, **env):
    for _ in range(runs):
        fake.push(Reply(text=ANSWER, chunk_chars=3, tokens_per_s=25))
    run_ids = create_runs(pg, runs)
    worker = WorkerProcess(pg, fake, **env)
    try:
        wait_until(lambda: all(tokens_of(pg, r) >= 3 for r in run_ids), timeout=30)
        getattr(pg, how)()
        went_down = time.monotonic()
        time.sleep(down_s)  # the outage itself
        pg.start()
        wait_until(lambda: ended(pg, run_ids), timeout=90)
    finally:
        worker.stop()
    return run_ids, went_down, worker.output


@pytest.mark.slow
def test_a_database_outage_longer_than_the_lease_loses_nothing(pg):
    with FakeLLM() as fake:
        run_ids, went_down, output = run_outage(pg, fake, 3, LEASE_S * 2, "stop")
    assert "run crashed" not in output and "Traceback" not in output, output
    assert output.count("database unreachable") == 1, output
    assert "database reachable again" in output, output
    # The model went on streaming while the database was away.
    assert all(r.last_byte_at > went_down for r in fake.requests)
    assert fake.post_count == len(run_ids)  # nothing was asked twice
    for run_id in run_ids:
        events, end = check_whole(pg, run_id)
        assert (end["status"], end["terminal_state"]) == ("completed", "completed")
        assert "".join(p["text"] for _, k, p in events if k == "token") == ANSWER
        [(token, owner)] = query(
            pg,
            "SELECT fencing_token, lease_owner FROM journal_run WHERE id = %s",
            run_id,
        )
        assert token == 1  # never taken over


@pytest.mark.chaos
def test_a_killed_database_loses_nothing_and_writes_nothing_twice(pg):
    with FakeLLM() as fake:
        run_ids, _went_down, output = run_outage(pg, fake, 6, 10, "kill")
    assert "run crashed" not in output and "Traceback" not in output, output
    for run_id in run_ids:
        events, end = check_whole(pg, run_id)
        assert end["status"] == "completed", output
        assert "".join(p["text"] for _, k, p in events if k == "token") == ANSWER


@pytest.mark.slow
def test_an_outage_beyond_the_bound_fails_the_run_as_database_keeping_its_text(pg):
    with FakeLLM() as fake:
        run_ids, went_down, output = run_outage(
            pg, fake, 1, 6, "stop", HERMES_DB_OUTAGE_MAX_S="2"
        )
        [request] = fake.requests
    assert "run crashed" not in output and "Traceback" not in output, output
    [run_id] = run_ids
    events, end = check_whole(pg, run_id)
    assert (end["status"], end["terminal_state"]) == ("failed", "database-unavailable")
    assert end["error"]["category"] == "database"
    [error] = [p for _, kind, p in events if kind == "error"]
    assert error["category"] == "database" and error["retryable"] is True
    # The model was stopped during the outage, once the bound had passed.
    assert request.closed_by == "client" and request.closed_at > went_down + 2
    text = "".join(p["text"] for _, k, p in events if k == "token")
    assert text and ANSWER.startswith(text) and text != ANSWER


LEASE_RUN = """
from datetime import timedelta
from django.contrib.auth import get_user_model
from django.utils import timezone
from journal.models import Run
user = get_user_model().objects.create_user(username="held", password="x")
run = Run.objects.create(owner=user, status="running", fencing_token=1,
    lease_owner="a worker", lease_expires_at=timezone.now() + timedelta(seconds=1))
print(run.id)
"""

WATCH_REAPER = """
import json, time
from django.db import connection
from journal.leases import reap_lost_runs
first = [r for r, _ in reap_lost_runs()]
while True:
    settled = [r for r, _ in reap_lost_runs()]
    if settled:
        break
    time.sleep(0.1)
with connection.cursor() as cursor:
    cursor.execute("SELECT extract(epoch FROM now() - pg_postmaster_start_time())")
    (uptime,) = cursor.fetchone()
print(json.dumps([first, settled, float(uptime)]))
"""


@pytest.mark.slow
def test_after_a_restart_no_process_reaps_a_lease_its_worker_could_not_renew(pg):
    """A process that never saw the outage still gives the worker a whole lease."""
    lease_s = 8
    run_id = manage(pg, "shell", "-c", LEASE_RUN).split()[-1]
    pg.stop()  # the lease lapses while the database is away
    pg.start()
    out = manage(pg, "shell", "-c", WATCH_REAPER, HERMES_LEASE_S=str(lease_s))
    first, settled, uptime = json.loads(out.strip().splitlines()[-1])
    assert (first, settled) == ([], [run_id])
    assert uptime >= lease_s  # reaped only once the database was up a lease


WS_LOGINS = """
from django.contrib.auth import (
    BACKEND_SESSION_KEY, HASH_SESSION_KEY, SESSION_KEY, get_user_model,
)
from django.contrib.sessions.backends.db import SessionStore
from rest_framework.authtoken.models import Token
from chat.models import ChatSession
from chat.services import run_start
user = get_user_model().objects.create_user(username="ws", password="x" * 12)
token = Token.objects.create(user=user)
store = SessionStore()
store[SESSION_KEY] = str(user.pk)
store[BACKEND_SESSION_KEY] = "django.contrib.auth.backends.ModelBackend"
store[HASH_SESSION_KEY] = user.get_session_auth_hash()
store.create()
run, _ = run_start(session=ChatSession.objects.create(owner=user), content="go",
                   model="fake-model", provider="openai")
print(token.key, store.session_key, run.id)
"""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def ws_close_code(
    url: str, origin: str, headers: dict, open_s: float = 20
) -> int | None:
    """The close code the server sent, or None if it kept following the run
    for `open_s` seconds."""

    async def closed_with() -> int | None:
        async with websockets.connect(
            url, additional_headers=headers, origin=Origin(origin), open_timeout=20
        ) as ws:
            try:
                while True:
                    await asyncio.wait_for(ws.recv(), open_s)
            except TimeoutError:
                return None  # open, following the run
            except websockets.ConnectionClosed as closed:
                return closed.rcvd.code if closed.rcvd else None

    return asyncio.run(closed_with())


class KeptOpen(threading.Thread):
    """A WebSocket reader following a run in a thread; counts keepalives."""

    def __init__(self, url: str, origin: str, headers: dict):
        super().__init__(daemon=True)
        self.url, self.origin, self.headers = url, origin, headers
        self.opened = self.closed = False
        self.keepalives = 0
        self.frames: list[dict] = []
        self.start()

    def run(self) -> None:
        asyncio.run(self._follow())

    async def _follow(self) -> None:
        async with websockets.connect(
            self.url, additional_headers=self.headers, origin=Origin(self.origin)
        ) as ws:
            self.opened = True
            try:
                async for raw in ws:
                    frame = json.loads(raw)
                    if frame == {"event": "keepalive"}:
                        self.keepalives += 1
                    else:
                        self.frames.append(frame)
            except websockets.ConnectionClosed:
                pass  # the server went away at the test's end
            finally:
                self.closed = True


@pytest.mark.slow
def test_under_daphne_a_websocket_meets_the_outage_with_1013_logged_once(pg, tmp_path):
    """Daphne's own WebSocket handling, not the test server's: a reader's
    reconnect during an outage is told 1013 (try again later), whether it
    signs in with a token or a session cookie (read by Channels' middleware
    before the consumer), and the outage is one warning line, not an ERROR
    with a traceback per attempt. A reader already following stays open and
    hears keepalive frames while the journal cannot be read."""
    token, session_key, run_id = (
        manage(pg, "shell", "-c", WS_LOGINS).strip().splitlines()[-1].split()
    )
    port = _free_port()
    log_path = tmp_path / "daphne.log"
    web = spawn_logged(
        daphne_args(port),
        env_for(pg, HERMES_SSE_KEEPALIVE_S="0.5", HERMES_READER_IDLE_CHECK_S="0.5"),
        log_path,
        "Listening on TCP address",
    )
    origin, url = f"http://127.0.0.1:{port}", f"ws://127.0.0.1:{port}/ws/runs/{run_id}/"
    as_token = {"Authorization": f"Token {token}"}
    as_cookie = {"Cookie": f"sessionid={session_key}"}
    follower = KeptOpen(url, origin, as_cookie)
    try:
        assert ws_close_code(url, origin, as_token, 3) is None  # up: it follows
        wait_until(lambda: follower.opened, timeout=30)
        pg.stop()
        # The reader already following the run hears keepalives meanwhile.
        wait_until(lambda: follower.keepalives >= 3, timeout=60)
        codes = [
            ws_close_code(url, origin, headers) for headers in (as_token, as_cookie) * 3
        ]
        pg.start()
        assert codes == [1013] * 6
        assert ws_close_code(url, origin, as_cookie, 3) is None  # back: it follows
        wait_until(lambda: "database recovered" in log_path.read_text(), timeout=60)
        assert not follower.closed  # it stayed open through the outage
    finally:
        web.terminate()
        web.wait(30)
        follower.join(30)
    log = log_path.read_text()
    assert "ERROR" not in log, log[-3000:]
    assert log.count("database unavailable") == 1, log[-3000:]
    assert log.count("Traceback") <= 2, log[-3000:]  # the one line's, chained
