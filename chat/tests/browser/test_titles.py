"""A new chat is named after its first message, then by its generated title,
live in the header and the sidebar (through the user's notifications)."""

from playwright.sync_api import expect

from chat.models import ChatSession
from chat.titles import title_subject
from hermes_testing.browser import PYTESTMARK, SCREENSHOTS, send, wait_settled
from hermes_testing.fake_llm import Reply
from journal.models import Run

pytestmark = PYTESTMARK


def test_a_new_chat_gets_its_generated_title_live(open_page, alice, model, titles_on):
    model.push(
        Reply(text="Rome, Florence and Venice are the classics."),
        Reply(text="Italy city trip ideas", tokens_per_s=8),
    )
    page = open_page(alice[0])
    send(page, "Which cities should I see in Italy on a first trip?")
    wait_settled(page)
    expect(page.get_by_test_id("session-title")).to_have_text("Italy city trip ideas")
    expect(page.get_by_test_id("session-name")).to_have_text("Italy city trip ideas")
    session = ChatSession.objects.get(owner=alice[0])
    assert session.title == "Italy city trip ideas" and not session.title_by_user
    # The transcript holds the chat's turn only.
    expect(page.get_by_test_id("assistant-turn")).to_have_count(1)
    expect(page.get_by_test_id("user-message")).to_have_count(1)
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / "generated-title.png"))

    # Still renameable, and the name given stays.
    item = page.get_by_test_id("session-item")
    item.hover()
    item.get_by_test_id("session-rename").click()
    page.get_by_test_id("rename-input").fill("My Italy")
    page.get_by_test_id("rename-input").press("Enter")
    expect(page.get_by_test_id("session-title")).to_have_text("My Italy")
    model.push(Reply(text="Also Bologna."))
    send(page, "And one more?")
    wait_settled(page)
    expect(page.get_by_test_id("session-name")).to_have_text("My Italy")
    assert ChatSession.objects.get(pk=session.pk).title == "My Italy"


def test_a_refusal_is_no_title_the_chat_is_named_after_the_question(
    open_page, alice, model, titles_on
):
    """A small model answering the title run "I'm sorry, …" (issue 41): the
    chat is named after the first words of its question, live and after a
    reload, and the title run completes."""
    model.push(
        Reply(text="Rome, Florence and Venice are the classics."),
        Reply(text="I'm sorry, but I can't help with naming this conversation."),
    )
    page = open_page(alice[0])
    send(page, "Which cities should I see in Italy on a first trip?")
    wait_settled(page)
    expect(page.get_by_test_id("session-title")).to_have_text(
        "Which cities should I see in"
    )
    expect(page.get_by_test_id("session-name")).to_have_text(
        "Which cities should I see in"
    )
    page.reload()
    expect(page.get_by_test_id("app")).to_have_attribute("data-ready", "true")
    expect(page.get_by_test_id("session-name")).to_have_text(
        "Which cities should I see in"
    )
    session = ChatSession.objects.get(owner=alice[0])
    title_run = Run.objects.get(subject=title_subject(session.pk))
    assert title_run.status == Run.Status.COMPLETED
