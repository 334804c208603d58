"""The admin: runs and journal readable, settle and cancel, read-only, cheap."""

import json

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from rest_framework.authtoken.models import Token

from chat.models import ChatSession, Message
from hermes_site.testing import running_run
from journal.admin import JOURNAL_PREVIEW
from journal.heartbeats import worker_beat
from journal.models import Event, Run
from journal.store import append

END = (
    "end",
    {"status": "completed", "terminal_state": "completed", "message_id": None},
)


@pytest.fixture
def root(transactional_db, django_user_model, client):
    user = django_user_model.objects.create_superuser(
        "root", "root@example.com", "pw-rootroot"
    )
    client.force_login(user)
    return user


def finished_run(owner, *, events: int = 3, session=None) -> Run:
    run = running_run(owner, session=session)
    tokens = [("token", {"text": f"word {i} "}) for i in range(events - 2)]
    append(run_id=run.id, token=1, events=[("start", {"model": "m"}), *tokens, END])
    run.refresh_from_db()
    return run


@pytest.fixture
def chat_data(alice):
    session = ChatSession.objects.create(owner=alice[0], title="Fox facts", model="m")
    run = finished_run(alice[0], events=8, session=session)
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
    return {"session": session, "run": run}


def admin_urls(data) -> list[str]:
    run, session = data["run"], data["session"]
    event = Event.objects.filter(run_id=run.id).first()
    message = Message.objects.filter(session=session).first()
    return [
        reverse("admin:index"),
        reverse("admin:journal_run_changelist"),
        reverse("admin:journal_run_changelist") + "?status__exact=completed&provider=",
        reverse("admin:journal_run_changelist") + f"?q={run.id}",
        reverse("admin:journal_run_changelist") + f"?session__id__exact={session.pk}",
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
    ]


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


def test_admin_is_forbidden_to_a_plain_user_and_to_staff_without_permissions(
    client, chat_data, alice, django_user_model
):
    client.force_login(alice[0])  # an ordinary account
    for url in admin_urls(chat_data):
        response = client.get(url)
        assert (
            response.status_code == 302 and "/admin/login/" in response["Location"]
        ), url
    staff = django_user_model.objects.create_user(
        "staff", password="pw-staffstaff", is_staff=True
    )
    client.force_login(staff)
    for url in admin_urls(chat_data)[1:]:
        assert client.get(url).status_code == 403, url


def test_the_journal_is_read_only(client, root, chat_data):
    run = chat_data["run"]
    event = Event.objects.filter(run_id=run.id).first()
    payload = event.payload
    assert client.get(reverse("admin:journal_event_add")).status_code == 403
    assert (
        client.post(
            reverse("admin:journal_event_change", args=[event.pk]), {"payload": "{}"}
        ).status_code
        == 403
    )
    assert (
        client.post(
            reverse("admin:journal_event_delete", args=[event.pk]), {"post": "yes"}
        ).status_code
        == 403
    )
    assert client.get(reverse("admin:journal_run_add")).status_code == 403
    assert (
        client.post(
            reverse("admin:journal_run_delete", args=[run.id]), {"post": "yes"}
        ).status_code
        == 403
    )
    assert Event.objects.get(pk=event.pk).payload == payload
    assert Event.objects.filter(run_id=run.id).count() == 8
    page = client.get(
        reverse("admin:journal_event_change", args=[event.pk])
    ).content.decode()
    assert 'name="_save"' not in page


def _queries(client, url) -> list[str]:
    client.get(url)  # warm per-process caches (content types, permissions)
    with CaptureQueriesContext(connection) as captured:
        response = client.get(url)
    assert response.status_code == 200
    return [q["sql"] for q in captured]


def test_run_changelist_queries_do_not_grow_with_the_rows_shown(
    client, root, alice, bob
):
    url = reverse("admin:journal_run_changelist")
    for i in range(5):
        owner = (alice, bob)[i % 2][0]
        finished_run(owner, session=ChatSession.objects.create(owner=owner))
    few = _queries(client, url)
    for i in range(45):
        owner = (alice, bob)[i % 2][0]
        finished_run(owner, session=ChatSession.objects.create(owner=owner))
    many = _queries(client, url)
    assert client.get(url).content.decode().count('class="action-select"') == 50
    assert len(many) == len(few), "\n".join(many)
    assert not [sql for sql in many if "journal_event" in sql]


