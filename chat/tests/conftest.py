"""Fixtures of chat's tests: alice's API client and chat, and a tool that asks."""

import pytest
from rest_framework.test import APIClient

from chat.models import ChatSession


@pytest.fixture
def api(alice):
    """A DRF test client signed in as alice (no server: the view is called)."""
    client = APIClient()
    client.force_authenticate(alice[0])
    return client


@pytest.fixture
def session(alice):
    return ChatSession.objects.create(owner=alice[0], title="mine")


@pytest.fixture
def asking(settings):
    """The calculator waits for a person's approval: a run parked at a tool step."""
    settings.HERMES = {**settings.HERMES, "TOOL_APPROVAL": {"calculator": "ask"}}
