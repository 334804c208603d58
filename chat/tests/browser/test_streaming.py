"""One tab follows a run: it streams, survives a reload, the network going away
and a flaky connection, and shows a stop and a failure.

What the user saw is checked, not only the redrawn result: every page records
each text its live turn showed (`hermes_testing.browser.RECORD_SEEN`), and
`assert_saw_exact` requires each to be a prefix of the journal's text and the
text shown when the page handles `end` (before it redraws the turn from saved
messages) to equal it. Bugs planted in the page to see these assertions fail
(and the checks of the redrawn text alone pass):

- `RunStream` applying every `token` twice (a second `applyEvent` in
  `ChatController`): every test here fails.
- the page attaching after a reload from seq 0 on top of the drawn snapshot
  (`afterSeq = 0` in `ChatController.#attach`): the reload test fails.
- `RunStream.#recover` resetting its cursor to 0 (back online, the page
  replays the run from the start over what it shows): both offline tests fail.
"""

import pytest
from playwright.sync_api import expect

from chat.models import ChatSession
from hermes_testing.browser import (
    ANSWER,
    LONG,
    PYTESTMARK,
    RECORD_SSE_FRAMES,
    WITHOUT_SHARED_WORKER,
    assert_saw_exact,
    last_turn,
    saved_text,
    seen,
    send,
    wait_settled,
    wait_streaming_text,
)
from hermes_testing.fake_llm import Reply
from hermes_testing.harness import wait_until
from journal.models import Run

pytestmark = PYTESTMARK


def test_message_streams_and_ends_with_the_saved_text(open_page, alice, model):
    model.push(Reply(text=ANSWER, tokens_per_s=40, chunk_chars=6))
    page = open_page(alice[0])
    send(page, "Tell me about durable streams")
    expect(page.get_by_test_id("user-message").last).to_have_text(
        "Tell me about durable streams"
    )
    expect(page.get_by_test_id("stop")).to_be_visible()
    wait_streaming_text(page, 10)  # seen while streaming, before the end
    assert len(last_turn(page).get_by_test_id("assistant-text").inner_text()) < len(
        ANSWER
    )

    run_id = wait_settled(page)
    assert_saw_exact(seen(page, run_id), run_id)
    expect(last_turn(page).get_by_test_id("assistant-text")).to_have_text(ANSWER)
    assert saved_text(run_id) == ANSWER
    expect(last_turn(page).get_by_test_id("run-usage")).to_have_text("12 in · 34 out")
    expect(page.get_by_test_id("send")).to_be_visible()
    expect(page.get_by_test_id("stop")).to_be_hidden()
    session = ChatSession.objects.get(owner=alice[0])
    assert page.url.endswith(f"/c/{session.pk}/")
    expect(page.get_by_test_id("session-item")).to_have_count(1)
    expect(page.get_by_test_id("session-name")).to_have_text(
        "Tell me about durable streams"
    )


def test_reload_mid_stream_ends_exact(open_page, alice, model):
    """Before and after the reload, every text shown streaming is a prefix of
    the journal's, and the text shown at `end` is all of it: the reloaded page
    draws the snapshot and follows after its `last_seq`, adding nothing twice."""
    model.push(Reply(text=ANSWER, tokens_per_s=15, chunk_chars=4))
    page = open_page(alice[0])
    send(page, "stream slowly")
    wait_streaming_text(page, 40)
    run_id = Run.objects.get(owner=alice[0]).pk
    before_reload = seen(page, run_id)
    page.reload()
    expect(page.get_by_test_id("app")).to_have_attribute("data-ready", "true")
    wait_streaming_text(page, 41)  # the snapshot, then the live tail
    assert wait_settled(page) == run_id
    assert_saw_exact(before_reload, run_id, ended=False)
    assert_saw_exact(seen(page, run_id), run_id)
    expect(last_turn(page).get_by_test_id("assistant-text")).to_have_text(ANSWER)
    expect(page.get_by_test_id("assistant-turn")).to_have_count(1)
    expect(page.get_by_test_id("user-message")).to_have_count(1)
    assert saved_text(run_id) == ANSWER


