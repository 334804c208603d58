"""An import costs others what any request does (issue 42, items 1 and 5).

The file is checked whole before anything is written, then written in short
transactions into a session hidden until its last chunk commits: another
user's write goes through between two chunks, a refused line late in the
file leaves nothing, a chunk that fails removes what was written, and the
hidden session is no one's to see. Bad input answers 400 naming the problem
(the API's own bounds), never a 500.
"""

import json
import threading

import pytest
from django.db import connection
from rest_framework.test import APIClient

from chat import transfer
from chat.models import ChatSession, Message
from chat.services import session_create

NDJSON = "application/x-ndjson"
IMPORT = "/api/sessions/import/"
HEAD = {"type": "session", "format": "hermes-session", "version": 1, "title": "big"}
WAIT_S = 60  # a bound on a condition that holds at once, not a pause


def lines(count: int, **extra) -> list[dict]:
    """A header and `count` small messages, a chain of questions and answers."""
    roles = ("user", "assistant")
    return [
        {**HEAD, **extra},
        *(
            {"type": "message", "role": roles[i % 2], "content": f"message {i}"}
            for i in range(count)
        ),
    ]


def body(objs: list[dict]) -> str:
    return "\n".join(json.dumps(obj) for obj in objs) + "\n"


def post(client, text: str | bytes):
    return client.post(IMPORT, data=text, content_type=NDJSON)


def nothing_kept():
    assert not ChatSession.all_objects.exists()
    assert not Message.objects.exists()


@pytest.fixture
def chunks_seen(monkeypatch):
    """Counts the import's write transactions (`transfer._write_chunk`)."""
    seen = []
    real = transfer._write_chunk

    def counted(*args, **kwargs):
        real(*args, **kwargs)
        seen.append(len(args[2]))

    monkeypatch.setattr(transfer, "_write_chunk", counted)
    return seen


def test_another_users_write_goes_through_between_two_chunks(
    api, alice, bob, monkeypatch
):
    """While the import is paused after its first chunk, a write through
    another connection commits: the import holds no lock between chunks (on
    SQLite one transaction for the whole file held the write lock for all of
    it). Meanwhile the import is invisible to its own owner's API."""
    count = transfer.CHUNK * 2 + 7
    real = transfer._write_chunk
    written: list[int] = []
    seen_meanwhile: dict = {}

    def other_users_write(done: threading.Event, outcome: list) -> None:
        try:
            session = session_create(owner=bob[0], title="bob's")
            Message.objects.create(session=session, role="user", content="hello")
            outcome.append(session.pk)
        except Exception as exc:  # the failure is the test's answer
            outcome.append(exc)
        finally:
            connection.close()
            done.set()

    def paused_after_first(owner, session_id, chunk, ids):
        real(owner, session_id, chunk, ids)
        written.append(len(chunk))
        if len(written) != 1:
            return
        done, outcome = threading.Event(), []
        writer = threading.Thread(target=other_users_write, args=(done, outcome))
        writer.start()
        assert done.wait(WAIT_S), "another user's write waited on the import"
        writer.join()
        seen_meanwhile["outcome"] = outcome
        seen_meanwhile["hidden"] = ChatSession.all_objects.get(pk=session_id)
        seen_meanwhile["list"] = api.get("/api/sessions/").json()
        seen_meanwhile["detail"] = api.get(f"/api/sessions/{session_id}/").status_code
        seen_meanwhile["messages"] = api.get(
            f"/api/sessions/{session_id}/messages/"
        ).status_code
        seen_meanwhile["search"] = api.get("/api/search/?q=message").json()

    monkeypatch.setattr(transfer, "_write_chunk", paused_after_first)
    response = post(api, body(lines(count)))

    assert response.status_code == 201, response.json()
    assert written == [transfer.CHUNK, transfer.CHUNK, 7]
    (bobs,) = seen_meanwhile["outcome"]
    assert isinstance(bobs, int), bobs  # committed while the import was paused
    hidden = seen_meanwhile["hidden"]
    assert hidden.importing and hidden.owner == alice[0]
    assert seen_meanwhile["list"] == []
    assert seen_meanwhile["detail"] == 404
    assert seen_meanwhile["messages"] == 404
    assert seen_meanwhile["search"]["results"] == []
    # Once the last chunk committed: shown, whole, its chain intact.
    imported = ChatSession.objects.get(pk=response.json()["session"]["id"])
    assert not imported.importing
    assert [s["id"] for s in api.get("/api/sessions/").json()] == [imported.pk]
    chain = list(imported.messages.order_by("id").values_list("id", "parent_id"))
    assert len(chain) == count
    assert [parent for _, parent in chain] == [None] + [pk for pk, _ in chain[:-1]]
    assert api.get("/api/search/?q=message").json()["results"]


