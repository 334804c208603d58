"""Queue and steer on the page (chat.pending): typing while an answer is
written. The run is parked at a tool step (the calculator asks for approval),
so what is typed is pending for as long as the test needs: a steer (Ctrl+Enter)
and two queued messages (Enter), one cancelled from a second tab, which shows
the same list; they survive a reload; after
the approval the steer is drawn in the answer where it landed and the queued
message starts the next turn, which the page follows.
"""

from playwright.sync_api import expect

from chat.models import ChatSession
from hermes_testing.api import CALCULATOR_STEP
from hermes_testing.browser import (
    PYTESTMARK,
    SCREENSHOTS,
    journal_events,
    last_turn,
    page_fold,
    send,
    wait_settled,
)
from hermes_testing.fake_llm import Reply
from journal.models import Run

pytestmark = PYTESTMARK


def test_type_while_streaming_see_it_pending_then_land(open_page, alice, model, asking):
    model.push(CALCULATOR_STEP, Reply(text="Quarante-deux."), Reply(text="De rien."))
    page = open_page(alice[0])
    send(page, "what is 6*7?")
    card = last_turn(page).get_by_test_id("tool-card")
    expect(card).to_have_attribute("data-approval", "pending")
    expect(page.get_by_test_id("steer")).to_be_visible()
    expect(page.get_by_test_id("send")).to_have_text("Queue")
    session = ChatSession.objects.get(owner=alice[0])
    other = open_page(alice[0], f"/c/{session.pk}/", tab_of=page)  # a second tab
    expect(last_turn(other).get_by_test_id("tool-card")).to_have_count(1)

    box = page.get_by_test_id("composer-input")
    box.fill("Answer in French.")
    box.press("Control+Enter")
    box.fill("Thanks!")
    box.press("Enter")
    box.fill("Never mind.")
    page.get_by_test_id("send").click()
    items = page.get_by_test_id("pending-item")
    expect(items).to_have_count(3)
    expect(items.get_by_test_id("pending-text")).to_have_text(
        ["Answer in French.", "Thanks!", "Never mind."]
    )
    expect(items.nth(0)).to_have_attribute("data-kind", "steer")
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / "queue-and-steer.png"))
    # The second tab hears of each change and shows the same list.
    others = other.get_by_test_id("pending-item")
    expect(others.get_by_test_id("pending-text")).to_have_text(
        ["Answer in French.", "Thanks!", "Never mind."]
    )
    others.nth(2).get_by_test_id("pending-cancel").click()  # cancelled there
    expect(items).to_have_count(2)

    page.reload()  # pending messages are the server's: back after a reload
    expect(page.get_by_test_id("app")).to_have_attribute("data-ready", "true")
    expect(items.get_by_test_id("pending-text")).to_have_text(
        ["Answer in French.", "Thanks!"]
    )
    first = Run.objects.get(turn__session=session)
    last_turn(page).get_by_test_id("approval-approve").click()

    # The steer lands in the first answer, between the tool card and the text;
    # the queued message then starts the next turn, which the page follows.
    expect(page.get_by_test_id("user-message")).to_have_count(2)
    second = wait_settled(page)
    assert second != first.id
    expect(last_turn(page).get_by_test_id("assistant-text")).to_have_text("De rien.")
    expect(items).to_have_count(0)
    answer = page.locator(f"[data-testid=assistant-turn][data-run-id='{first.id}']")
    expect(answer.get_by_test_id("steer-text")).to_have_text("Answer in French.")
    order = answer.locator(
        "[data-testid=tool-card], [data-testid=steer], [data-testid=assistant-text]"
    )
    expect(order).to_have_count(3)
    kinds = [order.nth(i).get_attribute("data-testid") for i in range(3)]
    assert kinds == ["tool-card", "steer", "assistant-text"]
    expect(page.get_by_test_id("user-message").last).to_have_text("Thanks!")
    assert wait_settled(other) == second  # the second tab followed both turns
    expect(other.get_by_test_id("steer-text")).to_have_text("Answer in French.")
    expect(others).to_have_count(0)
    assert model.requests[1].messages[-1] == {
        "role": "user",
        "content": "Answer in French.",
    }
    # The page's fold of the journal puts the steer where the journal has it.
    events = journal_events(first.id)
    parts = page_fold(page, {"run": events})["run"]["parts"]
    assert [p["kind"] for p in parts] == ["tool", "steer", "text"]
