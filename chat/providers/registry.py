"""Which providers and models exist, from settings (`settings.HERMES`).

- `demo`: the built-in demo provider (no network), always there.
- `openai`: any OpenAI-compatible endpoint at `OPENAI_BASE_URL` with
  `OPENAI_API_KEY`; its models are `HERMES_MODELS`, `HERMES_DEFAULT_MODEL` and
  whatever its `GET /v1/models` lists (the last good list, refreshed in the
  background: a provider whose listing fails keeps its models; see `Listing`).
- more, from `HERMES_PROVIDERS`, a JSON list of
  `{"name", "kind", "base_url", "api_key_env", "models": [...]}`; the key itself
  stays in the environment variable it names, never in settings dumps or the
  journal. `kind` says which API the endpoint speaks (`PROVIDER_KINDS`):
  `openai` (chat completions, the default), `anthropic` (Messages; also
  `max_tokens` and `thinking_budget`) or `responses` (OpenAI Responses in
  background mode, re-attached after a cut; also `reasoning_summary`).
  `vision` says which of its models take images: `true` (all), or a list.

Which models take images (`takes_images`): the demo model, those named in
`HERMES_VISION_MODELS` (any provider) and those of an entry's `vision`.

An admin may choose the provider of a model in `/admin/` (`chat.models.ModelRoute`):
an enabled route to a configured provider wins over the settings. Routes are
read from the database at each lookup (a small table; nothing cached), so a
change counts for the next run of every process, without a restart.

Provider objects are built on first use, never at import time.
"""

import logging
import os
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime

import httpx
from django.conf import settings
from django.db import connection

from ..checks import PROVIDER_OPTIONS, provider_entry_problems
from .anthropic import API_VERSION, AnthropicProvider
from .base import Provider
from .demo import DEMO_MODEL, DemoProvider
from .openai import OpenAIProvider
from .responses import ResponsesProvider

log = logging.getLogger(__name__)

MODELS_CACHE_S = 60.0  # how long a `/v1/models` listing is trusted before a refresh
MODELS_RETRY_S = 10.0  # refresh attempts while a listing fails (last good list kept)
LIST_TIMEOUT_S = 5.0  # one listing request, in the background thread
FIRST_LISTING_WAIT_S = 2.0  # only a process's first look waits, at most this long


@dataclass
class ProviderConfig:
    name: str
    base_url: str = ""
    api_key_env: str = ""
    models: list[str] = field(default_factory=list)
    kind: str = "openai"
    #: Per-kind settings passed to the provider (`max_tokens`, `thinking_budget`).
    options: dict = field(default_factory=dict)
    #: Whether its models take images: True (all of them) or some by name.
    vision: bool | list[str] = False

    def takes_images(self, model: str) -> bool:
        return self.vision is True or (
            isinstance(self.vision, list) and model in self.vision
        )

    @property
    def api_key(self) -> str:
        return os.environ.get(self.api_key_env, "") if self.api_key_env else ""

    def listing_headers(self) -> dict[str, str]:
        """The headers of `GET /models` for this kind of API."""
        key = self.api_key
        if self.kind == "anthropic":
            headers = {"anthropic-version": API_VERSION}
            return {**headers, "x-api-key": key} if key else headers
        return {"Authorization": f"Bearer {key}"} if key else {}


def configs() -> dict[str, ProviderConfig]:
    found = {"demo": ProviderConfig("demo", models=[DEMO_MODEL], vision=True)}
    hermes = settings.HERMES
    if hermes["OPENAI_BASE_URL"]:
        models = list(hermes["MODELS"])
        if hermes["DEFAULT_MODEL"]:
            models.insert(0, hermes["DEFAULT_MODEL"])
        found["openai"] = ProviderConfig(
            "openai",
            hermes["OPENAI_BASE_URL"],
            "OPENAI_API_KEY",
            [m.strip() for m in models],
            options={"continuation": hermes.get("CONTINUATION") or "prefill"},
        )
    for item in hermes["PROVIDERS"]:
        if provider_entry_problems(item):
            continue  # reported by the `chat` system check at startup
        found[item["name"]] = ProviderConfig(
            item["name"],
            item["base_url"],
            item.get("api_key_env", ""),
            item.get("models", []),
            item.get("kind", "openai"),
            {key: item[key] for key in PROVIDER_OPTIONS if key in item},
            item.get("vision", False),
        )
    return found


