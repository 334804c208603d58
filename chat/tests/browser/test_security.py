"""What the page must never do: run script from model output (or the user's
own text), or show one user another's chats; and the admin works under the
site's Content-Security-Policy."""

import httpx
from django.test import Client
from django.urls import reverse
from playwright.sync_api import expect

from chat.models import ChatSession, Message
from hermes_testing.browser import PYTESTMARK, last_turn, send, wait_settled
from hermes_testing.fake_llm import Reply
from hermes_testing.turns import running_turn
from journal.models import Event
from journal.store import append

pytestmark = PYTESTMARK


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
    # A model's link opens a tab of its own: the one left with an href ("#",
    # this page again) is inert there too, and is closed here, once drawn,
    # rather than at teardown in the middle of its start.
    with page.expect_popup() as opened:
        page.locator("[data-testid=assistant-text] a").last.click()
    popup = opened.value
    expect(popup.get_by_test_id("app")).to_have_attribute("data-ready", "true")
    assert popup.evaluate("typeof window.__pwned") == "undefined"
    popup.close()
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


RECORD_CSP_VIOLATIONS = """
window.__csp = [];
document.addEventListener("securitypolicyviolation", (e) =>
  window.__csp.push(`${e.violatedDirective} ${e.blockedURI}`));
"""


def test_admin_pages_break_no_rule_of_the_content_security_policy(
    chromium, browser, server, alice
):
    """The policy covers the admin too: its pages, and the payloads it shows,
    load nothing inline and nothing from elsewhere."""
    user = alice[0]
    user.is_staff = user.is_superuser = True
    user.save()
    session = ChatSession.objects.create(owner=user, title="Fox facts")
    run = running_turn(user, session=session)
    end = {"status": "completed", "terminal_state": "completed", "message_id": None}
    append(
        run_id=run.id,
        token=1,
        events=[("start", {"model": "m"}), ("token", {"text": "hi"}), ("end", end)],
    )
    message = Message.objects.create(
        session=session, role="assistant", content="hi", tool_calls=[{"id": "c1"}]
    )
    event = Event.objects.filter(run_id=run.id).first()
    assert event is not None
    client = Client()
    client.force_login(user)
    context = browser.new_context(base_url=server.url)
    context.add_cookies(
        [
            {
                "name": "sessionid",
                "value": client.cookies["sessionid"].value,
                "url": server.url,
            }
        ]
    )
    context.add_init_script(RECORD_CSP_VIOLATIONS)
    page = context.new_page()
    try:
        for path in [
            reverse("admin:index"),
            reverse("admin:journal_run_changelist"),
            reverse("admin:journal_run_change", args=[run.id]),
            reverse("admin:journal_event_change", args=[event.pk]),
            reverse("admin:chat_chatsession_change", args=[session.pk]),
            reverse("admin:chat_message_change", args=[message.pk]),
        ]:
            assert page.goto(path).status == 200, path
            page.wait_for_load_state("load")
            assert page.evaluate("window.__csp") == [], path
        payload = page.locator("pre.journal-payload").first
        assert payload.evaluate("e => getComputedStyle(e).whiteSpace") == "pre-wrap"
    finally:
        chromium.close_context(context)
