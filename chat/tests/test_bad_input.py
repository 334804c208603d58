"""Hostile input answers a 4xx (or the documented fallback), never a 500.

Over real sockets: cursors that `str.isdigit` accepts but `int` refuses, deeply
nested JSON, forged pagination cursors, NUL bytes (PostgreSQL refuses them in
text), path traversal under `manage.py serve`, and overflowing admin pages.
"""

import asyncio
import base64
import json
import socket
from urllib.parse import quote, urlencode

import httpx
import pytest

from chat.models import ChatSession, Message
from hermes_testing.harness import (
    read_sse,
    read_ws,
    running_run,
    spawn,
    subprocess_env,
    wait_until,
)
from hermes_testing.turns import running_turn
from journal.models import Run
from journal.publish import append_and_publish

END = ("end", {"status": "completed", "terminal_state": "completed"})
HUGE = "9" * 5000  # over Python's 4,300-digit int() limit
BAD_SEQS = ["²", "①", "1²", HUGE]
BAD_IDS = ["superscript", "circled", "mixed", "5000-digits"]


def finished_run(server, owner, n=3) -> Run:
    run = running_run(owner)
    tokens = [("token", {"text": f"w{i} "}) for i in range(n)]
    server.call(append_and_publish(run_id=run.id, token=1, events=[*tokens, END]))
    return run


def seqs(result) -> list[int]:
    return [int(event_id.rsplit(":", 1)[1]) for event_id, _, _ in result.events]


@pytest.mark.parametrize("raw", BAD_SEQS, ids=BAD_IDS)
def test_sse_cursor_of_odd_digits_replays_from_the_start(server, alice, raw):
    run = finished_run(server, alice[0])
    base = f"{server.url}/api/runs/{run.id}/events/"
    for url, extra in [
        (f"{base}?{urlencode({'after_seq': raw})}", {}),
        (f"{base}?{urlencode({'after_event_id': f'{run.id}:{raw}'})}", {}),
        (base, {"Last-Event-ID": f"{run.id}:{raw}".encode()}),
    ]:
        result = read_sse(url, headers={**alice[1], **extra})
        assert result.status == 200, (url[-40:], extra.keys())
        assert seqs(result) == [1, 2, 3, 4]


@pytest.mark.parametrize("raw", BAD_SEQS, ids=BAD_IDS)
def test_ws_cursor_of_odd_digits_replays_from_the_start(server, alice, raw):
    run = finished_run(server, alice[0])
    base = f"{server.ws_url}/ws/runs/{run.id}/"
    for url, extra in [
        (f"{base}?{urlencode({'after_seq': raw})}", {}),
        (f"{base}?{urlencode({'after_event_id': f'{run.id}:{raw}'})}", {}),
        (base, {"Last-Event-ID": f"{run.id}:{raw}".encode().decode("latin-1")}),
    ]:
        frames, code = asyncio.run(read_ws(url, headers={**alice[1], **extra}))
        assert code == 1000
        assert [f["seq"] for f in frames] == [1, 2, 3, 4]


def nested(depth: int) -> str:
    return '{"content": ' + "[" * depth + "]" * depth + "}"


@pytest.mark.parametrize(
    "method,path",
    [
        ("POST", "/api/sessions/"),
        ("PATCH", "/api/sessions/{sid}/"),
        ("POST", "/api/sessions/{sid}/runs/"),
    ],
)
def test_deeply_nested_json_is_400(server, alice, method, path):
    session = ChatSession.objects.create(owner=alice[0])
    run = running_turn(alice[0], session=session)
    body = nested(6000)  # 12 KB; the audit used 6 KB
    assert len(body) > 6000
    response = httpx.request(
        method,
        server.url + path.format(sid=session.pk, rid=run.id),
        content=body,
        headers={**alice[1], "Content-Type": "application/json"},
    )
    assert response.status_code == 400, response.text[:200]
    assert "JSON" in response.json()["error"]
    assert Message.objects.count() == 0


@pytest.mark.slow
def test_forged_message_cursor_is_404_not_500(server, alice):
    session = ChatSession.objects.create(owner=alice[0])
    Message.objects.create(session=session, role="user", content="hi")
    url = f"{server.url}/api/sessions/{session.pk}/messages/"
    assert httpx.get(url, headers=alice[1]).status_code == 200
    for position in ["abc", "1.5", "²", HUGE, "9" * 30, "-1"]:
        forged = base64.b64encode(urlencode({"p": position}).encode()).decode()
        response = httpx.get(url, params={"cursor": forged}, headers=alice[1])
        assert response.status_code == 404, (position[:10], response.text[:200])
        assert "cursor" in response.json()["error"].lower()


