"""Attachments (chat.attachments): every limit and type answers a 4xx naming
it, files reach each kind of provider in its own shape (checked on the
loopback fake servers), only their owner reaches them, and they survive an
export and import."""

import base64
import json

import httpx
import pytest
from rest_framework.test import APIClient

from chat.attachments import file_bytes
from chat.models import Attachment, ChatSession, Message
from chat.providers import registry
from chat.transfer import session_export, session_import, session_markdown
from hermes_testing.api import new_session, stream, text_of
from hermes_testing.fake_anthropic import (
    AnthropicReply,
    anthropic_provider,
)
from hermes_testing.fake_responses import responses_provider
from hermes_testing.images import GIF, JPEG, WEBP, png
from journal.models import Run

PNG = png(8, 8)


def named(value):
    """Test ids from the file names only, not the bytes."""
    return value if isinstance(value, str) and "/" not in value else ""


CODE = b'def greet(name):\n    return f"Hello, {name}!"\n'


def put(client, name: str, data: bytes, mime: str = "application/octet-stream"):
    from django.core.files.uploadedfile import SimpleUploadedFile

    return client.post(
        "/api/attachments/",
        {"file": SimpleUploadedFile(name, data, content_type=mime)},
        format="multipart",
    )


def uploaded(client, name: str, data: bytes, mime: str = "") -> int:
    response = put(client, name, data, mime or "application/octet-stream")
    assert response.status_code == 201, response.content
    return response.json()["id"]


def send(client, session, **body):
    return client.post(f"/api/sessions/{session.pk}/runs/", body, format="json")


# --- types and limits ------------------------------------------------------------


@pytest.mark.parametrize(
    "name,data,kind,mime",
    [
        ("notes.txt", b"plain words\n", "text", "text/plain; charset=utf-8"),
        ("greet.py", CODE, "text", "text/plain; charset=utf-8"),
        ("Makefile", b"all:\n\techo hi\n", "text", "text/plain; charset=utf-8"),
        ("picture.png", PNG, "image", "image/png"),
        ("photo.jpg", JPEG, "image", "image/jpeg"),
        ("anim.gif", GIF, "image", "image/gif"),
        ("shot.webp", WEBP, "image", "image/webp"),
        # the bytes decide, not the name
        ("mislabelled.txt", PNG, "image", "image/png"),
    ],
    ids=named,
)
def test_text_code_and_images_are_taken(api, name, data, kind, mime):
    response = put(api, name, data)
    assert response.status_code == 201, response.content
    body = response.json()
    assert (body["name"], body["kind"], body["mime"]) == (name, kind, mime)
    assert body["size"] == len(data)
    assert body["url"] == f"/api/attachments/{body['id']}/content/"
    assert Attachment.objects.get(pk=body["id"]).message is None


@pytest.mark.parametrize(
    "name,data,mime,status,needle",
    [
        ("fake.png", b"<html><script>alert(1)</script>", "image/png", 415, "its bytes"),
        ("tool.exe", b"MZ\x90\x00\x03", "application/x-msdownload", 415, "not taken"),
        ("data.bin", b"\x00\x01\x02", "application/octet-stream", 415, "not taken"),
        ("latin1.txt", "café".encode("latin-1"), "text/plain", 415, "not UTF-8"),
        ("nul.txt", b"a\x00b", "text/plain", 415, "not UTF-8"),
        ("empty.txt", b"", "text/plain", 400, "empty"),
    ],
    ids=named,
)
def test_a_type_not_taken_is_refused_by_name(api, name, data, mime, status, needle):
    response = put(api, name, data, mime)
    assert response.status_code == status, response.content
    assert needle in response.json()["error"] and name in response.json()["error"]
    assert not Attachment.objects.exists()


@pytest.mark.slow
def test_a_file_over_the_size_limit_is_413_naming_it(api, settings):
    settings.HERMES = {**settings.HERMES, "ATTACHMENT_MAX_BYTES": 100}
    response = put(api, "big.txt", b"x" * 101, "text/plain")
    assert response.status_code == 413
    assert response.json()["limit"] == "HERMES_ATTACHMENT_MAX_BYTES"
    assert "100 bytes" in response.json()["error"]
    assert put(api, "fits.txt", b"x" * 100, "text/plain").status_code == 201


