"""Django's async-safety check stays on in the server the browser tests use.

The browser tests' own thread may use the ORM beside Playwright's event loop
(`hermes_testing.browser.orm_in_this_thread`); the server's event loop may not:
a synchronous ORM call there would block every stream it serves, and the
check is what turns such a call into a failing test.
"""

import os

import pytest
from django.contrib.auth.models import User
from django.core.exceptions import SynchronousOnlyOperation

from hermes_testing.browser import PYTESTMARK

pytestmark = PYTESTMARK


def test_orm_on_the_servers_event_loop_raises(browser, server, alice, open_page):
    page = open_page(alice[0])  # Playwright is driving a page meanwhile
    assert "DJANGO_ALLOW_ASYNC_UNSAFE" not in os.environ
    assert User.objects.filter(username="alice").exists()  # the test's thread

    async def orm_on_the_loop() -> int:
        return User.objects.count()

    with pytest.raises(SynchronousOnlyOperation):
        server.call(orm_on_the_loop())
    assert page.get_by_test_id("app").get_attribute("data-ready") == "true"
