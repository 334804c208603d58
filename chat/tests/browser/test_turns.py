"""How an answer is drawn after a reload: its tool cards where the model called
them (the snapshot's parts in journal order), and every finished answer with
its footer (model, usage).

Bugs planted in the page to see these tests fail:

- the snapshot's text drawn first and its tool cards after it (as the page
  drew them before its turns were folded): the tool card test fails;
- the message pages' run statuses ignored (only the newest answer decorated
  after a load): the footer test fails.
"""

from playwright.sync_api import expect

from hermes_testing.browser import (
    ANSWER,
    PYTESTMARK,
    assert_saw_exact,
    journal_events,
    last_turn,
    page_fold,
    seen,
    send,
    wait_settled,
    wait_streaming_text,
)
from hermes_testing.fake_llm import Reply
from journal.fold import Fold

pytestmark = PYTESTMARK

LOOK = "Let me look at the clock."

# The kinds and texts of the newest turn's parts, in the order they are drawn,
# once that turn streams, shows a finished tool card and `chars` characters of
# text after it; false until then.
PARTS_WHILE_STREAMING = """(chars) => {
    const turns = document.querySelectorAll('[data-testid=assistant-turn]');
    const turn = turns[turns.length - 1];
    if (!turn || turn.dataset.streaming !== 'true') return false;
    const parts = Array.from(turn.querySelector('.turn-body').children, (node) => [
        node.dataset.testid,
        node.dataset.testid === 'assistant-text' ? node.innerText : node.dataset.state,
    ]);
    const card = parts.findIndex(([kind]) => kind === 'tool-card');
    if (card < 0 || parts[card][1] !== 'done') return false;
    const after = parts.slice(card + 1).map(([, text]) => text).join('');
    return after.length >= chars && parts;
}"""


def parts_while_streaming(page, chars: int) -> list[list[str]]:
    return page.wait_for_function(PARTS_WHILE_STREAMING, arg=chars).json_value()


def test_reload_mid_run_keeps_the_tool_card_where_it_was_called(
    open_page, alice, model
):
    clock = {"id": "call_1", "name": "current_time", "arguments": "{}"}
    model.push(
        Reply(text=LOOK, tool_calls=[clock]),
        Reply(text=ANSWER, tokens_per_s=5, chunk_chars=4),
    )
    page = open_page(alice[0])
    send(page, "what time is it?")
    drawn_live = parts_while_streaming(page, 12)
    page.reload()
    expect(page.get_by_test_id("app")).to_have_attribute("data-ready", "true")
    drawn_after_reload = parts_while_streaming(page, 12)

    for drawn in (drawn_live, drawn_after_reload):
        assert [kind for kind, _ in drawn] == [
            "assistant-text",
            "tool-card",
            "assistant-text",
        ], drawn
        assert drawn[0][1] == LOOK
        assert ANSWER.startswith(drawn[2][1]), drawn
    run_id = wait_settled(page)
    assert_saw_exact(seen(page, run_id), run_id)
    turn = last_turn(page)
    expect(turn.locator(".turn-body > *")).to_have_count(3)
    expect(turn.locator(".turn-body > *").nth(1)).to_have_attribute(
        "data-testid", "tool-card"
    )
    expect(turn.get_by_test_id("assistant-text")).to_have_text([LOOK, ANSWER])

    # The run's real journal folds alike on the page and on the server.
    events = journal_events(run_id)
    fold = Fold()
    for event in events:
        fold.add(event["event"], event["data"], event["seq"])
    assert page_fold(page, {"run": events})["run"] == fold.turn()
    assert [p["kind"] for p in fold.parts] == ["text", "tool", "text"]


def _footers(page, count: int) -> None:
    turns = page.get_by_test_id("assistant-turn")
    expect(turns).to_have_count(count)
    for index in range(count):
        turn = turns.nth(index)
        expect(turn.get_by_test_id("run-model")).to_have_text("fake-model")
        expect(turn.get_by_test_id("run-usage")).to_have_text("12 in · 34 out")


def test_every_answer_keeps_its_footer_after_a_reload(open_page, alice, model):
    model.push(
        Reply(text="First answer."),
        Reply(text="Second answer."),
        Reply(text=ANSWER, tokens_per_s=5, chunk_chars=4),
    )
    page = open_page(alice[0])
    for question in ("one", "two"):
        send(page, question)
        wait_settled(page)
    _footers(page, 2)

    page.reload()
    expect(page.get_by_test_id("app")).to_have_attribute("data-ready", "true")
    _footers(page, 2)

    send(page, "three")
    wait_streaming_text(page, 10)
    page.reload()  # the older answers keep theirs while a run streams
    expect(page.get_by_test_id("app")).to_have_attribute("data-ready", "true")
    wait_streaming_text(page, 10)
    expect(page.get_by_test_id("assistant-turn")).to_have_count(3)
    for index in range(2):
        turn = page.get_by_test_id("assistant-turn").nth(index)
        expect(turn.get_by_test_id("run-model")).to_have_text("fake-model")
        expect(turn.get_by_test_id("run-usage")).to_have_text("12 in · 34 out")
    wait_settled(page)
    _footers(page, 3)
