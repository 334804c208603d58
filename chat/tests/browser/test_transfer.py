"""Export a chat from the page (Markdown, and the project's JSON Lines) and
import such a file back, as a user does it: links that download, a file picker."""

import io
import json

from django.core.management import call_command
from playwright.sync_api import expect

from chat.models import ChatSession
from hermes_testing.browser import (
    PYTESTMARK,
    SCREENSHOTS,
    last_turn,
    send,
    wait_settled,
)
from hermes_testing.fake_llm import Reply

pytestmark = PYTESTMARK


def _download(page, link) -> tuple[str, str]:
    if not page.get_by_test_id("settings").get_attribute("open") == "":
        page.get_by_test_id("settings").locator("summary").click()  # open it
    with page.expect_download() as info:
        link.click()
    download = info.value
    with open(download.path(), encoding="utf-8") as file:
        return download.suggested_filename, file.read()


def test_export_a_chat_as_markdown_and_json(open_page, alice, model):
    model.push(Reply(text="Durable **streams**."))
    page = open_page(alice[0])
    send(page, "what are you?")
    wait_settled(page)
    session = ChatSession.objects.get(owner=alice[0])
    page.get_by_test_id("settings").locator("summary").click()  # the ⚙ panel
    expect(page.get_by_test_id("export-row")).to_be_visible()
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / "export.png"))

    name, text = _download(page, page.get_by_test_id("export-markdown"))
    assert name == f"hermes-session-{session.pk}.md"
    assert text.startswith("# what are you?\n")
    assert "## User\n\nwhat are you?\n" in text
    assert "## Assistant\n\nDurable **streams**.\n" in text

    name, text = _download(page, page.get_by_test_id("export-json"))
    assert name == f"hermes-session-{session.pk}.jsonl"
    command = io.StringIO()
    call_command("export_session", str(session.pk), stdout=command)
    assert text == command.getvalue()  # the same file as `manage.py export_session`


def test_import_a_chat_from_the_page(open_page, alice, bob, model, tmp_path):
    model.push(Reply(text="An answer worth keeping."))
    page = open_page(alice[0])
    send(page, "keep this")
    wait_settled(page)
    exported = io.StringIO()
    call_command(
        "export_session",
        str(ChatSession.objects.get(owner=alice[0]).pk),
        stdout=exported,
    )
    path = tmp_path / "chat.jsonl"
    path.write_text(exported.getvalue(), encoding="utf-8")

    other = open_page(bob[0])
    other.get_by_test_id("import-file").set_input_files(str(path))
    copy = ChatSession.objects.filter(owner=bob[0])
    expect(other.get_by_test_id("session-title")).to_have_text("keep this")
    assert other.url.endswith(f"/c/{copy.get().pk}/")
    expect(other.get_by_test_id("user-message")).to_have_text(["keep this"])
    expect(last_turn(other).get_by_test_id("assistant-text")).to_have_text(
        "An answer worth keeping."
    )
    expect(other.get_by_test_id("session-name")).to_have_text(["keep this"])

    # A file that is not an export says what is wrong with it, and keeps nothing.
    lines = exported.getvalue().splitlines()
    broken = tmp_path / "broken.jsonl"
    broken.write_text(
        "\n".join([lines[0], json.dumps({"type": "message", "role": "x"})]),
        encoding="utf-8",
    )
    other.get_by_test_id("import-file").set_input_files(str(broken))
    expect(other.get_by_test_id("composer-error")).to_have_text(
        "Not imported: line 2: missing 'content'"
    )
    assert copy.count() == 1