def test_a_refused_line_late_in_the_file_writes_nothing(api, chunks_seen):
    objs = lines(transfer.CHUNK * 2 + 3)
    objs.append({"type": "message", "role": "wizard", "content": "x"})
    response = post(api, body(objs))
    number = len(objs)
    assert response.status_code == 400
    assert response.json() == {
        "error": f"line {number}: unknown role 'wizard'",
        "line": number,
    }
    assert chunks_seen == []  # checked whole before the first write
    nothing_kept()


def test_a_chunk_that_fails_removes_what_was_written(alice, monkeypatch):
    real = transfer._write_chunk
    calls = []

    def failing_second(*args):
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("disk full")
        real(*args)

    monkeypatch.setattr(transfer, "_write_chunk", failing_second)
    with pytest.raises(RuntimeError, match="disk full"):
        transfer.session_import(
            owner=alice[0], lines=body(lines(transfer.CHUNK + 1)).splitlines()
        )
    assert len(calls) == 2
    nothing_kept()


def test_a_stale_hidden_import_is_removed_by_the_next(alice, api):
    from datetime import timedelta

    from django.utils import timezone

    left = ChatSession.all_objects.create(owner=alice[0], importing=True, title="x")
    Message.objects.create(session=left, role="user", content="left behind")
    ChatSession.all_objects.filter(pk=left.pk).update(
        created_at=timezone.now() - transfer.STALE_IMPORT - timedelta(minutes=1)
    )
    assert post(api, body(lines(2))).status_code == 201
    assert not ChatSession.all_objects.filter(pk=left.pk).exists()
    assert not Message.objects.filter(content="left behind").exists()


def test_more_messages_than_an_import_may_hold_is_413(api, settings, chunks_seen):
    settings.HERMES = {**settings.HERMES, "IMPORT_MAX_MESSAGES": 3}
    assert post(api, body(lines(3))).status_code == 201
    ChatSession.objects.all().delete()
    response = post(api, body(lines(4)))
    assert response.status_code == 413
    assert response.json() == {
        "error": "line 5: more than 3 messages, the most one import may hold",
        "line": 5,
        "limit": "import_messages",
    }
    assert chunks_seen == [3]  # the first import's only
    nothing_kept()


def test_the_upload_is_read_in_pieces_not_whole(api, monkeypatch):
    """The body is copied in bounded reads to a spooled file; the import
    reads it line by line (no list of every line)."""
    from chat import api_transfer

    reads = []
    real = api_transfer.Upload.read_from.__func__

    def spy(cls, stream, limit):
        real_read = stream.read

        def read(size=-1):
            reads.append(size)
            return real_read(size)

        stream.read = read
        return real(cls, stream, limit)

    monkeypatch.setattr(api_transfer.Upload, "read_from", classmethod(spy))
    text = body(lines(3000))
    assert len(text) > 2 * api_transfer.READ_BYTES
    assert post(api, text).status_code == 201
    assert reads and all(0 < size <= api_transfer.READ_BYTES for size in reads)


MESSAGE = {"type": "message", "role": "user", "content": "hi"}
CALL = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}


def deep(levels: int) -> str:
    return "[" * levels + "]" * levels


