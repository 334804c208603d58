"""File bytes are stored once and bounded per user (issue 42, item 4).

An edit used to copy every file of the edited question (24.5 MiB stored per
~40-byte request) and nothing bounded what one user stored. Now a file is
stored once per owner (`chat.models.StoredFile`), referenced by every
message that keeps it; `HERMES_USER_MAX_STORED_BYTES` bounds each user's
bytes (413 naming it), `GET /api/attachments/` answers the usage line, and
deleting the chats that keep a file frees it.
"""

import base64
import json

import pytest

from chat.attachments import file_bytes
from chat.models import Attachment, ChatSession, Message, StoredFile
from chat.tests.test_attachments import send, uploaded
from chat.transfer import session_export
from journal.models import Run

MIB = 1024 * 1024
FILE = b"x" * MIB


def usage(api) -> dict:
    response = api.get("/api/attachments/")
    assert response.status_code == 200
    return response.json()


@pytest.mark.slow
def test_edits_keep_one_copy_of_the_files(api, session, settings):
    pk = uploaded(api, "big.txt", FILE)
    assert send(api, session, content="v1", attachments=[pk]).status_code == 201
    for version in range(2, 6):
        Run.objects.update(status=Run.Status.COMPLETED)
        first = Message.objects.filter(role="user").order_by("id").first()
        edit = send(api, session, content=f"v{version}", edit_of=first.pk)
        assert edit.status_code == 201
    assert Attachment.objects.count() == 5  # one per version of the question
    assert StoredFile.objects.count() == 1  # the bytes, once
    assert usage(api) == {
        "used_bytes": MIB,
        "limit_bytes": settings.HERMES["USER_MAX_STORED_BYTES"],
    }


def test_storing_past_the_bound_is_413_naming_it(api, settings):
    settings.HERMES = {**settings.HERMES, "USER_MAX_STORED_BYTES": 2 * MIB}
    uploaded(api, "a.txt", FILE)
    uploaded(api, "b.txt", FILE[:-1] + b"y")
    response = api.post(
        "/api/attachments/",
        {"file": _file("c.txt", b"z" * 10)},
        format="multipart",
    )
    assert response.status_code == 413
    body = response.json()
    assert body["limit"] == "HERMES_USER_MAX_STORED_BYTES"
    assert "2097152 bytes one user may keep" in body["error"]
    # The same bytes again cost nothing: stored already.
    assert uploaded(api, "again.txt", FILE)
    assert StoredFile.objects.count() == 2
    assert usage(api)["used_bytes"] == 2 * MIB


def test_an_import_past_the_bound_is_413_and_keeps_nothing(api, session, settings):
    pk = uploaded(api, "a.txt", FILE)
    send(api, session, content="with a file", attachments=[pk])
    exported = "".join(session_export(session=session))
    settings.HERMES = {**settings.HERMES, "USER_MAX_STORED_BYTES": MIB + 10}
    response = api.post(
        "/api/sessions/import/", data=exported, content_type="application/x-ndjson"
    )
    assert response.status_code == 413
    assert response.json()["limit"] == "HERMES_USER_MAX_STORED_BYTES"
    assert ChatSession.all_objects.count() == 1
    # Within the bound the import's file is the one already stored.
    settings.HERMES = {**settings.HERMES, "USER_MAX_STORED_BYTES": 3 * MIB}
    response = api.post(
        "/api/sessions/import/", data=exported, content_type="application/x-ndjson"
    )
    assert response.status_code == 201, response.json()
    assert StoredFile.objects.count() == 1 and Attachment.objects.count() == 2


def test_deleting_the_chats_frees_their_files(api, session):
    pk = uploaded(api, "a.txt", FILE)
    send(api, session, content="v1", attachments=[pk])
    Run.objects.update(status=Run.Status.COMPLETED)
    question = Message.objects.get(role="user")
    send(api, session, content="v2", edit_of=question.pk)
    Run.objects.update(status=Run.Status.COMPLETED)
    assert usage(api)["used_bytes"] == MIB
    assert api.delete(f"/api/sessions/{session.pk}/").status_code == 204
    assert not Attachment.objects.exists() and not StoredFile.objects.exists()
    assert usage(api)["used_bytes"] == 0


def test_a_file_stored_before_sharing_counts_and_is_shared_on_edit(api, session, alice):
    question = Message.objects.create(session=session, role="user", content="old")
    Attachment.objects.create(
        owner=alice[0],
        message=question,
        name="old.txt",
        kind="text",
        mime="text/plain; charset=utf-8",
        size=3,
        data=b"old",
    )
    assert usage(api)["used_bytes"] == 3
    assert send(api, session, content="new", edit_of=question.pk).status_code == 201
    files = list(Attachment.objects.order_by("id"))
    assert [file_bytes(f) for f in files] == [b"old", b"old"]
    assert files[0].stored_id == files[1].stored_id is not None
    assert usage(api)["used_bytes"] == 3
    # And the export still carries the bytes.
    lines = [json.loads(line) for line in session_export(session=session)][1:]
    assert base64.b64decode(lines[0]["attachments"][0]["data"]) == b"old"


@pytest.mark.slow
def test_others_files_do_not_count(api, bob, session):
    from rest_framework.test import APIClient

    uploaded(api, "a.txt", FILE)
    client = APIClient()
    client.force_authenticate(bob[0])
    assert usage(client)["used_bytes"] == 0
    uploaded(client, "a.txt", FILE)  # the same bytes: bob's own copy
    assert StoredFile.objects.count() == 2


def _file(name: str, data: bytes):
    from django.core.files.uploadedfile import SimpleUploadedFile

    return SimpleUploadedFile(name, data, content_type="text/plain")


@pytest.fixture(autouse=True)
def _large_text_files(settings):
    """A 1 MiB text file is taken (its characters are bounded too)."""
    settings.HERMES = {**settings.HERMES, "MAX_MESSAGE_CHARS": 2 * MIB}


def test_the_account_page_shows_what_is_stored_and_the_bound(
    api, alice, client, settings
):
    settings.HERMES = {**settings.HERMES, "USER_MAX_STORED_BYTES": 2 * MIB}
    client.force_login(alice[0])
    page = client.get("/accounts/").content.decode()
    assert "0\xa0bytes of 2.0\xa0MB used" in page
    uploaded(api, "a.txt", FILE)
    uploaded(api, "b.txt", FILE[:-1] + b"y")
    page = client.get("/accounts/").content.decode()
    assert "2.0\xa0MB of 2.0\xa0MB used" in page and "the limit is reached" in page
