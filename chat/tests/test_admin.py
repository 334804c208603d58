"""Chat's admin: sessions, messages, the run admin with its turn, cancel."""

import json

import pytest
from django.urls import reverse
from rest_framework.authtoken.models import Token

from chat.models import ChatSession, Message, ModelRoute, Turn
from hermes_testing.admin import assert_closed_to_others, page_queries
from hermes_testing.harness import running_run
from hermes_testing.turns import running_turn
from journal.heartbeats import worker_beat
from journal.models import Event, Run
from journal.store import append

END = (
    "end",
    {"status": "completed", "terminal_state": "completed", "message_id": None},
)


def finished_turn(owner, *, session, events: int = 3) -> Run:
    run = running_turn(owner, session=session)
    Turn.objects.filter(run_id=run.id).update(
        model="fake-model", provider="openai", usage={"total_tokens": 18}
    )
    tokens = [("token", {"text": f"word {i} "}) for i in range(events - 2)]
    append(run_id=run.id, token=1, events=[("start", {"model": "m"}), *tokens, END])
    run.refresh_from_db()
    return run


@pytest.fixture
def chat_data(alice):
    session = ChatSession.objects.create(owner=alice[0], title="Fox facts", model="m")
    run = finished_turn(alice[0], events=8, session=session)
    Message.objects.create(session=session, role="user", content="tell me", run=run)
    Message.objects.create(
        session=session,
        role="assistant",
        content="The fox <b>jumps</b>.",
        reasoning="hmm",
        tool_calls=[
            {
                "id": "c1",
                "type": "function",
                "function": {"name": "calculator", "arguments": "{}"},
            }
        ],
        run=run,
    )
    worker_beat(worker_id="host:1:w", active_runs=0)
    route = ModelRoute.objects.create(model="m", provider="demo")
    return {"session": session, "run": run, "route": route}


def admin_urls(data) -> list[str]:
    run, session = data["run"], data["session"]
    event = Event.objects.filter(run_id=run.id).first()
    message = Message.objects.filter(session=session).first()
    assert event is not None and message is not None
    return [
        reverse("admin:index"),
        reverse("admin:journal_run_changelist"),
        reverse("admin:journal_run_changelist")
        + "?status__exact=completed&turn__provider=",
        reverse("admin:journal_run_changelist") + f"?q={run.id}",
        reverse("admin:journal_run_changelist") + f"?subject__exact={session.subject}",
        reverse("admin:journal_run_change", args=[run.id]),
        reverse("admin:journal_run_events_json", args=[run.id]),
        reverse("admin:journal_event_changelist"),
        reverse("admin:journal_event_changelist")
        + f"?run__id__exact={run.id}&type=token",
        reverse("admin:journal_event_change", args=[event.pk]),
        reverse("admin:journal_workerheartbeat_changelist"),
        reverse("admin:chat_chatsession_changelist"),
        reverse("admin:chat_chatsession_change", args=[session.pk]),
        reverse("admin:chat_message_changelist"),
        reverse("admin:chat_message_changelist") + f"?session__id__exact={session.pk}",
        reverse("admin:chat_message_change", args=[message.pk]),
        reverse("admin:chat_modelroute_changelist"),
        reverse("admin:chat_modelroute_add"),
        reverse("admin:chat_modelroute_change", args=[data["route"].pk]),
    ]