@pytest.mark.parametrize(
    ("raw", "needle"),
    [
        # The API's bounds on a session (its serializer).
        (
            body([{**HEAD, "system_prompt": "x" * 1_000_000}]),
            "line 1: 'system_prompt': system prompt is longer than 100000",
        ),
        (body([{**HEAD, "model": "no-such-model"}]), "unknown model 'no-such-model'"),
        (body([{**HEAD, "title": ""}]), "line 1: 'title'"),
        # …and on a message: what the API makes, as long as it takes.
        (
            body([HEAD, {**MESSAGE, "role": "system"}]),
            "line 2: a 'system' message is not imported",
        ),
        (
            body([HEAD, {**MESSAGE, "content": "x" * 100_001}]),
            "line 2: 'content': message is longer than 100000 characters",
        ),
        # Input no database stores, or Python cannot read.
        (
            json.dumps(HEAD) + '\n{"type": "message", "role": "user", '
            '"content": "a\\ud800b"}\n',
            "line 2: 'content' holds a lone surrogate (\\ud800)",
        ),
        (body([HEAD, {**MESSAGE, "content": "a\x00b"}]), "'content' holds a NUL"),
        (
            json.dumps(HEAD) + '\n{"type": "message", "role": "user", "content": '
            f'"x", "steer": {deep(100_000)}}}\n',
            "line 2: invalid JSON (nested too deeply)",
        ),
        (
            json.dumps(HEAD) + '\n{"type": "message", "role": "user", "content": '
            f'"x", "parent": {"9" * 5000}}}\n',
            "line 2: invalid JSON (a number too long)",
        ),
        (
            json.dumps(HEAD) + '\n{"type": "message", "role": "user", "content": '
            '"x", "complete": NaN}\n',
            "NaN is not a JSON number",
        ),
        (
            json.dumps({**HEAD, "version": int("9" * 4000)}) + "\n",
            "unsupported version",
        ),
        # Dates that parse as a shape but are no time.
        (
            body([HEAD, {**MESSAGE, "selected_at": "2024-02-30T10:00:00+00:00"}]),
            "line 2: 'selected_at' must be an ISO date and time",
        ),
        (
            body([HEAD, {**MESSAGE, "selected_at": "0001-01-01T00:00:00+05:00"}]),
            "line 2: 'selected_at' must be an ISO date and time",
        ),
        (body([HEAD, {**MESSAGE, "selected_at": 5}]), "'selected_at' must be"),
        # Tool calls in any shape but Hermes's own.
        (
            body([HEAD, {**MESSAGE, "role": "assistant", "tool_calls": [1]}]),
            "each tool call must be {id, type: 'function'",
        ),
        (
            body(
                [
                    HEAD,
                    {
                        **MESSAGE,
                        "role": "assistant",
                        "tool_calls": [{**CALL, "function": "f"}],
                    },
                ]
            ),
            "each tool call must be",
        ),
        (
            body(
                [
                    HEAD,
                    {
                        **MESSAGE,
                        "role": "assistant",
                        "tool_calls": [
                            {**CALL, "function": {"name": 5, "arguments": "{}"}}
                        ],
                    },
                ]
            ),
            "'tool_calls.function.name' must be str",
        ),
        (
            body([HEAD, {**MESSAGE, "role": "assistant", "tool_calls": {"a": 1}}]),
            "'tool_calls' must be a list",
        ),
        (
            body([HEAD, {**MESSAGE, "tool_calls": [CALL]}]),
            "only an assistant message has tool calls",
        ),
        (
            body([HEAD, {**MESSAGE, "role": "assistant", "tool_calls": [CALL] * 65}]),
            "more than 64 tool calls",
        ),
        (
            body([HEAD, {**MESSAGE, "role": "tool", "tool_call_id": "x" * 121}]),
            "'tool_call_id' is longer than 120",
        ),
        (body([HEAD, {**MESSAGE, "type": {"a": 1}}]), "got type of another kind"),
        (
            body(
                [
                    HEAD,
                    {
                        **MESSAGE,
                        "role": "assistant",
                        "attachments": [{"name": "a.txt", "data": "aGk="}],
                    },
                ]
            ),
            "only a user message has attachments",
        ),
        (b"\xff\xfe{}", "not UTF-8"),
    ],
    ids=lambda value: str(value)[-40:],
)
@pytest.mark.slow
def test_bad_input_is_400_naming_it_and_keeps_nothing(api, raw, needle):
    response = post(api, raw)
    assert response.status_code == 400, response.content[:300]
    assert needle in response.json()["error"]
    nothing_kept()


