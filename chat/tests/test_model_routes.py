"""The provider per model an admin chooses (`chat.models.ModelRoute`): the admin
pages, what they refuse, and that the next run follows the choice without a
restart (docs/operating.md, "Model providers")."""

import httpx
import pytest
from django.urls import reverse

from chat.models import ModelRoute, Turn
from chat.providers import registry
from hermes_testing.api import new_session, stream, text_of
from hermes_testing.fake_anthropic import AnthropicReply, FakeAnthropic
from hermes_testing.fake_responses import FakeResponses, ResponsesReply

SECRET = "sk-ant-route-secret-4711"
ADD = reverse("admin:chat_modelroute_add")
LIST = reverse("admin:chat_modelroute_changelist")


@pytest.fixture
def providers(settings, fake_llm, monkeypatch):
    """Three providers: `openai` (fake_llm: fake-model, other-model), `claude`
    (anthropic, with a key) and `bg` (responses); each fake takes any model."""
    with (
        FakeAnthropic(api_key=SECRET, models=["claude-x"]) as claude,
        FakeResponses(models=["gpt-bg"]) as bg,
    ):
        monkeypatch.setenv("HERMES_TEST_ROUTE_KEY", SECRET)
        entries = [
            {
                "name": "claude",
                "kind": "anthropic",
                "base_url": claude.base_url,
                "api_key_env": "HERMES_TEST_ROUTE_KEY",
                "models": ["claude-x"],
            },
            {"name": "bg", "kind": "responses", "base_url": bg.base_url},
        ]
        settings.HERMES = {**settings.HERMES, "PROVIDERS": entries}
        registry.reset()
        yield {"claude": claude, "bg": bg, "openai": fake_llm}
        registry.reset()


def choice_of(server, headers, model: str) -> dict | None:
    models = httpx.get(f"{server.url}/api/models/", headers=headers).json()["models"]
    return next((m for m in models if m["id"] == model), None)


def run_on(server, headers, model: str, content: str) -> list:
    session_id = new_session(server, headers)
    response = httpx.post(
        f"{server.url}/api/sessions/{session_id}/runs/",
        json={"content": content, "model": model},
        headers=headers,
    )
    assert response.status_code == 201, response.text
    return stream(server, headers, response.json()["run_id"])


@pytest.mark.slow
def test_the_next_run_follows_the_route_chosen_in_the_admin(
    server, alice, providers, live_worker, client, root
):
    claude, bg, openai = providers["claude"], providers["bg"], providers["openai"]
    assert choice_of(server, alice[1], "other-model") == {
        "id": "other-model",
        "provider": "openai",
        "kind": "openai",
        "vision": False,
    }
    # Routed to the Anthropic provider: the picker says so, the request goes there.
    response = client.post(
        ADD, {"model": "other-model", "provider": "claude", "enabled": "on"}
    )
    assert response.status_code == 302, response.content.decode()
    assert choice_of(server, alice[1], "other-model") == {
        "id": "other-model",
        "provider": "claude",
        "kind": "anthropic",
        "vision": False,
    }
    claude.push(AnthropicReply(text="Claude answers."))
    events = run_on(server, alice[1], "other-model", "first")
    assert text_of(events) == "Claude answers."
    assert events[0][2]["provider"] == "claude"
    assert [r.body["model"] for r in claude.requests] == ["other-model"]
    # Changed to the Responses provider: the next run goes there.
    route = ModelRoute.objects.get(model="other-model")
    change = reverse("admin:chat_modelroute_change", args=[route.pk])
    response = client.post(
        change, {"model": "other-model", "provider": "bg", "enabled": "on"}
    )
    assert response.status_code == 302, response.content.decode()
    bg.push(ResponsesReply(text="Responses answers."))
    events = run_on(server, alice[1], "other-model", "second")
    assert text_of(events) == "Responses answers."
    assert [r.body["model"] for r in bg.of_kind("POST", "/responses")] == [
        "other-model"
    ]
    # Disabled: the settings choose again (the OpenAI-compatible endpoint).
    response = client.post(change, {"model": "other-model", "provider": "bg"})
    assert response.status_code == 302, response.content.decode()
    events = run_on(server, alice[1], "other-model", "third")
    assert text_of(events) == "Hello from the fake model."
    assert [r.body["model"] for r in openai.requests] == ["other-model"]
    assert len(claude.requests) == 1 and len(bg.of_kind("POST")) == 1
    assert list(Turn.objects.order_by("run_id").values_list("provider", flat=True))[
        -3:
    ] == ["claude", "bg", "openai"]


def test_a_route_written_by_another_process_counts_for_the_next_run(
    server, alice, providers, live_worker
):
    """Another process's write (here a plain UPDATE: no signal, no admin) is
    seen at the next run: routes are read at each lookup, never cached."""
    route = ModelRoute.objects.create(model="fake-model", provider="claude")
    assert run_on(server, alice[1], "fake-model", "one")[0][2]["provider"] == "claude"
    ModelRoute.objects.filter(pk=route.pk).update(provider="bg")
    assert run_on(server, alice[1], "fake-model", "two")[0][2]["provider"] == "bg"
    ModelRoute.objects.filter(pk=route.pk).delete()
    assert run_on(server, alice[1], "fake-model", "three")[0][2]["provider"] == (
        "openai"
    )


