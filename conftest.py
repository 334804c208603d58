"""Fixtures shared by every test: users, runs, and a real ASGI server."""

import pytest

from hermes_site.testing import AsgiServer, make_user
from journal import dbpool


@pytest.fixture(scope="session", autouse=True)
def _close_pool_connections(django_db_setup):
    """Pool threads hold connections; close them before the test database goes."""
    yield
    dbpool.shutdown()


@pytest.fixture(scope="session")
def server(django_db_setup, django_db_blocker):
    from hermes_site.asgi import application

    with django_db_blocker.unblock():
        srv = AsgiServer(application).start()
        yield srv
        srv.stop()


@pytest.fixture
def fast_readers(settings):
    """Readers that check the journal after 0.3 s of silence instead of seconds."""
    settings.HERMES = {
        **settings.HERMES,
        "READER_IDLE_CHECK_S": 0.3,
        "SSE_KEEPALIVE_S": 0.5,
    }


@pytest.fixture
def alice(transactional_db, django_user_model):
    return make_user(django_user_model, "alice")


@pytest.fixture
def bob(transactional_db, django_user_model):
    return make_user(django_user_model, "bob")


@pytest.fixture(scope="session")
def _fake_llm_server():
    from chat.testing.fake_llm import FakeLLM

    with FakeLLM(models=["fake-model", "other-model"]) as fake:
        yield fake


@pytest.fixture
def fake_llm(_fake_llm_server, settings):
    """The loopback OpenAI-compatible server, wired as provider `openai`, model `fake-model`."""
    from chat.providers import registry

    _fake_llm_server.reset()
    settings.HERMES = {
        **settings.HERMES,
        "OPENAI_BASE_URL": _fake_llm_server.base_url,
        "DEFAULT_MODEL": "fake-model",
        "HEARTBEAT_S": 0.3,
    }
    registry.reset()
    yield _fake_llm_server
    registry.reset()


@pytest.fixture
def live_worker(server, fake_llm):
    """The turn worker running inside the server's event loop (the embedded mode)."""
    from chat.worker import Worker

    worker = Worker(concurrency=8)
    server.call(worker.start())
    yield worker
    server.call(worker.stop(grace_s=5))