def test_a_text_file_over_the_message_limit_is_413_naming_it(api, settings):
    settings.HERMES = {**settings.HERMES, "MAX_MESSAGE_CHARS": 10}
    response = put(api, "long.md", "é".encode() * 11)  # 22 bytes, 11 characters
    assert response.status_code == 413
    assert response.json()["limit"] == "HERMES_MAX_MESSAGE_CHARS"


def test_the_text_extensions_are_a_setting(api, settings):
    settings.HERMES = {**settings.HERMES, "ATTACHMENT_TEXT_EXTENSIONS": ["log"]}
    assert put(api, "run.log", b"ok\n").status_code == 201
    refused = put(api, "code.py", CODE)
    assert refused.status_code == 415
    assert refused.json()["limit"] == "HERMES_ATTACHMENT_TEXT_EXTENSIONS"


def test_no_file_field_is_400(api):
    response = api.post("/api/attachments/", {"other": "x"}, format="multipart")
    assert response.status_code == 400 and "`file`" in response.json()["error"]


def test_too_many_files_per_message_is_400_naming_the_limit(api, session, settings):
    settings.HERMES = {**settings.HERMES, "ATTACHMENT_MAX_FILES": 2}
    ids = [uploaded(api, f"f{i}.txt", b"x") for i in range(3)]
    response = send(api, session, content="three", attachments=ids)
    assert response.status_code == 400
    assert response.json()["limit"] == "HERMES_ATTACHMENT_MAX_FILES"
    assert not Run.objects.exists() and not Message.objects.exists()


def test_too_many_uploads_waiting_is_429(api, monkeypatch):
    from chat import attachments

    monkeypatch.setattr(attachments, "PENDING_MAX", 2)
    uploaded(api, "a.txt", b"a")
    uploaded(api, "b.txt", b"b")
    response = put(api, "c.txt", b"c")
    assert response.status_code == 429
    assert response.json()["limit"] == "attachments_pending"


def test_a_name_is_cleaned(api):
    response = put(api, "../../etc/pass\x07wd.txt", b"x")
    assert response.status_code == 201 and response.json()["name"] == "passwd.txt"


# --- sending -------------------------------------------------------------------------


def test_an_image_for_a_model_without_vision_is_refused(api, session, fake_llm):
    image = uploaded(api, "p.png", PNG)
    response = send(
        api, session, content="see", attachments=[image], model="fake-model"
    )
    assert response.status_code == 400
    assert response.json()["limit"] == "vision"
    assert "does not take images" in response.json()["error"]
    assert not Message.objects.exists()
    # Text files go to any model.
    text = uploaded(api, "a.py", CODE)
    assert send(api, session, content="x", attachments=[text]).status_code == 201


def test_the_model_list_says_which_models_take_images(api, fake_llm, settings):
    settings.HERMES = {**settings.HERMES, "VISION_MODELS": ["other-model"]}
    models = {m["id"]: m["vision"] for m in api.get("/api/models/").json()["models"]}
    assert models["fake-model"] is False and models["other-model"] is True
    assert models["demo"] is True


def test_someone_elses_attachment_is_404_everywhere(api, session, bob):
    theirs = APIClient()
    theirs.force_authenticate(bob[0])
    pk = uploaded(theirs, "secret.txt", b"bob's")
    response = send(api, session, content="steal", attachments=[pk])
    assert (
        response.status_code == 404
        and f"no attachment {pk}" in response.json()["error"]
    )
    for url in (f"/api/attachments/{pk}/", f"/api/attachments/{pk}/content/"):
        assert api.get(url).status_code == 404
    assert api.delete(f"/api/attachments/{pk}/").status_code == 404
    for junk in ("abc", "0", "9" * 30, "١"):
        assert api.get(f"/api/attachments/{junk}/").status_code == 404
    assert Attachment.objects.get(pk=pk).message is None


