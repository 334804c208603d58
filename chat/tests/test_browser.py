"""The chat page in a real Chromium, against a real server, worker and model server.

Playwright (sync API) drives `/usr/bin/chromium`; the page talks to the
`server` fixture (uvicorn) whose loop also runs the turn worker (`live_worker`),
which streams from the loopback model server (`fake_llm`). Nothing is waited on
by sleeping: every wait is on something the page or the database shows.
"""

import re
import shutil
import threading
from pathlib import Path

import httpx
import pytest
from django.http import JsonResponse
from django.test import Client
from playwright.sync_api import Page, expect, sync_playwright

from chat import sse
from chat.models import ChatSession, Message
from chat.testing.fake_llm import Reply
from hermes_site.testing import wait_until
from journal import metrics
from journal.models import Run

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not shutil.which("chromium"), reason="needs /usr/bin/chromium"),
]

CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
]
SCREENSHOTS = Path(__file__).resolve().parents[2] / "docs" / "screenshots"
WAIT_MS = 30_000  # a whole run, with its retries, fits well inside this

ANSWER = (
    "Durable streams keep every word. The worker journals each chunk before any "
    "reader sees it, and every reader replays the journal from its cursor before it "
    "follows the live tail. A reload, a second tab or a phone that slept all end "
    "with the same text, with nothing lost and nothing said twice."
)
LONG = "The quick brown fox jumps over the lazy dog. " * 8

expect.set_options(timeout=WAIT_MS)


@pytest.fixture(autouse=True)
def _orm_beside_playwright(monkeypatch):
    """Playwright's sync API keeps an event loop running in this thread, which
    Django's async-safety check mistakes for async code calling the ORM."""
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")


@pytest.fixture(scope="module")
def browser():
    """One Chromium for this module. Not longer: while Playwright runs, its loop
    counts as running in this thread, and later modules' ORM calls would fail."""
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(
            executable_path=shutil.which("chromium"), args=CHROMIUM_ARGS
        )
        yield chromium
        chromium.close()


@pytest.fixture
def open_page(browser, server):
    """`open_page(user, path="/", **context_options)` -> a signed-in page, ready.

    `tab_of=page` opens another tab of that page's browser (its context: same
    cookies, same SharedWorker) instead of a new browser. Uncaught page errors
    fail the test.
    """
    contexts, errors = [], []

    def make(user, path: str = "/", *, tab_of: Page | None = None, **options) -> Page:
        if tab_of is not None:
            context = tab_of.context
        else:
            client = Client()
            client.force_login(user)
            context = browser.new_context(base_url=server.url, **options)
            context.add_cookies(
                [
                    {
                        "name": "sessionid",
                        "value": client.cookies["sessionid"].value,
                        "url": server.url,
                    }
                ]
            )
            contexts.append(context)
        page = context.new_page()
        page.on("pageerror", lambda error: errors.append(str(error)))
        page.goto(path)
        expect(page.get_by_test_id("app")).to_have_attribute("data-ready", "true")
        return page

    yield make
    for context in contexts:
        context.close()
    assert not errors, errors


@pytest.fixture
def model(fake_llm, live_worker):
    """The loopback model server, with a worker running turns against it."""
    return fake_llm


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
    return int(re.search(r"^id: [^:\n]+:(\d+)$", sse_text, re.MULTILINE).group(1))


