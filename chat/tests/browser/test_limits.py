"""The chat page shows a per-user limit plainly, in the composer (chat.limits)."""

from playwright.sync_api import expect

from chat.models import ChatSession
from hermes_testing.browser import PYTESTMARK, send, wait_settled
from hermes_testing.fake_llm import Reply
from journal.models import Run

pytestmark = PYTESTMARK


def test_over_the_runs_per_minute_limit_the_composer_says_so(
    open_page, alice, model, settings
):
    settings.HERMES = {**settings.HERMES, "USER_RUNS_PER_MINUTE": 1}
    model.push(Reply(text="First answer."))
    page = open_page(alice[0])
    send(page, "first")
    wait_settled(page)

    box = page.get_by_test_id("composer-input")
    box.fill("second, too soon")
    box.press("Enter")
    error = page.get_by_test_id("composer-error")
    expect(error).to_be_visible()
    expect(error).to_contain_text("Limit reached: you started 1 runs in the last")
    expect(error).to_contain_text("retry in")
    # The message was not sent: it stays in the composer, not in the chat.
    expect(page.get_by_test_id("user-message")).to_have_count(1)
    expect(box).to_have_value("second, too soon")
    assert Run.objects.filter(owner=alice[0]).count() == 1


def test_over_the_sessions_limit_the_composer_says_so(
    open_page, alice, model, settings
):
    settings.HERMES = {**settings.HERMES, "USER_MAX_SESSIONS": 1}
    ChatSession.objects.create(owner=alice[0], title="the only one")
    page = open_page(alice[0])
    page.get_by_test_id("new-session").click()
    page.get_by_test_id("composer-input").fill("a new chat")
    page.get_by_test_id("composer-input").press("Enter")
    error = page.get_by_test_id("composer-error")
    expect(error).to_contain_text("Limit reached: you have 1 sessions")
    assert ChatSession.objects.filter(owner=alice[0]).count() == 1
    assert not Run.objects.filter(owner=alice[0]).exists()