def test_an_attachment_is_sent_once_and_then_stays(api, session):
    pk = uploaded(api, "a.txt", b"once")
    assert send(api, session, content="first", attachments=[pk]).status_code == 201
    Run.objects.update(status=Run.Status.COMPLETED)
    again = send(api, session, content="second", attachments=[pk])
    assert again.status_code == 400 and "already sent" in again.json()["error"]
    assert api.delete(f"/api/attachments/{pk}/").status_code == 409
    assert send(api, session, regenerate=1, attachments=[pk]).status_code == 400


def test_an_upload_not_sent_can_be_removed(api):
    pk = uploaded(api, "a.txt", b"x")
    assert api.delete(f"/api/attachments/{pk}/").status_code == 204
    assert not Attachment.objects.exists()


def test_files_alone_are_a_message_but_nothing_is_not(api, session):
    pk = uploaded(api, "a.txt", b"x")
    response = send(api, session, attachments=[pk])
    assert response.status_code == 201, response.content
    question = Message.objects.get(role="user")
    assert question.content == "" and question.attachments.get().pk == pk
    assert send(api, session, content="  ").status_code == 400


def test_a_retried_send_with_its_key_gets_the_same_run(api, session):
    pk = uploaded(api, "a.txt", b"x")
    headers = {"HTTP_IDEMPOTENCY_KEY": "k1"}
    body = {"content": "hi", "attachments": [pk]}
    url = f"/api/sessions/{session.pk}/runs/"
    first = api.post(url, body, format="json", **headers)
    second = api.post(url, body, format="json", **headers)
    assert (first.status_code, second.status_code) == (201, 200)
    assert first.json()["run_id"] == second.json()["run_id"]


def test_messages_list_their_attachments_and_the_owner_gets_the_bytes(api, session):
    image = uploaded(api, "p.png", PNG)
    text = uploaded(api, "a.py", CODE)
    assert (
        send(api, session, content="look", attachments=[image, text]).status_code == 201
    )
    page = api.get(f"/api/sessions/{session.pk}/messages/").json()
    (files,) = [m["attachments"] for m in page["results"] if m["role"] == "user"]
    assert [(f["name"], f["kind"], f["size"]) for f in files] == [
        ("p.png", "image", len(PNG)),
        ("a.py", "text", len(CODE)),
    ]
    shown = api.get(files[0]["url"])
    assert shown.status_code == 200 and shown.content == PNG
    assert shown["Content-Type"] == "image/png"
    assert shown["X-Content-Type-Options"] == "nosniff"
    assert shown["Content-Security-Policy"] == "default-src 'none'; sandbox"
    assert shown["Content-Disposition"].startswith("inline;")
    code = api.get(files[1]["url"])
    assert code["Content-Type"] == "text/plain; charset=utf-8"
    assert code["Content-Disposition"].startswith("attachment;")


def test_an_edit_keeps_the_files_of_the_version_it_replaces(api, session):
    pk = uploaded(api, "a.txt", b"kept")
    send(api, session, content="v1", attachments=[pk])
    Run.objects.update(status=Run.Status.COMPLETED)
    question = Message.objects.get(role="user")
    assert send(api, session, content="v2", edit_of=question.pk).status_code == 201
    edited = Message.objects.get(role="user", content="v2")
    (copy,) = edited.attachments.all()
    assert (copy.name, file_bytes(copy)) == ("a.txt", b"kept") and copy.pk != pk
    # The same stored bytes, not a copy of them.
    assert copy.stored_id == Attachment.objects.get(pk=pk).stored_id is not None


def test_the_schema_documents_attachments(api):
    schema = api.get("/api/schema/", HTTP_ACCEPT="application/json").json()
    assert "/api/attachments/" in schema["paths"]
    assert "/api/attachments/{attachment_id}/content/" in schema["paths"]
    body = schema["components"]["schemas"]["RunCreate"]["properties"]
    assert "attachments" in body


# --- what each provider is sent ------------------------------------------------------