def saved_text(run_id: str) -> str:
    """The run's answer as the session keeps it: its assistant messages, in order."""
    return "".join(
        Message.objects.filter(run_id=run_id, role="assistant")
        .order_by("id")
        .values_list("content", flat=True)
    )


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
    model.push(Reply(text=ANSWER, tokens_per_s=15, chunk_chars=4))
    page = open_page(alice[0])
    send(page, "stream slowly")
    wait_streaming_text(page, 40)
    page.reload()
    expect(page.get_by_test_id("app")).to_have_attribute("data-ready", "true")
    wait_streaming_text(page, 41)  # the snapshot, then the live tail
    run_id = wait_settled(page)
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
        seen = Run.objects.get(pk=run.pk).last_seq
        wait_until(lambda: Run.objects.get(pk=run.pk).last_seq >= seen + 3, timeout=25)
        assert not Run.objects.get(pk=run.pk).is_terminal
    shown = len(last_turn(page).inner_text())
    page.context.set_offline(False)
    if not ends_while_offline:
        wait_streaming_text(page, shown + 1)  # live again before the end
    wait_settled(page)
    expect(page.get_by_test_id("connection")).to_be_hidden()
    expect(last_turn(page).get_by_test_id("assistant-text")).to_have_text(ANSWER)
    assert saved_text(run.pk) == ANSWER


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
    expect(last_turn(page).get_by_test_id("assistant-text")).to_have_text(ANSWER)
    assert saved_text(run_id) == ANSWER
    assert len(calls) == 3 and all("after_seq" not in url for url in calls)
    # Every seq reached the page exactly once over the wire: the browser's own
    # reconnect sent Last-Event-ID (Playwright does not show that header) and
    # the server resumed right after the cut, not from the start.
    seqs = page.evaluate("window.__sseSeqs")
    assert seqs == list(range(1, Run.objects.get(pk=run_id).last_seq + 1))


def test_second_tab_opened_mid_run_shows_the_same_final_text(open_page, alice, model):
    model.push(Reply(text=ANSWER, tokens_per_s=20, chunk_chars=4))
    first = open_page(alice[0])
    send(first, "two tabs")
    wait_streaming_text(first, 20)
    session = ChatSession.objects.get(owner=alice[0])
    second = open_page(alice[0], f"/c/{session.pk}/")
    expect(second.get_by_test_id("session-running")).to_be_visible()
    for page in (first, second):
        wait_settled(page)
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
        wait_settled(page)
        expect(last_turn(page).get_by_test_id("assistant-text")).to_have_text(
            "Told by the notification stream."
        )
        expect(page.get_by_test_id("assistant-turn")).to_have_count(2)


def test_stop_cancels_and_the_next_message_works(open_page, alice, model):
    model.push(Reply(text=LONG, stall_after_chars=24), Reply(text="Back again."))
    page = open_page(alice[0])
    send(page, "stall please")
    wait_streaming_text(page, 24)
    page.get_by_test_id("stop").click()
    run_id = wait_settled(page)
    expect(last_turn(page)).to_have_attribute("data-status", "cancelled")
    expect(last_turn(page).get_by_test_id("run-outcome")).to_contain_text("cancelled")
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
    turn = last_turn(page)
    expect(turn).to_have_attribute("data-status", "failed")
    expect(turn.get_by_test_id("error-category")).to_have_text("network")
    expect(turn.get_by_test_id("status")).to_have_count(3)
    expect(turn.get_by_test_id("status").first).to_contain_text(
        "Retry attempt: stream-resume 1/3"
    )
    partial = saved_text(run_id)
    assert partial == LONG[:40] * 4
    expect(turn.get_by_test_id("assistant-text")).to_have_text(partial.strip())

    page.reload()  # the error and its category survive a reload
    expect(last_turn(page).get_by_test_id("error-category")).to_have_text("network")

    model.push(Reply(text="Second answer."))
    page.get_by_test_id("retry").click()
    expect(page.get_by_test_id("assistant-turn")).to_have_count(2)
    second = wait_settled(page)
    assert second != run_id
    expect(last_turn(page).get_by_test_id("assistant-text")).to_have_text(
        "Second answer."
    )
    expect(page.get_by_test_id("user-message")).to_have_text(["first question"] * 2)
    expect(page.get_by_test_id("retry")).to_be_hidden()


