"""Readers through a PostgreSQL outage: a daphne process on a private cluster.

The test makes its own cluster (initdb on a free port), runs daphne on it, and
stops the cluster while a run's SSE stream is open: new requests answer 503
with `Retry-After` and a JSON body (never 500), the open stream keeps sending
keepalives, and once the database is back it goes on with no event lost or
repeated. See docs/operating.md, "Database outage".
"""

import json
import subprocess
import sys
import threading
import time

import httpx
import pytest
from django.conf import settings

from hermes_testing.harness import daphne_args, spawn_logged, subprocess_env, wait_until
from hermes_testing.private_servers import PrivatePostgres, free_port

pytestmark = [
    pytest.mark.chaos,
    pytest.mark.skipif(
        not PrivatePostgres.available(), reason="PostgreSQL server binaries are missing"
    ),
]

# A writer process on the same database: creates a user, a token and a running
# run, then appends what it is told on stdin ("a <from> <to>", "end").
WRITER = """
import sys, django
django.setup()
from django.contrib.auth import get_user_model
from django.db import connection
from rest_framework.authtoken.models import Token
from hermes_testing.harness import running_run
from journal.store import append

user = get_user_model().objects.create_user(username="dora", password="pw-dora-dora")
token = Token.objects.create(user=user).key
run = running_run(user, lease_s=600)
print(json.dumps({"run_id": run.id, "token": token}), flush=True)
for line in sys.stdin:
    connection.close()  # the server may have restarted since the last command
    words = line.split()
    if words[0] == "a":
        lo, hi = int(words[1]), int(words[2])
        events = [("token", {"text": f"w{i} "}) for i in range(lo, hi)]
    else:
        events = [("end", {"status": "completed", "terminal_state": "completed"})]
    append(run_id=run.id, token=1, events=events)  # readers poll: no publish
    print("ok", flush=True)
""".replace("import sys, django", "import json, sys, django")


class Lines:
    """An SSE stream's raw lines, read in a thread, with their arrival times."""

    def __init__(self, url: str, headers: dict):
        self.lines: list[tuple[float, str]] = []
        self.status = 0
        self.done = threading.Event()
        self._thread = threading.Thread(
            target=self._read, args=(url, headers), daemon=True
        )
        self._thread.start()

    def _read(self, url: str, headers: dict) -> None:
        try:
            with httpx.Client(timeout=60) as client:
                with client.stream("GET", url, headers=headers) as response:
                    self.status = response.status_code
                    for line in response.iter_lines():
                        self.lines.append((time.monotonic(), line))
        finally:
            self.done.set()

    def keepalives_since(self, moment: float) -> int:
        return sum(1 for t, line in self.lines if t > moment and line == ": keepalive")

    def ids(self) -> list[str]:
        return [line[4:] for _, line in self.lines if line.startswith("id: ")]


def test_new_requests_get_503_and_an_open_stream_rides_through(tmp_path):
    with PrivatePostgres() as pg:
        env = subprocess_env(
            DATABASE_URL=pg.url,
            HERMES_SSE_KEEPALIVE_S="0.5",
            HERMES_READER_IDLE_CHECK_S="0.3",
        )
        env.pop("REDIS_URL", None)  # the in-memory layer: readers poll the journal
        subprocess.run(
            [sys.executable, "manage.py", "migrate", "-v", "0"],
            cwd=settings.BASE_DIR,
            env=env,
            check=True,
        )
        writer = subprocess.Popen(
            [sys.executable, "-c", WRITER],
            cwd=settings.BASE_DIR,
            env={**env, "DJANGO_SETTINGS_MODULE": "hermes_site.settings"},
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

        def write(command: str) -> None:
            writer.stdin.write(command + "\n")
            writer.stdin.flush()
            assert writer.stdout.readline().strip() == "ok"

        port = free_port()
        daphne_log = tmp_path / "daphne.log"
        daphne = None
        try:
            made = json.loads(writer.stdout.readline())
            run_id, headers = (
                made["run_id"],
                {"Authorization": f"Token {made['token']}"},
            )
            daphne = spawn_logged(
                daphne_args(port), env, daphne_log, "Listening on TCP address"
            )
            base = f"http://127.0.0.1:{port}"
            write("a 0 10")
            stream = Lines(f"{base}/api/runs/{run_id}/events/", headers)
            wait_until(lambda: len(stream.ids()) == 10, 30)

            pg.stop()
            stopped = time.monotonic()
            for path in (
                "/api/sessions/",
                f"/api/runs/{run_id}/events/",
                "/api/models/",
            ):
                response = httpx.get(f"{base}{path}", headers=headers, timeout=30)
                assert response.status_code == 503, (path, response.text)
                assert int(response.headers["Retry-After"]) > 0
                assert "database" in response.json()["error"]
            wait_until(lambda: stream.keepalives_since(stopped) >= 4, 30)
            assert not stream.done.is_set()  # the open stream stayed open

            pg.start()
            write("a 10 20")
            write("end")
            assert stream.done.wait(60)
            assert (
                httpx.get(f"{base}/api/sessions/", headers=headers).status_code == 200
            )
        finally:
            writer.kill()
            if daphne is not None:
                daphne.terminate()
                daphne.wait(20)
        assert stream.status == 200
        assert stream.ids() == [f"{run_id}:{n}" for n in range(1, 22)]
        log = daphne_log.read_text()
        assert "Internal Server Error" not in log and " 500 " not in log, log[-3000:]
        assert "Service Unavailable" not in log  # no error line per request
        assert log.count("database unavailable") == 1, log[-3000:]
        assert "database recovered" in log, log[-3000:]