def test_a_routed_model_no_provider_names_is_offered(providers, transactional_db):
    assert "brand-new" not in {c["id"] for c in registry.model_choices()}
    ModelRoute.objects.create(model="brand-new", provider="claude")
    ModelRoute.objects.create(model="claude-x", provider="bg", enabled=False)
    choices = {c["id"]: c["provider"] for c in registry.model_choices()}
    assert choices["brand-new"] == "claude" and choices["claude-x"] == "claude"
    assert registry.is_known_model("brand-new")
    assert registry.provider_name_for("brand-new") == "claude"
    assert registry.provider_name_for("claude-x") == "claude"  # disabled: settings


def test_a_route_to_a_provider_gone_from_the_settings_is_ignored_and_said(
    providers, client, root, settings
):
    route = ModelRoute.objects.create(model="fake-model", provider="claude")
    settings.HERMES = {**settings.HERMES, "PROVIDERS": []}
    assert registry.provider_name_for("fake-model") == "openai"
    page = client.get(LIST).content.decode()
    assert "no: the provider is not configured in the settings" in page
    change = reverse("admin:chat_modelroute_change", args=[route.pk])
    page = client.get(change).content.decode()
    assert "claude (not configured)" in page  # kept in the list, never swapped
    response = client.post(
        change, {"model": "fake-model", "provider": "claude", "enabled": "on"}
    )
    assert response.status_code == 200
    assert "no provider &#x27;claude&#x27; is configured" in response.content.decode()


def test_route_pages_offer_configured_providers_and_show_no_secret(
    providers, client, root
):
    page = client.get(ADD).content.decode()
    for option in ("demo", "openai", "claude (anthropic)", "bg (responses)"):
        assert f">{option}</option>" in page, option
    route = ModelRoute.objects.create(model="other-model", provider="claude")
    pages = [
        ADD,
        LIST,
        LIST + "?enabled__exact=1&provider=claude",
        LIST + "?q=other",
        reverse("admin:chat_modelroute_change", args=[route.pk]),
        reverse("admin:chat_modelroute_history", args=[route.pk]),
        reverse("admin:chat_modelroute_delete", args=[route.pk]),
    ]
    endpoints = [providers[name].base_url for name in ("claude", "bg", "openai")]
    for url in pages:
        response = client.get(url)
        assert response.status_code == 200, url
        text = response.content.decode()
        assert SECRET not in text and "HERMES_TEST_ROUTE_KEY" not in text, url
        assert not [e for e in endpoints if e in text], url
    listed = client.get(LIST).content.decode()
    assert "claude (anthropic)" in listed and "Without this route" in listed


BAD_INPUT = [
    (
        {"model": "m1", "provider": "nope"},
        "provider",
        "no provider &#x27;nope&#x27; is configured (configured: bg, claude,"
        " demo, openai)",
    ),
    ({"model": "two words", "provider": "demo"}, "model", "no spaces"),
    ({"model": "bell\x07", "provider": "demo"}, "model", "control characters"),
    ({"model": "   ", "provider": "demo"}, "model", "This field is required"),
    ({"model": "taken", "provider": "demo"}, "model", "already exists"),
    ({"model": "x" * 201, "provider": "demo"}, "model", "at most 200"),
]


def test_bad_input_is_a_form_error_naming_it(providers, client, root):
    ModelRoute.objects.create(model="taken", provider="openai")
    for data, field, error in BAD_INPUT:
        response = client.post(ADD, {**data, "enabled": "on"})
        assert response.status_code == 200, data
        errors = response.context["adminform"].form.errors
        assert list(errors) == [field], data
        assert error in response.content.decode(), data
    assert list(ModelRoute.objects.values_list("model", flat=True)) == ["taken"]


def test_route_pages_are_for_staff_with_permission(
    providers, client, alice, django_user_model
):
    from django.contrib.auth.models import Permission

    route = ModelRoute.objects.create(model="other-model", provider="claude")
    change = reverse("admin:chat_modelroute_change", args=[route.pk])
    client.force_login(alice[0])
    for url in (LIST, ADD, change):
        response = client.get(url)
        assert response.status_code == 302 and "/admin/login/" in response["Location"]
    assert client.post(ADD, {"model": "m", "provider": "demo"}).status_code == 302
    staff = django_user_model.objects.create_user(
        "staff", password="pw-staffstaff", is_staff=True
    )
    client.force_login(staff)
    assert client.get(LIST).status_code == 403
    assert client.post(ADD, {"model": "m", "provider": "demo"}).status_code == 403
    staff.user_permissions.add(Permission.objects.get(codename="view_modelroute"))
    assert client.get(LIST).status_code == 200
    assert (
        client.post(change, {"model": "other-model", "provider": "demo"}).status_code
        == 403
    )
    assert list(ModelRoute.objects.values_list("model", "provider")) == [
        ("other-model", "claude")
    ]
