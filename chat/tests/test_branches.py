"""Branches over the live server: regenerate and edit keep earlier versions,
the page can switch between them, and the model is sent the active branch only
(the loopback model records every request it gets)."""

import httpx
import pytest

from chat.models import ChatSession, Message
from chat.transfer import session_export, session_import
from chat.tree import Tree
from hermes_testing.fake_llm import Reply
from hermes_testing.harness import wait_until
from journal.models import Run


@pytest.fixture
def api(server, alice):
    with httpx.Client(base_url=server.url, headers=alice[1], timeout=30) as client:
        yield client


@pytest.fixture
def session(alice):
    return ChatSession.objects.create(owner=alice[0], title="branches")


def _run(api, session, body: dict, reply: str, fake_llm) -> str:
    """Start a run answered `reply` and wait for it to complete."""
    fake_llm.push(Reply(text=reply))
    response = api.post(f"/api/sessions/{session.pk}/runs/", json=body)
    assert response.status_code == 201, response.text
    run_id = response.json()["run_id"]
    wait_until(lambda: Run.objects.get(pk=run_id).is_terminal, timeout=30)
    assert Run.objects.get(pk=run_id).status == Run.Status.COMPLETED
    return run_id


def _sent(fake_llm) -> list[tuple[str, str]]:
    """What the model was sent last, as (role, content)."""
    return [(m["role"], m["content"]) for m in fake_llm.requests[-1].messages]


def _listing(api, session, branch: str = "all") -> list[dict]:
    response = api.get(f"/api/sessions/{session.pk}/messages/?branch={branch}")
    assert response.status_code == 200, response.text
    return response.json()["results"]


def _user(session, content: str) -> Message:
    return Message.objects.get(session=session, role="user", content=content)


def test_regenerate_is_a_sibling_answer_and_only_the_active_one_is_sent(
    api, session, fake_llm, live_worker
):
    _run(api, session, {"content": "Q1"}, "A1", fake_llm)
    question = _user(session, "Q1")
    _run(api, session, {"regenerate": question.pk}, "A1 again", fake_llm)
    assert _sent(fake_llm) == [("user", "Q1")]  # neither the old answer nor Q1 twice
    assert Message.objects.filter(session=session, role="user").count() == 1

    listed = {m["content"]: m for m in _listing(api, session)}
    assert (listed["A1"]["sibling_index"], listed["A1"]["siblings"]) == (1, 2)
    assert (listed["A1 again"]["sibling_index"], listed["A1 again"]["siblings"]) == (
        2,
        2,
    )
    assert listed["A1 again"]["parent"] == listed["A1"]["parent"] == question.pk
    assert not listed["A1"]["active"] and listed["A1 again"]["active"]
    active = [m["content"] for m in _listing(api, session, "active")]
    assert active == ["Q1", "A1 again"]

    _run(api, session, {"content": "Q2"}, "A2", fake_llm)
    assert _sent(fake_llm) == [
        ("user", "Q1"),
        ("assistant", "A1 again"),
        ("user", "Q2"),
    ]

    # Back to the first answer: the next question follows it, not the other.
    first = listed["A1"]["id"]
    response = api.post(f"/api/sessions/{session.pk}/messages/{first}/select/")
    assert response.status_code == 200, response.text
    assert response.json()["active"] == [question.pk, first]
    _run(api, session, {"content": "Q3"}, "A3", fake_llm)
    assert _sent(fake_llm) == [("user", "Q1"), ("assistant", "A1"), ("user", "Q3")]
    active = [m["content"] for m in _listing(api, session, "active")]
    assert active == ["Q1", "A1", "Q3", "A3"]
    # Every version is kept.
    assert {m["content"] for m in _listing(api, session)} == {
        "Q1",
        "A1",
        "A1 again",
        "Q2",
        "A2",
        "Q3",
        "A3",
    }


def test_edit_is_a_sibling_question_and_the_old_one_is_kept(
    api, session, fake_llm, live_worker
):
    _run(api, session, {"content": "Q1"}, "A1", fake_llm)
    _run(api, session, {"content": "Q2 with a typo"}, "A2", fake_llm)
    typo = _user(session, "Q2 with a typo")
    _run(api, session, {"content": "Q2", "edit_of": typo.pk}, "A2 edited", fake_llm)
    assert _sent(fake_llm) == [("user", "Q1"), ("assistant", "A1"), ("user", "Q2")]
    listed = {m["content"]: m for m in _listing(api, session)}
    assert listed["Q2"]["parent"] == listed["Q2 with a typo"]["parent"]
    assert (listed["Q2"]["sibling_index"], listed["Q2"]["siblings"]) == (2, 2)
    assert [m["content"] for m in _listing(api, session, "active")] == [
        "Q1",
        "A1",
        "Q2",
        "A2 edited",
    ]
    # The old question's branch comes back whole, answer included.
    api.post(f"/api/sessions/{session.pk}/messages/{typo.pk}/select/")
    assert [m["content"] for m in _listing(api, session, "active")] == [
        "Q1",
        "A1",
        "Q2 with a typo",
        "A2",
    ]


def test_the_first_message_can_be_edited(api, session, fake_llm, live_worker):
    _run(api, session, {"content": "first"}, "A", fake_llm)
    first = _user(session, "first")
    _run(api, session, {"content": "first, edited", "edit_of": first.pk}, "B", fake_llm)
    assert _sent(fake_llm) == [("user", "first, edited")]
    listed = {m["content"]: m for m in _listing(api, session)}
    assert listed["first, edited"]["parent"] is None
    assert listed["first, edited"]["siblings"] == 2


