"""Search across message text (`chat.search`, `GET /api/search/`): FTS5 on
SQLite, full-text search on PostgreSQL (`DATABASE_URL`); the same promises on
both."""

import pytest
from django.db import connection
from rest_framework.test import APIClient

from chat.models import ChatSession, Message
from chat.search import fts_repair, message_search

pytestmark = pytest.mark.django_db(transaction=True)


def chat(owner, title: str, *texts: str, archived: bool = False) -> ChatSession:
    session = ChatSession.objects.create(owner=owner, title=title, archived=archived)
    for i, text in enumerate(texts):
        role = Message.Role.USER if i % 2 == 0 else Message.Role.ASSISTANT
        Message.objects.create(session=session, role=role, content=text)
    return session


def found(api, query: str, **params) -> list[dict]:
    response = api.get("/api/search/", {"q": query, **params})
    assert response.status_code == 200, response.content
    return response.json()["results"]


def test_finds_words_in_message_text_not_only_titles(api, alice):
    owner = alice[0]
    cooking = chat(owner, "Dinner", "How long do I boil an egg?", "About 7 minutes.")
    chat(owner, "Trip", "Trains to Lyon?", "Every hour from Paris.")
    hits = found(api, "boil egg")
    assert [(h["session_id"], h["session_title"], h["role"]) for h in hits] == [
        (cooking.pk, "Dinner", "user")
    ]
    message = cooking.messages.get(role="user")
    assert hits[0]["message_id"] == message.pk
    assert hits[0]["snippet"] == (
        "How long do I <mark>boil</mark> an <mark>egg</mark>?"
    )
    # Every word is required; the last one may be the start of a word.
    assert found(api, "boil train") == []
    assert [h["session_title"] for h in found(api, "pari")] == ["Trip"]
    assert [h["role"] for h in found(api, "minutes")] == ["assistant"]


@pytest.mark.slow
def test_a_very_long_answer_is_saved_and_found_by_its_beginning(api, alice):
    """PostgreSQL refuses a tsvector past 1 MiB: indexing a whole 3 MiB answer
    of distinct words refused the answer itself."""
    words = " ".join(f"w{i}" for i in range(400_000))
    session = chat(alice[0], "Long", "write a lot", f"aardvark {words} zebra")
    assert len(session.messages.get(role="assistant").content) > 3_000_000
    assert [h["session_title"] for h in found(api, "aardvark")] == ["Long"]


@pytest.mark.slow
def test_only_own_unarchived_sessions_and_conversation_text(api, alice, bob):
    owner = alice[0]
    mine = chat(owner, "Mine", "the secret word is walrus")
    chat(owner, "Shelved", "walrus again", archived=True)
    chat(bob[0], "Bob's", "walrus of bob")
    Message.objects.create(session=mine, role=Message.Role.TOOL, content="walrus tool")
    Message.objects.create(session=mine, role=Message.Role.SYSTEM, content="walrus")
    hits = found(api, "walrus")
    assert [(h["session_title"], h["role"]) for h in hits] == [("Mine", "user")]
    bob_client = APIClient()
    bob_client.force_authenticate(bob[0])
    assert [h["session_title"] for h in found(bob_client, "walrus")] == ["Bob's"]


def test_snippets_are_escaped_and_marked_only(api, alice):
    chat(
        alice[0],
        "Html",
        'Use <script>alert("x")</script> & <b>bold</b> markup, said the walrus',
    )
    (hit,) = found(api, "script")
    snippet = hit["snippet"]
    assert "<script>" not in snippet and "<b>" not in snippet
    assert "&lt;<mark>script</mark>&gt;" in snippet
    assert "&amp;" in snippet and "&lt;b&gt;bold&lt;/b&gt;" in snippet
    stripped = snippet.replace("<mark>", "").replace("</mark>", "")
    assert "<" not in stripped and ">" not in stripped


def test_query_syntax_is_plain_words(api, alice):
    chat(alice[0], "Ops", "NEAR the AND gate, OR not: a ^column* \"quoted\" 'x'")
    for query in ['"', "'", "*", "AND", "a OR", "NEAR(", "col:umn", "\\", "&|!", "()"]:
        response = api.get("/api/search/", {"q": query})
        assert response.status_code == 200, (query, response.content)
    assert len(found(api, "and gate")) == 1
    assert len(found(api, '"quoted')) == 1
    assert found(api, "   ") == [] and found(api, "") == []


@pytest.mark.slow
def test_edits_and_deletes_are_seen(api, alice):
    session = chat(alice[0], "Edits", "first draft about otters")
    message = session.messages.get()
    message.content = "second draft about beavers"
    message.save()
    assert found(api, "otters") == []
    assert [h["message_id"] for h in found(api, "beavers")] == [message.pk]
    message.delete()
    assert found(api, "beavers") == []
    chat(alice[0], "Gone", "penguins here").delete()
    assert found(api, "penguins") == []


def test_pages_newest_first(api, alice):
    session = chat(alice[0], "Many", *[f"numbered note {i}" for i in range(25)])
    ids = list(session.messages.order_by("-id").values_list("id", flat=True))
    first = api.get("/api/search/", {"q": "note"}).json()
    assert [h["message_id"] for h in first["results"]] == ids[:20]
    assert first["page"] == 1 and first["next"].endswith("q=note&page=2")
    second = api.get(first["next"]).json()
    assert [h["message_id"] for h in second["results"]] == ids[20:]
    assert second["next"] is None


def test_bad_input_is_a_400_naming_it(api, alice):
    for page in ["0", "-1", "x", "51", "1.5"]:
        response = api.get("/api/search/", {"q": "a", "page": page})
        assert response.status_code == 400
        assert "page" in response.json()["error"]
    response = api.get("/api/search/", {"q": "a" * 201})
    assert response.status_code == 400 and "`q`" in response.json()["error"]


def test_needs_login(alice):
    assert APIClient().get("/api/search/", {"q": "a"}).status_code in (401, 403)


def test_selector_reads_unicode_words(alice):
    chat(alice[0], "Café", "Un café crème à Zürich", "日本語 text")
    assert [
        h.session_title for h in message_search(user=alice[0], query="zürich", limit=5)
    ] == ["Café"]
    assert len(message_search(user=alice[0], query="CAFÉ Crème", limit=5)) == 1


@pytest.mark.skipif(
    connection.vendor != "sqlite", reason="the FTS triggers exist on SQLite only"
)
def test_lost_triggers_come_back_after_migrate(alice):
    """A migration that remakes chat_message on SQLite drops the triggers."""
    session = chat(alice[0], "Repair", "before the remake")
    with connection.cursor() as cursor:
        for name in ("chat_message_fts_ai", "chat_message_fts_au"):
            cursor.execute(f"DROP TRIGGER {name}")
    Message.objects.create(session=session, role="user", content="during the gap")
    fts_repair(using="default")
    owner = alice[0]
    assert len(message_search(user=owner, query="gap", limit=5)) == 1
    Message.objects.create(session=session, role="user", content="after the gap")
    assert len(message_search(user=owner, query="gap", limit=5)) == 2