class Listing:
    """One provider's `GET /models`: the last good list, kept when a refresh fails.

    Refreshed in a background thread at most every `MODELS_CACHE_S` (every
    `MODELS_RETRY_S` while failing); requests read what is there and never
    wait, except the very first of a process, which waits up to
    `FIRST_LISTING_WAIT_S` for the first answer.

    Never sent while that provider streams an answer (`upstream_busy`): some
    servers end the answer they are streaming when any other request reaches
    them (llama.cpp's Python server by default), so a listing would cut an
    answer as a side effect. A busy provider's refresh is put off and looked
    at again every `MODELS_RETRY_S`.
    """

    def __init__(self, config: ProviderConfig):
        self.config = config
        self.models: list[str] = []
        self.ok_at: float | None = None  # monotonic time of the last good answer
        self.ok_at_wall: float | None = None
        self.error = ""  # why the last refresh failed ("" when it did not)
        self.put_off = False  # the last refresh waited for the provider's streams
        self.failing_since: float | None = None
        self.tried_at = 0.0
        self._lock = threading.Lock()
        self._first = threading.Event()
        self._waited = False
        self._thread: threading.Thread | None = None

    def current(self) -> list[str]:
        self.refresh_if_due()
        if not self._waited:
            self._waited = True
            self._first.wait(FIRST_LISTING_WAIT_S)
        return self.models

    def refresh_if_due(self) -> None:
        now = time.monotonic()
        every = MODELS_RETRY_S if self.error or self.put_off else MODELS_CACHE_S
        with self._lock:
            running = self._thread is not None and self._thread.is_alive()
            if running or (self.tried_at and now - self.tried_at < every):
                return
            self.tried_at = now
            self._thread = threading.Thread(
                target=self._refresh,
                name=f"hermes-models-{self.config.name}",
                daemon=True,
            )
            self._thread.start()

    def _refresh(self) -> None:
        config = self.config
        headers = config.listing_headers()
        self.put_off = upstream_busy(config.name)
        if self.put_off:
            log.info(
                "listing the models of provider %s put off: it streams", config.name
            )
            self._first.set()
            return
        try:
            response = httpx.get(
                f"{config.base_url.rstrip('/')}/models",
                headers=headers,
                timeout=LIST_TIMEOUT_S,
            )
            response.raise_for_status()
            names = [m["id"] for m in response.json().get("data", [])]
        except (
            httpx.HTTPError,
            ValueError,
            KeyError,
            TypeError,
            AttributeError,
        ) as exc:
            error = _describe(exc)
            if not self.error:
                self.failing_since = time.time()
                log.warning(
                    "listing the models of provider %s failed (%s); keeping the "
                    "last good list of %d models",
                    config.name,
                    error,
                    len(self.models),
                )
            self.error = error
        else:
            if self.error:
                log.info("listing the models of provider %s works again", config.name)
            self.models, self.error, self.failing_since = names, "", None
            self.ok_at, self.ok_at_wall = time.monotonic(), time.time()
        finally:
            self._first.set()

    def status(self) -> dict:
        """What `/api/models/` and `/healthz` say about this listing."""
        if self.error:
            state = "failing"
        elif self.ok_at is None:
            state = "pending"
        else:
            state = "ok"
        return {
            "listing": state,
            "error": self.error or None,
            "failing_since": _iso(self.failing_since),
            "listed_at": _iso(self.ok_at_wall),
            "models_listed": len(self.models),
        }


def upstream_busy(name: str) -> bool:
    """Whether provider `name` streams an answer now, in this process or any
    other (a running run's turn names its provider)."""
    provider = _providers.get(name)
    if provider is not None and provider.active_requests > 0:
        return True
    from journal.models import Run  # late: models are not loaded at import time

    from ..models import Turn

    try:
        return Turn.objects.filter(
            provider=name, run__status=Run.Status.RUNNING
        ).exists()
    except Exception:  # no database here (a test without one, an outage)
        return False
    finally:
        connection.close()  # this thread's own connection


def _describe(exc: Exception) -> str:
    """A failure by its status or class: never a URL (it may carry credentials)."""
    if isinstance(exc, httpx.HTTPStatusError):
        return f"HTTP {exc.response.status_code}"
    return type(exc).__name__


def _iso(wall: float | None) -> str | None:
    if wall is None:
        return None
    return datetime.fromtimestamp(wall, tz=UTC).isoformat()


_listings: dict[str, Listing] = {}
_listings_lock = threading.Lock()


def _listing(config: ProviderConfig) -> Listing:
    with _listings_lock:
        listing = _listings.get(config.name)
        if listing is None or listing.config != config:
            listing = _listings[config.name] = Listing(config)
        return listing


def _listed_models(config: ProviderConfig) -> list[str]:
    """The models a provider lists at `GET /models`: the last good list."""
    if not config.base_url:
        return []
    return _listing(config).current()


def listing_status() -> dict[str, dict]:
    """Per provider with an endpoint: whether its model listing works."""
    return {
        config.name: _listing(config).status()
        for config in configs().values()
        if config.base_url
    }