@pytest.mark.slow
def test_admin_pages_render_for_a_superuser_and_show_no_secret(
    client, root, chat_data, alice
):
    key = Token.objects.get(user=alice[0]).key
    for url in admin_urls(chat_data):
        response = client.get(url)
        assert response.status_code == 200, url
        assert key not in response.content.decode(), url
    # DRF's token admin (which lists keys) is gone.
    assert client.get("/admin/authtoken/tokenproxy/").status_code == 404
    page = client.get(
        reverse("admin:journal_run_change", args=[chat_data["run"].id])
    ).content
    page = page.decode()
    assert "&quot;text&quot;: &quot;word 0 &quot;" in page  # pretty-printed, escaped
    assert "cancel_runs" not in page  # actions live on the list, not here
    session_page = client.get(
        reverse("admin:chat_chatsession_change", args=[chat_data["session"].pk])
    ).content.decode()
    assert (
        "The fox &lt;b&gt;jumps&lt;/b&gt;." in session_page
    )  # messages inline, escaped
    assert "&quot;name&quot;: &quot;calculator&quot;" in session_page
    # The run's page shows its turn and links to the session; the session's
    # page links to its runs (the journal's list, filtered by subject).
    session = chat_data["session"]
    session_url = reverse("admin:chat_chatsession_change", args=[session.pk])
    assert f'href="{session_url}"' in page
    assert "&quot;total_tokens&quot;: 18" in page and "fake-model" in page
    runs_url = reverse("admin:journal_run_changelist")
    runs_link = f"{runs_url}?subject__exact={session.subject}"
    assert f'href="{runs_link}"' in session_page
    listed = client.get(runs_link).content.decode()
    assert chat_data["run"].id in listed


@pytest.mark.slow
def test_admin_is_forbidden_to_a_plain_user_and_to_staff_without_permissions(
    client, chat_data, alice, django_user_model
):
    assert_closed_to_others(client, admin_urls(chat_data), alice[0], django_user_model)


@pytest.mark.slow
def test_run_changelist_queries_do_not_grow_with_the_rows_shown(
    client, root, alice, bob
):
    url = reverse("admin:journal_run_changelist")
    for i in range(5):
        owner = (alice, bob)[i % 2][0]
        finished_turn(owner, session=ChatSession.objects.create(owner=owner))
    few = page_queries(client, url)
    for i in range(45):
        owner = (alice, bob)[i % 2][0]
        finished_turn(owner, session=ChatSession.objects.create(owner=owner))
    many = page_queries(client, url)
    assert client.get(url).content.decode().count('class="action-select"') == 50
    assert len(many) == len(few), "\n".join(many)
    assert not [sql for sql in many if "journal_event" in sql]


def test_settle_action_ends_a_running_run_once_and_keeps_its_partial(
    client, root, alice
):
    session = ChatSession.objects.create(owner=alice[0])
    run = running_turn(alice[0], session=session)  # a live lease: only the admin
    append(
        run_id=run.id,
        token=1,
        events=[("start", {}), ("token", {"text": "half an ans"})],
    )
    done = running_run(alice[0])
    append(run_id=done.id, token=1, events=[END])
    url = reverse("admin:journal_run_changelist")
    response = client.post(
        url,
        {"action": "settle_interrupted", "_selected_action": [run.id, done.id]},
        follow=True,
    )
    assert "1 run(s) settled as interrupted." in response.content.decode()
    assert "1 run(s) had already ended." in response.content.decode()
    run.refresh_from_db()
    assert (run.status, run.terminal_state) == ("interrupted", "settled-by-admin")
    end = json.loads(Event.objects.get(run_id=run.id, type="end").payload)
    partial = Message.objects.get(run_id=run.id, role="assistant")
    assert (partial.content, partial.complete) == ("half an ans", False)
    assert end == {
        "status": "interrupted",
        "terminal_state": "settled-by-admin",
        "message_id": partial.pk,
    }
    client.post(url, {"action": "settle_interrupted", "_selected_action": [run.id]})
    assert Event.objects.filter(run_id=run.id, type="end").count() == 1
    assert Run.objects.get(id=done.id).terminal_state == "completed"


@pytest.mark.slow
def test_cancel_action_settles_a_queued_run_and_flags_a_running_one(
    client, root, alice
):
    queued = running_turn(alice[0], session=ChatSession.objects.create(owner=alice[0]))
    Run.objects.filter(id=queued.id).update(status=Run.Status.QUEUED, fencing_token=0)
    running = running_turn(alice[0], session=ChatSession.objects.create(owner=alice[0]))
    client.post(
        reverse("admin:journal_run_changelist"),
        {"action": "cancel_runs", "_selected_action": [queued.id, running.id]},
    )
    queued.refresh_from_db()
    assert (queued.status, queued.terminal_state) == ("cancelled", "cancelled-by-user")
    running.refresh_from_db()  # its worker sees the request within a second and ends it
    assert running.status == "running" and running.cancel_requested_at is not None
