"""Helpers of the browser tests (chat/tests/browser/): the page's waits, the
texts the model streams, and a recorder of what the user saw on screen.

Playwright (sync API) drives Chromium; the fixtures that use these live in
`chat/tests/browser/conftest.py`. Nothing here waits by sleeping: every wait
is on something the page or the database shows.
"""

import importlib
import json
import os
import re
import shutil
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from django.templatetags.static import static
from playwright.sync_api import Page, expect

from chat.models import Message
from journal import metrics
from journal.models import Event

CHROMIUM = shutil.which("chromium")
# A machine without Chromium skips these, except in CI (CI=true), where the
# `browser` fixture fails instead: a CI run must not pass without them.
PYTESTMARK = [
    pytest.mark.browser,
    pytest.mark.skipif(
        not CHROMIUM and not os.environ.get("CI"), reason="needs /usr/bin/chromium"
    ),
]

CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
]
# `make test` leaves the git tree as it found it: pictures go under var/ (ignored).
# `make screenshots` points this at docs/screenshots/ to refresh the README's.
SCREENSHOTS = Path(
    os.environ.get("HERMES_SCREENSHOTS_DIR")
    or Path(__file__).resolve().parents[1] / "var" / "screenshots"
)
WAIT_MS = 30_000  # a whole run, with its retries, fits well inside this

ANSWER = (
    "Durable streams keep every word. The worker journals each chunk before any "
    "reader sees it, and every reader replays the journal from its cursor before it "
    "follows the live tail. A reload, a second tab or a phone that slept all end "
    "with the same text, with nothing lost and nothing said twice."
)
LONG = "The quick brown fox jumps over the lazy dog. " * 8

# Records the seq of every journaled frame any EventSource of the page receives.
RECORD_SSE_FRAMES = """
(() => {
  const Native = window.EventSource;
  const types = ["start", "token", "reasoning", "status", "usage", "end"];
  window.__sseSeqs = [];
  window.EventSource = class extends Native {
    constructor(url, options) {
      super(url, options);
      for (const type of types) {
        this.addEventListener(type, (e) => {
          window.__sseSeqs.push(Number(e.lastEventId.split(":").pop()));
        });
      }
    }
  };
})();
"""

WITHOUT_SHARED_WORKER = "delete window.SharedWorker;"

# What the user saw of each live turn, recorded into `window.__seen` from the
# first paint of the document: `{run, text, end}` each time the text on screen
# of a streaming turn (`data-streaming=true`) changes, and one `end: true`
# entry when the page handles the run's `end` (the turn's `data-streaming`
# goes from "true" to "false"; `TurnView.setStreaming` renders what is pending
# first). The page redraws the turn from saved messages only later (after a
# fetch, in another task): those redrawn turns never stream, so they are not
# recorded, and a wrong live text cannot hide behind the redraw.
RECORD_SEEN = """
(() => {
  window.__seen = [];
  const last = new Map();
  const texts = "[data-testid=assistant-text]";
  const textOf = (turn) =>
    Array.from(turn.querySelectorAll(texts), (node) => node.innerText).join("");
  const record = (turn, end) => {
    const run = turn.dataset.runId || "";
    const text = textOf(turn);
    if (!end && last.get(turn) === text) return;
    last.set(turn, text);
    window.__seen.push({ run, text, end });
  };
  new MutationObserver((records) => {
    for (const r of records) {
      const turn = r.target;
      if (r.type === "attributes" && r.oldValue === "true"
          && turn.dataset.testid === "assistant-turn"
          && turn.dataset.streaming === "false") {
        record(turn, true);
      }
    }
    const live = "[data-testid=assistant-turn][data-streaming=true]";
    for (const turn of document.querySelectorAll(live)) record(turn, false);
  }).observe(document, {
    subtree: true,
    childList: true,
    characterData: true,
    attributes: true,
    attributeFilter: ["data-streaming"],
    attributeOldValue: true,
  });
})();
"""

# Every text the connection banner showed, into `window.__banners`: a banner
# shown for half a second can come and go between two polls of a busy test.
RECORD_BANNERS = """
(() => {
  window.__banners = [];
  new MutationObserver(() => {
    const banner = document.querySelector("[data-testid=connection]");
    const text = banner && !banner.hidden ? banner.textContent : "";
    if (text && window.__banners.at(-1) !== text) window.__banners.push(text);
  }).observe(document, {
    subtree: true,
    childList: true,
    characterData: true,
    attributes: true,
    attributeFilter: ["hidden"],
  });
})();
"""


@contextmanager
def orm_in_this_thread() -> Iterator[None]:
    """Let this thread (the test's) use the ORM while Playwright runs.

    Playwright's sync API keeps its event loop running in the thread that
    drives the browser, and Django's async-safety check takes that loop for
    async code calling the ORM. The check is lifted for this thread only:
    the server's threads and event loop keep it (unlike
    `DJANGO_ALLOW_ASYNC_UNSAFE`, which would lift it for the whole process).
    """
    checks = importlib.import_module("django.utils.asyncio")
    name = "get_running_loop"  # what its `async_unsafe` asks
    exempt = threading.get_ident()
    real = getattr(checks, name)

    def running_loop():
        if threading.get_ident() == exempt:
            raise RuntimeError("the test thread's ORM calls are synchronous")
        return real()

    setattr(checks, name, running_loop)
    try:
        yield
    finally:
        setattr(checks, name, real)


