"""Tool approval on the page: the pending card, a reload, a second tab.

The calculator asks for approval here. The first tab sends the question and
is reloaded while the run waits (its card comes back from the session's
snapshot); a second tab approves; both follow the run to its end. The journal
is the judge: one request and one decision, in that order, each drawn once
by every tab and folded alike by the page's fold.
"""

from playwright.sync_api import expect

from chat.models import ChatSession
from hermes_testing.api import CALCULATOR_STEP
from hermes_testing.browser import (
    PYTESTMARK,
    journal_events,
    last_turn,
    page_fold,
    send,
    wait_settled,
)
from hermes_testing.fake_llm import Reply
from hermes_testing.harness import wait_until
from journal.models import Run

pytestmark = PYTESTMARK


def _pending_card(page):
    card = last_turn(page).get_by_test_id("tool-card")
    expect(card).to_have_count(1)
    expect(card).to_have_attribute("data-approval", "pending")
    expect(card.get_by_test_id("tool-state")).to_have_text("waiting for approval")
    return card


def test_approve_from_a_second_tab_while_the_first_was_reloaded(
    open_page, alice, model, asking
):
    model.push(CALCULATOR_STEP, Reply(text="It is 42."))
    first = open_page(alice[0])
    send(first, "what is 6*7?")
    _pending_card(first)
    session = ChatSession.objects.get(owner=alice[0])
    run = Run.objects.get(turn__session=session)
    wait_until(lambda: Run.objects.get(id=run.id).status == Run.Status.WAITING)

    first.reload()
    expect(first.get_by_test_id("app")).to_have_attribute("data-ready", "true")
    _pending_card(first)
    second = open_page(alice[0], f"/c/{session.pk}/")
    card = _pending_card(second)
    card.get_by_test_id("approval-note").fill("go ahead")
    card.get_by_test_id("approval-approve").click()

    for page in (first, second):
        assert wait_settled(page) == run.id
        turn = last_turn(page)
        expect(turn.get_by_test_id("assistant-text")).to_have_text("It is 42.")
        cards = turn.get_by_test_id("tool-card")
        expect(cards).to_have_count(1)
        expect(cards.get_by_test_id("tool-result")).to_have_text("42")
        expect(turn.get_by_test_id("approval-approve")).to_have_count(0)

    events = journal_events(run.id)
    kinds = [e["event"] for e in events if e["event"].startswith("approval")]
    assert kinds == ["approval_request", "approval"]
    (decision,) = [e["data"] for e in events if e["event"] == "approval"]
    assert (decision["decision"], decision["note"]) == ("approve", "go ahead")
    # The page's fold of the journal: one card, approved with the note, run.
    (part,) = [
        p
        for p in page_fold(first, {"run": events})["run"]["parts"]
        if p["kind"] == "tool"
    ]
    assert part["approval"] == {"state": "approve", "note": "go ahead"}
    assert part["result"] == "42"


def test_deny_from_the_page_answers_the_model(open_page, alice, model, asking):
    model.push(CALCULATOR_STEP, Reply(text="No maths then."))
    page = open_page(alice[0])
    send(page, "what is 6*7?")
    card = _pending_card(page)
    card.get_by_test_id("approval-note").fill("not now")
    card.get_by_test_id("approval-deny").click()
    wait_settled(page)
    turn = last_turn(page)
    expect(turn.get_by_test_id("assistant-text")).to_have_text("No maths then.")
    expect(turn.get_by_test_id("tool-result")).to_contain_text(
        "a person denied this call of calculator; their note: not now"
    )
    sent = model.requests[1].messages[-1]
    assert sent["role"] == "tool" and "not now" in sent["content"]