def test_model_output_cannot_run_script(open_page, alice, model):
    hostile = (
        "Look: <img src=x onerror=window.__pwned=1> and "
        "<script>window.__pwned=1</script> and [a link](javascript:window.__pwned=1) "
        'and <a href="#" onclick="window.__pwned=1">click</a> done.'
    )
    model.push(Reply(text=hostile))
    page = open_page(alice[0])
    send(page, "<img src=y onerror=window.__pwned=2>")  # the user's own text too
    wait_settled(page)
    expect(last_turn(page).get_by_test_id("assistant-text")).to_contain_text("done.")
    expect(page.get_by_test_id("user-message")).to_have_text(
        "<img src=y onerror=window.__pwned=2>"
    )
    page.locator("[data-testid=assistant-text] a").last.click()
    page.locator("[data-testid=assistant-text] a").first.click(modifiers=[])
    assert page.evaluate("typeof window.__pwned") == "undefined"
    hostile_nodes = page.evaluate(
        """() => document.querySelector('[data-testid=messages]').querySelectorAll(
            'script, [onerror], [onclick], a[href^="javascript"]').length"""
    )
    assert hostile_nodes == 0
    page.reload()  # drawn from the saved message: still inert
    expect(page.get_by_test_id("app")).to_have_attribute("data-ready", "true")
    expect(last_turn(page).get_by_test_id("assistant-text")).to_contain_text("done.")
    assert page.evaluate("typeof window.__pwned") == "undefined"


def test_other_users_sessions_are_invisible(open_page, server, alice, bob, model):
    secret = ChatSession.objects.create(owner=alice[0], title="Alice's secret plans")
    page = open_page(bob[0])
    expect(page.get_by_test_id("session-empty")).to_be_visible()
    expect(page.get_by_test_id("session-item")).to_have_count(0)
    page.get_by_test_id("session-search").fill("secret")
    expect(page.get_by_test_id("session-item")).to_have_count(0)

    stranger = open_page(bob[0], f"/c/{secret.pk}/")
    expect(stranger.get_by_test_id("composer-error")).to_contain_text("does not exist")
    expect(stranger.get_by_test_id("session-title")).to_have_text("New chat")
    assert "secret plans" not in stranger.content()

    api = httpx.get(f"{server.url}/api/sessions/{secret.pk}/", headers=bob[1])
    assert api.status_code == 404
    mine = open_page(alice[0])
    expect(mine.get_by_test_id("session-name")).to_have_text("Alice's secret plans")


def test_sidebar_rename_search_delete(open_page, alice, model):
    model.push(Reply(text="First."), Reply(text="Second."))
    page = open_page(alice[0])
    send(page, "alpha chat")
    wait_settled(page)
    page.get_by_test_id("new-session").click()
    expect(page.get_by_test_id("empty-state")).to_be_visible()
    send(page, "beta chat")
    wait_settled(page)
    expect(page.get_by_test_id("session-item")).to_have_count(2)

    item = page.get_by_test_id("session-item").filter(has_text="beta chat")
    item.get_by_test_id("session-rename").click()
    page.get_by_test_id("rename-input").fill("Renamed beta")
    page.get_by_test_id("rename-input").press("Enter")
    expect(page.get_by_test_id("session-title")).to_have_text("Renamed beta")
    expect(
        page.get_by_test_id("session-name").filter(has_text="Renamed beta")
    ).to_have_count(1)

    page.get_by_test_id("session-search").fill("alpha")
    expect(page.get_by_test_id("session-item")).to_have_count(1)
    page.get_by_test_id("session-search").fill("")
    expect(page.get_by_test_id("session-item")).to_have_count(2)

    page.once("dialog", lambda dialog: dialog.accept())
    page.get_by_test_id("session-item").filter(has_text="Renamed beta").get_by_test_id(
        "session-delete"
    ).click()
    expect(page.get_by_test_id("session-item")).to_have_count(1)
    expect(page.get_by_test_id("empty-state")).to_be_visible()
    assert list(
        ChatSession.objects.filter(owner=alice[0]).values_list("title", flat=True)
    ) == ["alpha chat"]


