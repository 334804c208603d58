"""Database errors become 503 + Retry-After on every path, in process.

The daphne-level proof is `test_database_outage.py` (a real cluster stopped);
these cover the paths it does not reach: an error that escapes a middleware
before any view runs, and the WebSocket's close code.
"""

import asyncio

import httpx
import pytest
import websockets
from django.contrib.sessions.backends.db import SessionStore
from django.db import OperationalError

from chat import consumers
from hermes_testing.harness import running_run
from journal.outages import Outage


@pytest.fixture(autouse=True)
def _fresh_outages():
    Outage._all.clear()
    yield
    Outage._all.clear()


def _down(*args, **kwargs):
    raise OperationalError("the database system is shutting down")


def test_an_error_outside_the_views_is_a_503_not_a_500(
    client, db, monkeypatch, caplog, settings
):
    """Without the middleware's hook, only `handler500` stands between the
    error and a 500: what escapes a middleware takes that path."""
    settings.MIDDLEWARE = [
        m for m in settings.MIDDLEWARE if not m.endswith("DatabaseOutageMiddleware")
    ]
    client.raise_request_exception = False
    client.cookies["sessionid"] = "x" * 32  # the session is read before any view
    monkeypatch.setattr(SessionStore, "load", _down)
    for _ in range(3):
        response = client.get("/")
        assert response.status_code == 503
        assert response["Retry-After"] == "5"
        assert response.json()["error"].startswith("the database is unavailable")
    lines = [r.getMessage() for r in caplog.records if r.name == "journal.outages"]
    assert len(lines) == 1 and "database unavailable" in lines[0]
    assert not [r for r in caplog.records if r.name == "django.request"]


def _limit_exceeded(*args, **kwargs):
    error = OperationalError("index row requires 1200000 bytes, maximum size is 8191")
    error.sqlstate = "54000"  # program limit exceeded
    raise error


def test_an_error_of_the_request_itself_is_no_outage(client, db, monkeypatch, caplog):
    """A limit of the server exceeded is filed under OperationalError too; a
    503 would tell the client to send the same request again for ever."""
    client.raise_request_exception = False
    client.cookies["sessionid"] = "x" * 32
    monkeypatch.setattr(SessionStore, "load", _limit_exceeded)
    response = client.get("/")
    assert response.status_code == 500
    assert "Retry-After" not in response
    assert not [r for r in caplog.records if r.name == "journal.outages"]


def test_a_websocket_meets_the_outage_with_close_code_1013(server, alice, monkeypatch):
    run = running_run(alice[0])
    monkeypatch.setattr(consumers, "_authorize", _down)

    async def close_code() -> int | None:
        async with websockets.connect(
            f"{server.ws_url}/ws/runs/{run.id}/",
            additional_headers=alice[1],
            origin=server.url,
        ) as ws:
            try:
                await asyncio.wait_for(ws.recv(), 20)
            except websockets.ConnectionClosed as closed:
                return closed.rcvd.code if closed.rcvd else None
        return None

    assert asyncio.run(close_code()) == consumers.CLOSE_TRY_AGAIN == 1013


def test_the_api_answers_503_with_a_json_body(server, alice, monkeypatch):
    from chat import sse

    run = running_run(alice[0])
    monkeypatch.setattr(sse, "_authorize", _down)
    response = httpx.get(f"{server.url}/api/runs/{run.id}/events/", headers=alice[1])
    assert response.status_code == 503 and response.headers["Retry-After"] == "5"
    assert response.json()["retry_after_s"] == 5