@pytest.mark.parametrize(
    "ends_while_offline", [True, False], ids=["ends-offline", "back-mid-run"]
)
def test_offline_mid_stream_then_back_completes_exact(
    open_page, alice, model, ends_while_offline
):
    """Offline, the page drops its stream; back online it resumes from its cursor:
    from `events.json` if the run ended meanwhile, else a new stream after it."""
    model.push(
        Reply(text=ANSWER, tokens_per_s=12 if ends_while_offline else 6, chunk_chars=4)
    )
    page = open_page(alice[0])
    send(page, "survive the network")
    wait_streaming_text(page, 30)
    page.context.set_offline(True)
    expect(page.get_by_test_id("connection")).to_contain_text("offline")
    run = Run.objects.get(owner=alice[0])
    if ends_while_offline:
        wait_until(
            lambda: Run.objects.get(pk=run.pk).status == Run.Status.COMPLETED,
            timeout=25,
        )
    else:
        then = Run.objects.get(pk=run.pk).last_seq
        wait_until(lambda: Run.objects.get(pk=run.pk).last_seq >= then + 3, timeout=25)
        assert not Run.objects.get(pk=run.pk).is_terminal
    shown = len(last_turn(page).inner_text())
    page.context.set_offline(False)
    if not ends_while_offline:
        wait_streaming_text(page, shown + 1)  # live again before the end
    wait_settled(page)
    assert_saw_exact(seen(page, run.pk), run.pk)
    expect(page.get_by_test_id("connection")).to_be_hidden()
    expect(last_turn(page).get_by_test_id("assistant-text")).to_have_text(ANSWER)
    assert saved_text(run.pk) == ANSWER


def test_flaky_stream_connection_loses_and_doubles_nothing(open_page, alice, model):
    """The tab's own EventSource (a browser without SharedWorker):
    First stream request: 503 (EventSource gives up; the page re-attaches).
    Second: cut after a few frames (EventSource reconnects with Last-Event-ID).
    Third: the real stream, which must resume right after the last frame shown.
    (`test_flaky_shared_stream_loses_and_doubles_nothing` does the same to the
    shared worker's stream, which Playwright's routes cannot see.)"""
    model.push(Reply(text=ANSWER, tokens_per_s=60, chunk_chars=4))
    page = open_page(alice[0])
    page.add_init_script(WITHOUT_SHARED_WORKER)
    page.add_init_script(RECORD_SSE_FRAMES)
    page.reload()
    calls = []

    def flaky(route):
        calls.append(route.request.url)
        if len(calls) == 1:
            route.fulfill(status=503, body="busy")
        elif len(calls) == 2:
            frames = route.fetch().text().split("\n\n")  # the whole run, once ended
            third_token = [i for i, f in enumerate(frames) if "event: token" in f][2]
            route.fulfill(
                status=200,
                headers={"Content-Type": "text/event-stream"},
                body="\n\n".join(frames[: third_token + 1]) + "\n\n",
            )
        else:
            route.continue_()

    page.route("**/api/runs/*/events/**", flaky)
    expect(page.get_by_test_id("app")).to_have_attribute("data-ready", "true")
    send(page, "flaky network")
    run_id = wait_settled(page)
    assert_saw_exact(seen(page, run_id), run_id)
    expect(last_turn(page).get_by_test_id("assistant-text")).to_have_text(ANSWER)
    assert saved_text(run_id) == ANSWER
    assert len(calls) == 3 and all("after_seq" not in url for url in calls)
    # Every seq reached the page exactly once over the wire: the browser's own
    # reconnect sent Last-Event-ID (Playwright does not show that header) and
    # the server resumed right after the cut, not from the start.
    seqs = page.evaluate("window.__sseSeqs")
    assert seqs == list(range(1, Run.objects.get(pk=run_id).last_seq + 1))