def test_the_markdown_export_shows_any_stored_tool_call_shape(api, session):
    """Rows stored before imports were checked may hold any JSON."""
    odd = [
        1,
        "call",
        None,
        {"function": "x"},
        {"function": {"name": 5, "arguments": {"a": [1, 2]}}},
        {"name": "by_name", "function": None},
        CALL,
    ]
    Message.objects.create(
        session=session, role="assistant", content="calls", tool_calls=odd
    )
    Message.objects.create(
        session=session, role="assistant", content="not a list", tool_calls={"a": 1}
    )
    for kind in ("markdown", "json"):
        response = api.get(f"/api/sessions/{session.pk}/export/?as={kind}")
        assert response.status_code == 200
        text = b"".join(response).decode()
    markdown = b"".join(
        api.get(f"/api/sessions/{session.pk}/export/?as=markdown")
    ).decode()
    assert "Tool call `by_name`" in markdown
    assert 'Tool call `5`:\n\n```\n{"a": [1, 2]}\n```' in markdown
    assert "Tool call `f`:\n\n```\n{}\n```" in markdown
    assert text  # the JSON export too


@pytest.mark.parametrize("page", ["²", "١", "1²", "-1", "0", "51", "9" * 30, ""])
def test_search_page_that_is_no_ascii_number_is_400(api, page):
    response = api.get("/api/search/", {"q": "hello", "page": page})
    assert response.status_code == 400
    assert "`page` must be a whole number from 1 to 50" in response.json()["error"]


@pytest.mark.slow
def test_an_import_of_another_user_is_not_shown_to_them(api, bob, monkeypatch):
    """A hidden import is no one's: not even reachable by its id for others."""
    client = APIClient()
    client.force_authenticate(bob[0])
    real = transfer._reveal
    looked: dict = {}

    def look_first(session):
        looked["bob"] = client.get(f"/api/sessions/{session.pk}/").status_code
        looked["alice"] = api.get(f"/api/sessions/{session.pk}/").status_code
        real(session)

    monkeypatch.setattr(transfer, "_reveal", look_first)
    response = post(api, body(lines(3)))
    assert response.status_code == 201
    assert looked == {"bob": 404, "alice": 404}
    pk = response.json()["session"]["id"]
    assert api.get(f"/api/sessions/{pk}/").status_code == 200
    assert client.get(f"/api/sessions/{pk}/").status_code == 404


def test_a_session_past_its_message_bound_starts_no_run(api, session, settings):
    """`HERMES_SESSION_MAX_MESSAGES` bounds a chat's messages, however they
    came: a run would add more (429 naming it), an import of more is 413."""
    from journal.models import Run

    settings.HERMES = {**settings.HERMES, "SESSION_MAX_MESSAGES": 2}
    Message.objects.create(session=session, role="user", content="one")
    Message.objects.create(session=session, role="assistant", content="two")
    response = api.post(
        f"/api/sessions/{session.pk}/runs/", {"content": "three"}, format="json"
    )
    assert response.status_code == 429
    assert response.json()["limit"] == "session_messages"
    assert "holds 2 messages, the most one may" in response.json()["error"]
    assert not Run.objects.exists() and session.messages.count() == 2

    refused = post(api, body(lines(3)))
    assert refused.status_code == 413
    assert refused.json()["limit"] == "session_messages"
    assert "more than 2 messages, the most one chat may hold" in refused.json()["error"]
    assert ChatSession.all_objects.count() == 1
