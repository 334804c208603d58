"""Several tabs of one browser follow the same runs, sharing their streaming
connections through the SharedWorker, or each on its own without one.

Each tab's live text is checked as the user saw it, before the redraw from
saved messages (`hermes_testing.browser.assert_saw_exact`, see
test_streaming.py). A tab that joins a running run draws its snapshot and
follows after the snapshot's `last_seq`: with the page planted to attach from
seq 0 instead (`afterSeq = 0` in `ChatController.#attach`), the second-tab and
eight-tab tests fail on the doubled text; they passed with it before.
"""

import threading

import pytest
from django.http import JsonResponse
from playwright.sync_api import expect

from chat import sse
from chat.models import ChatSession
from hermes_testing.browser import (
    ANSWER,
    LONG,
    PYTESTMARK,
    WITHOUT_SHARED_WORKER,
    assert_saw_exact,
    last_turn,
    saved_text,
    seen,
    send,
    seq_of,
    wait_settled,
    wait_streaming_text,
)
from hermes_testing.fake_llm import Reply
from hermes_testing.harness import wait_until
from journal.models import Run

pytestmark = PYTESTMARK


def test_second_tab_opened_mid_run_shows_the_same_final_text(open_page, alice, model):
    # Slow enough (about 15 s) that the second tab opens while the run streams,
    # even on a loaded machine.
    model.push(Reply(text=ANSWER, tokens_per_s=5, chunk_chars=4))
    first = open_page(alice[0])
    send(first, "two tabs")
    wait_streaming_text(first, 20)
    session = ChatSession.objects.get(owner=alice[0])
    second = open_page(alice[0], f"/c/{session.pk}/")
    expect(second.get_by_test_id("session-running")).to_be_visible()
    for page in (first, second):
        run_id = wait_settled(page)
        assert_saw_exact(seen(page, run_id), run_id)
        expect(last_turn(page).get_by_test_id("assistant-text")).to_have_text(ANSWER)
        expect(page.get_by_test_id("session-running")).to_be_hidden()

    # A run started in one tab is followed by the other, told by /api/stream/.
    model.push(Reply(text="Told by the notification stream.", tokens_per_s=20))
    send(second, "and the other way round")
    expect(first.get_by_test_id("session-running")).to_be_visible()
    expect(first.get_by_test_id("user-message").last).to_have_text(
        "and the other way round"
    )
    for page in (first, second):
        run_id = wait_settled(page)
        assert_saw_exact(seen(page, run_id), run_id, may_miss=page is first)
        expect(last_turn(page).get_by_test_id("assistant-text")).to_have_text(
            "Told by the notification stream."
        )
        expect(page.get_by_test_id("assistant-turn")).to_have_count(2)


def _held(text: str, go_on: threading.Event, *, after_chunks: int, **pace) -> Reply:
    """A reply that streams `after_chunks` chunks, then waits for `go_on`."""
    return Reply(
        text=text, chunk_chars=4, hold_after_chunks=after_chunks, hold=go_on, **pace
    )