def test_stop_cancels_and_the_next_message_works(open_page, alice, model):
    model.push(Reply(text=LONG, stall_after_chars=24), Reply(text="Back again."))
    page = open_page(alice[0])
    send(page, "stall please")
    wait_streaming_text(page, 24)
    page.get_by_test_id("stop").click()
    run_id = wait_settled(page)
    assert_saw_exact(seen(page, run_id), run_id)
    expect(last_turn(page)).to_have_attribute("data-status", "cancelled")
    # In words, not the journal's names ("cancelled (cancelled-by-user)").
    expect(last_turn(page).get_by_test_id("run-outcome")).to_have_text("Stopped")
    assert "cancelled" not in last_turn(page).inner_text()
    assert Run.objects.get(pk=run_id).status == Run.Status.CANCELLED
    expect(last_turn(page).get_by_test_id("assistant-text")).to_have_text(
        LONG[:24].strip()
    )
    expect(page.get_by_test_id("retry")).to_be_visible()

    send(page, "and now?")
    wait_until(lambda: Run.objects.filter(owner=alice[0]).count() == 2)
    expect(page.get_by_test_id("assistant-turn")).to_have_count(2)
    wait_settled(page)
    expect(last_turn(page).get_by_test_id("assistant-text")).to_have_text("Back again.")
    expect(last_turn(page)).to_have_attribute("data-status", "completed")


def test_failed_run_shows_its_error_and_partial_then_retry_works(
    open_page, alice, model
):
    model.push(*[Reply(text=LONG, cut_after_chars=40) for _ in range(4)])
    page = open_page(alice[0])
    send(page, "first question")
    run_id = wait_settled(page)
    assert_saw_exact(seen(page, run_id), run_id)
    turn = last_turn(page)
    expect(turn).to_have_attribute("data-status", "failed")
    expect(turn.get_by_test_id("error-category")).to_have_text(
        "Connection to the model lost"
    )
    expect(turn.get_by_test_id("run-error")).to_have_attribute(
        "data-category", "network"
    )
    expect(turn.get_by_test_id("status")).to_have_count(3)
    expect(turn.get_by_test_id("status").first).to_have_text(
        "The connection to the model dropped (body cut); continuing the answer,"
        " attempt 1 of 3."
    )
    expect(turn.get_by_test_id("run-outcome")).to_have_text(
        "Failed: the model could not finish this answer"
    )
    assert "stream-resume" not in turn.inner_text()
    partial = saved_text(run_id)
    assert partial == LONG[:40] * 4
    # Each kept fragment is its own segment, a resume mark between each two.
    expect(turn.get_by_test_id("assistant-text")).to_have_text([LONG[:40].strip()] * 4)
    expect(turn.get_by_test_id("resume-mark")).to_have_count(3)

    page.reload()  # the error and its category survive a reload
    expect(last_turn(page).get_by_test_id("run-error")).to_have_attribute(
        "data-category", "network"
    )

    # Retry answers the same question again: a new run, no second copy of it,
    # and the model is sent the question without the failed answer, which is
    # kept as the other version of the answer ("1 / 2").
    model.push(Reply(text=ANSWER, tokens_per_s=40, chunk_chars=6))
    page.get_by_test_id("retry").click()
    expect(page.get_by_test_id("assistant-turn")).to_have_count(1)
    wait_streaming_text(page, 10)
    second = wait_settled(page)
    assert second != run_id
    assert_saw_exact(seen(page, second), second)
    expect(last_turn(page).get_by_test_id("assistant-text")).to_have_text(ANSWER)
    expect(last_turn(page).get_by_test_id("branch-label")).to_have_text("2 / 2")
    expect(page.get_by_test_id("user-message")).to_have_text(["first question"])
    expect(page.get_by_test_id("retry")).to_be_hidden()
    assert model.requests[-1].messages == [
        {"role": "user", "content": "first question"}
    ]
    page.reload()  # and so it stays
    expect(page.get_by_test_id("assistant-turn")).to_have_count(1)
    expect(last_turn(page).get_by_test_id("branch-label")).to_have_text("2 / 2")
    expect(page.get_by_test_id("user-message")).to_have_text(["first question"])
