"""Titles generated after a chat's first answer (`chat.titles`): a run of its
own, journaled, never a turn of the transcript; a user's name always wins."""

import json
import threading

import httpx
import pytest

from chat import titles
from chat.models import ChatSession, Message
from chat.providers.base import TITLE_INSTRUCTION
from chat.services import session_update
from chat.titles import clean_title, title_subject
from hermes_testing.api import start_run, stream, text_of
from hermes_testing.fake_llm import Reply
from hermes_testing.harness import running_run, wait_until
from journal.leases import Claim
from journal.models import Event, Run


def _unnamed_session(server, headers: dict) -> int:
    response = httpx.post(f"{server.url}/api/sessions/", json={}, headers=headers)
    assert response.status_code == 201, response.text
    assert response.json()["title"] == "New chat"
    return response.json()["id"]


def _title_run(session_id: int) -> Run:
    return Run.objects.get(subject=title_subject(session_id))


@pytest.mark.slow
def test_first_answer_brings_a_title_run_journaled_and_out_of_the_transcript(
    server, alice, fake_llm, live_worker, titles_on
):
    user, headers = alice
    session_id = _unnamed_session(server, headers)
    fake_llm.push(
        Reply(text="Paris is the capital."), Reply(text='"Capital of France."\n')
    )
    run_id = start_run(server, headers, session_id, "What is the capital of France?")
    assert text_of(stream(server, headers, run_id)) == "Paris is the capital."

    # Named after the question at once, then by the title run.
    wait_until(
        lambda: ChatSession.objects.get(pk=session_id).title == "Capital of France"
    )
    title_run = _title_run(session_id)
    assert title_run.owner_id == user.pk
    assert title_run.status == Run.Status.COMPLETED
    events = list(Event.objects.filter(run=title_run).order_by("seq"))
    assert [e.type for e in events] == ["start", "token", "end"]
    # What the model was asked: the title instruction over the first exchange.
    asked = fake_llm.requests[-1].messages
    assert asked[0] == {"role": "system", "content": TITLE_INSTRUCTION}
    assert "What is the capital of France?" in asked[1]["content"]
    assert "Paris is the capital." in asked[1]["content"]
    assert "tools" not in fake_llm.requests[-1].body
    assert (
        fake_llm.requests[-1].body["max_tokens"] == titles.TITLE_MAX_TOKENS
    )  # bounded

    # Not a turn: the transcript and the session's runs are the chat's only.
    listed = httpx.get(
        f"{server.url}/api/sessions/{session_id}/messages/", headers=headers
    ).json()
    assert [(m["role"], m["run"]) for m in listed["results"]] == [
        ("user", run_id),
        ("assistant", run_id),
    ]
    assert not Message.objects.filter(run=title_run).exists()
    detail = httpx.get(f"{server.url}/api/sessions/{session_id}/", headers=headers)
    assert detail.json()["active_run"] is None

    # A second answer asks for no second title.
    fake_llm.push(Reply(text="About two million."))
    second = start_run(server, headers, session_id, "How many people live there?")
    stream(server, headers, second)
    assert Run.objects.filter(subject=title_subject(session_id)).count() == 1
    assert len(fake_llm.requests) == 3


def test_a_chat_the_user_named_keeps_its_name(
    server, alice, fake_llm, live_worker, titles_on
):
    _, headers = alice
    session_id = _unnamed_session(server, headers)
    renamed = httpx.patch(
        f"{server.url}/api/sessions/{session_id}/",
        json={"title": "My own name"},
        headers=headers,
    )
    assert renamed.status_code == 200
    fake_llm.push(Reply(text="Hello."))
    stream(server, headers, start_run(server, headers, session_id, "hi"))
    assert not Run.objects.filter(subject=title_subject(session_id)).exists()
    assert ChatSession.objects.get(pk=session_id).title == "My own name"
    assert len(fake_llm.requests) == 1


def test_a_rename_before_the_title_run_ends_wins(alice):
    """The title is written with the run's `end`, only over a title nobody
    gave: a rename that landed first is kept, and the run still ends."""
    user = alice[0]
    session = ChatSession.objects.create(owner=user)
    session_update(session=session, title="Renamed first")
    run = running_run(user, subject=title_subject(session.pk))
    end = {"status": Run.Status.COMPLETED, "terminal_state": "completed"}
    events = [("start", {}), ("token", {"text": "Generated"}), ("end", end)]
    titles._finish(Claim(run.pk, 1), session.pk, events, "Generated")
    assert ChatSession.objects.get(pk=session.pk).title == "Renamed first"
    assert Run.objects.get(pk=run.pk).status == Run.Status.COMPLETED
    # Without the rename, the same end names the chat.
    other = ChatSession.objects.create(owner=user)
    run = running_run(user, subject=title_subject(other.pk))
    titles._finish(Claim(run.pk, 1), other.pk, events, "Generated")
    assert ChatSession.objects.get(pk=other.pk).title == "Generated"


