"""Retry over the API: `POST /api/sessions/<id>/runs/ {"retry_of": <run_id>}`
starts a new run over the question of the session's latest run, without a
second copy of it, and the model is sent the question without the answer
retried."""

import pytest

from chat.models import ChatSession, Message
from hermes_testing.fake_llm import Reply
from hermes_testing.harness import wait_until
from journal.models import Run


def runs_url(session):
    return f"/api/sessions/{session.pk}/runs/"


def start(api, session, body) -> str:
    response = api.post(runs_url(session), data=body, format="json")
    assert response.status_code == 201, response.json()
    return response.json()["run_id"]


def ended(run_id: str) -> Run:
    wait_until(lambda: Run.objects.get(pk=run_id).is_terminal, timeout=30)
    return Run.objects.get(pk=run_id)


def test_retry_answers_the_same_question_once_more(api, session, fake_llm, live_worker):
    fake_llm.push(Reply(text="First answer.", status=400))  # fails before any text
    first = start(api, session, {"content": "What is durable?"})
    assert ended(first).status == Run.Status.FAILED
    fake_llm.push(Reply(text="Second try, fine."))

    # The session names its newest run, though no message names this one.
    assert api.get(f"/api/sessions/{session.pk}/").json()["last_run_id"] == first
    retry = start(api, session, {"retry_of": first})
    assert ended(retry).status == Run.Status.COMPLETED
    assert api.get(f"/api/sessions/{session.pk}/").json()["last_run_id"] == retry
    users = Message.objects.filter(session=session, role="user")
    assert list(users.values_list("content", flat=True)) == ["What is durable?"]
    sent = fake_llm.requests[-1].messages
    assert sent == [{"role": "user", "content": "What is durable?"}]


def test_the_answer_retried_is_kept_but_not_sent(api, session, fake_llm, live_worker):
    long = "A partial answer that is cut. " * 4
    fake_llm.push(*[Reply(text=long, cut_after_chars=20) for _ in range(4)])
    first = start(api, session, {"content": "Tell me"})
    assert ended(first).status == Run.Status.FAILED
    kept = list(Message.objects.filter(run_id=first, role="assistant"))
    assert kept  # the partials stay in the transcript

    fake_llm.push(Reply(text="Complete answer."))
    retry = start(api, session, {"retry_of": first})
    assert ended(retry).status == Run.Status.COMPLETED
    assert fake_llm.requests[-1].messages == [{"role": "user", "content": "Tell me"}]

    # The next question carries the retried question with its newest answer only.
    fake_llm.push(Reply(text="Sure."))
    assert ended(start(api, session, {"content": "And then?"})).is_terminal
    assert fake_llm.requests[-1].messages == [
        {"role": "user", "content": "Tell me"},
        {"role": "assistant", "content": "Complete answer."},
        {"role": "user", "content": "And then?"},
    ]


def test_retry_of_a_run_not_the_latest_or_not_here_is_refused(
    api, session, alice, fake_llm, live_worker
):
    fake_llm.push(Reply(text="One."), Reply(text="Two."))
    first = start(api, session, {"content": "one"})
    ended(first)
    second = start(api, session, {"content": "two"})
    ended(second)
    other = ChatSession.objects.create(owner=alice[0], title="other")
    runs_before = Run.objects.count()

    older = api.post(runs_url(session), data={"retry_of": first}, format="json")
    assert older.status_code == 409 and second in older.json()["error"]
    elsewhere = api.post(runs_url(other), data={"retry_of": second}, format="json")
    assert elsewhere.status_code == 400
    assert "not a run of this session" in elsewhere.json()["error"]
    assert Run.objects.count() == runs_before
    assert Message.objects.filter(role="user").count() == 2


def test_retry_of_a_run_still_active_is_409(api, session, fake_llm, live_worker):
    fake_llm.push(Reply(text="Slow and long " * 10, stall_after_chars=5))
    run_id = start(api, session, {"content": "stall"})
    response = api.post(runs_url(session), data={"retry_of": run_id}, format="json")
    assert response.status_code == 409 and response.json()["run_id"] == run_id
    api.post(f"/api/runs/{run_id}/cancel/")
    ended(run_id)


@pytest.mark.parametrize(
    "body", [{"content": "hi", "retry_of": "run_x"}, {"model": ""}]
)
def test_content_or_retry_of_exactly_one(api, session, body):
    response = api.post(runs_url(session), data=body, format="json")
    assert response.status_code == 400
    assert "either `content` or `retry_of`" in str(response.json())
    assert not Run.objects.exists() and not Message.objects.exists()
