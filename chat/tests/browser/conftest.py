"""Fixtures of the browser tests: one Chromium per module, signed-in pages,
the model server with a worker, and a meter of the server's streams.

The helpers these tests share (waits, texts, recorders) are in
`hermes_testing.browser`.
"""

import pytest
from django.test import Client
from playwright.sync_api import Page, expect, sync_playwright

from chat import sse
from hermes_testing.browser import (
    CHROMIUM,
    CHROMIUM_ARGS,
    RECORD_BANNERS,
    RECORD_SEEN,
    WAIT_MS,
    StreamMeter,
    orm_in_this_thread,
)
from hermes_testing.chromium import BoundedChromium
from hermes_testing.harness import wait_until
from journal import metrics

expect.set_options(timeout=WAIT_MS)


@pytest.fixture(autouse=True)
def _orm_beside_playwright():
    """Playwright's sync API keeps an event loop running in this thread, which
    Django's async-safety check mistakes for async code calling the ORM: the
    check is lifted for this thread only, never for the server's."""
    with orm_in_this_thread():
        yield


@pytest.fixture(scope="package")
def chromium():
    """One Chromium for the browser tests (relaunched only if a close hangs:
    `hermes_testing.chromium`). Not longer: while Playwright runs, its loop
    counts as running in this thread, and ORM calls of the tests after this
    package would fail."""
    if CHROMIUM is None:
        pytest.fail("Chromium is missing (`make test` installs Debian's chromium)")
    with sync_playwright() as playwright:
        bounded = BoundedChromium(playwright, CHROMIUM, CHROMIUM_ARGS)
        yield bounded
        bounded.close()


@pytest.fixture
def browser(chromium):
    return chromium.browser


@pytest.fixture
def open_page(chromium, browser, server):
    """`open_page(user, path="/", **context_options)` -> a signed-in page, ready.

    `tab_of=page` opens another tab of that page's browser (its context: same
    cookies, same SharedWorker) instead of a new browser. Every page records
    what the user saw of live turns and of the connection banner
    (`hermes_testing.browser.RECORD_SEEN`, `RECORD_BANNERS`).
    Uncaught page errors fail the test.
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
            context.add_init_script(RECORD_SEEN)
            context.add_init_script(RECORD_BANNERS)
            contexts.append(context)
        page = context.new_page()
        page.on("pageerror", lambda error: errors.append(str(error)))
        page.goto(path)
        expect(page.get_by_test_id("app")).to_have_attribute("data-ready", "true")
        return page

    yield make
    for context in contexts:
        chromium.close_context(context)
    assert not errors, errors


@pytest.fixture
def model(fake_llm, live_worker):
    """The loopback model server, with a worker running turns against it."""
    return fake_llm


@pytest.fixture
def stream_meter(monkeypatch):
    wait_until(
        lambda: metrics.subscriptions_active() == 0
    )  # earlier tests' readers gone
    meter = StreamMeter()
    gauge_inc = metrics.SUBSCRIPTIONS.inc

    def inc(amount: int = 1) -> None:
        gauge_inc(amount)
        with meter.lock:
            meter.peak_runs = max(meter.peak_runs, metrics.subscriptions_active())

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
