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
    settings.HERMES = {**settings.HERMES, "READER_IDLE_CHECK_S": 0.3, "SSE_KEEPALIVE_S": 0.5}


@pytest.fixture
def alice(transactional_db, django_user_model):
    return make_user(django_user_model, "alice")


@pytest.fixture
def bob(transactional_db, django_user_model):
    return make_user(django_user_model, "bob")
