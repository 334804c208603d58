"""Pinned chats and who named a chat (`PATCH /api/sessions/<id>/`)."""

import pytest
from rest_framework.test import APIClient

from chat.models import ChatSession

pytestmark = pytest.mark.django_db(transaction=True)


def titles(api) -> list[tuple[str, bool]]:
    return [(s["title"], s["pinned"]) for s in api.get("/api/sessions/").json()]


def test_pinned_chats_list_first_and_pinning_is_not_activity(api, alice):
    old = ChatSession.objects.create(owner=alice[0], title="old")
    ChatSession.objects.create(owner=alice[0], title="new")
    before = ChatSession.objects.get(pk=old.pk).updated_at
    assert titles(api) == [("new", False), ("old", False)]
    response = api.patch(f"/api/sessions/{old.pk}/", {"pinned": True}, format="json")
    assert response.status_code == 200 and response.json()["pinned"] is True
    assert titles(api) == [("old", True), ("new", False)]
    # Pinning leaves the chat's date (and its date group) as it was.
    assert ChatSession.objects.get(pk=old.pk).updated_at == before
    api.patch(f"/api/sessions/{old.pk}/", {"pinned": False}, format="json")
    assert titles(api) == [("new", False), ("old", False)]


def test_pin_needs_the_owner(alice, bob):
    session = ChatSession.objects.create(owner=alice[0], title="mine")
    other = APIClient()
    other.force_authenticate(bob[0])
    url = f"/api/sessions/{session.pk}/"
    assert other.patch(url, {"pinned": True}, format="json").status_code == 404
    assert ChatSession.objects.get(pk=session.pk).pinned is False


def test_a_title_given_by_the_user_is_marked_theirs(api, alice):
    created = api.post("/api/sessions/", {}, format="json").json()
    assert ChatSession.objects.get(pk=created["id"]).title_by_user is False
    api.patch(f"/api/sessions/{created['id']}/", {"title": "Mine"}, format="json")
    assert ChatSession.objects.get(pk=created["id"]).title_by_user is True
    named = api.post("/api/sessions/", {"title": "Named"}, format="json").json()
    assert ChatSession.objects.get(pk=named["id"]).title_by_user is True
    assert api.post("/api/sessions/", {"pinned": True}, format="json").json()["pinned"]