def test_a_failed_title_run_leaves_the_chat_named_after_its_first_message(
    server, alice, fake_llm, live_worker, titles_on
):
    _, headers = alice
    session_id = _unnamed_session(server, headers)
    fake_llm.push(Reply(text="Hello."), Reply(status=400))
    stream(server, headers, start_run(server, headers, session_id, "hi"))
    wait_until(lambda: _title_run(session_id).status == Run.Status.FAILED)
    run = _title_run(session_id)
    assert run.terminal_state == "provider-error"
    # Named after its first message, as before the title run.
    assert ChatSession.objects.get(pk=session_id).title == "hi"
    assert Event.objects.filter(run=run).order_by("-seq").first().type == "end"


def test_deleting_the_chat_deletes_its_title_run(
    server, alice, fake_llm, live_worker, titles_on
):
    _, headers = alice
    session_id = _unnamed_session(server, headers)
    fake_llm.push(Reply(text="Hello."), Reply(text="Greeting"))
    stream(server, headers, start_run(server, headers, session_id, "hi"))
    wait_until(lambda: _title_run(session_id).status == Run.Status.COMPLETED)
    httpx.delete(f"{server.url}/api/sessions/{session_id}/", headers=headers)
    assert not Run.objects.filter(subject=title_subject(session_id)).exists()


@pytest.mark.slow
def test_the_demo_model_titles_a_chat_too(
    server, alice, fake_llm, live_worker, titles_on
):
    _, headers = alice
    session_id = _unnamed_session(server, headers)
    response = httpx.post(
        f"{server.url}/api/sessions/{session_id}/runs/",
        json={"content": "Plan a weekend in Lisbon, please", "model": "demo"},
        headers=headers,
    )
    assert response.status_code == 201, response.text
    stream(server, headers, response.json()["run_id"])
    wait_until(lambda: _title_run(session_id).status == Run.Status.COMPLETED)
    assert ChatSession.objects.get(pk=session_id).title == "Plan a weekend in Lisbon"
    assert fake_llm.requests == []  # the demo model needs no server


@pytest.mark.parametrize(
    ("answer", "title"),
    [
        ('"Capital of France."', "Capital of France"),
        ("\n\n**Trip plans**\nmore text", "Trip plans"),
        ("x" * 100, "x" * 59 + "…"),
        ("   ", ""),
        # What a small local model answered instead of a title (issue 41):
        ("Capital of France:", "Capital of France"),
        ("Capital of France:\nParis is its capital.", "Capital of France"),
        ("Here are some ideas:\n- Capital of France", "Capital of France"),
        ("Weekend in Lisbon,", "Weekend in Lisbon"),
        ("## Title: *Weekend in Lisbon*", "Weekend in Lisbon"),
        ("Sure! Here is a title:\n\n“Weekend in Lisbon”", "Weekend in Lisbon"),
        ('The title of this conversation is "Weekend in Lisbon".', "Weekend in Lisbon"),
        ("Title insurance basics", "Title insurance basics"),
        ("I'm sorry, but I cannot help with that.", ""),
        # What SmolLM2-135M answered a title run (llama.cpp's server).
        ('The answer to the question above is "Paris."', ""),
        ("The correct answer is `reversed(xs)` or `x` in Python.", ""),
        ("You can answer that, I'm here to help you with anything!", ""),
        ('A "Paris trip', "A Paris trip"),
        ("Same answer. No additional context added in this instance.", ""),
        ("Dr. Who and U.S. Politics", "Dr. Who and U.S. Politics"),
        (
            "In a day of the sea, calm and gentle /\nthe ocean's secrets",
            "In a day of the sea, calm and gentle",
        ),
        (
            "You can reverse a list in Python using slicing. Here's an example:"
            "\n\n```python\nmy_list = [1, 2, 3]\n```",
            "",
        ),
        ("I cannot write a title for this conversation", ""),
        ("I’m unable to do that", ""),
        # An answer's first line, which used to be cut at 80 characters.
        (
            "The capital of France is Paris, a city known for its art, "
            "its food and the Eiffel Tower.",
            "",
        ),
        # Longer than a sidebar line, short enough for a title: cut on a word.
        (
            "Planning a long weekend in Lisbon with trams, fado and pastries",
            "Planning a long weekend in Lisbon with trams, fado and…",
        ),
    ],
)
def test_clean_title(answer, title):
    assert clean_title(answer) == title
    assert len(title) <= titles.TITLE_MAX_CHARS