def test_eight_tabs_share_one_run_stream_and_one_notification_stream(
    open_page, alice, model, stream_meter
):
    """Eight tabs of one browser follow a slow run to its exact end on two
    streaming connections: the SharedWorker's notification stream and its one
    stream of the run (a browser allows six per host; sixteen would hang)."""
    # The model holds after ten chunks until all eight tabs have joined, so
    # each joins mid-run however long opening a tab takes.
    all_joined = threading.Event()
    model.push(_held(ANSWER * 2, all_joined, after_chunks=10, tokens_per_s=20))
    first = open_page(alice[0])
    send(first, "eight tabs")
    wait_streaming_text(first, 10)
    session = ChatSession.objects.get(owner=alice[0])
    tabs = [first]
    for _ in range(7):
        tab = open_page(alice[0], f"/c/{session.pk}/", tab_of=first)
        expect(last_turn(tab)).to_have_attribute("data-streaming", "true")
        tabs.append(tab)
    run = Run.objects.get(owner=alice[0])
    assert not Run.objects.get(pk=run.pk).is_terminal  # all eight joined mid-run
    all_joined.set()
    for tab in tabs:
        assert wait_settled(tab) == run.pk
        assert_saw_exact(seen(tab, run.pk), run.pk)
        expect(last_turn(tab).get_by_test_id("assistant-text")).to_have_text(ANSWER * 2)
        expect(tab.get_by_test_id("assistant-turn")).to_have_count(1)
        expect(tab.get_by_test_id("session-running")).to_be_hidden()
    assert saved_text(run.pk) == ANSWER * 2
    assert (stream_meter.peak_runs, stream_meter.peak_notes) == (1, 1)
    # The run's stream closes after `end`; the notification stream stays, one.
    wait_until(lambda: stream_meter.runs == 0)
    assert stream_meter.notes == 1

    # Still one stream each for the next run, started from another tab.
    stream_meter.reset_peaks()
    model.push(Reply(text="Everyone hears this.", tokens_per_s=20))
    send(tabs[5], "and again")
    for tab in tabs:
        expect(tab.get_by_test_id("user-message").last).to_have_text("and again")
        run_id = wait_settled(tab)
        assert_saw_exact(seen(tab, run_id), run_id, may_miss=tab is not tabs[5])
        expect(last_turn(tab).get_by_test_id("assistant-text")).to_have_text(
            "Everyone hears this."
        )
    assert (stream_meter.peak_runs, stream_meter.peak_notes) == (1, 1)


def test_tab_closed_mid_run_leaves_the_others_streaming(
    open_page, alice, model, stream_meter
):
    """The tab whose watch opened the shared run stream closes mid-run: the
    others go on to the exact end. Next run: a tab closes (its `pagehide` says
    `bye`) and the last two leave the run for a blank new chat: the worker
    closes the run's stream at once while the run goes on, and a tab coming
    back resumes from its cursor."""
    # Each run holds (`_held`) until the tabs have done what happens mid-run.
    first_closed = threading.Event()
    model.push(_held(ANSWER, first_closed, after_chunks=8, tokens_per_s=15))
    first = open_page(alice[0])
    send(first, "close me")
    wait_streaming_text(first, 20)
    session = ChatSession.objects.get(owner=alice[0])
    others = [open_page(alice[0], f"/c/{session.pk}/", tab_of=first) for _ in range(2)]
    for tab in others:
        expect(last_turn(tab)).to_have_attribute("data-streaming", "true")
    first.close()
    first_closed.set()
    for tab in others:
        run_id = wait_settled(tab)
        assert_saw_exact(seen(tab, run_id), run_id)
        expect(last_turn(tab).get_by_test_id("assistant-text")).to_have_text(ANSWER)
    assert stream_meter.peak_runs == 1

    all_left = threading.Event()
    model.push(_held(LONG, all_left, after_chunks=6, tokens_per_s=10))
    send(others[0], "leave it running")
    wait_until(lambda: Run.objects.filter(owner=alice[0]).count() == 2)
    run = Run.objects.filter(owner=alice[0]).latest("created_at")
    closing = open_page(alice[0], f"/c/{session.pk}/", tab_of=others[0])
    for tab in [*others, closing]:
        wait_streaming_text(tab, 10)
    closing.close()
    for tab in others:
        tab.get_by_test_id("new-session").click()
        expect(tab.get_by_test_id("empty-state")).to_be_visible()
    # Long before a silent port's 30 s: the closed tab said `bye`.
    wait_until(lambda: stream_meter.runs == 0, timeout=5)
    assert not Run.objects.get(pk=run.pk).is_terminal
    assert stream_meter.notes == 1
    all_left.set()
    back = others[1]
    back.get_by_test_id("session-link").first.click()
    wait_settled(back)
    expect(last_turn(back).get_by_test_id("assistant-text")).to_have_text(LONG.strip())
    expect(back.get_by_test_id("assistant-turn")).to_have_count(2)
    assert saved_text(run.pk) == LONG
    assert stream_meter.peak_runs == 1