def test_run_change_page_queries_do_not_grow_with_the_events_shown(client, root, alice):
    small, large = (
        finished_run(alice[0], events=5),
        finished_run(alice[0], events=JOURNAL_PREVIEW),
    )
    few = _queries(client, reverse("admin:journal_run_change", args=[small.id]))
    many = _queries(client, reverse("admin:journal_run_change", args=[large.id]))
    assert len(many) == len(few), "\n".join(many)
    page = client.get(
        reverse("admin:journal_run_change", args=[large.id])
    ).content.decode()
    assert page.count("<tr><td>") == JOURNAL_PREVIEW and "more:" not in page


def test_a_long_run_shows_its_first_events_and_links_to_the_rest(client, root, alice):
    run = finished_run(alice[0], events=JOURNAL_PREVIEW + 30)
    page = client.get(
        reverse("admin:journal_run_change", args=[run.id])
    ).content.decode()
    assert page.count("<tr><td>") == JOURNAL_PREVIEW
    link = reverse("admin:journal_run_events_json", args=[run.id])
    assert (
        f'30 more: <a href="{link}?after_seq={JOURNAL_PREVIEW}">events.json</a>' in page
    )
    rest = client.get(f"{link}?after_seq={JOURNAL_PREVIEW}").json()
    assert [e["seq"] for e in rest["events"]] == list(
        range(JOURNAL_PREVIEW + 1, run.last_seq + 1)
    )
    assert rest["events"][-1]["event"] == "end" and rest["next_after_seq"] is None
    page = client.get(f"{link}?after_seq=0&limit=10").json()
    assert page["next_after_seq"] == 10 and page["events"][0]["id"] == f"{run.id}:1"
    assert client.get(f"{link}?limit=x").status_code == 400


def test_event_changelist_never_counts_the_journal(client, root, alice):
    run = finished_run(alice[0], events=130)
    url = reverse("admin:journal_event_changelist")
    first = _queries(client, url)
    assert not [sql for sql in first if "COUNT(" in sql.upper()], first
    page = client.get(url).content.decode()
    assert page.count('class="field-seq"') == 100
    assert "?p=2" in page  # a next page, known without counting
    last = client.get(url + "?p=2").content.decode()
    assert last.count('class="field-seq"') == 30 and "?p=3" not in last
    by_run = client.get(f"{url}?run__id__exact={run.id}").content.decode()
    seqs = [
        int(chunk.split("</td>")[0]) for chunk in by_run.split('class="field-seq">')[1:]
    ]
    assert seqs == list(range(1, 101))  # one run's events read in seq order
    assert client.get(url + "?p=9").status_code == 302  # past the end: back to page 1


def test_settle_action_ends_a_running_run_once_and_keeps_its_partial(
    client, root, alice
):
    session = ChatSession.objects.create(owner=alice[0])
    run = running_run(
        alice[0], session=session
    )  # a live lease: only the admin may settle it
    append(
        run_id=run.id,
        token=1,
        events=[("start", {}), ("token", {"text": "half an ans"})],
    )
    done = finished_run(alice[0])
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


def test_cancel_action_settles_a_queued_run_and_flags_a_running_one(
    client, root, alice
):
    queued = Run.objects.create(
        owner=alice[0], session=ChatSession.objects.create(owner=alice[0])
    )
    running = running_run(alice[0], session=ChatSession.objects.create(owner=alice[0]))
    client.post(
        reverse("admin:journal_run_changelist"),
        {"action": "cancel_runs", "_selected_action": [queued.id, running.id]},
    )
    queued.refresh_from_db()
    assert (queued.status, queued.terminal_state) == ("cancelled", "cancelled-by-user")
    running.refresh_from_db()  # its worker sees the request within a second and ends it
    assert running.status == "running" and running.cancel_requested_at is not None


def test_staff_who_may_only_view_runs_get_no_actions(
    client, chat_data, django_user_model
):
    from django.contrib.auth.models import Permission

    viewer = django_user_model.objects.create_user(
        "viewer", password="pw-viewview", is_staff=True
    )
    viewer.user_permissions.add(Permission.objects.get(codename="view_run"))
    client.force_login(viewer)
    page = client.get(reverse("admin:journal_run_changelist")).content.decode()
    assert "settle_interrupted" not in page and "cancel_runs" not in page
    response = client.post(
        reverse("admin:journal_run_changelist"),
        {"action": "settle_interrupted", "_selected_action": [chat_data["run"].id]},
    )
    assert response.status_code in (200, 302)
    assert Run.objects.get(id=chat_data["run"].id).terminal_state == "completed"
