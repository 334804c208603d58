"""What a request may make the server hold before any view runs, over real
sockets, under the tests' server (uvicorn) and under daphne
(hermes_site/request_limits.py; docs/security.md, "Request bodies and
headers"):

- a declared body over the route's bound is answered 413 naming the bound,
  without login and before the body is sent;
- a chunked body is answered 413 as soon as it passes the bound, before it
  ends;
- a body that stops arriving is answered 408 after the body timeout;
- a header line over 16 KiB is answered 431 under daphne (it was dropped
  without an answer), headers over 16 KiB in all 400;
- the SSE endpoints answer GET and HEAD only: 405 with `Allow` otherwise.
"""

from __future__ import annotations

import json
import socket
import time

import httpx
import pytest

from chat import limits
from hermes_testing.harness import (
    daphne_args,
    make_user,
    running_run,
    spawn_logged,
    subprocess_env,
    wait_until,
)
from hermes_testing.private_servers import free_port

KiB = 1024
MiB = 1024 * KiB
ANSWER_WITHIN_S = 20  # generous: every answer here comes at once, or after 1 s


class Answer:
    def __init__(self, raw: bytes):
        self.raw = raw
        head, _, self.body = raw.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        self.status = int(lines[0].split()[1]) if lines[0] else 0
        self.headers = {
            k.strip().lower(): v.strip()
            for k, _, v in (line.partition(":") for line in lines[1:])
        }

    def json(self) -> dict:
        return json.loads(self.body)


def _connect(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=ANSWER_WITHIN_S)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def _read_answer(sock: socket.socket) -> Answer:
    """Everything the server sends until it closes (or its whole
    Content-Length arrived). A server that never answers fails the test at
    the socket's timeout."""
    data = b""
    while True:
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            raise AssertionError(
                f"no answer within {ANSWER_WITHIN_S} s (got {data[:200]!r})"
            ) from None
        except ConnectionResetError:
            break
        if not chunk:
            break
        data += chunk
        answer = Answer(data)
        length = answer.headers.get("content-length")
        if length is not None and len(answer.body) >= int(length):
            break
    return Answer(data)


def _head(path: str, *lines: str) -> bytes:
    return (
        "\r\n".join([f"POST {path} HTTP/1.1", "Host: 127.0.0.1", *lines]) + "\r\n\r\n"
    ).encode()


def declared_over(port: int, path: str, length: int) -> Answer:
    """Headers declaring `length` bytes, and not one byte of the body."""
    with _connect(port) as sock:
        sock.sendall(_head(path, f"Content-Length: {length}"))
        return _read_answer(sock)


def chunked_over(port: int, path: str, send: int, piece: int = 8 * KiB) -> Answer:
    """A chunked body of `send` bytes, never ended: only an answer given
    before the end of the body comes back."""
    with _connect(port) as sock:
        sock.sendall(_head(path, "Transfer-Encoding: chunked"))
        sent = 0
        try:
            while sent < send:
                sock.sendall(b"%x\r\n%s\r\n" % (piece, b"x" * piece))
                sent += piece
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server stopped taking it: its answer may be waiting
        return _read_answer(sock)


def stalled(port: int, path: str) -> tuple[Answer, float]:
    """100 bytes declared, 20 sent, then nothing: the answer and when."""
    with _connect(port) as sock:
        sock.sendall(_head(path, "Content-Length: 100") + b"x" * 20)
        began = time.monotonic()
        answer = _read_answer(sock)
        return answer, time.monotonic() - began


def _assert_too_large(answer: Answer, setting: str, limit: int) -> None:
    assert answer.status == 413, answer.raw[:300]
    body = answer.json()
    assert body["limit"] == setting and body["max_bytes"] == limit
    assert str(limit) in body["error"]


# --- the tests' server (uvicorn): the ASGI middleware ------------------------


@pytest.fixture
def small_bounds(settings):
    settings.HERMES = {
        **settings.HERMES,
        "MAX_REQUEST_BYTES": 64 * KiB,
        "ATTACHMENT_MAX_BYTES": 256 * KiB,
        "IMPORT_MAX_BYTES": 512 * KiB,
        "REQUEST_BODY_TIMEOUT_S": 1.0,
    }