def test_flaky_shared_stream_loses_and_doubles_nothing(
    open_page, alice, model, stream_meter, monkeypatch
):
    """The shared worker's run stream, broken on the server side (Playwright's
    routes do not see a SharedWorker's requests): the first request answers
    503 (the worker's EventSource gives up; the tab re-watches after its
    status check), the second is cut after three tokens (the browser
    reconnects with Last-Event-ID), the third must resume right after the cut.
    Over the wire every seq is sent once, and the tab shows the exact text."""
    model.push(Reply(text=ANSWER, tokens_per_s=30, chunk_chars=4))
    calls = []  # per run stream request: None for the 503, else its cursor and seqs
    authorize, frames = sse._authorize, sse._frames

    def busy_once(request, run_id):
        if not calls:
            calls.append(None)
            return None, JsonResponse({"error": "busy"}, status=503)
        return authorize(request, run_id)

    async def cut_once(run_id, after_seq, note):
        call = {"after": after_seq, "seqs": []}
        calls.append(call)
        tokens = 0
        async for chunk in frames(run_id, after_seq, note):
            text = chunk.decode() if isinstance(chunk, bytes) else chunk
            for frame in text.split("\n\n")[:-1]:
                if frame.startswith("id: "):  # a journaled event, not a comment
                    call["seqs"].append(seq_of(frame))
                    tokens += "\nevent: token\n" in frame
                yield f"{frame}\n\n"
                if len(calls) == 2 and tokens == 3:
                    return  # the connection drops mid-run

    monkeypatch.setattr(sse, "_authorize", busy_once)
    monkeypatch.setattr(sse, "_frames", cut_once)
    page = open_page(alice[0])
    send(page, "flaky shared stream")
    run_id = wait_settled(page)
    assert_saw_exact(seen(page, run_id), run_id)
    expect(last_turn(page).get_by_test_id("assistant-text")).to_have_text(ANSWER)
    assert saved_text(run_id) == ANSWER
    assert len(calls) == 3 and calls[0] is None, calls
    cut, resumed = calls[1], calls[2]
    assert cut["after"] == 0 and len(cut["seqs"]) >= 3
    assert resumed["after"] == cut["seqs"][-1]  # Last-Event-ID, not the start
    last_seq = Run.objects.get(pk=run_id).last_seq
    assert cut["seqs"] + resumed["seqs"] == list(range(1, last_seq + 1))
    assert stream_meter.peak_runs == 1


OTHER_SHARED_WORKER = """
(() => {
  const Real = window.SharedWorker;
  window.SharedWorker = function (url, options) {
    return new Real("/static/hermes/js/%s", options);
  };
})();
"""


@pytest.mark.parametrize(
    "script",
    [
        WITHOUT_SHARED_WORKER,
        OTHER_SHARED_WORKER % "no-such-worker.js",
        OTHER_SHARED_WORKER % "clipboard.js",
    ],
    ids=["no-shared-worker", "worker-fails", "worker-silent"],
)
def test_without_a_working_shared_worker_each_tab_streams_by_itself(
    open_page, alice, model, stream_meter, script
):
    """No SharedWorker, one that fails to start, or one that never answers a
    hello (given 5 s): every tab falls back to its own two EventSources, and
    still ends with the exact text."""
    model.push(Reply(text=ANSWER, tokens_per_s=20, chunk_chars=4))
    session = ChatSession.objects.create(owner=alice[0], title="Every tab for itself")
    first = open_page(alice[0], f"/c/{session.pk}/")
    first.context.add_init_script(script)
    first.reload()
    expect(first.get_by_test_id("app")).to_have_attribute("data-ready", "true")
    wait_until(lambda: stream_meter.notes == 1)  # the page's own, not a worker's
    second = open_page(alice[0], f"/c/{session.pk}/", tab_of=first)
    wait_until(lambda: stream_meter.notes == 2)
    stream_meter.reset_peaks()
    send(first, "every tab for itself")
    expect(second.get_by_test_id("user-message")).to_have_text("every tab for itself")
    for page in (first, second):
        run_id = wait_settled(page)
        assert_saw_exact(seen(page, run_id), run_id, may_miss=page is second)
        expect(last_turn(page).get_by_test_id("assistant-text")).to_have_text(ANSWER)
    assert (stream_meter.peak_runs, stream_meter.peak_notes) == (2, 2)
