"""Search in the sidebar: hits in message text, shown escaped with their words
marked, open the chat scrolled to the message; pinned chats sit on top."""

import re

from playwright.sync_api import expect

from chat.models import ChatSession, Message
from hermes_testing.browser import PYTESTMARK, SCREENSHOTS

pytestmark = PYTESTMARK


def test_a_hit_in_message_text_opens_the_chat_at_that_message(open_page, alice):
    owner = alice[0]
    long_chat = ChatSession.objects.create(owner=owner, title="Long chat")
    parent = None  # one branch: each message answers the one before it
    for i in range(40):
        role = Message.Role.USER if i % 2 == 0 else Message.Role.ASSISTANT
        text = f"Filler line {i}. " * 6
        if i == 5:
            text = "The <b>zebra</b> crossing is where the answer was."
        parent = Message.objects.create(
            session=long_chat, role=role, content=text, parent=parent
        )
    target = long_chat.messages.get(content__contains="zebra")
    ChatSession.objects.create(owner=owner, title="Newer chat")
    page = open_page(owner, viewport={"width": 1100, "height": 700})
    expect(page.get_by_test_id("session-title")).to_have_text("Newer chat")

    page.get_by_test_id("session-search").fill("zebr")
    hit = page.get_by_test_id("search-hit")
    expect(hit).to_have_count(1)
    expect(hit).to_contain_text("Long chat")
    snippet = hit.get_by_test_id("search-hit-snippet")
    # The message's own angle brackets are text, not markup; the hit is marked.
    expect(snippet).to_contain_text("The <b>zebra</b> crossing")
    expect(snippet.locator("mark")).to_have_text(["zebra"])
    expect(snippet.locator("b")).to_have_count(0)
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / "search.png"))

    hit.click()
    expect(page).to_have_url(f"/c/{long_chat.pk}/")
    messages = page.get_by_test_id("messages")
    expect(messages).to_have_attribute("data-revealed", str(target.pk))
    shown = page.locator(f'[data-message-ids~="{target.pk}"]')
    expect(shown).to_have_class(re.compile(r"\bsearch-hit\b"))
    expect(shown).to_be_in_viewport()
    expect(shown).to_contain_text("zebra crossing")
    # The end of the chat is not where the page stayed.
    last = long_chat.messages.order_by("-id").first()
    expect(page.locator(f'[data-message-ids~="{last.pk}"]')).not_to_be_in_viewport()

    page.get_by_test_id("session-search").fill("nothing like this")
    expect(page.get_by_test_id("search-none")).to_be_visible()
    page.get_by_test_id("session-search").fill("")
    expect(page.get_by_test_id("search-hits")).to_be_hidden()


def test_pinned_chats_group_on_top(open_page, alice):
    owner = alice[0]
    for title in ("first", "second", "third"):
        ChatSession.objects.create(owner=owner, title=title)
    page = open_page(owner)
    listed = page.get_by_test_id("session-list").locator(
        "[data-testid=session-group], [data-testid=session-name]"
    )
    expect(listed).to_have_text(["Today", "third", "second", "first"], ignore_case=True)
    item = page.get_by_test_id("session-item").filter(has_text="first")
    item.hover()
    item.get_by_test_id("session-pin").click()
    expect(listed).to_have_text(
        ["Pinned", "first", "Today", "third", "second"], ignore_case=True
    )
    assert ChatSession.objects.get(title="first").pinned
    item = page.get_by_test_id("session-item").filter(has_text="first")
    item.hover()
    item.get_by_test_id("session-pin").click()
    expect(listed).to_have_text(["Today", "third", "second", "first"], ignore_case=True)
    assert not ChatSession.objects.get(title="first").pinned


def test_more_hits_come_a_page_at_a_time(open_page, alice):
    session = ChatSession.objects.create(owner=alice[0], title="Notes")
    for i in range(25):
        Message.objects.create(session=session, role="user", content=f"kiwi note {i}")
    page = open_page(alice[0])
    page.get_by_test_id("session-search").fill("kiwi")
    hits = page.get_by_test_id("search-hit")
    expect(hits).to_have_count(20)
    expect(hits.first).to_contain_text("kiwi note 24")  # newest first
    page.get_by_test_id("search-more").click()
    expect(hits).to_have_count(25)
    expect(hits.last).to_contain_text("kiwi note 0")
    expect(page.get_by_test_id("search-more")).to_be_hidden()


def test_a_hit_on_another_branch_opens_that_branch_at_the_message(open_page, alice):
    """A regenerated answer hid the first one; a hit in the first one opens
    the chat on its branch ("1 / 2"), scrolled to it, and the server's active
    branch follows (a reload shows the same)."""
    owner = alice[0]
    chat = ChatSession.objects.create(owner=owner, title="Branched chat")
    parent = None
    for i in range(12):
        role = Message.Role.USER if i % 2 == 0 else Message.Role.ASSISTANT
        parent = Message.objects.create(
            session=chat, role=role, content=f"Earlier line {i}. " * 6, parent=parent
        )
    question = Message.objects.create(
        session=chat, role=Message.Role.USER, content="Name an animal.", parent=parent
    )
    hidden = Message.objects.create(
        session=chat, role=Message.Role.ASSISTANT, content="An okapi.", parent=question
    )
    below = hidden
    for i in range(10):  # the first version's branch goes on below the hit
        role = Message.Role.USER if i % 2 == 0 else Message.Role.ASSISTANT
        below = Message.objects.create(
            session=chat, role=role, content=f"Later line {i}. " * 6, parent=below
        )
    Message.objects.create(  # the newer version: the active branch ends here
        session=chat, role=Message.Role.ASSISTANT, content="A heron.", parent=question
    )
    page = open_page(owner, viewport={"width": 1100, "height": 700})
    expect(page.get_by_test_id("session-title")).to_have_text("Branched chat")
    expect(page.get_by_text("A heron.")).to_be_visible()

    page.get_by_test_id("session-search").fill("okapi")
    hit = page.get_by_test_id("search-hit")
    expect(hit).to_have_count(1)
    hit.click()
    messages = page.get_by_test_id("messages")
    expect(messages).to_have_attribute("data-revealed", str(hidden.pk))
    shown = page.locator(f'[data-message-ids~="{hidden.pk}"]')
    expect(shown).to_contain_text("An okapi.")
    expect(shown).to_be_in_viewport()
    expect(shown.get_by_test_id("branch-label")).to_have_text("1 / 2")
    expect(page.get_by_text("A heron.")).to_have_count(0)
    expect(page.locator(f'[data-message-ids~="{below.pk}"]')).not_to_be_in_viewport()
    page.reload()
    expect(page.get_by_test_id("app")).to_have_attribute("data-ready", "true")
    expect(page.get_by_text("An okapi.")).to_be_visible()
