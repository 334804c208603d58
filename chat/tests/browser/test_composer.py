"""The composer and the controls around it: the model picker beside a send,
Retry, the wording of outcomes and statuses, copying an answer, and the
keyboard shortcuts.

Requests the page makes are held with Playwright routes where a race decides
the outcome, so each race is played in the order that once lost the answer.
"""

from playwright.sync_api import expect

from chat.models import ChatSession
from hermes_testing.browser import (
    ANSWER,
    LONG,
    PYTESTMARK,
    SCREENSHOTS,
    assert_saw_exact,
    last_turn,
    seen,
    send,
    wait_settled,
    wait_streaming_text,
)
from hermes_testing.fake_llm import Reply
from hermes_testing.harness import wait_until

pytestmark = PYTESTMARK


def _held_until(page, held: dict, *keys: str) -> None:
    """Wait until the routes `keys` are held (the page's events are dispatched
    while Playwright is asked something, hence the evaluate)."""
    wait_until(lambda: page.evaluate("1") and all(k in held for k in keys), timeout=30)


def test_model_changed_then_sent_at_once_streams_in_this_tab(open_page, alice, model):
    """The picker's save lands while the message's POST is in flight (the order
    that lost the answer): the answer still streams here, with Stop and the
    sidebar's running mark, on the model just picked."""
    model.push(Reply(text="First."), Reply(text=ANSWER, tokens_per_s=40, chunk_chars=6))
    page = open_page(alice[0])
    send(page, "first question")
    wait_settled(page)

    held: dict = {}

    def hold(route):
        held[route.request.method] = route

    def hold_patch(route):
        if route.request.method == "PATCH":
            hold(route)
        else:
            route.continue_()

    page.route("**/api/sessions/*/", hold_patch)
    page.route("**/api/sessions/*/runs/", hold)
    page.get_by_test_id("model-picker").select_option("other-model")
    send(page, "second question, on the other model")
    _held_until(page, held, "PATCH", "POST")
    held["PATCH"].continue_()
    expect(page.get_by_test_id("model-picker")).to_have_attribute(
        "data-session-model", "other-model"
    )
    held["POST"].continue_()

    wait_streaming_text(page, 10)
    expect(page.get_by_test_id("stop")).to_be_visible()
    expect(page.get_by_test_id("session-running")).to_be_visible()
    run_id = wait_settled(page)
    assert_saw_exact(seen(page, run_id), run_id)
    expect(last_turn(page).get_by_test_id("assistant-text")).to_have_text(ANSWER)
    expect(page.get_by_test_id("session-running")).to_be_hidden()
    assert model.requests[1].body["model"] == "other-model"
    assert ChatSession.objects.get(owner=alice[0]).model == "other-model"


def test_copy_a_whole_answer(open_page, alice, model):
    answer = "Two parts.\n\n```python\nprint('hi')\n```\n\nAnd **bold** prose."
    model.push(Reply(text=answer))
    page = open_page(alice[0], permissions=["clipboard-read", "clipboard-write"])
    send(page, "give me markdown")
    wait_settled(page)
    button = last_turn(page).get_by_test_id("copy-answer")
    button.click()
    expect(button).to_have_text("Copied")
    assert page.evaluate("navigator.clipboard.readText()") == answer


def test_keyboard_shortcuts_new_chat_stop_focus_and_help(open_page, alice, model):
    model.push(Reply(text="Hello."), Reply(text=LONG, stall_after_chars=24))
    page = open_page(alice[0])
    send(page, "first")
    wait_settled(page)
    box = page.get_by_test_id("composer-input")

    # "?" (outside the message box) shows the help, which lists the shortcuts.
    page.get_by_test_id("session-title").click()
    page.keyboard.press("?")
    help_ = page.get_by_test_id("shortcuts")
    expect(help_).to_be_visible()
    expect(help_).to_contain_text("New chat")
    expect(help_).to_contain_text("Stop the answer being written")
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / "shortcuts.png"))
    page.keyboard.press("Escape")
    expect(help_).to_be_hidden()

    # Shift+Esc focuses the message box; Esc while an answer streams stops it.
    page.get_by_test_id("session-title").click()
    expect(box).not_to_be_focused()
    page.keyboard.press("Shift+Escape")
    expect(box).to_be_focused()
    box.fill("stall please")
    box.press("Enter")
    wait_streaming_text(page, 24)
    page.keyboard.press("Escape")
    run_id = wait_settled(page)
    assert_saw_exact(seen(page, run_id), run_id)
    expect(last_turn(page).get_by_test_id("run-outcome")).to_have_text("Stopped")

    # Ctrl+Shift+O opens a new chat.
    page.keyboard.press("Control+Shift+O")
    expect(page.get_by_test_id("empty-state")).to_be_visible()
    expect(page.get_by_test_id("session-title")).to_have_text("New chat")
    assert page.url.endswith("/")


def test_retry_after_answers_that_left_no_text_and_a_reload(open_page, alice, model):
    """Two answers refused before any text (no message names their runs), then
    a reload: Retry still answers the question once more, over the newest run."""
    refused = {"error": {"message": "bad request", "type": "invalid_request_error"}}
    model.push(
        Reply(status=400, error_body=refused), Reply(status=400, error_body=refused)
    )
    page = open_page(alice[0])
    send(page, "only once")
    first = wait_settled(page)
    expect(last_turn(page)).to_have_attribute("data-status", "failed")
    page.get_by_test_id("retry").click()
    expect(last_turn(page)).not_to_have_attribute("data-run-id", first)
    second = wait_settled(page)
    assert second != first
    expect(last_turn(page)).to_have_attribute("data-status", "failed")

    page.reload()
    expect(page.get_by_test_id("app")).to_have_attribute("data-ready", "true")
    expect(last_turn(page)).to_have_attribute("data-run-id", second)
    model.push(Reply(text=ANSWER, tokens_per_s=40, chunk_chars=6))
    page.get_by_test_id("retry").click()
    wait_streaming_text(page, 10)
    third = wait_settled(page)
    assert third not in (first, second)
    assert_saw_exact(seen(page, third), third)
    expect(page.get_by_test_id("composer-error")).to_be_hidden()
    expect(page.get_by_test_id("user-message")).to_have_text(["only once"])
    assert [r.messages for r in model.requests] == [
        [{"role": "user", "content": "only once"}]
    ] * 3