def send(page: Page, text: str) -> None:
    """Type and send a message; it shows at once, before the server answers."""
    asked = page.get_by_test_id("user-message")
    before = asked.count()
    box = page.get_by_test_id("composer-input")
    box.fill(text)
    box.press("Enter")
    expect(asked).to_have_count(before + 1)


def last_turn(page: Page):
    return page.get_by_test_id("assistant-turn").last


def wait_settled(page: Page) -> str:
    """Wait until the newest question's answer ended and was redrawn from saved
    messages (the page marks the run it settled last); its run id."""
    page.wait_for_function(
        """() => {
            const box = document.querySelector('[data-testid=messages]');
            const turns = box.querySelectorAll('[data-testid=assistant-turn]');
            const users = box.querySelectorAll('[data-testid=user-message]');
            const last = turns[turns.length - 1];
            const asked = users[users.length - 1];
            if (!last || !last.dataset.runId) return false;
            const following = Node.DOCUMENT_POSITION_FOLLOWING;
            const after = !asked || asked.compareDocumentPosition(last) & following;
            return after && box.dataset.settled === last.dataset.runId;
        }""",
        timeout=WAIT_MS,
    )
    return last_turn(page).get_attribute("data-run-id")


def wait_streaming_text(page: Page, at_least: int) -> None:
    """Wait until the live turn shows `at_least` characters and still streams."""
    page.wait_for_function(
        """(n) => {
            const turns = document.querySelectorAll('[data-testid=assistant-turn]');
            const turn = turns[turns.length - 1];
            return turn && turn.dataset.streaming === 'true'
                && turn.innerText.length >= n;
        }""",
        arg=at_least,
        timeout=WAIT_MS,
    )


def seq_of(sse_text: str) -> int:
    """The seq of the first `id: <run>:<seq>` line of SSE text."""
    match = re.search(r"^id: [^:\n]+:(\d+)$", sse_text, re.MULTILINE)
    assert match, sse_text
    return int(match.group(1))


def saved_text(run_id: str) -> str:
    """The run's answer as the session keeps it: its assistant messages, in order."""
    return "".join(
        Message.objects.filter(run_id=run_id, role="assistant")
        .order_by("id")
        .values_list("content", flat=True)
    )


def journal_text(run_id: str) -> str:
    """The run's answer as its journal has it: its `token` events, in seq order."""
    payloads = (
        Event.objects.filter(run_id=run_id, type="token")
        .order_by("seq")
        .values_list("payload", flat=True)
    )
    return "".join(json.loads(payload)["text"] for payload in payloads)


def seen(page: Page, run_id: str) -> list[dict]:
    """What `RECORD_SEEN` recorded of run `run_id` in this page since it loaded."""
    return [entry for entry in page.evaluate("window.__seen") if entry["run"] == run_id]


def assert_saw_exact(
    entries: list[dict], run_id: str, *, ended: bool = True, may_miss: bool = False
) -> None:
    """Every text the user saw of the live run was a prefix of the journal's
    final text, and (if `ended`) the page showed exactly that text when it
    handled `end`, before it redrew the turn from saved messages.

    `may_miss`: the page may have learnt of the run only after it ended (then
    it drew the saved messages and saw nothing live). Shown text is rendered
    Markdown, so the comparison is of both texts without their trailing
    whitespace (the answers here are plain prose)."""
    final = _visible(journal_text(run_id))
    assert final, run_id
    if may_miss and not entries:
        return
    assert any(not entry["end"] for entry in entries), "never seen streaming"
    for entry in entries:
        assert final.startswith(_visible(entry["text"])), (entry["text"], final)
    ends = [_visible(entry["text"]) for entry in entries if entry["end"]]
    assert ends == ([final] if ended else []), (ends, final)


def _visible(text: str) -> str:
    """Text without its whitespace. What is shown is rendered Markdown: a
    segment's trailing whitespace is not drawn (a segment drawn while its last
    chunk ends in a space shows it, the final render does not), and a resume
    starts a new segment, so where a cut fell after a space the page shows
    none. Every other character is compared, in order."""
    return "".join(text.split())


def page_fold(page: Page, journals: dict[str, list[dict]]) -> dict[str, dict]:
    """Each journal (`[{seq, event, data}]`) folded by the page's own
    `fold.js`, one event at a time: `{name: folded turn}`."""
    folded = page.evaluate(
        """async ([url, journals]) => {
            const { foldEvents } = await import(url);
            const out = {};
            for (const [name, events] of Object.entries(journals)) {
                out[name] = foldEvents(events);
            }
            return JSON.stringify(out);
        }""",
        [static("hermes/js/fold.js"), journals],
    )
    return json.loads(folded)


def journal_events(run_id: str) -> list[dict]:
    """A run's whole journal as `events.json` lists it: `{seq, event, data}`."""
    return [
        {"seq": seq, "event": kind, "data": json.loads(payload)}
        for seq, kind, payload in Event.objects.filter(run_id=run_id)
        .order_by("seq")
        .values_list("seq", "type", "payload")
    ]


class StreamMeter:
    """The streaming connections the server holds, and their peaks: run readers
    (`journal.metrics.SUBSCRIPTIONS`, readers inside `journal.subscribe`) and
    `/api/stream/` readers (counted around `chat.sse._notifications`)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.notes = 0
        self.peak_notes = 0
        self.peak_runs = 0

    @property
    def runs(self) -> int:
        return metrics.subscriptions_active()

    def reset_peaks(self) -> None:
        with self.lock:
            self.peak_notes, self.peak_runs = self.notes, self.runs