ENVELOPE = 64 * KiB  # hermes_site.request_limits.MULTIPART_ENVELOPE


def test_declared_bodies_over_the_routes_bound_are_refused_unread(
    server, transactional_db, small_bounds
):
    port = server.port
    _assert_too_large(
        declared_over(port, "/api/attachments/", 1024 * MiB),
        "HERMES_ATTACHMENT_MAX_BYTES",
        256 * KiB + ENVELOPE,
    )
    _assert_too_large(
        declared_over(port, "/api/sessions/import/", 512 * KiB + 1),
        "HERMES_IMPORT_MAX_BYTES",
        512 * KiB,
    )
    for path in ("/api/sessions/", "/accounts/login/", "/admin/login/"):
        _assert_too_large(
            declared_over(port, path, 64 * KiB + 1),
            "HERMES_MAX_REQUEST_BYTES",
            64 * KiB,
        )


def test_a_chunked_body_is_refused_once_past_the_bound(
    server, transactional_db, small_bounds
):
    _assert_too_large(
        chunked_over(server.port, "/api/sessions/", 256 * KiB),
        "HERMES_MAX_REQUEST_BYTES",
        64 * KiB,
    )
    _assert_too_large(
        chunked_over(server.port, "/api/attachments/", 1 * MiB),
        "HERMES_ATTACHMENT_MAX_BYTES",
        256 * KiB + ENVELOPE,
    )


@pytest.mark.slow
def test_a_body_that_stops_arriving_is_answered_408(
    server, transactional_db, small_bounds
):
    answer, after = stalled(server.port, "/api/sessions/")
    assert answer.status == 408, answer.raw[:300]
    assert answer.json()["limit"] == "HERMES_REQUEST_BODY_TIMEOUT_S"
    assert 0.9 <= after < ANSWER_WITHIN_S


def test_bodies_within_the_bounds_go_through(
    server, transactional_db, django_user_model, small_bounds, settings
):
    """The import's and the upload's own bounds let more through than the
    default: their views answer, not the bound."""
    settings.HERMES = {**settings.HERMES, "MAX_MESSAGE_CHARS": 1_000_000}
    _, headers = make_user(django_user_model, "bea")
    big_file = b"a" * (200 * KiB)  # over the default bound, under the upload's
    uploaded = httpx.post(
        f"{server.url}/api/attachments/",
        files={"file": ("notes.txt", big_file, "text/plain")},
        headers=headers,
        timeout=30,
    )
    assert uploaded.status_code == 201, uploaded.text
    imported = httpx.post(
        f"{server.url}/api/sessions/import/",
        content=b"\n" * (300 * KiB),  # not an export: the view says so (400)
        headers=headers,
        timeout=30,
    )
    assert imported.status_code == 400, imported.text
    created = httpx.post(
        f"{server.url}/api/sessions/", json={"title": "t"}, headers=headers
    )
    assert created.status_code == 201


# --- SSE methods ---------------------------------------------------------------


@pytest.mark.parametrize("method", ["POST", "PUT", "PATCH", "DELETE", "OPTIONS"])
def test_the_streams_answer_other_methods_405(
    server, transactional_db, django_user_model, method
):
    user, headers = make_user(django_user_model, "sam")
    run = running_run(user)
    for path in (f"/api/runs/{run.id}/events/", "/api/stream/"):
        answer = httpx.request(
            method, f"{server.url}{path}", headers=headers, timeout=ANSWER_WITHIN_S
        )
        assert answer.status_code == 405, (path, answer.status_code)
        assert answer.headers["Allow"] == "GET, HEAD"
    assert limits.open_streams(user.pk) == 0