@pytest.mark.parametrize(
    ("question", "title"),
    [
        ("What is the capital of France?", "What is the capital of France"),
        ("hi", "hi"),
        (
            "Plan a weekend in Lisbon, please, with trams",
            "Plan a weekend in Lisbon, please",
        ),
        ("", ""),
    ],
)
def test_fallback_title_is_the_first_words_of_the_question(question, title):
    assert titles.fallback_title(question) == title


@pytest.mark.parametrize(
    ("text", "enough"),
    [
        ("Capital of", False),
        ("Capital of France\n", True),
        ("Here is a title:\n", False),  # a lead-in: the title comes next
        ("Some ideas:\n", False),
        ("Capital of France:\n", True),  # a title with a ':' too many
        ("Here is a title:\n\nCapital of France\n", True),
        ("x" * titles.READ_MAX_CHARS, True),
    ],
)
def test_a_title_run_stops_reading_once_a_title_came(text, enough):
    assert titles.title_read_enough(text) is enough


QUESTION = "What is the capital of France?"
FALLBACK = "What is the capital of France"  # its first words


def _titled(server, headers, fake_llm, title_reply: Reply) -> Run:
    """A chat's first exchange, then its title run answered `title_reply`;
    the title run once it ended."""
    session_id = _unnamed_session(server, headers)
    fake_llm.push(Reply(text="Paris is the capital."), title_reply)
    run_id = start_run(server, headers, session_id, QUESTION)
    assert text_of(stream(server, headers, run_id)) == "Paris is the capital."
    wait_until(
        lambda: Run.objects.filter(subject=title_subject(session_id))
        .exclude(status__in=Run.ACTIVE)
        .exists()
    )
    return _title_run(session_id)


def _chat_title(run: Run) -> str:
    return ChatSession.objects.get(pk=int(run.subject.split(":")[1])).title


@pytest.mark.parametrize(
    ("answer", "title"),
    [
        ("Capital of France:", "Capital of France"),
        ("Capital of France,\n", "Capital of France"),
        ("**Title:** “Capital of France.”", "Capital of France"),
        # A first line that used to become an 80-character cut title.
        (
            "The capital of France is Paris, which is also its largest city and "
            "the home of the Eiffel Tower.\nIt has been the capital since 987.",
            FALLBACK,
        ),
        ("I'm sorry, but I can't help with naming this conversation.", FALLBACK),
    ],
)
@pytest.mark.slow
def test_a_models_answer_is_cleaned_or_replaced_by_the_questions_words(
    server, alice, fake_llm, live_worker, titles_on, answer, title
):
    run = _titled(server, alice[1], fake_llm, Reply(text=answer))
    assert run.status == Run.Status.COMPLETED
    assert _chat_title(run) == title
    tokens = Event.objects.filter(run=run, type="token")
    assert [json.loads(e.payload)["text"] for e in tokens] == [title]


def test_an_empty_title_completes_the_run_named_after_the_question(
    server, alice, fake_llm, live_worker, titles_on
):
    run = _titled(server, alice[1], fake_llm, Reply(text=""))
    assert (run.status, run.terminal_state) == (Run.Status.COMPLETED, "completed")
    assert _chat_title(run) == FALLBACK
    (status,) = Event.objects.filter(run=run, type="status")
    assert "empty" in json.loads(status.payload)["message"]


def test_a_title_run_stops_reading_a_long_answer(
    server, alice, fake_llm, live_worker, titles_on
):
    """A 1,215-character "title" (an answer, no line break early on): the
    run reads a title's worth and closes the stream, without waiting for the
    rest (which would never come: the server holds it back)."""
    answer = ("Paris is the capital of France and its largest city. " * 23)[:1215]
    held = threading.Event()
    reply = Reply(text=answer, chunk_chars=4, hold_after_chunks=120, hold=held)
    try:
        run = _titled(server, alice[1], fake_llm, reply)
        assert run.status == Run.Status.COMPLETED
        assert _chat_title(run) == FALLBACK
        # It hung up while the rest was still held back.
        wait_until(lambda: fake_llm.requests[-1].closed_by == "client")
        assert not held.is_set()
    finally:
        held.set()


@pytest.mark.slow
def test_a_slow_title_run_gives_up_and_names_the_chat_after_the_question(
    server, alice, fake_llm, live_worker, titles_on, monkeypatch
):
    monkeypatch.setattr(titles, "TIME_LIMIT_S", 1.0)
    held = threading.Event()
    reply = Reply(text="Capital of France", hold_after_chunks=2, hold=held)
    try:
        run = _titled(server, alice[1], fake_llm, reply)
        assert (run.status, run.error_category) == (Run.Status.FAILED, "timeout")
        assert _chat_title(run) == FALLBACK
        wait_until(lambda: fake_llm.requests[-1].closed_by == "client")
    finally:
        held.set()
