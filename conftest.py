"""Fixtures shared by every test: users, runs, and a real ASGI server."""

import os
import warnings

import pytest

from hermes_testing.harness import AsgiServer, make_user
from journal import dbpool

# Worker processes the tests start inherit this: no title run after a chat's
# first answer (one more model request than a test scripts or counts). In this
# process `_no_titles` says the same; tests of titles turn them on.
os.environ["HERMES_TITLES"] = "0"


@pytest.fixture(scope="session", autouse=True)
def _close_pool_connections(django_db_setup, django_db_blocker):
    """Pool threads hold connections; close them before the test database goes.

    On PostgreSQL any other session still open on the test database (a
    server thread's connection) would keep it from being dropped, leaving a
    `test_hermes_<pid>` behind: those sessions of this run's own test
    database are ended first.

    A module that imports the ASGI application at collection warms the pools
    (`hermes_site.asgi.warm_up`) before the test database exists: their
    threads, and the connections they opened, are stopped here first.
    """
    dbpool.shutdown()
    yield
    dbpool.shutdown()
    from django.db import connection

    db = connection.settings_dict
    if connection.vendor != "postgresql" or db["NAME"] != db["TEST"]["NAME"]:
        return  # no test database on PostgreSQL: none of the tests run used one
    try:
        with django_db_blocker.unblock(), connection.cursor() as cursor:
            cursor.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
    except Exception as exc:  # the drop then warns, as it did before
        warnings.warn(
            f"could not end the test database's other sessions: {exc}", stacklevel=1
        )


@pytest.fixture(autouse=True)
def _fresh_request_throttles():
    """Throttle counters are keyed by user id, and ids repeat from test to test:
    each test starts with none. Only a cache in this process's memory is
    cleared, never a shared one."""
    from django.core.cache import caches
    from django.core.cache.backends.locmem import LocMemCache

    if isinstance(caches["default"], LocMemCache):
        caches["default"].clear()


@pytest.fixture(autouse=True)
def _no_titles(settings):
    """A generated title is one more model request after a chat's first answer;
    tests that count requests or notices do not expect it. Tests of titles
    turn them on (`titles_on`)."""
    settings.HERMES = {**settings.HERMES, "TITLES": False}


@pytest.fixture
def titles_on(_no_titles, settings):
    settings.HERMES = {**settings.HERMES, "TITLES": True}


@pytest.fixture(scope="session")
def server(django_db_setup, django_db_blocker):
    with django_db_blocker.unblock():  # loading the application warms the pools
        from hermes_site.asgi import application

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
    from hermes_testing.fake_llm import FakeLLM

    with FakeLLM(models=["fake-model", "other-model"]) as fake:
        yield fake


@pytest.fixture
def fake_llm(_fake_llm_server, settings):
    """The loopback OpenAI-compatible server: provider `openai`, model `fake-model`."""
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


@pytest.fixture
def private_redis(settings):
    """A redis-server of the test's own as the channel layer; killable at will."""
    from hermes_testing.private_servers import PrivateRedis
    from journal.outages import Outage

    Outage._all.clear()
    with PrivateRedis() as redis_server:
        settings.CHANNEL_LAYERS = {
            "default": {
                # The deployment's layer, with its own inbox reader.
                "BACKEND": "hermes_site.channel_layers.HermesRedisChannelLayer",
                "CONFIG": {"hosts": [redis_server.url], "capacity": 1000},
            }
        }
        yield redis_server
    Outage._all.clear()


@pytest.fixture
def root(transactional_db, django_user_model, client):
    """A superuser, signed in on the test `client` (the admin's tests)."""
    user = django_user_model.objects.create_superuser(
        "root", "root@example.com", "pw-rootroot"
    )
    client.force_login(user)
    return user
