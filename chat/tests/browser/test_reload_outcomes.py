"""How finished answers read once the page drew them again from saved
messages (after a reload, or the redraw at a run's end) — as they read live
(issue 41, item 6):

- an earlier run that failed before any text keeps its turn, with its error
  in words and a Retry that answers that question again;
- a tool call a person denied reads "denied", with the decision and its note.
"""

from playwright.sync_api import expect

from hermes_testing.api import CALCULATOR_STEP
from hermes_testing.browser import PYTESTMARK, last_turn, send, wait_settled
from hermes_testing.fake_llm import Reply
from hermes_testing.harness import wait_until
from journal.models import Run

pytestmark = PYTESTMARK

REFUSED = {"error": {"message": "bad request", "type": "invalid_request_error"}}


def _reload(page) -> None:
    page.reload()
    expect(page.get_by_test_id("app")).to_have_attribute("data-ready", "true")


def _failed_first_turn(page, run_id: str):
    """The first question's turn: its run's error and outcome, and Retry."""
    turns = page.get_by_test_id("assistant-turn")
    expect(turns).to_have_count(2)
    turn = turns.first
    expect(turn).to_have_attribute("data-run-id", run_id)
    expect(turn).to_have_attribute("data-status", "failed")
    expect(turn.get_by_test_id("run-error")).to_have_attribute(
        "data-category", "invalid_request"
    )
    expect(turn.get_by_test_id("error-category")).to_have_text(
        "The model's service refused the request"
    )
    expect(turn.get_by_test_id("error-message")).to_contain_text("bad request")
    expect(turn.get_by_test_id("run-outcome")).to_have_text(
        "Failed: the model could not finish this answer"
    )
    expect(turn.get_by_test_id("turn-retry")).to_be_visible()
    # Between the question it answered and the next one.
    order = page.evaluate(
        """() => Array.from(
            document.querySelectorAll(
                '[data-testid=user-message], [data-testid=assistant-turn]'),
            (node) => node.dataset.testid)"""
    )
    assert order == ["user-message", "assistant-turn"] * 2
    return turn


def test_an_earlier_run_that_failed_before_any_text_keeps_its_error_and_retry(
    open_page, alice, model
):
    model.push(Reply(status=400, error_body=REFUSED), Reply(text="Second answer."))
    page = open_page(alice[0])
    send(page, "first question")
    failed = wait_settled(page)
    expect(last_turn(page)).to_have_attribute("data-status", "failed")
    expect(page.get_by_test_id("retry")).to_be_visible()
    send(page, "second question")
    wait_settled(page)
    _failed_first_turn(page, failed)  # the redraw at the second run's end

    _reload(page)
    turn = _failed_first_turn(page, failed)
    expect(last_turn(page).get_by_test_id("assistant-text")).to_have_text(
        "Second answer."
    )

    # Retry answers the first question again, without the second.
    model.push(Reply(text="First answer."))
    turn.get_by_test_id("turn-retry").click()
    wait_until(lambda: Run.objects.filter(owner=alice[0]).count() == 3)
    retried = wait_settled(page)
    assert retried != failed
    expect(last_turn(page).get_by_test_id("assistant-text")).to_have_text(
        "First answer."
    )
    expect(page.get_by_test_id("user-message")).to_have_text(["first question"])
    assert model.requests[-1].messages == [
        {"role": "user", "content": "first question"}
    ]


def _denied_card(page) -> None:
    card = last_turn(page).get_by_test_id("tool-card")
    expect(card).to_have_count(1)
    expect(card).to_have_attribute("data-state", "denied")
    expect(card).to_have_attribute("data-approval", "deny")
    expect(card.get_by_test_id("tool-state")).to_have_text("denied")
    expect(card.get_by_test_id("approval-decision")).to_have_text("Denied: not now")
    expect(card.get_by_test_id("tool-result")).to_contain_text(
        "a person denied this call of calculator"
    )


def test_a_denied_call_reads_denied_after_the_redraw_and_a_reload(
    open_page, alice, model, asking
):
    model.push(CALCULATOR_STEP, Reply(text="No maths then."))
    page = open_page(alice[0])
    send(page, "what is 6*7?")
    card = last_turn(page).get_by_test_id("tool-card")
    expect(card).to_have_attribute("data-approval", "pending")
    card.get_by_test_id("approval-note").fill("not now")
    card.get_by_test_id("approval-deny").click()
    wait_settled(page)  # drawn again from the saved messages
    expect(last_turn(page).get_by_test_id("assistant-text")).to_have_text(
        "No maths then."
    )
    _denied_card(page)
    _reload(page)
    _denied_card(page)
