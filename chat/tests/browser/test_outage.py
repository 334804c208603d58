"""The chat page through a database outage: it says it is reconnecting and
recovers by itself (an EventSource refused with a 503 never retries alone).

The outage is real on the server's side of the socket: the notification
stream's first database read raises `OperationalError`, which the outage
middleware answers with 503 + Retry-After, as it would while PostgreSQL is down.
"""

import httpx
import pytest
from django.db import OperationalError
from playwright.sync_api import expect

from chat import sse
from hermes_testing.browser import PYTESTMARK, WITHOUT_SHARED_WORKER
from hermes_testing.harness import wait_until

pytestmark = PYTESTMARK

REFUSALS = 3


@pytest.mark.parametrize(
    "script", [None, WITHOUT_SHARED_WORKER], ids=["shared-worker", "own-stream"]
)
def test_a_refused_notification_stream_shows_reconnecting_and_recovers(
    open_page,
    server,
    alice,
    model,
    monkeypatch,
    script,
):
    refused = []
    armed = {"on": script is None}  # the shared worker: from the first page load
    original = sse._authenticated_user_id

    def database_down(request):
        if armed["on"] and len(refused) < REFUSALS:
            refused.append(request.path)
            raise OperationalError("the database system is shutting down")
        return original(request)

    monkeypatch.setattr(sse, "_authenticated_user_id", database_down)
    page = open_page(alice[0])
    app = page.get_by_test_id("app")
    if script:
        # A page of its own streams: reloaded without the worker (a worker
        # can outlive a reload, keeping its stream open), then refused. The
        # first page's stream is live before, so the reloaded page meets
        # every refusal.
        expect(app).to_have_attribute("data-notes-state", "live")
        page.add_init_script(script)
        armed["on"] = True
        page.reload()
    wait_until(lambda: len(refused) == REFUSALS, timeout=30)
    expect(app).to_have_attribute("data-notes-state", "live")
    expect(page.get_by_test_id("connection")).to_be_hidden()
    # What the banner showed meanwhile (`RECORD_BANNERS`, installed by
    # `open_page`): it may have come and gone between two polls of this test.
    assert page.evaluate("window.__banners") == ["Reconnecting…"]
    assert refused == ["/api/stream/"] * REFUSALS

    # Notifications flow again: a chat made elsewhere shows up in the sidebar.
    made = httpx.post(
        f"{server.url}/api/sessions/",
        json={"title": "made elsewhere"},
        headers=alice[1],
    )
    assert made.status_code == 201
    expect(
        page.get_by_test_id("session-item").filter(has_text="made elsewhere")
    ).to_have_count(1)