def admin_routes(
    found: dict[str, ProviderConfig], model: str | None = None
) -> dict[str, str]:
    """The admin's enabled routes to configured providers, model -> provider
    (only `model`'s when given). A route to a provider the settings no longer
    configure is ignored; the admin's route list says so."""
    from ..models import ModelRoute  # late: models are not loaded at import time

    routes = ModelRoute.objects.filter(enabled=True)
    if model is not None:
        routes = routes.filter(model=model)
    return {
        name: provider
        for name, provider in routes.values_list("model", "provider")
        if provider in found
    }


def settings_provider_for(model: str, found: dict[str, ProviderConfig]) -> str:
    """The provider the settings alone choose for `model` (no admin route)."""
    for config in found.values():
        if model in config.models:
            return config.name
    for config in found.values():
        if model in _listed_models(config):
            return config.name
    return "openai" if "openai" in found else "demo"


def model_choices() -> list[dict]:
    """Every model a user may pick, with its provider."""
    configured = configs()
    found = configured.values()
    seen: dict[str, str] = {}
    # A model named in a provider's settings belongs to that provider, even if
    # another endpoint lists it too.
    for config in found:
        for model in config.models:
            seen.setdefault(model, config.name)
    for config in found:
        for model in _listed_models(config):
            seen.setdefault(model, config.name)
    # The admin's choice wins; a routed model no provider names joins the list.
    seen.update(admin_routes(configured))
    kinds = {
        config.name: "demo" if config.name == "demo" else config.kind
        for config in found
    }
    vision = set(settings.HERMES.get("VISION_MODELS") or ())
    return [
        {
            "id": model,
            "provider": provider,
            "kind": kinds[provider],
            "vision": model in vision or configured[provider].takes_images(model),
        }
        for model, provider in seen.items()
    ]


def takes_images(model: str) -> bool:
    """Whether `model` is sent images (else an image attachment is refused)."""
    if model in (settings.HERMES.get("VISION_MODELS") or ()):
        return True
    config = configs().get(provider_name_for(model))
    return config is not None and config.takes_images(model)


def default_model() -> str:
    hermes = settings.HERMES
    if hermes["DEFAULT_MODEL"]:
        return hermes["DEFAULT_MODEL"]
    choices = model_choices()
    non_demo = [c["id"] for c in choices if c["provider"] != "demo"]
    # A model its server lists comes first: a name in the settings that the
    # server does not serve would fail every chat that did not choose.
    listed = {
        model
        for config in configs().values()
        if config.base_url
        for model in _listed_models(config)
    }
    served = [m for m in non_demo if m in listed]
    return (served or non_demo or [DEMO_MODEL])[0]


def provider_name_for(model: str) -> str:
    """The provider that serves `model` now: the admin's route, else the settings."""
    found = configs()
    routed = admin_routes(found, model).get(model)
    return routed or settings_provider_for(model, found)


def is_known_model(model: str) -> bool:
    """Listed or configured; or possibly listed: a listing that never answered
    yet fails open (the provider itself refuses a model it lacks)."""
    if any(choice["id"] == model for choice in model_choices()):
        return True
    return any(
        _listing(config).ok_at is None
        for config in configs().values()
        if config.base_url
    )


_providers: dict[str, Provider] = {}


def get_provider(name: str) -> Provider:
    """The provider object for `name`, built on first use and then shared."""
    provider = _providers.get(name)
    if provider is None:
        config = configs().get(name)
        if config is None:
            raise KeyError(f"no provider {name!r}")
        provider = DemoProvider() if name == "demo" else _build(config)
        _providers[name] = provider
    return provider


def _build(config: ProviderConfig) -> OpenAIProvider:
    """The provider object of `config.kind` (checked by the `chat` system check)."""
    hermes = settings.HERMES
    options = dict(config.options)
    common = {
        "idle_timeout": hermes["STREAM_IDLE_TIMEOUT_S"],
        "max_http_retries": options.pop("http_retries", hermes["HTTP_RETRIES"]),
        "retry_budget_s": options.pop("retry_budget_s", hermes["RETRY_BUDGET_S"]),
        "model_max_tokens": hermes.get("MODEL_OUTPUT_TOKENS") or {},
    }
    if config.kind == "anthropic":  # the API requires a limit; it has its own
        return AnthropicProvider(
            config.name, config.base_url, config.api_key, **common, **options
        )
    options.setdefault("max_tokens", hermes["MAX_OUTPUT_TOKENS"] or None)
    cls = ResponsesProvider if config.kind == "responses" else OpenAIProvider
    return cls(config.name, config.base_url, config.api_key, **common, **options)


def built() -> dict[str, object]:
    """The providers built so far in this process, by name."""
    return dict(_providers)


def active_requests() -> int:
    """Provider request slots in use in this process: 0 when idle."""
    return sum(getattr(p, "active_requests", 0) for p in _providers.values())


def reset() -> None:
    """Forget built providers and model listings (settings changed: tests, reloads)."""
    for provider in _providers.values():
        provider.discard()
    _providers.clear()
    with _listings_lock:
        _listings.clear()