def test_nul_in_a_run_id_or_query_is_a_4xx(server, alice):
    session = ChatSession.objects.create(owner=alice[0], title="mine")
    for url in [
        f"{server.url}/api/runs/run_%00x/",
        f"{server.url}/api/runs/run_%00x/events/",
        f"{server.url}/api/runs/run_%00x/events.json",
        f"{server.url}/api/sessions/?q=a%00b",
        f"{server.url}/api/sessions/{session.pk}/messages/?q=%00",
    ]:
        response = httpx.get(url, headers=alice[1])
        assert response.status_code in (400, 404), (url, response.text[:200])
        assert "error" in response.json()
    frames, code = asyncio.run(
        read_ws(f"{server.ws_url}/ws/runs/run_%00x/", headers=alice[1])
    )
    assert (frames, code) == ([], 4404)


@pytest.mark.slow
def test_nul_in_an_admin_search_is_400(server, transactional_db, django_user_model):
    root = django_user_model.objects.create_superuser("root", "r@x.org", "pw-root99!")
    client = httpx.Client(base_url=server.url)
    client.get("/admin/login/")
    login = client.post(
        "/admin/login/",
        data={
            "username": root.username,
            "password": "pw-root99!",
            "csrfmiddlewaretoken": client.cookies["csrftoken"],
        },
        headers={"Referer": server.url + "/admin/login/"},
    )
    assert login.status_code == 302
    for path in ["/admin/journal/run/", "/admin/chat/chatsession/"]:
        response = client.get(path + "?q=" + quote("a\x00b"))
        assert response.status_code == 400, path


@pytest.mark.parametrize(
    "page",
    ["99999999999999999999", HUGE, "-5", "²"],
    ids=["20-digits", *BAD_IDS[3:], "negative", "superscript"],
)
@pytest.mark.slow
def test_overflowing_admin_page_numbers_do_not_500(
    server, alice, django_user_model, page
):
    root = django_user_model.objects.create_superuser("root", "r@x.org", "pw-root99!")
    finished_run(server, alice[0])
    client = httpx.Client(base_url=server.url)
    client.get("/admin/login/")
    client.post(
        "/admin/login/",
        data={
            "username": root.username,
            "password": "pw-root99!",
            "csrfmiddlewaretoken": client.cookies["csrftoken"],
        },
        headers={"Referer": server.url + "/admin/login/"},
    )
    run = Run.objects.get()
    for path in [
        "/admin/journal/event/",
        "/admin/chat/message/",
        "/admin/journal/run/",
        "/admin/chat/chatsession/",
        f"/admin/journal/run/{run.id}/events.json?after_seq={page}&limit=1&x=",
    ]:
        sep = "&" if "?" in path else "?"
        response = client.get(f"{path}{sep}p={page}")
        assert response.status_code < 500, path
        assert response.status_code in (200, 302, 400), path


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def raw_get_status(port: int, path: str) -> int:
    """GET `path` exactly as written (clients normalise away the `..`)."""
    with socket.create_connection(("127.0.0.1", port), timeout=20) as sock:
        request = f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close"
        sock.sendall(f"{request}\r\n\r\n".encode())
        head = sock.makefile("rb").readline().decode()
    return int(head.split()[1])


@pytest.mark.slow
def test_static_dot_dot_under_serve_is_404(transactional_db):
    port = _free_port()
    proc = spawn(
        ["manage.py", "serve", "--no-worker", "--port", str(port)],
        subprocess_env(),
        "Hermes at",
    )
    try:
        base = f"http://127.0.0.1:{port}"

        def listening() -> bool:  # the banner precedes the listening socket
            try:
                return httpx.get(f"{base}/healthz").status_code > 0
            except httpx.ConnectError:
                return False

        wait_until(listening, timeout=30, interval=0.1)
        assert httpx.get(f"{base}/static/hermes/css/app.css").status_code == 200
        for path in [
            "/static/..",
            "/static/../manage.py",
            "/static/%2e%2e/",
        ]:
            assert raw_get_status(port, path) == 404, path
        assert raw_get_status(port, "/static/a%00b") == 400  # as any NUL in a URL
    finally:
        proc.terminate()
        proc.wait(10)


def test_nul_in_json_text_is_400_not_500(server, alice):
    session = ChatSession.objects.create(owner=alice[0])
    response = httpx.post(
        f"{server.url}/api/sessions/{session.pk}/runs/",
        content=json.dumps({"content": "a\x00b"}),
        headers={**alice[1], "Content-Type": "application/json"},
    )
    assert response.status_code == 400
    assert not Run.objects.exists()


def test_provider_json_nested_too_deeply_is_a_provider_error():
    """A model server's chunk or error body is parsed by hand, not by DRF."""
    from chat.providers.base import ProviderError
    from chat.providers.http import detail
    from chat.providers.openai import _parse_chunk

    assert detail(b"[" * 6000).startswith("[[[")  # falls back to the raw text
    with pytest.raises(ProviderError, match="malformed chunk"):
        list(_parse_chunk("[" * 6000))
