"""The README's instructions, run as a reader would run them: its API example
pasted into bash against `manage.py serve --port <port>`, and `PORT=… make run`."""

import json
import os
import re
import socket
import subprocess
from pathlib import Path

import pytest
from django.conf import settings

from chat.models import ChatSession, Message
from hermes_testing.fake_llm import Reply
from hermes_testing.harness import spawn, subprocess_env, wait_until

README = Path(settings.BASE_DIR) / "README.md"


def readme_api_example() -> str:
    """The shell block that follows "Example, a script to paste" in the README."""
    text = README.read_text()
    start = text.index("Example, a script to paste")
    match = re.compile(r"```sh\n(.*?)```", re.S).search(text, start)
    assert match, "no sh block after the API example's heading"
    return match.group(1)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _listening(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


@pytest.fixture
def served(fake_llm):
    """`manage.py serve --port <free port>`, with its worker, on the test database."""
    port = _free_port()
    env = subprocess_env(
        OPENAI_BASE_URL=fake_llm.base_url,
        HERMES_DEFAULT_MODEL="fake-model",
        HERMES_HEARTBEAT_S="0.3",
    )
    proc = spawn(["manage.py", "serve", "--port", str(port)], env, f":{port}/")
    try:
        wait_until(lambda: _listening(port), timeout=30)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(30)


@pytest.mark.slow
def test_readme_api_example_pastes_and_streams_the_run(alice, fake_llm, served):
    fake_llm.push(Reply(text="Hello from the example."))
    other = ChatSession.objects.create(owner=alice[0], title="not this one")
    key = alice[1]["Authorization"].removeprefix("Token ")
    result = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", readme_api_example()],
        env={**os.environ, "KEY": key, "BASE": served},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    frames = re.findall(r"^event: (\w+)\ndata: (.*)$", result.stdout, re.M)
    assert frames[-1][0] == "end", result.stdout
    text = "".join(json.loads(data)["text"] for kind, data in frames if kind == "token")
    assert text == "Hello from the example."
    # The run went to the session the script created, not to an older one.
    created = ChatSession.objects.get(owner=alice[0], title="demo")
    asked = Message.objects.filter(role="user")
    assert [(m.session_id, m.content) for m in asked] == [(created.pk, "hello")]
    assert not other.messages.exists()


def test_make_run_takes_port_from_the_environment():
    result = subprocess.run(
        ["make", "-n", "run"],
        cwd=settings.BASE_DIR,
        env={**os.environ, "PORT": "8089"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert "manage.py serve --host 127.0.0.1 --port 8089" in result.stdout