@pytest.mark.parametrize(
    "body,needle",
    [
        ({"regenerate": "ANSWER"}, "not a user message"),
        ({"content": "x", "edit_of": "ANSWER"}, "not a user message"),
        ({"regenerate": "OTHER"}, "not a user message"),
        ({"regenerate": 10**12}, "not a user message"),
        ({"regenerate": "abc"}, "integer"),
        ({"regenerate": 10**30}, "less than or equal"),
        ({"edit_of": "QUESTION"}, "needs `content`"),
        ({"regenerate": "QUESTION", "content": "x"}, "one of them"),
    ],
)
def test_bad_branch_input_is_400_and_changes_nothing(
    api, session, alice, fake_llm, live_worker, body, needle
):
    _run(api, session, {"content": "Q"}, "A", fake_llm)
    other = ChatSession.objects.create(owner=alice[0], title="other")
    elsewhere = Message.objects.create(session=other, role="user", content="there")
    ids = {
        "QUESTION": _user(session, "Q").pk,
        "ANSWER": Message.objects.get(session=session, role="assistant").pk,
        "OTHER": elsewhere.pk,
    }
    body = {k: ids.get(v, v) if isinstance(v, str) else v for k, v in body.items()}
    before = (Run.objects.count(), Message.objects.count())
    response = api.post(f"/api/sessions/{session.pk}/runs/", json=body)
    assert response.status_code == 400, response.text
    assert needle in response.text
    assert (Run.objects.count(), Message.objects.count()) == before


def test_select_checks_ownership_and_input(api, server, session, bob):
    mine = Message.objects.create(session=session, role="user", content="mine")
    base = f"/api/sessions/{session.pk}/messages"
    with httpx.Client(base_url=server.url, headers=bob[1], timeout=30) as theirs:
        assert theirs.post(f"{base}/{mine.pk}/select/").status_code == 404
    other = ChatSession.objects.create(owner=session.owner, title="other")
    stray = Message.objects.create(session=other, role="user", content="stray")
    assert api.post(f"{base}/{stray.pk}/select/").status_code == 404
    assert api.post(f"{base}/nope/select/").status_code == 404
    assert api.post(f"{base}/{10**30}/select/").status_code == 404
    response = api.get(f"{base}/?branch=some")
    assert response.status_code == 400 and "branch" in response.text


def test_export_and_import_keep_the_branches_exactly(api, session, alice):
    def add(content, role="user", parent=None):
        return Message.objects.create(
            session=session, role=role, content=content, parent=parent
        )

    q = add("Q")
    a1 = add("A1", "assistant", q)
    a2 = add("A2", "assistant", q)
    q2 = add("Q2", parent=a2)
    add("Q2 edited", parent=a2)
    add("A3", "assistant", q2)
    first_edit = add("Q edited")  # a second first message
    api.post(f"/api/sessions/{session.pk}/messages/{a1.pk}/select/")
    api.post(f"/api/sessions/{session.pk}/messages/{q2.pk}/select/")

    copy, count = session_import(owner=alice[0], lines=session_export(session=session))
    assert count == 7

    def shape(s):
        tree = Tree.of_session(s.pk)
        rows = list(s.messages.order_by("id"))
        position = {m.pk: i for i, m in enumerate(rows)}
        return (
            [(m.role, m.content, position.get(m.parent_id)) for m in rows],
            [position[pk] for pk in tree.active_path()],
        )

    assert shape(copy) == shape(session)
    assert shape(copy)[1] == [0, 2, 3, 5]  # Q, A2, Q2, A3: selected last
    assert first_edit.parent_id is None


def test_an_export_without_parents_imports_as_one_chain(alice):
    lines = [
        '{"type":"session","format":"hermes-session","version":1,"title":"t"}',
        '{"type":"message","role":"user","content":"one"}',
        '{"type":"message","role":"assistant","content":"two"}',
        '{"type":"message","role":"user","content":"three"}',
    ]
    session, count = session_import(owner=alice[0], lines=lines)
    rows = list(session.messages.order_by("id"))
    assert [m.parent_id for m in rows] == [None, rows[0].pk, rows[1].pk]
    assert Tree.of_session(session.pk).active_path() == [m.pk for m in rows]


def test_while_a_regenerated_answer_runs_the_older_one_is_not_on_the_branch(
    api, session, fake_llm, live_worker
):
    _run(api, session, {"content": "Q"}, "old answer", fake_llm)
    question = _user(session, "Q")
    fake_llm.push(Reply(text="never shown", stall_after_chars=0))
    response = api.post(
        f"/api/sessions/{session.pk}/runs/", json={"regenerate": question.pk}
    )
    assert response.status_code == 201, response.text
    run_id = response.json()["run_id"]
    wait_until(lambda: Run.objects.get(pk=run_id).status == Run.Status.RUNNING)
    assert [m["content"] for m in _listing(api, session, "active")] == ["Q"]
    assert api.post(f"/api/runs/{run_id}/cancel/").status_code == 202
    wait_until(lambda: Run.objects.get(pk=run_id).is_terminal, timeout=30)
    # It ended with nothing to keep: the older answer is the branch again.
    assert [m["content"] for m in _listing(api, session, "active")] == [
        "Q",
        "old answer",
    ]
