"""The REST API: bad input gets a 4xx naming the problem, and nothing changes."""

import json

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from rest_framework.test import APIClient

from chat.models import ChatSession, Message, Turn
from hermes_testing.turns import running_turn
from journal.models import Run
from journal.store import append


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


@pytest.mark.slow
def test_session_snapshot_is_bounded_and_reading_it_changes_nothing(
    api, alice, session
):
    run = running_turn(alice[0], session=session)
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
    parts = snapshot["parts"]
    assert snapshot["run_id"] == run.id and parts[:2] == [
        {"kind": "text", "text": "Hello "},
        {"kind": "reasoning", "text": "hmm"},
    ]
    assert snapshot["last_seq"] == len(events)
    assert len(parts) <= 64 and len(snapshot["statuses"]) <= 64
    tools = [p for p in parts if p["kind"] == "tool"]
    assert tools[-1]["tool_call_id"] == "c199"  # the newest cards are kept
    assert snapshot["statuses"][-1] == "step 199"
    assert all(len(t["args"]) <= 8 * 1024 + 1 for t in tools)
    assert len(response.content) < 200 * 1024
    assert Run.objects.values().get(id=run.id) == before


def test_session_snapshot_keeps_tool_cards_where_they_streamed(api, alice, session):
    run = running_turn(alice[0], session=session)
    call = {"tool_call_id": "c1", "name": "current_time", "args": "{}"}
    done = {**call, "result": "noon", "is_error": False, "duration_ms": 2}
    del done["args"]
    append(
        run_id=run.id,
        token=1,
        events=[
            ("token", {"text": "What "}),
            ("tool", call),
            ("tool_complete", done),
            ("token", {"text": "you are seeing: "}),
            ("token", {"text": "noon"}),
            ("status", {"message": "Retry attempt: stream-resume 1/3; body cut"}),
        ],
    )
    snapshot = api.get(f"/api/sessions/{session.pk}/").json()["active_run"]
    assert snapshot["parts"] == [
        {"kind": "text", "text": "What "},
        {
            "kind": "tool",
            "tool_call_id": "c1",
            "name": "current_time",
            "args": "{}",
            "result": "noon",
            "is_error": False,
            "duration_ms": 2,
        },
        {"kind": "text", "text": "you are seeing: noon"},
        # A resume marks where the answer was asked for again (journal.fold).
        {"kind": "resume", "text": "Retry attempt: stream-resume 1/3; body cut"},
    ]
    assert snapshot["statuses"] == ["Retry attempt: stream-resume 1/3; body cut"]
    assert snapshot["last_seq"] == 6 and snapshot["too_large"] is False


def test_openapi_schema_is_served(api):
    response = api.get("/api/schema/", HTTP_ACCEPT="application/json")
    assert response.status_code == 200
    assert "/api/runs/{run_id}/" in response.json()["paths"]


def test_message_pages_carry_the_status_of_their_runs(api, alice, session):
    """So a reloaded page draws every answer's footer without a request per run."""
    run = running_turn(alice[0], session=session)
    Turn.objects.filter(run=run).update(
        model="fake-model", usage={"input_tokens": 12, "output_tokens": 34}
    )
    append(
        run_id=run.id,
        token=1,
        events=[
            ("token", {"text": "Hi"}),
            ("end", {"status": "completed", "terminal_state": "completed"}),
        ],
    )
    Message.objects.create(session=session, role="user", content="hello", run=run)
    Message.objects.create(session=session, role="assistant", content="Hi", run=run)
    Message.objects.create(session=session, role="user", content="no run")
    page = api.get(f"/api/sessions/{session.pk}/messages/").json()
    assert list(page["runs"]) == [run.id]
    status = page["runs"][run.id]
    assert status == api.get(f"/api/runs/{run.id}/").json()
    assert (status["status"], status["model"], status["usage"]) == (
        "completed",
        "fake-model",
        {"input_tokens": 12, "output_tokens": 34},
    )


def test_session_snapshot_of_too_many_text_segments_asks_for_a_replay(
    api, alice, session
):
    """Segments cannot be dropped without losing text: past 64 parts with no
    tool card left to drop, the page is told to replay the run from seq 0."""
    run = running_turn(alice[0], session=session)
    events = []
    for i in range(40):
        events += [("reasoning", {"text": f"r{i}"}), ("token", {"text": f"t{i}"})]
    append(run_id=run.id, token=1, events=events)
    snapshot = api.get(f"/api/sessions/{session.pk}/").json()["active_run"]
    assert snapshot["too_large"] is True and snapshot["last_seq"] == 0
    assert "parts" not in snapshot


def test_the_run_statuses_of_a_message_page_cost_one_query(api, alice, session):
    def page_queries() -> int:
        with CaptureQueriesContext(connection) as queries:
            assert api.get(f"/api/sessions/{session.pk}/messages/").status_code == 200
        return len(queries)

    def answered_turn() -> None:
        run = running_turn(alice[0], session=session)
        Message.objects.create(session=session, role="user", content="q", run=run)
        Message.objects.create(session=session, role="assistant", content="a", run=run)

    answered_turn()
    one = page_queries()
    for _ in range(5):
        answered_turn()
    assert page_queries() == one
