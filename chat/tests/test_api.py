"""The REST API: bad input gets a 4xx naming the problem, and nothing changes."""

import json

import pytest
from rest_framework.test import APIClient

from chat.models import ChatSession, Message
from hermes_site.testing import running_run
from journal.models import Run
from journal.store import append


@pytest.fixture
def api(alice):
    client = APIClient()
    client.force_authenticate(alice[0])
    return client


@pytest.fixture
def session(alice):
    return ChatSession.objects.create(owner=alice[0], title="mine")


def runs_url(session):
    return f"/api/sessions/{session.pk}/runs/"


def test_invalid_json_is_400(api, session):
    response = api.post(
        runs_url(session), data="{nope", content_type="application/json"
    )
    assert response.status_code == 400 and "JSON" in response.json()["error"]
    assert not Run.objects.exists()


@pytest.mark.parametrize(
    "body,needle",
    [
        ({}, "content"),
        ({"content": "   "}, "empty"),
        ({"content": "x" * 100_001}, "longer than"),
        ({"content": "hi", "model": "no-such-model"}, "unknown model"),
    ],
)
def test_bad_run_input_is_400_and_changes_nothing(api, session, body, needle):
    response = api.post(runs_url(session), data=body, format="json")
    assert response.status_code == 400
    assert needle in json.dumps(response.json())
    assert not Run.objects.exists() and not Message.objects.exists()


def test_unknown_model_on_a_session_is_400(api, session):
    response = api.patch(
        f"/api/sessions/{session.pk}/", data={"model": "nope"}, format="json"
    )
    assert response.status_code == 400
    assert ChatSession.objects.get(pk=session.pk).model == ""


def test_another_users_session_is_404_everywhere(bob, session):
    client = APIClient()
    client.force_authenticate(bob[0])
    base = f"/api/sessions/{session.pk}/"
    assert client.get(base).status_code == 404
    assert client.patch(base, data={"title": "x"}, format="json").status_code == 404
    assert client.delete(base).status_code == 404
    assert client.get(base + "messages/").status_code == 404
    assert (
        client.post(base + "runs/", data={"content": "x"}, format="json").status_code
        == 404
    )
    assert client.get("/api/sessions/").json() == []
    assert ChatSession.objects.get(pk=session.pk).title == "mine"


def test_unknown_ids_are_404_not_500(api):
    assert api.get("/api/sessions/abc/").status_code == 404
    assert api.get("/api/sessions/999999/messages/").status_code == 404
    assert api.get("/api/runs/run_nope/").status_code == 404


def test_login_is_required():
    client = APIClient()
    for url in ("/api/sessions/", "/api/models/", "/api/runs/run_x/"):
        assert client.get(url).status_code in (401, 403)


def test_messages_are_paginated_in_order(api, session):
    for i in range(130):
        Message.objects.create(session=session, role="user", content=f"m{i}")
    first = api.get(f"/api/sessions/{session.pk}/messages/").json()
    assert [m["content"] for m in first["results"]] == [f"m{i}" for i in range(100)]
    second = api.get(first["next"]).json()
    assert [m["content"] for m in second["results"]] == [
        f"m{i}" for i in range(100, 130)
    ]
    assert "active_run" not in second


def test_session_snapshot_is_bounded_and_reading_it_changes_nothing(
    api, alice, session
):
    run = running_run(alice[0], session=session)
    big = "a" * 50_000
    events = [("token", {"text": "Hello "}), ("reasoning", {"text": "hmm"})]
    for i in range(200):
        events += [
            ("tool", {"tool_call_id": f"c{i}", "name": "calculator", "args": big}),
            (
                "tool_complete",
                {
                    "tool_call_id": f"c{i}",
                    "name": "calculator",
                    "result": big,
                    "is_error": False,
                    "duration_ms": 1,
                },
            ),
            ("status", {"message": f"step {i}"}),
        ]
    append(run_id=run.id, token=1, events=events)
    before = Run.objects.values().get(id=run.id)
    response = api.get(f"/api/sessions/{session.pk}/")
    snapshot = response.json()["active_run"]
    assert snapshot["run_id"] == run.id and snapshot["text"] == "Hello "
    assert snapshot["last_seq"] == len(events)
    assert len(snapshot["tools"]) <= 64 and len(snapshot["statuses"]) <= 64
    assert all(len(t["args"]) <= 8 * 1024 + 1 for t in snapshot["tools"])
    assert len(response.content) < 200 * 1024
    assert Run.objects.values().get(id=run.id) == before


def test_openapi_schema_is_served(api):
    response = api.get("/api/schema/", HTTP_ACCEPT="application/json")
    assert response.status_code == 200
    assert "/api/runs/{run_id}/" in response.json()["paths"]