def test_head_on_a_stream_answers_its_head_and_holds_no_stream(
    server, transactional_db, django_user_model
):
    user, headers = make_user(django_user_model, "hal")
    run = running_run(user)
    for path in (f"/api/runs/{run.id}/events/", "/api/stream/"):
        answer = httpx.head(
            f"{server.url}{path}", headers=headers, timeout=ANSWER_WITHIN_S
        )
        assert answer.status_code == 200
        assert answer.headers["Content-Type"] == "text/event-stream"
        assert answer.content == b""
    wait_until(lambda: limits.open_streams(user.pk) == 0, timeout=10)


# --- daphne: the guard inside its request -------------------------------------


@pytest.fixture
def daphne_port(transactional_db, tmp_path):
    port = free_port()
    env = subprocess_env(
        HERMES_MAX_REQUEST_BYTES=str(64 * KiB),
        HERMES_ATTACHMENT_MAX_BYTES=str(256 * KiB),
        HERMES_IMPORT_MAX_BYTES=str(512 * KiB),
        HERMES_REQUEST_BODY_TIMEOUT_S="1",
    )
    env.pop("REDIS_URL", None)
    log = tmp_path / "daphne.log"
    daphne = spawn_logged(daphne_args(port), env, log, "Listening on TCP address")
    try:
        yield port
    finally:
        daphne.terminate()
        daphne.wait(20)


@pytest.mark.slow
def test_daphne_refuses_declared_and_chunked_bodies_and_stalls(daphne_port):
    _assert_too_large(
        declared_over(daphne_port, "/api/attachments/", 1024 * MiB),
        "HERMES_ATTACHMENT_MAX_BYTES",
        256 * KiB + ENVELOPE,
    )
    _assert_too_large(
        declared_over(daphne_port, "/api/sessions/", 64 * KiB + 1),
        "HERMES_MAX_REQUEST_BYTES",
        64 * KiB,
    )
    _assert_too_large(
        chunked_over(daphne_port, "/api/sessions/", 256 * KiB),
        "HERMES_MAX_REQUEST_BYTES",
        64 * KiB,
    )
    answer, after = stalled(daphne_port, "/api/sessions/import/")
    assert answer.status == 408, answer.raw[:300]
    assert 0.9 <= after < ANSWER_WITHIN_S
    # Under the bound, the request goes through to the view (no login).
    with httpx.Client(base_url=f"http://127.0.0.1:{daphne_port}") as client:
        answer = client.post("/api/sessions/", json={"title": "x"})
        assert answer.status_code == 403 and "credentials" in answer.text


@pytest.mark.slow
def test_daphne_stops_taking_a_large_upload_at_the_bound(daphne_port):
    """A 96 MiB upload (chunked) is not read past the upload's bound: the
    server stops taking it, and answers 413 if the client reads. (What the
    client gets to send is the bound and the two sides' socket buffers,
    a few MiB each at most on Linux.)"""
    send = 96 * MiB
    with _connect(daphne_port) as sock:
        sock.sendall(_head("/api/attachments/", "Transfer-Encoding: chunked"))
        piece = b"%x\r\n%s\r\n" % (64 * KiB, b"x" * (64 * KiB))
        sent = 0
        try:
            while sent < send:
                sock.sendall(piece)
                sent += len(piece)
        except (BrokenPipeError, ConnectionResetError):
            pass
        answer = _read_answer(sock)
    assert sent < 24 * MiB, f"the server took {sent} bytes"
    if answer.raw:  # a reset may have overtaken the answer
        assert answer.status == 413


@pytest.mark.slow
def test_daphne_answers_a_header_line_over_16_kib(daphne_port):
    with _connect(daphne_port) as sock:
        sock.sendall(
            b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: "
            + b"y" * (17 * KiB)
            + b"\r\n\r\n"
        )
        answer = _read_answer(sock)
    assert answer.status == 431, answer.raw[:300]
    # Many short lines over 16 KiB in all: Twisted's own 400.
    with _connect(daphne_port) as sock:
        lines = b"".join(b"X-H%d: %s\r\n" % (n, b"z" * 1000) for n in range(20))
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n" + lines + b"\r\n")
        answer = _read_answer(sock)
    assert answer.status == 400, answer.raw[:300]
