"""Idempotency-Key is bound to user, session and body, over a real socket.

A retry of the same request gets the same run; the same key on a different
message (or another session) answers 422 and changes nothing; an over-long
key answers 400 instead of being silently cut.
"""

import httpx
import pytest

from chat.models import ChatSession, Message
from journal.models import Run


@pytest.fixture
def post_run(server):
    def post(headers, session_id, content, key=None, **extra):
        return httpx.post(
            f"{server.url}/api/sessions/{session_id}/runs/",
            json={"content": content, **extra},
            headers={**headers, **({"Idempotency-Key": key} if key else {})},
        )

    return post


def test_a_retry_of_the_same_request_gets_the_same_run(alice, post_run):
    session = ChatSession.objects.create(owner=alice[0])
    first = post_run(alice[1], session.pk, "hello", "k-1")
    again = post_run(alice[1], session.pk, "hello", "k-1")
    assert first.status_code == 201 and again.status_code == 200
    assert again.json()["run_id"] == first.json()["run_id"]
    assert Run.objects.count() == 1 and Message.objects.count() == 1


def test_same_key_with_another_message_is_422(alice, post_run):
    session = ChatSession.objects.create(owner=alice[0])
    first = post_run(alice[1], session.pk, "hello", "k-1")
    assert first.status_code == 201
    Run.objects.update(status=Run.Status.COMPLETED)  # no 409 in the way
    for content, extra in [("something else", {}), ("hello", {"model": "demo"})]:
        response = post_run(alice[1], session.pk, content, "k-1", **extra)
        assert response.status_code == 422, response.text
        assert "Idempotency-Key" in response.json()["error"]
    assert Run.objects.count() == 1
    assert list(Message.objects.values_list("content", flat=True)) == ["hello"]


def test_same_key_and_body_in_another_session_is_422(alice, post_run):
    one = ChatSession.objects.create(owner=alice[0])
    two = ChatSession.objects.create(owner=alice[0])
    assert post_run(alice[1], one.pk, "hello", "k-1").status_code == 201
    response = post_run(alice[1], two.pk, "hello", "k-1")
    assert response.status_code == 422
    assert not two.messages.exists() and Run.objects.count() == 1


def test_keys_are_per_user(alice, bob, post_run):
    mine = ChatSession.objects.create(owner=alice[0])
    theirs = ChatSession.objects.create(owner=bob[0])
    a = post_run(alice[1], mine.pk, "hello", "shared-key")
    b = post_run(bob[1], theirs.pk, "hello", "shared-key")
    assert a.status_code == b.status_code == 201
    assert a.json()["run_id"] != b.json()["run_id"]


def test_over_long_keys_are_400_not_cut(alice, post_run):
    session = ChatSession.objects.create(owner=alice[0])
    long_key = "k" * 201
    response = post_run(alice[1], session.pk, "hello", long_key)
    assert response.status_code == 400
    assert "Idempotency-Key" in response.text and "200" in response.text
    assert not Run.objects.exists() and not Message.objects.exists()
    # The 200-character prefix it would have been cut to is a different key.
    assert post_run(alice[1], session.pk, "hello", "k" * 200).status_code == 201
