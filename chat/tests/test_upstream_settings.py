"""What each provider is sent and how long it is retried, from the settings:
an output limit on every request, the continuation flags of a resume, and
rule 1's retries per provider with their budget (docs/providers.md)."""

from __future__ import annotations

import asyncio
import contextlib
import time

import pytest

from chat.providers import registry
from chat.providers.base import ProviderError
from hermes_testing.api import new_session, start_run, stream, text_of
from hermes_testing.fake_llm import FakeLLM, Reply
from journal.models import Run

MESSAGES = [{"role": "user", "content": "hi"}]


def _providers(settings, fake: FakeLLM, **entry) -> None:
    local = {"name": "local", "base_url": fake.base_url, "models": ["m"], **entry}
    settings.HERMES = {**settings.HERMES, "PROVIDERS": [local]}
    registry.reset()


async def _drain(
    provider, messages=MESSAGES, *, model: str = "m", **options
) -> ProviderError | None:
    """Read one stream to its end (`options` go to `stream`); its error."""
    try:
        stream = provider.stream(model, messages, **options)
        async with contextlib.aclosing(stream) as items:
            async for _ in items:
                pass
    except ProviderError as error:
        return error
    finally:
        await provider.aclose()
    return None


def test_every_request_carries_an_output_limit(settings):
    with FakeLLM() as fake:
        _providers(settings, fake)
        assert asyncio.run(_drain(registry.get_provider("local"))) is None
        assert fake.requests[0].body["max_tokens"] == 4096  # the default
        settings.HERMES = {**settings.HERMES, "MAX_OUTPUT_TOKENS": 0}
        _providers(settings, fake)
        asyncio.run(_drain(registry.get_provider("local")))
        assert "max_tokens" not in fake.requests[1].body  # none: the server's own
        _providers(settings, fake, max_tokens=64)
        asyncio.run(_drain(registry.get_provider("local")))
        assert fake.requests[2].body["max_tokens"] == 64  # the provider's wins
    registry.reset()


def test_a_resume_asks_for_a_continuation_as_the_provider_is_set(settings):
    partial = [*MESSAGES, {"role": "assistant", "content": "Once upon"}]
    with FakeLLM() as fake:
        _providers(settings, fake)
        asyncio.run(_drain(registry.get_provider("local"), partial))
        assert "continue_final_message" not in fake.requests[0].body  # prefill
        assert fake.requests[0].messages[-1] == partial[-1]
        _providers(settings, fake, continuation="continue_final_message")
        asyncio.run(_drain(registry.get_provider("local"), partial))
        body = fake.requests[1].body
        assert body["continue_final_message"] is True
        assert body["add_generation_prompt"] is False
        asyncio.run(_drain(registry.get_provider("local")))  # not a resume
        assert "continue_final_message" not in fake.requests[2].body
    registry.reset()


def test_retries_are_set_per_provider(settings):
    with FakeLLM() as fake:
        _providers(settings, fake, http_retries=0)
        fake.push(Reply(status=429, retry_after=0), Reply(text="late"))
        error = asyncio.run(_drain(registry.get_provider("local")))
        assert error is not None and error.category == "rate_limit"
        assert fake.post_count == 1  # no retry of ours on top of a proxy's
    registry.reset()


def test_a_retry_after_past_the_budget_fails_at_once_and_says_why(settings):
    with FakeLLM() as fake:
        _providers(settings, fake, retry_budget_s=5)
        fake.push(Reply(status=429, retry_after=30))
        began = time.monotonic()
        error = asyncio.run(_drain(registry.get_provider("local")))
        assert time.monotonic() - began < 20  # never waited the 30 s asked
        assert error is not None and error.category == "rate_limit"
        assert "asked to wait 30 s" in error.message
        assert "5 s retry budget" in error.message
        assert fake.post_count == 1
    registry.reset()


