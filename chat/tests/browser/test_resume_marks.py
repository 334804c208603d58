"""An answer cut upstream and asked for again shows where, live and after a
reload; an answer cut at its output limit says so and offers Continue.

The mark is the fold's `resume` part (`journal/fold.py`, `static/hermes/js/
fold.js`): drawn while the run streams, and again from the snapshot after a
reload, where the text went on (or the model started over)."""

import threading

from playwright.sync_api import expect

from hermes_testing.browser import PYTESTMARK, last_turn, send, wait_settled
from hermes_testing.fake_llm import Reply

pytestmark = PYTESTMARK


def test_a_resume_is_marked_in_the_answer_live_and_after_a_reload(
    open_page, alice, model
):
    hold = threading.Event()
    model.push(
        Reply(text="The first part was cut", cut_after_chars=14),
        Reply(text=" and the rest came later.", hold_after_chunks=3, hold=hold),
    )
    page = open_page(alice[0])
    send(page, "tell me a story")
    turn = last_turn(page)
    mark = turn.get_by_test_id("resume-mark")
    model.wait_held(1)
    expect(mark).to_have_count(1)  # while the run streams
    expect(turn).to_have_attribute("data-streaming", "true")
    expect(mark).to_contain_text("dropped here (body cut)")
    texts = turn.get_by_test_id("assistant-text")
    expect(texts.first).to_have_text("The first part")
    hold.set()
    wait_settled(page)
    page.reload()
    turn = last_turn(page)
    expect(turn.get_by_test_id("resume-mark")).to_have_count(1)
    expect(turn.get_by_test_id("assistant-text").last).to_have_text(
        " and the rest came later."
    )


def test_an_answer_cut_at_its_output_limit_offers_continue(open_page, alice, model):
    model.push(
        Reply(text="A long answer that went on and", finish_reason="length"),
        Reply(text="on, to its end."),
    )
    page = open_page(alice[0])
    send(page, "tell me everything")
    wait_settled(page)
    turn = last_turn(page)
    expect(turn.get_by_test_id("run-outcome")).to_contain_text("output limit")
    turn.get_by_test_id("continue-answer").click()
    expect(page.get_by_test_id("user-message").last).to_have_text(
        "Continue from where you stopped."
    )
    wait_settled(page)
    expect(last_turn(page).get_by_test_id("assistant-text")).to_have_text(
        "on, to its end."
    )
    sent = model.requests[-1].messages
    assert [m["role"] for m in sent] == ["user", "assistant", "user"]
    assert sent[1]["content"] == "A long answer that went on and"