def test_tool_card_model_picker_and_system_prompt(open_page, alice, model):
    calc = {"id": "call_1", "name": "calculator", "arguments": '{"expression": "6*7"}'}
    model.push(
        Reply(text="Let me compute.", tool_calls=[calc]), Reply(text="It is 42.")
    )
    page = open_page(alice[0])
    page.get_by_test_id("model-picker").select_option("other-model")
    page.get_by_test_id("settings").locator("summary").click()
    page.get_by_test_id("system-prompt").fill("Answer in numbers.")
    page.get_by_test_id("save-settings").click()  # no chat yet: kept for the new one
    expect(page.get_by_test_id("settings-saved")).to_be_visible()
    send(page, "what is 6*7?")
    wait_settled(page)

    turn = last_turn(page)
    expect(turn.get_by_test_id("assistant-text")).to_have_text(
        ["Let me compute.", "It is 42."]
    )
    card = turn.get_by_test_id("tool-card")
    expect(card.get_by_test_id("tool-name")).to_have_text("calculator")
    expect(card.get_by_test_id("tool-args")).to_contain_text('"expression": "6*7"')
    expect(card.get_by_test_id("tool-result")).to_have_text("42")
    first = model.requests[0]
    assert first.body["model"] == "other-model"
    assert first.messages[0] == {"role": "system", "content": "Answer in numbers."}
    session = ChatSession.objects.get(owner=alice[0])
    assert (session.model, session.system_prompt) == (
        "other-model",
        "Answer in numbers.",
    )


SHOWCASE = """Here is a **Python** function that reads a run's journal:

```python
def replay(run_id: str, after_seq: int = 0) -> list[dict]:
    \"\"\"Every event after the cursor, in order.\"\"\"
    return [e.payload for e in read_after(run_id=run_id, after_seq=after_seq)]
```

- the cursor is the last `seq` a reader applied
- nothing is skipped, nothing is sent twice
"""


@pytest.mark.parametrize(
    ("name", "options"),
    [
        (
            "chat-light",
            {"color_scheme": "light", "viewport": {"width": 1280, "height": 800}},
        ),
        (
            "chat-dark",
            {"color_scheme": "dark", "viewport": {"width": 1280, "height": 800}},
        ),
        (
            "chat-phone",
            {
                "color_scheme": "light",
                "viewport": {"width": 390, "height": 844},
                "device_scale_factor": 2,
                "is_mobile": True,
                "has_touch": True,
            },
        ),
    ],
)
def test_screenshots(open_page, alice, model, name, options):
    usage = {"prompt_tokens": 9, "completion_tokens": 6, "total_tokens": 15}
    model.push(
        Reply(text="Hello! Ask me anything.", usage=usage, tokens_per_s=50),
        Reply(
            text=SHOWCASE,
            reasoning="The user wants an example of reading the journal.",
            tokens_per_s=120,
        ),
    )
    page = open_page(alice[0], **options)
    send(page, "Hi there")
    wait_settled(page)
    send(page, "Show me how a reader replays a run")
    wait_settled(page)
    expect(last_turn(page).locator("pre code.hljs")).to_have_count(1)
    expect(last_turn(page).get_by_test_id("copy-code")).to_be_visible()
    background = page.evaluate("getComputedStyle(document.body).backgroundColor")
    dark = options["color_scheme"] == "dark"
    assert (background == "rgb(22, 24, 28)") is dark, background
    if options["viewport"]["width"] < 760:
        expect(page.get_by_test_id("sidebar")).not_to_be_in_viewport()
        expect(page.get_by_test_id("sidebar-toggle")).to_be_visible()
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / f"{name}.png"))


def test_theme_toggle_pins_dark_and_survives_reload(open_page, alice, model):
    page = open_page(alice[0], color_scheme="light")
    toggle = page.get_by_test_id("theme-toggle")
    expect(toggle).to_have_text("Theme: auto")
    toggle.click()
    expect(toggle).to_have_text("Theme: light")
    toggle.click()
    expect(toggle).to_have_text("Theme: dark")
    assert (
        page.evaluate("getComputedStyle(document.body).backgroundColor")
        == "rgb(22, 24, 28)"
    )
    page.reload()
    expect(page.locator("html")).to_have_attribute("data-theme", "dark")


# --- tabs of one browser share their streaming connections -------------------------