def upload_http(server, headers, name: str, data: bytes) -> int:
    response = httpx.post(
        f"{server.url}/api/attachments/",
        files={"file": (name, data, "application/octet-stream")},
        headers=headers,
    )
    assert response.status_code == 201, response.text
    return response.json()["id"]


def run_with_files(server, headers, model: str, names_data) -> list:
    session_id = new_session(server, headers)
    ids = [upload_http(server, headers, n, d) for n, d in names_data]
    response = httpx.post(
        f"{server.url}/api/sessions/{session_id}/runs/",
        json={"content": "What is in these?", "model": model, "attachments": ids},
        headers=headers,
    )
    assert response.status_code == 201, response.text
    return stream(server, headers, response.json()["run_id"])


DATA_URL = "data:image/png;base64," + base64.b64encode(PNG).decode()
INLINED = (
    "What is in these?\n\nFile: greet.py\n```py\n"
    + CODE.decode().rstrip("\n")
    + "\n```"
)


@pytest.mark.slow
def test_openai_gets_text_inlined_and_image_url_parts(
    server, alice, fake_llm, live_worker, settings
):
    settings.HERMES = {**settings.HERMES, "VISION_MODELS": ["fake-model"]}
    events = run_with_files(
        server, alice[1], "fake-model", [("greet.py", CODE), ("p.png", PNG)]
    )
    assert events[-1][2]["status"] == "completed"
    (request,) = fake_llm.requests
    assert request.body["messages"][-1] == {
        "role": "user",
        "content": [
            {"type": "text", "text": INLINED},
            {"type": "image_url", "image_url": {"url": DATA_URL}},
        ],
    }


def test_text_files_alone_keep_the_content_a_string(
    server, alice, fake_llm, live_worker
):
    run_with_files(server, alice[1], "fake-model", [("greet.py", CODE)])
    (request,) = fake_llm.requests
    assert request.body["messages"][-1] == {"role": "user", "content": INLINED}


def test_a_fence_is_longer_than_any_backticks_in_the_file():
    from chat.attachments import fenced

    assert fenced("a.md", "x\n````\ny") == "File: a.md\n`````md\nx\n````\ny\n`````"


def test_a_model_switched_to_without_vision_is_told_the_image_was_left_out(
    server, alice, fake_llm, live_worker, settings
):
    settings.HERMES = {**settings.HERMES, "VISION_MODELS": ["fake-model"]}
    run_with_files(server, alice[1], "fake-model", [("p.png", PNG)])
    question = Message.objects.get(role="user")
    response = httpx.post(
        f"{server.url}/api/sessions/{question.session_id}/runs/",
        json={"regenerate": question.pk, "model": "other-model"},
        headers=alice[1],
    )
    assert response.status_code == 201, response.text
    stream(server, alice[1], response.json()["run_id"])
    sent = fake_llm.requests[-1].body["messages"][-1]
    assert sent == {
        "role": "user",
        "content": "What is in these?\n\n[Image p.png left out: this model "
        "does not take images]",
    }


@pytest.fixture
def claude(settings, fake_llm, monkeypatch):
    with anthropic_provider(settings, monkeypatch, vision=True) as server:
        yield server


@pytest.mark.slow
def test_anthropic_gets_base64_image_blocks(server, alice, claude, live_worker):
    claude.push(AnthropicReply(text="A gradient."))
    events = run_with_files(
        server, alice[1], "claude-x", [("greet.py", CODE), ("p.png", PNG)]
    )
    assert text_of(events) == "A gradient."
    (request,) = claude.requests
    assert request.body["messages"] == [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": INLINED},
                {
                    "type": "image",
                    "source": {
                        "type": "base64",
                        "media_type": "image/png",
                        "data": base64.b64encode(PNG).decode(),
                    },
                },
            ],
        }
    ]


@pytest.fixture
def responses(settings, fake_llm):
    with responses_provider(settings, vision=["gpt-bg"]) as server:
        yield server


