"""Branches on the page: Regenerate adds a version of an answer, Edit a version
of a question; "‹ 2 / 2 ›" moves between them in place, and a reload shows the
same branch, also while the new answer streams.

Bugs planted in the page to see these tests fail:

- the conversation drawn from every message, not the active branch: both
  answers show at once and the turn counts fail;
- the version buttons not selecting on the server: "1 / 2" does not survive
  the reload.
"""

from playwright.sync_api import expect

from chat.models import Message
from hermes_testing.browser import (
    ANSWER,
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

pytestmark = PYTESTMARK

FIRST = "The first answer."


def _ready(page) -> None:
    expect(page.get_by_test_id("app")).to_have_attribute("data-ready", "true")


def test_regenerate_then_go_back_to_the_first_answer_across_reloads(
    open_page, alice, model
):
    model.push(Reply(text=FIRST))
    page = open_page(alice[0])
    send(page, "what is durable?")
    wait_settled(page)

    model.push(Reply(text=ANSWER, tokens_per_s=5, chunk_chars=4))
    last_turn(page).get_by_test_id("regenerate").click()
    wait_streaming_text(page, 12)
    turns = page.get_by_test_id("assistant-turn")
    expect(turns).to_have_count(1)  # the new version streams in the old one's place
    page.reload()
    _ready(page)
    wait_streaming_text(page, 40)
    expect(turns).to_have_count(1)
    expect(page.get_by_test_id("user-message")).to_have_count(1)
    run_id = wait_settled(page)
    print(
        "DEBUG",
        list(
            Message.objects.values_list(
                "id", "role", "parent_id", "selected_at", "run_id", "content"
            )
        ),
    )
    assert_saw_exact(seen(page, run_id), run_id)
    assert model.requests[-1].messages == [
        {"role": "user", "content": "what is durable?"}
    ]

    label = last_turn(page).get_by_test_id("branch-label")
    expect(label).to_have_text("2 / 2")
    last_turn(page).get_by_test_id("branch-prev").click()
    expect(label).to_have_text("1 / 2")
    expect(last_turn(page).get_by_test_id("assistant-text")).to_have_text(FIRST)
    page.reload()
    _ready(page)
    expect(turns).to_have_count(1)
    expect(label).to_have_text("1 / 2")
    expect(last_turn(page).get_by_test_id("assistant-text")).to_have_text(FIRST)
    last_turn(page).get_by_test_id("branch-next").click()
    expect(label).to_have_text("2 / 2")
    expect(last_turn(page).get_by_test_id("assistant-text")).to_have_text(
        ANSWER.rstrip()
    )


def test_edit_a_question_keeps_the_old_one_as_a_version(open_page, alice, model):
    model.push(Reply(text="One."), Reply(text="Two."), Reply(text="Two, edited."))
    page = open_page(alice[0])
    send(page, "first")
    wait_settled(page)
    send(page, "secnod")
    wait_settled(page)

    asked = page.get_by_test_id("user-message")
    bars = page.get_by_test_id("user-branch")
    bars.last.get_by_test_id("edit").click()
    asked.last.get_by_test_id("edit-text").fill("second")
    asked.last.get_by_test_id("edit-send").click()
    expect(bars.last.get_by_test_id("branch-label")).to_have_text("2 / 2")
    wait_settled(page)
    expect(last_turn(page).get_by_test_id("assistant-text")).to_have_text(
        "Two, edited."
    )
    sent = [m["content"] for m in model.requests[-1].messages]
    assert sent == ["first", "One.", "second"]
    assert Message.objects.filter(role="user", content="secnod").exists()

    bars.last.get_by_test_id("branch-prev").click()
    expect(asked.last.locator(".bubble")).to_have_text("secnod")
    expect(last_turn(page).get_by_test_id("assistant-text")).to_have_text("Two.")
    page.reload()
    _ready(page)
    expect(asked).to_have_count(2)
    expect(asked.last.locator(".bubble")).to_have_text("secnod")
    expect(bars.last.get_by_test_id("branch-label")).to_have_text("1 / 2")


def test_three_versions_of_an_answer_screenshot(open_page, alice, model):
    """The picture of branches in docs/screenshots/ (`make screenshots`
    refreshes it): three answers to one question, the second shown."""
    model.push(
        Reply(
            text="**Hermes**: the messenger who never loses a letter.", tokens_per_s=60
        ),
        Reply(
            text="**Ledger**: every word is written before it is read.", tokens_per_s=60
        ),
        Reply(text="**Waypoint**: a reader knows where it left off.", tokens_per_s=60),
    )
    page = open_page(alice[0], viewport={"width": 1100, "height": 560})
    send(page, "Suggest a name for a chat app whose answers survive reloads.")
    wait_settled(page)
    for versions in ("2 / 2", "3 / 3"):
        last_turn(page).get_by_test_id("regenerate").click()
        label = last_turn(page).get_by_test_id("branch-label")
        expect(label).to_have_text(versions)
        wait_settled(page)
    last_turn(page).get_by_test_id("branch-prev").click()
    expect(last_turn(page).get_by_test_id("branch-label")).to_have_text("2 / 3")
    expect(last_turn(page).get_by_test_id("assistant-text")).to_contain_text("Ledger")
    page.mouse.move(0, 0)
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / "branches.png"))
