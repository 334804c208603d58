"""WebSocket handshakes: the full Origin (scheme, host, port) must be allowed.

A signed-in user's cookie rides along from any page the browser shows, so a
page on another port or scheme of the same host must not read their runs.
"""

import asyncio

import pytest
import websockets
from django.test import Client

from hermes_testing.harness import read_ws, running_run
from journal.publish import append_and_publish

END = ("end", {"status": "completed", "terminal_state": "completed"})


@pytest.fixture
def cookie_run(server, alice):
    """A finished run of alice and her browser's session cookie."""
    run = running_run(alice[0])
    server.call(
        append_and_publish(
            run_id=run.id, token=1, events=[("token", {"text": "x"}), END]
        )
    )
    client = Client()
    client.force_login(alice[0])
    return run, {"Cookie": f"sessionid={client.cookies['sessionid'].value}"}


def handshake(server, run, headers, origin):
    url = f"{server.ws_url}/ws/runs/{run.id}/"
    return asyncio.run(read_ws(url, headers=headers, origin=origin))


def test_own_origin_reads_the_run_with_the_cookie(server, cookie_run):
    run, cookie = cookie_run
    frames, code = handshake(server, run, cookie, f"http://127.0.0.1:{server.port}")
    assert [f["seq"] for f in frames] == [1, 2] and code == 1000


@pytest.mark.parametrize(
    "origin",
    [
        "http://127.0.0.1:{other}",  # same host, another port: the audit's page
        "https://127.0.0.1:{port}",  # same host and port, another scheme
        "http://127.0.0.1",  # default port 80
        "http://localhost:{port}",  # an allowed host, but not this handshake's
        "http://evil.example",
        "null",  # sandboxed iframes and file:// pages
        "http://127.0.0.1:{port}/path",
    ],
)
def test_other_origins_are_refused_even_with_the_cookie(server, cookie_run, origin):
    run, cookie = cookie_run
    origin = origin.format(port=server.port, other=server.port + 1)
    with pytest.raises(websockets.InvalidStatus) as refused:
        handshake(server, run, cookie, origin)
    assert refused.value.response.status_code == 403


def test_trusted_origins_name_scheme_host_and_port(server, cookie_run, settings):
    run, cookie = cookie_run
    settings.CSRF_TRUSTED_ORIGINS = ["https://chat.example.org", "https://*.corp.test"]
    for origin in ["https://chat.example.org", "https://a.corp.test:443"]:
        frames, code = handshake(server, run, cookie, origin)
        assert code == 1000 and frames, origin
    for origin in [
        "http://chat.example.org",
        "https://chat.example.org:8443",
        "https://evilcorp.test",
    ]:
        with pytest.raises(websockets.InvalidStatus):
            handshake(server, run, cookie, origin)


def test_proxy_header_makes_the_own_origin_https(server, cookie_run, settings):
    run, cookie = cookie_run
    settings.SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    https_origin = f"https://127.0.0.1:{server.port}"
    headers = {**cookie, "X-Forwarded-Proto": "https"}
    frames, code = handshake(server, run, headers, https_origin)
    assert code == 1000 and frames
    with pytest.raises(websockets.InvalidStatus):
        handshake(server, run, cookie, https_origin)  # no header: plain http


def test_no_origin_needs_a_token(server, cookie_run, alice):
    run, _cookie = cookie_run
    frames, code = handshake(server, run, alice[1], None)
    assert code == 1000 and frames
