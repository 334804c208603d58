"""The `HERMES_PROVIDERS` system check, and the registry leaving bad entries out."""

import pytest
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.urls import reverse

from chat.checks import check_providers
from chat.models import ChatSession, Turn
from chat.providers import registry
from chat.providers.anthropic import AnthropicProvider
from chat.providers.openai import OpenAIProvider
from chat.providers.responses import ResponsesProvider
from hermes_testing.turns import running_turn

GOOD = {"name": "local", "base_url": "http://127.0.0.1:9/v1", "models": ["m"]}


@pytest.fixture
def providers(settings):
    def use(entries):
        settings.HERMES = {**settings.HERMES, "PROVIDERS": entries}
        registry.reset()

    yield use
    registry.reset()


def _ids(messages) -> list[str]:
    return [m.id for m in messages]


def test_well_formed_providers_pass(providers):
    providers([GOOD, {**GOOD, "name": "other", "api_key_env": "OTHER_KEY"}])
    assert check_providers() == []
    assert registry.configs()["other"].api_key_env == "OTHER_KEY"


def test_a_missing_key_is_an_error_and_the_entry_is_left_out(providers):
    providers([{"name": "broken", "models": ["x"]}, GOOD])
    messages = check_providers()
    assert _ids(messages) == ["hermes.E002"]
    assert "HERMES_PROVIDERS[0] needs 'base_url'" in messages[0].msg
    assert "broken" not in registry.configs()  # no KeyError on every call
    assert registry.configs()["local"].models == ["m"]
    with pytest.raises(SystemCheckError, match="HERMES_PROVIDERS\\[0\\]"):
        call_command("check")


@pytest.mark.parametrize(
    "entry,expected",
    [
        ("local", "is not a JSON object"),
        ({**GOOD, "name": ""}, "needs 'name'"),
        ({**GOOD, "name": "demo"}, "may not be named 'demo'"),
        ({**GOOD, "api_key_env": 3}, "'api_key_env' must be a string"),
        ({**GOOD, "models": "m1,m2"}, "'models' must be a list of strings"),
    ],
)
def test_each_malformed_entry_is_named(providers, entry, expected):
    providers([entry])
    messages = check_providers()
    assert _ids(messages) == ["hermes.E002"] and expected in messages[0].msg
    assert set(registry.configs()) == {"demo"} | (
        {"openai"} if registry.settings.HERMES["OPENAI_BASE_URL"] else set()
    )


def test_not_a_list_is_an_error(providers):
    providers({"name": "local"})
    assert _ids(check_providers()) == ["hermes.E001"]


def test_unknown_keys_and_repeated_names_warn(providers):
    providers([{**GOOD, "model": ["typo"]}, GOOD])
    messages = check_providers()
    assert _ids(messages) == ["hermes.W001", "hermes.W002"]
    assert "['model']" in messages[0].msg


@pytest.mark.parametrize(
    "entry,expected",
    [
        ({**GOOD, "kind": "bogus"}, "'kind' must be one of"),
        ({**GOOD, "thinking_budget": 100}, "'thinking_budget' applies to kind"),
        ({**GOOD, "continuation": "glue"}, "'continuation' must be one of"),
        ({**GOOD, "http_retries": -1}, "'http_retries' must be a whole number"),
        ({**GOOD, "retry_budget_s": 0}, "'retry_budget_s' must be a positive"),
        ({**GOOD, "kind": "anthropic", "max_tokens": 0}, "must be a positive whole"),
        ({**GOOD, "kind": "anthropic", "thinking_budget": True}, "positive whole"),
        ({**GOOD, "kind": "responses", "reasoning_summary": "all"}, "must be one of"),
        (
            {**GOOD, "kind": "anthropic", "reasoning_summary": "auto"},
            "'responses' only",
        ),
        ({**GOOD, "vision": "yes"}, "'vision' must be true, false or a list"),
        ({**GOOD, "vision": [1]}, "'vision' must be true, false or a list"),
    ],
)
def test_a_bad_kind_or_option_is_named(providers, entry, expected):
    providers([entry])
    messages = check_providers()
    assert _ids(messages) == ["hermes.E002"] and expected in messages[0].msg
    assert "local" not in registry.configs()


def test_each_kind_builds_its_provider(providers):
    providers(
        [
            GOOD,
            {
                **GOOD,
                "name": "claude",
                "kind": "anthropic",
                "models": ["c"],
                "max_tokens": 64,
            },
        ]
    )
    assert check_providers() == []
    bg = {**GOOD, "name": "bg", "kind": "responses", "models": ["r"]}
    providers([*registry.settings.HERMES["PROVIDERS"], bg])
    assert check_providers() == []
    assert isinstance(registry.get_provider("bg"), ResponsesProvider)
    claude = registry.get_provider("claude")
    assert isinstance(claude, AnthropicProvider) and claude.max_tokens == 64
    assert type(registry.get_provider("local")) is OpenAIProvider
    kinds = {c["provider"]: c["kind"] for c in registry.model_choices()}
    assert kinds["claude"] == "anthropic" and kinds["local"] == "openai"
    assert kinds["bg"] == "responses" and kinds["demo"] == "demo"


def test_the_run_admin_names_the_api_a_runs_provider_speaks(
    providers, alice, django_user_model, client
):
    providers([{**GOOD, "name": "claude", "kind": "anthropic", "models": ["c"]}])
    root = django_user_model.objects.create_superuser("root", "r@example.com", "pw")
    client.force_login(root)
    session = ChatSession.objects.create(owner=alice[0], title="t", model="c")
    run = running_turn(alice[0], session=session)
    Turn.objects.filter(run=run).update(provider="claude", model="c")
    page = client.get(reverse("admin:journal_run_changelist")).content.decode()
    assert "claude (anthropic)" in page
