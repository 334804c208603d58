"""Which providers and models exist, from settings and the environment.

- `demo`: the built-in demo provider (no network), always there.
- `openai`: any OpenAI-compatible endpoint at `OPENAI_BASE_URL` with
  `OPENAI_API_KEY`; its models are `HERMES_MODELS`, `HERMES_DEFAULT_MODEL` and
  whatever its `GET /v1/models` lists.
- more, from `HERMES_PROVIDERS`, a JSON list of
  `{"name", "base_url", "api_key_env", "models": [...]}`; the key itself stays in
  the environment variable it names, never in settings dumps or the journal.

Provider objects are built on first use, never at import time.
"""

import json
import logging
import os
import time
from dataclasses import dataclass, field

import httpx
from django.conf import settings

from .demo import DEMO_MODEL, DemoProvider
from .openai import OpenAIProvider

log = logging.getLogger(__name__)

MODELS_CACHE_S = 60.0  # how long a `/v1/models` listing is trusted


@dataclass
class ProviderConfig:
    name: str
    base_url: str = ""
    api_key_env: str = ""
    models: list[str] = field(default_factory=list)

    @property
    def api_key(self) -> str:
        return os.environ.get(self.api_key_env, "") if self.api_key_env else ""


def configs() -> dict[str, ProviderConfig]:
    found = {"demo": ProviderConfig("demo", models=[DEMO_MODEL])}
    hermes = settings.HERMES
    if hermes["OPENAI_BASE_URL"]:
        models = [
            m for m in os.environ.get("HERMES_MODELS", "").split(",") if m.strip()
        ]
        if hermes["DEFAULT_MODEL"]:
            models.insert(0, hermes["DEFAULT_MODEL"])
        found["openai"] = ProviderConfig(
            "openai",
            hermes["OPENAI_BASE_URL"],
            "OPENAI_API_KEY",
            [m.strip() for m in models],
        )
    try:
        extra = json.loads(os.environ.get("HERMES_PROVIDERS", "") or "[]")
    except json.JSONDecodeError:
        log.error("HERMES_PROVIDERS is not valid JSON; ignored")
        extra = []
    for item in extra:
        found[item["name"]] = ProviderConfig(
            item["name"],
            item["base_url"],
            item.get("api_key_env", ""),
            item.get("models", []),
        )
    return found


_listed: dict[str, tuple[float, list[str]]] = {}


def _listed_models(config: ProviderConfig) -> list[str]:
    """The models a provider lists at `GET /v1/models`, cached briefly."""
    if not config.base_url:
        return []
    cached = _listed.get(config.name)
    if cached and time.monotonic() - cached[0] < MODELS_CACHE_S:
        return cached[1]
    headers = {"Authorization": f"Bearer {config.api_key}"} if config.api_key else {}
    try:
        response = httpx.get(
            f"{config.base_url.rstrip('/')}/models", headers=headers, timeout=5
        )
        response.raise_for_status()
        names = [m["id"] for m in response.json().get("data", [])]
    except (httpx.HTTPError, ValueError, KeyError, TypeError):
        log.warning("could not list models of provider %s", config.name)
        names = []
    _listed[config.name] = (time.monotonic(), names)
    return names


def model_choices() -> list[dict]:
    """Every model a user may pick, with its provider."""
    found = configs().values()
    seen: dict[str, str] = {}
    # A model named in a provider's settings belongs to that provider, even if
    # another endpoint lists it too.
    for config in found:
        for model in config.models:
            seen.setdefault(model, config.name)
    for config in found:
        for model in _listed_models(config):
            seen.setdefault(model, config.name)
    return [{"id": model, "provider": provider} for model, provider in seen.items()]


def default_model() -> str:
    hermes = settings.HERMES
    if hermes["DEFAULT_MODEL"]:
        return hermes["DEFAULT_MODEL"]
    choices = model_choices()
    non_demo = [c["id"] for c in choices if c["provider"] != "demo"]
    return non_demo[0] if non_demo else DEMO_MODEL


def provider_name_for(model: str) -> str:
    for config in configs().values():
        if model in config.models:
            return config.name
    for choice in model_choices():
        if choice["id"] == model:
            return choice["provider"]
    return "openai" if "openai" in configs() else "demo"


def is_known_model(model: str) -> bool:
    return any(choice["id"] == model for choice in model_choices())


_providers: dict[str, object] = {}


def get_provider(name: str):
    """The provider object for `name`, built on first use and then shared."""
    provider = _providers.get(name)
    if provider is None:
        config = configs().get(name)
        if config is None:
            raise KeyError(f"no provider {name!r}")
        if name == "demo":
            provider = DemoProvider()
        else:
            provider = OpenAIProvider(
                name,
                config.base_url,
                config.api_key,
                idle_timeout=settings.HERMES["STREAM_IDLE_TIMEOUT_S"],
            )
        _providers[name] = provider
    return provider


def active_requests() -> int:
    """Provider request slots in use in this process: 0 when idle."""
    return sum(getattr(p, "active_requests", 0) for p in _providers.values())


def reset() -> None:
    """Forget built providers and model listings (settings changed: tests, reloads)."""
    _providers.clear()
    _listed.clear()
