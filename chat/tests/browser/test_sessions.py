"""The sidebar's chats (rename, search, delete) and a chat's settings: model,
system prompt, and the tool cards of its answers."""

from playwright.sync_api import expect

from chat.models import ChatSession, ModelRoute
from chat.providers import registry
from hermes_testing.browser import PYTESTMARK, last_turn, send, wait_settled
from hermes_testing.fake_llm import Reply

pytestmark = PYTESTMARK


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


def test_the_model_picker_names_each_models_provider_and_its_api(
    open_page, alice, model, settings
):
    entry = {
        "name": "claude",
        "kind": "anthropic",
        "base_url": "http://127.0.0.1:9/v1",  # never asked: the model is named here
        "models": ["claude-x"],
    }
    settings.HERMES = {**settings.HERMES, "PROVIDERS": [entry]}
    registry.reset()
    ModelRoute.objects.create(model="other-model", provider="claude")  # the admin's
    page = open_page(alice[0])
    options = page.get_by_test_id("model-picker").locator("option")
    expect(options.filter(has_text="claude-x")).to_have_text(
        "claude-x · claude (anthropic)"
    )
    expect(options.filter(has_text="fake-model")).to_have_text("fake-model · openai")
    expect(options.filter(has_text="other-model")).to_have_text(
        "other-model · claude (anthropic)"
    )