@pytest.mark.slow
def test_an_answer_cut_at_its_output_limit_says_so(
    server, alice, fake_llm, live_worker
):
    fake_llm.push(Reply(text="A long answer that went on and", finish_reason="length"))
    session_id = new_session(server, alice[1])
    run_id = start_run(server, alice[1], session_id, "tell me everything")
    events = stream(server, alice[1], run_id)
    assert text_of(events) == "A long answer that went on and"
    assert events[-1][2]["status"] == "completed"
    assert events[-1][2]["terminal_state"] == "output-limit"
    assert Run.objects.get(id=run_id).terminal_state == "output-limit"


def test_a_base_url_without_v1_is_named_at_startup_and_in_the_error(settings):
    from chat.checks import check_base_urls

    with FakeLLM() as fake:
        bare = fake.base_url.removesuffix("/v1")
        settings.HERMES = {**settings.HERMES, "OPENAI_BASE_URL": bare}
        (warning,) = check_base_urls()
        assert warning.id == "hermes.W010" and "does not end in /v1" in warning.msg
        _providers(settings, fake)
        settings.HERMES = {**settings.HERMES, "PROVIDERS": []}
        provider = registry.get_provider("openai")
        error = asyncio.run(_drain(provider))
        assert error is not None and error.category == "invalid_request"
        assert "HTTP 404" in error.message and "ends in /v1" in error.message
    registry.reset()


def test_a_server_that_is_down_is_named_without_its_address(settings):
    import socket

    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    url = f"http://127.0.0.1:{port}/v1"
    settings.HERMES = {
        **settings.HERMES,
        "PROVIDERS": [{"name": "local", "base_url": url, "http_retries": 0}],
    }
    registry.reset()
    error = asyncio.run(_drain(registry.get_provider("local")))
    assert error is not None and error.category == "network"
    assert "could not connect to the model's server" in error.message
    assert str(port) not in error.message and "ssl" not in error.message
    registry.reset()


def test_a_proxys_traceback_mid_stream_is_cut_to_its_first_line(settings):
    trace = (
        "litellm.APIError: upstream failed\n"
        'Traceback (most recent call last):\n  File "/srv/proxy/router.py", line 9'
    )
    with FakeLLM() as fake:
        _providers(settings, fake)
        fake.push(Reply(status=500, error_body={"error": {"message": trace}}))
        fake.push(Reply(status=500, error_body={"error": {"message": trace}}))
        fake.push(Reply(status=500, error_body={"error": {"message": trace}}))
        fake.push(Reply(status=500, error_body={"error": {"message": trace}}))
        settings.HERMES = {**settings.HERMES}
        provider = registry.get_provider("local")
        provider.backoff_base = 0.01
        error = asyncio.run(_drain(provider))
        assert error is not None
        assert error.message == "HTTP 500: litellm.APIError: upstream failed"
    registry.reset()


def test_the_default_model_is_one_the_server_lists(settings):
    with FakeLLM(models=["served"]) as fake:
        settings.HERMES = {
            **settings.HERMES,
            "OPENAI_BASE_URL": fake.base_url,
            "DEFAULT_MODEL": "",
            "MODELS": ["not-served", "served"],
        }
        registry.reset()
        assert registry.default_model() == "served"
    registry.reset()


def test_one_answer_may_ask_for_less_than_the_providers_limit(settings):
    with FakeLLM() as fake:
        _providers(settings, fake, max_tokens=64)
        provider = registry.get_provider("local")
        asyncio.run(_drain(provider, max_tokens=8))
        asyncio.run(_drain(provider, max_tokens=500))
        assert [r.body["max_tokens"] for r in fake.requests] == [8, 64]
    registry.reset()


def test_a_model_may_have_an_output_limit_of_its_own(settings):
    with FakeLLM(models=["m", "small"]) as fake:
        settings.HERMES = {**settings.HERMES, "MODEL_OUTPUT_TOKENS": {"small": 512}}
        _providers(settings, fake, max_tokens=64)
        provider = registry.get_provider("local")
        for model in ("m", "small"):
            asyncio.run(_drain(provider, model=model))
        assert [r.body["max_tokens"] for r in fake.requests] == [64, 512]
    registry.reset()
