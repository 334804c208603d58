"""A run's progress through its steps on the page (chat.budget): one receipt
says which step runs, replaced as the run moves on, live and after a reload,
and a run ended by its step limit says so in words."""

from playwright.sync_api import expect

from hermes_testing.api import CALCULATOR_STEP
from hermes_testing.browser import LONG, PYTESTMARK, last_turn, send, wait_settled
from hermes_testing.fake_llm import Reply

pytestmark = PYTESTMARK


def test_the_step_in_progress_is_one_receipt_live_and_after_a_reload(
    open_page, alice, model, settings
):
    settings.HERMES = {**settings.HERMES, "RUN_MAX_STEPS": 4}
    model.push(
        CALCULATOR_STEP,
        CALCULATOR_STEP,
        Reply(text=LONG, tokens_per_s=20, chunk_chars=4),
    )
    page = open_page(alice[0])
    send(page, "compute twice, then talk")
    steps = page.locator("[data-testid=status][data-kind=step]")
    expect(steps).to_have_count(1)
    expect(steps).to_have_text("Step 3 of at most 4")

    page.reload()  # the snapshot holds both step lines; one receipt shows
    steps = page.locator("[data-testid=status][data-kind=step]")
    expect(steps).to_have_text("Step 3 of at most 4")
    expect(steps).to_have_count(1)
    wait_settled(page)
    expect(last_turn(page)).to_have_attribute("data-status", "completed")


def test_a_run_ended_by_its_step_limit_says_so(open_page, alice, model, settings):
    settings.HERMES = {**settings.HERMES, "RUN_MAX_STEPS": 2}
    model.push(CALCULATOR_STEP, CALCULATOR_STEP)
    page = open_page(alice[0])
    send(page, "keep computing")
    wait_settled(page)
    turn = last_turn(page)
    expect(turn).to_have_attribute("data-status", "failed")
    expect(turn.get_by_test_id("run-outcome")).to_have_text(
        "Stopped: the answer reached its limit of model steps"
    )
    expect(turn.get_by_test_id("error-category")).to_have_text(
        "The answer reached one of its limits"
    )
    expect(turn.get_by_test_id("run-error")).to_have_attribute("data-category", "limit")
