"""The sidebar's running mark and its date groups.

The mark must clear exactly when the run ends, whatever order the page hears
things in: a list fetched while the run was active can be answered after the
run's end was shown (seen under load as a mark that stayed).
"""

from datetime import timedelta
from urllib.parse import urlparse

from django.utils import timezone
from playwright.sync_api import expect

from chat.models import ChatSession
from hermes_testing.browser import (
    LONG,
    PYTESTMARK,
    SCREENSHOTS,
    send,
    wait_settled,
    wait_streaming_text,
)
from hermes_testing.fake_llm import Reply
from hermes_testing.harness import wait_until
from journal.models import Run

pytestmark = PYTESTMARK


def _is_list(url: str) -> bool:
    return urlparse(url).path == "/api/sessions/"


def test_running_mark_clears_when_a_stale_list_comes_after_the_end(
    open_page, alice, model
):
    model.push(Reply(text="Hello."), Reply(text=LONG, stall_after_chars=24))
    page = open_page(alice[0])
    send(page, "first")
    wait_settled(page)
    send(page, "stall please")
    wait_streaming_text(page, 24)
    dot = page.get_by_test_id("session-running")
    expect(dot).to_be_visible()
    run_id = Run.objects.filter(owner=alice[0], status=Run.Status.RUNNING).get().pk

    held: list = []

    def hold_first_list(route):
        if route.request.method == "GET" and not held:
            held.append((route, route.fetch()))  # answered now, delivered later
        else:
            route.continue_()

    page.route(_is_list, hold_first_list)
    # A rename is announced to the tab, which fetches its list again.
    item = page.get_by_test_id("session-item")
    item.get_by_test_id("session-rename").click()
    page.get_by_test_id("rename-input").fill("Renamed while running")
    page.get_by_test_id("rename-input").press("Enter")
    wait_until(lambda: page.evaluate("1") and bool(held), timeout=30)
    route, stale = held[0]
    listed = {s["title"]: s["active_run_id"] for s in stale.json()}
    assert listed["Renamed while running"] == run_id  # the list says: running

    page.get_by_test_id("stop").click()
    assert wait_settled(page) == run_id
    expect(dot).to_be_hidden()
    answers = page.get_by_test_id("session-list").get_attribute("data-answers")
    route.fulfill(response=stale)
    expect(page.get_by_test_id("session-list")).not_to_have_attribute(
        "data-answers", answers or ""
    )
    expect(dot).to_be_hidden()
    expect(page.get_by_test_id("session-name")).to_have_text("Renamed while running")


def test_chats_are_grouped_by_date(open_page, alice):
    now = timezone.now()
    midnight = now.replace(hour=0, minute=0, second=0, microsecond=0)
    ages = {
        "chat of today": now,
        "chat of yesterday": midnight - timedelta(hours=1),
        "chat of last week": midnight - timedelta(days=3),
        "chat of last month": midnight - timedelta(days=15),
        "an old chat": midnight - timedelta(days=90),
    }
    for title, when in ages.items():
        session = ChatSession.objects.create(owner=alice[0], title=title)
        ChatSession.objects.filter(pk=session.pk).update(updated_at=when)
    page = open_page(alice[0], timezone_id="UTC")  # the calendar of `midnight`
    listed = page.get_by_test_id("session-list").locator(
        "[data-testid=session-group], [data-testid=session-name]"
    )
    expect(listed).to_have_text(
        [
            "Today",
            "chat of today",
            "Yesterday",
            "chat of yesterday",
            "Previous 7 days",
            "chat of last week",
            "Previous 30 days",
            "chat of last month",
            "Older",
            "an old chat",
        ],
        ignore_case=True,
    )
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.get_by_test_id("sidebar").screenshot(path=str(SCREENSHOTS / "sidebar.png"))
    # Search results keep the headings of what they found.
    page.get_by_test_id("session-search").fill("old")
    expect(listed).to_have_text(["Older", "an old chat"], ignore_case=True)


def test_a_started_note_after_the_finished_one_leaves_no_mark(open_page, alice):
    """The other order the page can hear a short run in: its "finished" note
    first (sent by the worker), its "started" note after (sent by the request
    that queued it). The page's own sidebar is driven as its notes would."""
    session = ChatSession.objects.create(owner=alice[0], title="short run")
    page = open_page(alice[0])
    expect(page.get_by_test_id("session-item")).to_have_count(1)
    shown = page.evaluate(
        """async (id) => {
            const app = document.querySelector("script[type=module]").src;
            const { Sidebar } = await import(new URL("sidebar.js", app));
            const dot = () => !document.querySelector(
                `[data-session-id="${id}"] [data-testid=session-running]`).hidden;
            const bar = new Sidebar({onSelect() {}, onDeleted() {}, onRenamed() {},
                                     onRun() {}});
            await bar.refresh();
            const seen = [];
            bar.setRunning(id, false, "run_short");  // finished, heard first
            bar.setRunning(id, true, "run_short");   // started, heard late
            seen.push(dot());
            bar.setRunning(id, true, "run_next");    // a later run marks it
            seen.push(dot());
            bar.setRunning(id, false, "run_short");  // an old end clears nothing
            seen.push(dot());
            bar.setRunning(id, false, "run_next");
            seen.push(dot());
            return seen;
        }""",
        session.pk,
    )
    assert shown == [False, True, True, False]


def test_a_refresh_keeps_the_row_under_the_pointer_and_the_focus(open_page, alice):
    """A list fetched again (here: a rename in another tab) updates the rows in
    place: a row is the same node after the refresh, so the button with the
    keyboard's focus keeps it (and a row under the pointer its hover, which
    shows its buttons as focus does)."""
    for title in ("first", "second"):
        ChatSession.objects.create(owner=alice[0], title=title)
    page = open_page(alice[0])
    listed = page.get_by_test_id("session-list").locator(
        "[data-testid=session-group], [data-testid=session-name]"
    )
    expect(listed).to_have_text(["Today", "second", "first"], ignore_case=True)
    row = page.get_by_test_id("session-item").filter(has_text="first")
    row.hover()
    pin = row.get_by_test_id("session-pin")
    pin.focus()
    focused = pin.element_handle()

    other = open_page(alice[0], tab_of=page)
    renamed = other.get_by_test_id("session-item").filter(has_text="second")
    renamed.hover()
    renamed.get_by_test_id("session-rename").click()
    other.get_by_test_id("rename-input").fill("second, renamed")
    other.get_by_test_id("rename-input").press("Enter")

    expect(listed).to_have_text(["Today", "second, renamed", "first"], ignore_case=True)
    assert page.evaluate(
        "el => el.isConnected && document.activeElement === el", focused
    )
    expect(pin).to_be_visible()
