"""The journal's admin: runs and journal readable, settle, read-only, cheap.

Chat's additions (turns, sessions, cancel) are in chat/tests/test_admin.py.
"""

import json

import pytest
from django.urls import reverse
from rest_framework.authtoken.models import Token

from hermes_testing.admin import assert_closed_to_others, page_queries
from hermes_testing.harness import running_run
from journal import wire
from journal.admin import JOURNAL_PREVIEW
from journal.heartbeats import worker_beat
from journal.models import Event, Run
from journal.store import append

END = (
    "end",
    {"status": "completed", "terminal_state": "completed", "message_id": None},
)


def finished_run(owner, *, events: int = 3, subject: str = "") -> Run:
    run = running_run(owner, subject=subject)
    tokens = [("token", {"text": f"word {i} "}) for i in range(events - 2)]
    append(run_id=run.id, token=1, events=[("start", {"model": "m"}), *tokens, END])
    run.refresh_from_db()
    return run


@pytest.mark.slow
def test_the_journal_is_read_only(client, root, journal_data):
    run = journal_data["run"]
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


@pytest.fixture
def journal_data(alice):
    run = finished_run(alice[0], events=8, subject="demo:fox")
    worker_beat(worker_id="host:1:w", active_runs=0)
    return {"run": run}


def admin_urls(data) -> list[str]:
    run = data["run"]
    event = Event.objects.filter(run_id=run.id).first()
    assert event is not None
    return [
        reverse("admin:index"),
        reverse("admin:journal_run_changelist"),
        reverse("admin:journal_run_changelist") + "?status__exact=completed",
        reverse("admin:journal_run_changelist") + f"?q={run.id}",
        reverse("admin:journal_run_changelist") + f"?subject__exact={run.subject}",
        reverse("admin:journal_run_change", args=[run.id]),
        reverse("admin:journal_run_events_json", args=[run.id]),
        reverse("admin:journal_event_changelist"),
        reverse("admin:journal_event_changelist")
        + f"?run__id__exact={run.id}&type=token",
        reverse("admin:journal_event_change", args=[event.pk]),
        reverse("admin:journal_workerheartbeat_changelist"),
    ]


def test_admin_pages_render_for_a_superuser_and_show_no_secret(
    client, root, journal_data, alice
):
    key = Token.objects.get(user=alice[0]).key
    for url in admin_urls(journal_data):
        response = client.get(url)
        assert response.status_code == 200, url
        assert key not in response.content.decode(), url
    run = journal_data["run"]
    page = client.get(reverse("admin:journal_run_change", args=[run.id]))
    page = page.content.decode()
    assert "&quot;text&quot;: &quot;word 0 &quot;" in page  # pretty-printed, escaped
    assert "journal/admin.css" in page  # its style: none inline, under the CSP
    assert " style=" not in page and "<style" not in page
    assert "demo:fox" in page  # the subject, as text
    listed = client.get(reverse("admin:journal_run_changelist")).content.decode()
    filtered = client.get(admin_urls(journal_data)[4]).content.decode()
    other = finished_run(alice[0], subject="demo:other")
    assert run.id in listed and run.id in filtered and other.id not in filtered


@pytest.mark.slow
def test_admin_is_forbidden_to_a_plain_user_and_to_staff_without_permissions(
    client, journal_data, alice, django_user_model
):
    assert_closed_to_others(
        client, admin_urls(journal_data), alice[0], django_user_model
    )


@pytest.mark.slow
def test_run_changelist_queries_do_not_grow_with_the_rows_shown(
    client, root, alice, bob
):
    url = reverse("admin:journal_run_changelist")
    for i in range(5):
        finished_run((alice, bob)[i % 2][0], subject=f"demo:{i}")
    few = page_queries(client, url)
    for i in range(45):
        finished_run((alice, bob)[i % 2][0], subject=f"demo:{i}")
    many = page_queries(client, url)
    assert client.get(url).content.decode().count('class="action-select"') == 50
    assert len(many) == len(few), "\n".join(many)
    assert not [sql for sql in many if "journal_event" in sql]


def test_settle_action_ends_a_running_run_once(client, root, alice):
    run = running_run(alice[0], subject="demo:live")  # a live lease: only the admin
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
    assert (end["status"], end["terminal_state"]) == ("interrupted", "settled-by-admin")
    client.post(url, {"action": "settle_interrupted", "_selected_action": [run.id]})
    assert Event.objects.filter(run_id=run.id, type="end").count() == 1
    assert Run.objects.get(id=done.id).terminal_state == "completed"


def test_run_change_page_queries_do_not_grow_with_the_events_shown(client, root, alice):
    small, large = (
        finished_run(alice[0], events=5),
        finished_run(alice[0], events=JOURNAL_PREVIEW),
    )
    few = page_queries(client, reverse("admin:journal_run_change", args=[small.id]))
    many = page_queries(client, reverse("admin:journal_run_change", args=[large.id]))
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


@pytest.mark.slow
def test_event_changelist_never_counts_the_journal(client, root, alice):
    run = finished_run(alice[0], events=130)
    url = reverse("admin:journal_event_changelist")
    first = page_queries(client, url)
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


@pytest.mark.slow
def test_staff_who_may_only_view_runs_get_no_actions(
    client, journal_data, django_user_model
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
        {"action": "settle_interrupted", "_selected_action": [journal_data["run"].id]},
    )
    assert response.status_code in (200, 302)
    assert Run.objects.get(id=journal_data["run"].id).terminal_state == "completed"


@pytest.mark.parametrize(
    "query,name",
    [
        ("after_seq=-5", "after_seq"),  # once clamped to 0 here
        ("limit=0", "limit"),  # once clamped to 1
        (f"limit={wire.EVENTS_PAGE_MAX + 1}", "limit"),  # once clamped to the max
        ("after_seq=abc", "after_seq"),
        ("after_seq=3&limit=x", "limit"),
    ],
)
@pytest.mark.slow
def test_events_json_refuses_bad_input_as_the_api_does(
    client, root, alice, query, name
):
    run = finished_run(alice[0], events=5)
    link = reverse("admin:journal_run_events_json", args=[run.id])
    response = client.get(f"{link}?{query}")
    assert response.status_code == 400
    with pytest.raises(wire.BadPageParam) as expected:
        wire.parse_page_params(dict(pair.split("=") for pair in query.split("&")))
    assert response.json() == expected.value.body()
    assert name in response.json()["fields"]


def test_events_json_of_a_pruned_run_is_gone(client, root, alice):
    run = finished_run(alice[0], events=5)
    Run.objects.filter(id=run.id).update(pruned_at=run.created_at)
    link = reverse("admin:journal_run_events_json", args=[run.id])
    response = client.get(link)
    assert response.status_code == 410 and "pruned" in response.json()["error"]
