"""Export and import over the API (`chat.api_transfer`): the same file as
`manage.py export_session`, a Markdown transcript, and an import that checks
ownership, size and content, all or nothing."""

import io
import json
import warnings

import pytest
from django.core.management import call_command
from rest_framework.test import APIClient

from chat.models import ChatSession, Message
from chat.tests.test_transfer import rich_session, transcript  # noqa: F401

NDJSON = "application/x-ndjson"


def content(response) -> bytes:
    """A streamed export's body (the test client reads it through Django's
    sync fallback; daphne streams it)."""
    assert response.streaming
    with warnings.catch_warnings():  # Django's note that it reads it whole
        warnings.simplefilter("ignore")
        return b"".join(response)


def export_url(session, kind: str = "json") -> str:
    return f"/api/sessions/{session.pk}/export/?as={kind}"


def test_json_export_is_the_export_session_file(api, rich_session):  # noqa: F811
    response = api.get(export_url(rich_session))
    assert response.status_code == 200
    assert response["Content-Type"].startswith(NDJSON)
    assert response["Content-Disposition"] == (
        f'attachment; filename="hermes-session-{rich_session.pk}.jsonl"'
    )
    command = io.StringIO()
    call_command("export_session", str(rich_session.pk), stdout=command)
    assert content(response).decode() == command.getvalue()


def test_markdown_export_reads_as_a_transcript(api, rich_session):  # noqa: F811
    response = api.get(export_url(rich_session, "markdown"))
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/markdown")
    text = content(response).decode()
    assert text.startswith("# Über «tricky» chat\n\nModel: `demo`\n")
    assert "## System prompt\n\n```\nBe brief.\nAlways.\n```\n" in text
    assert "## User\n\nwhat is 6*7?\n" in text
    assert 'Tool call `calculator`:\n\n```\n{"expression": "6*7"}\n```\n' in text
    assert "## Tool result\n\n```\n42\n```\n" in text
    assert "## Assistant (incomplete)\n\nIt is 4\n" in text
    assert '2 — 🦊 "quoted"\n\ttabbed' in text


@pytest.mark.slow
def test_export_of_another_users_session_is_404(bob, rich_session):  # noqa: F811
    client = APIClient()
    client.force_authenticate(bob[0])
    assert client.get(export_url(rich_session)).status_code == 404


def test_export_in_an_unknown_format_is_400(api, rich_session):  # noqa: F811
    response = api.get(export_url(rich_session, "pdf"))
    assert response.status_code == 400 and "json, markdown" in response.json()["error"]


@pytest.mark.slow
def test_import_of_an_export_makes_the_callers_copy(api, bob, rich_session):  # noqa: F811
    exported = content(api.get(export_url(rich_session)))
    client = APIClient()
    client.force_authenticate(bob[0])
    response = client.post("/api/sessions/import/", data=exported, content_type=NDJSON)
    assert response.status_code == 201, response.json()
    body = response.json()
    copy = ChatSession.objects.get(pk=body["session"]["id"])
    assert body["messages"] == 5 and copy.owner == bob[0]
    assert copy.title == rich_session.title
    assert transcript(copy) == transcript(rich_session)


def test_a_bad_line_is_400_naming_it_and_keeps_nothing(api):
    head = {"type": "session", "format": "hermes-session", "version": 1, "title": "t"}
    lines = [
        json.dumps(head),
        json.dumps({"type": "message", "role": "user", "content": "hi"}),
        json.dumps({"type": "message", "role": "wizard", "content": "x"}),
    ]
    response = api.post(
        "/api/sessions/import/", data="\n".join(lines), content_type=NDJSON
    )
    assert response.status_code == 400
    assert response.json() == {"error": "line 3: unknown role 'wizard'", "line": 3}
    assert not ChatSession.objects.exists() and not Message.objects.exists()


@pytest.mark.parametrize(
    ("data", "needle"),
    [(b"", "empty file"), (b"\xff\xfe{}", "not UTF-8"), (b"[1]", "JSON object")],
)
def test_import_of_something_else_is_400(api, data, needle):
    response = api.post("/api/sessions/import/", data=data, content_type=NDJSON)
    assert response.status_code == 400 and needle in response.json()["error"]
    assert not ChatSession.objects.exists()


def test_import_over_the_size_limit_is_413(api, settings, rich_session):  # noqa: F811
    exported = content(api.get(export_url(rich_session)))
    settings.HERMES = {**settings.HERMES, "IMPORT_MAX_BYTES": len(exported) - 1}
    response = api.post("/api/sessions/import/", data=exported, content_type=NDJSON)
    assert response.status_code == 413
    assert f"larger than {len(exported) - 1} bytes" in response.json()["error"]
    assert ChatSession.objects.count() == 1


def test_import_over_the_session_limit_is_429(api, settings, rich_session):  # noqa: F811
    exported = content(api.get(export_url(rich_session)))
    settings.HERMES = {**settings.HERMES, "USER_MAX_SESSIONS": 1}
    response = api.post("/api/sessions/import/", data=exported, content_type=NDJSON)
    assert response.status_code == 429 and response.json()["limit"] == "sessions"
    assert ChatSession.objects.count() == 1


def test_export_and_import_need_login(rich_session):  # noqa: F811
    client = APIClient()
    assert client.get(export_url(rich_session)).status_code in (401, 403)
    response = client.post("/api/sessions/import/", data=b"{}", content_type=NDJSON)
    assert response.status_code in (401, 403)
    assert ChatSession.objects.count() == 1


@pytest.mark.slow
def test_the_server_streams_a_long_export_and_takes_it_back(server, alice):
    """Through the ASGI server: the export is sent in pieces as it is read
    (no Content-Length, several body messages), is the command's file, and
    imports as a copy."""
    import httpx

    session = ChatSession.objects.create(owner=alice[0], title="long", model="demo")
    Message.objects.bulk_create(
        Message(session=session, role=("user", "assistant")[i % 2], content=f"m{i}")
        for i in range(1200)
    )
    pieces = []
    with httpx.stream(
        "GET", f"{server.url}{export_url(session)}", headers=alice[1], timeout=60
    ) as response:
        assert response.status_code == 200
        assert "content-length" not in response.headers
        pieces = list(response.iter_raw())
    assert len(pieces) > 1
    exported = b"".join(pieces)
    command = io.StringIO()
    call_command("export_session", str(session.pk), stdout=command)
    assert exported.decode() == command.getvalue()

    imported = httpx.post(
        f"{server.url}/api/sessions/import/",
        content=exported,
        headers={**alice[1], "Content-Type": NDJSON},
        timeout=60,
    )
    assert imported.status_code == 201, imported.text
    assert imported.json()["messages"] == 1200
    copy = ChatSession.objects.get(pk=imported.json()["session"]["id"])
    assert transcript(copy) == transcript(session)