def test_responses_gets_input_image_parts(server, alice, responses, live_worker):
    events = run_with_files(
        server, alice[1], "gpt-bg", [("greet.py", CODE), ("p.png", PNG)]
    )
    assert events[-1][2]["status"] == "completed"
    (created,) = responses.of_kind("POST", "/responses")
    assert created.body["input"] == [
        {
            "role": "user",
            "content": [
                {"type": "input_text", "text": INLINED},
                {"type": "input_image", "image_url": DATA_URL},
            ],
        }
    ]


# --- export and import ---------------------------------------------------------------


def test_export_and_import_keep_the_files(api, session, alice, bob):
    image = uploaded(api, "p.png", PNG)
    text = uploaded(api, "a.py", CODE)
    send(api, session, content="look", attachments=[image, text])
    lines = list(session_export(session=session))
    (question,) = [json.loads(line) for line in lines[1:]]
    assert [(f["name"], f["kind"], f["size"]) for f in question["attachments"]] == [
        ("p.png", "image", len(PNG)),
        ("a.py", "text", len(CODE)),
    ]
    copy, count = session_import(owner=bob[0], lines=lines)
    (message,) = copy.messages.all()
    files = list(message.attachments.all())
    assert [(f.name, f.kind, f.mime, file_bytes(f)) for f in files] == [
        ("p.png", "image", "image/png", PNG),
        ("a.py", "text", "text/plain; charset=utf-8", CODE),
    ]
    assert {f.owner_id for f in files} == {bob[0].pk}
    markdown = "".join(session_markdown(session=session))
    assert "Image attached: `p.png`" in markdown and "File: a.py" in markdown


def test_an_import_checks_the_files_as_an_upload_and_keeps_nothing(alice):
    header = {"type": "session", "format": "hermes-session", "version": 1, "title": "t"}
    bad = {
        "type": "message",
        "role": "user",
        "content": "x",
        "attachments": [
            {"name": "x.png", "data": base64.b64encode(b"<svg onload=1>").decode()}
        ],
    }
    from chat.transfer import TransferError

    with pytest.raises(TransferError, match="line 2: attachment x.png: not a PNG"):
        session_import(owner=alice[0], lines=[json.dumps(header), json.dumps(bad)])
    with pytest.raises(TransferError, match="not base64"):
        bad["attachments"][0]["data"] = "%%%"
        session_import(owner=alice[0], lines=[json.dumps(header), json.dumps(bad)])
    assert not ChatSession.objects.exists() and not Attachment.objects.exists()


def test_an_older_export_without_attachments_still_imports(alice):
    header = {"type": "session", "format": "hermes-session", "version": 1, "title": "t"}
    line = {"type": "message", "role": "user", "content": "old"}
    session, count = session_import(
        owner=alice[0], lines=[json.dumps(header), json.dumps(line)]
    )
    assert count == 1 and not Attachment.objects.exists()


# --- the admin and the demo model ----------------------------------------------------


@pytest.mark.slow
def test_the_admin_lists_attachments_under_their_message_without_bytes(
    root, client, alice
):
    session = ChatSession.objects.create(owner=alice[0], title="mine")
    message = Message.objects.create(session=session, role="user", content="see")
    secret = b"TOP-SECRET-BYTES"
    Attachment.objects.create(
        owner=alice[0],
        message=message,
        name="notes.txt",
        kind="text",
        mime="text/plain; charset=utf-8",
        size=len(secret),
        data=secret,
    )
    for url in (
        f"/admin/chat/message/{message.pk}/change/",
        "/admin/chat/attachment/",
    ):
        page = client.get(url)
        assert page.status_code == 200
        assert b"notes.txt" in page.content and secret not in page.content


def test_the_demo_model_takes_images_and_says_so(db):
    from chat.providers.base import ContentDelta
    from chat.providers.demo import _script

    parts = [
        {"type": "text", "text": "What is this?"},
        {"type": "image_url", "image_url": {"url": DATA_URL}},
    ]
    items = _script([{"role": "user", "content": parts}], None)
    text = "".join(i.text for i in items if isinstance(i, ContentDelta))
    assert 'You wrote: "What is this? (and 1 image)"' in text
    assert registry.takes_images("demo")