class StreamMeter:
    """The streaming connections the server holds, and their peaks: run readers
    (`journal.metrics.SUBSCRIPTIONS`, readers inside `journal.subscribe`) and
    `/api/stream/` readers (counted around `chat.sse._notifications`)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.notes = 0
        self.peak_notes = 0
        self.peak_runs = 0

    @property
    def runs(self) -> int:
        return metrics.SUBSCRIPTIONS.value

    def reset_peaks(self) -> None:
        with self.lock:
            self.peak_notes, self.peak_runs = self.notes, self.runs


@pytest.fixture
def stream_meter(monkeypatch):
    wait_until(lambda: metrics.SUBSCRIPTIONS.value == 0)  # earlier tests' readers gone
    meter = StreamMeter()
    gauge_inc = metrics.SUBSCRIPTIONS.inc

    def inc(amount: int = 1) -> None:
        gauge_inc(amount)
        with meter.lock:
            meter.peak_runs = max(meter.peak_runs, metrics.SUBSCRIPTIONS.value)

    notifications = sse._notifications

    async def counted(user_id):
        with meter.lock:
            meter.notes += 1
            meter.peak_notes = max(meter.peak_notes, meter.notes)
        try:
            async for chunk in notifications(user_id):
                yield chunk
        finally:
            with meter.lock:
                meter.notes -= 1

    monkeypatch.setattr(metrics.SUBSCRIPTIONS, "inc", inc)
    monkeypatch.setattr(sse, "_notifications", counted)
    return meter


def test_eight_tabs_share_one_run_stream_and_one_notification_stream(
    open_page, alice, model, stream_meter
):
    """Eight tabs of one browser follow a slow run to its exact end on two
    streaming connections: the SharedWorker's notification stream and its one
    stream of the run (a browser allows six per host; sixteen would hang)."""
    model.push(Reply(text=ANSWER * 2, tokens_per_s=12, chunk_chars=4))
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
    for tab in tabs:
        wait_settled(tab)
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
        wait_settled(tab)
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
    model.push(Reply(text=ANSWER, tokens_per_s=15, chunk_chars=4))
    first = open_page(alice[0])
    send(first, "close me")
    wait_streaming_text(first, 20)
    session = ChatSession.objects.get(owner=alice[0])
    others = [open_page(alice[0], f"/c/{session.pk}/", tab_of=first) for _ in range(2)]
    for tab in others:
        expect(last_turn(tab)).to_have_attribute("data-streaming", "true")
    first.close()
    for tab in others:
        wait_settled(tab)
        expect(last_turn(tab).get_by_test_id("assistant-text")).to_have_text(ANSWER)
    assert stream_meter.peak_runs == 1

    model.push(Reply(text=LONG, tokens_per_s=10, chunk_chars=4))
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

    async def cut_once(run_id, after_seq, unusable_reason):
        call = {"after": after_seq, "seqs": []}
        calls.append(call)
        tokens = 0
        async for chunk in frames(run_id, after_seq, unusable_reason):
            for frame in chunk.split("\n\n")[:-1]:
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
    expect(last_turn(page).get_by_test_id("assistant-text")).to_have_text(ANSWER)
    assert saved_text(run_id) == ANSWER
    assert len(calls) == 3 and calls[0] is None, calls
    cut, resumed = calls[1], calls[2]
    assert cut["after"] == 0 and len(cut["seqs"]) >= 3
    assert resumed["after"] == cut["seqs"][-1]  # Last-Event-ID, not the start
    last_seq = Run.objects.get(pk=run_id).last_seq
    assert cut["seqs"] + resumed["seqs"] == list(range(1, last_seq + 1))
    assert stream_meter.peak_runs == 1


# The page's SharedWorker runs another script: one that fails to load, or one
# that loads and never answers (a module that only exports a function).
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
        wait_settled(page)
        expect(last_turn(page).get_by_test_id("assistant-text")).to_have_text(ANSWER)
    assert (stream_meter.peak_runs, stream_meter.peak_notes) == (2, 2)
