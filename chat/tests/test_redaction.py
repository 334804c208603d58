"""Provider error bodies never carry a secret into the journal, API, streams or admin.

The loopback model server answers 401 with a body that echoes the configured
key, a bearer header, other key-shaped strings and a long traceback, as real
providers and proxies do.
"""

import json

import httpx
import pytest
from django.test import Client

from chat.redact import MESSAGE_MAX_CHARS, REDACTED, redact
from hermes_testing.fake_llm import Reply
from hermes_testing.harness import read_sse
from journal.models import Event, Run

CONFIGURED_KEY = "hermes-test-key-Zq8Kx1Lm"  # not key-shaped: found as configured
LEAKS = [
    CONFIGURED_KEY,
    "sk-proj-4f9XbQ2LmN0pRsT7uVwXyZ12",
    "W****3210",
    "eyJhbGciOiJIUzI1NiJ9.payload.sig",
]


def echoing_body() -> dict:
    traceback = "".join(
        f'  File "/srv/litellm/proxy/route_{i}.py", line {i}, in handler\n'
        for i in range(40)
    )
    return {
        "error": {
            "message": (
                f"Incorrect API key provided: {CONFIGURED_KEY}. "
                f"You sent Authorization: Bearer {LEAKS[3]} (also {LEAKS[1]}); "
                "your key sk-W****3210 is invalid. api_key=s3cr3tvalue99\n"
                f"Traceback (most recent call last):\n{traceback}"
            ),
            "type": "invalid_request_error",
        }
    }


def test_redact_removes_configured_and_key_shaped_secrets(settings):
    settings.HERMES = {**settings.HERMES, "OPENAI_API_KEY": CONFIGURED_KEY}
    text = redact(json.dumps(echoing_body()))
    for leak in [*LEAKS, "s3cr3tvalue99"]:
        assert leak not in text
    assert REDACTED in text and "Incorrect API key provided" in text
    assert len(text) <= MESSAGE_MAX_CHARS
    assert redact("model 'gpt-x' not found") == "model 'gpt-x' not found"


@pytest.fixture
def keyed_fake(fake_llm, monkeypatch, settings):
    monkeypatch.setenv("OPENAI_API_KEY", CONFIGURED_KEY)
    settings.HERMES = {**settings.HERMES, "OPENAI_API_KEY": CONFIGURED_KEY}
    fake_llm.push(Reply(status=401, error_body=echoing_body()))
    return fake_llm


@pytest.mark.slow
def test_echoed_key_reaches_no_reader(server, alice, keyed_fake, live_worker):
    headers = alice[1]
    session = httpx.post(f"{server.url}/api/sessions/", json={}, headers=headers)
    run_id = httpx.post(
        f"{server.url}/api/sessions/{session.json()['id']}/runs/",
        json={"content": "hi"},
        headers=headers,
    ).json()["run_id"]
    # The SSE stream, to its end.
    result = read_sse(f"{server.url}/api/runs/{run_id}/events/", headers=headers)
    assert result.events[-1][1] == "end"
    assert result.events[-1][2]["status"] == "failed"
    assert result.events[-1][2]["error"]["category"] == "auth"
    seen = {"sse": json.dumps([e[2] for e in result.events])}
    # The journal as stored, and the run row.
    seen["journal"] = " ".join(
        Event.objects.filter(run_id=run_id).values_list("payload", flat=True)
    )
    run = Run.objects.select_related("turn").get(id=run_id)
    seen["run row"] = run.error_message + json.dumps(run.turn.diagnostics)
    # The API's status and its events.json page.
    seen["api"] = httpx.get(f"{server.url}/api/runs/{run_id}/", headers=headers).text
    seen["events.json"] = httpx.get(
        f"{server.url}/api/runs/{run_id}/events.json", headers=headers
    ).text
    # The admin's run page.
    admin = Client()
    admin.force_login(type(alice[0]).objects.create_superuser("root", "", "x"))
    seen["admin"] = admin.get(f"/admin/journal/run/{run_id}/change/").content.decode()
    for where, text in seen.items():
        for leak in LEAKS:
            assert leak not in text, (where, leak)
        assert "srv/litellm/proxy/route_39" not in text, where  # capped
    assert "Incorrect API key provided" in seen["api"]
    assert len(run.error_message) <= MESSAGE_MAX_CHARS
