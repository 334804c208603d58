"""A new chat is named after its first message, then by its generated title,
live in the header and the sidebar (through the user's notifications)."""

from playwright.sync_api import expect

from chat.models import ChatSession
from hermes_testing.browser import PYTESTMARK, SCREENSHOTS, send, wait_settled
from hermes_testing.fake_llm import Reply

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
