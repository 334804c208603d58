"""Schemathesis against the live schema: no input the schema allows, or
breaks, gets a 5xx.

The real ASGI server (the `server` fixture) is fuzzed through its own
`/api/schema/` with a token, for a bounded number of examples per operation
and a bounded time. Path parameters name a real session and a finished run of
the user, so bodies and query parameters reach the views behind the 404s.
`/api/stream/` never ends by design and is left out, and the session is not
deleted (everything after would be a 404).
"""

import subprocess
import sys
from pathlib import Path

import pytest

from chat.models import ChatSession
from hermes_testing.turns import running_turn
from journal.store import append

MAX_EXAMPLES = 25  # per operation and phase
MAX_TIME_S = 60


@pytest.mark.schemathesis
def test_no_5xx_from_any_operation(server, alice, tmp_path, settings):
    # Fuzz the inputs, not the request throttle (its own tests cover it).
    settings.HERMES = {**settings.HERMES, "USER_REQUEST_RATE": "100000/min"}
    session = ChatSession.objects.create(owner=alice[0], title="fuzzed")
    run = running_turn(alice[0], session=session)
    end = {"status": "completed", "terminal_state": "completed"}
    append(run_id=run.id, token=1, events=[("token", {"text": "hi"}), ("end", end)])
    config = tmp_path / "schemathesis.toml"
    config.write_text(
        "[parameters]\n"
        f'"path.session_id" = "{session.pk}"\n'
        f'"path.run_id" = "{run.id}"\n'
    )
    st = Path(sys.executable).with_name("st")
    done = subprocess.run(
        [
            str(st),
            "--config-file",
            str(config),
            "run",
            f"{server.url}/api/schema/",
            "--header",
            f"Authorization: {alice[1]['Authorization']}",
            "--checks",
            "not_a_server_error",
            "--max-examples",
            str(MAX_EXAMPLES),
            "--max-time",
            str(MAX_TIME_S),
            "--phases",
            "examples,coverage,fuzzing",
            "--exclude-path",
            "/api/stream/",
            "--exclude-method",
            "DELETE",
            "--request-timeout",
            "20",
            "--workers",
            "1",
            "--seed",
            "9",
            "--generation-database",
            "none",
            "--no-color",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=MAX_TIME_S + 120,
    )
    report = done.stdout[-6000:] + done.stderr[-2000:]
    assert done.returncode == 0, report
    assert "Server error" not in done.stdout, report
    assert "passed" in done.stdout.lower() or "success" in done.stdout.lower(), report
