"""The fake model server keeps its promises, checked on raw sockets and httpx."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest

from hermes_testing.fake_llm import FakeLLM, Reply

ROOT = Path(__file__).resolve().parents[2]
STREAM_BODY = {
    "model": "m",
    "stream": True,
    "stream_options": {"include_usage": True},
    "messages": [{"role": "user", "content": "hi"}],
}


@pytest.fixture
def fake():
    with FakeLLM(models=["alpha", "beta"]) as server:
        yield server


def sse_chunks(lines: list[str]) -> list[Any]:
    """JSON payloads of ``data:`` lines; ``[DONE]`` kept as the string."""
    out = []
    for line in lines:
        if line.startswith("data: "):
            data = line[len("data: ") :]
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


def raw_exchange(port: int, body: dict[str, Any]) -> tuple[socket.socket, bytes]:
    """POST over a bare socket; returns it and the response head."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    data = json.dumps(body).encode()
    sock.sendall(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
        b"Content-Type: application/json\r\n"
        + f"Content-Length: {len(data)}\r\n\r\n".encode()
        + data
    )
    head = b""
    while b"\r\n\r\n" not in head:
        head += sock.recv(1)
    return sock, head


def read_to_eof(sock: socket.socket) -> bytes:
    chunks = []
    while chunk := sock.recv(65536):
        chunks.append(chunk)
    return b"".join(chunks)


def content_of(body: bytes) -> str:
    chunks = sse_chunks(body.decode().split("\n"))
    return "".join(
        c["choices"][0]["delta"].get("content") or ""
        for c in chunks
        if isinstance(c, dict) and c["choices"]
    )


def declared_length(head: bytes) -> int:
    for line in head.decode().split("\r\n"):
        if line.lower().startswith("content-length:"):
            return int(line.split(":")[1])
    raise AssertionError("no Content-Length")


def test_models_and_bearer_key():
    with FakeLLM(models=["alpha", "beta"], api_key="sekrit") as fake:
        good = httpx.get(
            f"{fake.base_url}/models", headers={"Authorization": "Bearer sekrit"}
        )
        assert [m["id"] for m in good.json()["data"]] == ["alpha", "beta"]
        for headers in ({}, {"Authorization": "Bearer wrong"}):
            bad = httpx.get(f"{fake.base_url}/models", headers=headers)
            assert bad.status_code == 401
            assert "error" in bad.json()
        post = httpx.post(f"{fake.base_url}/chat/completions", json=STREAM_BODY)
        assert post.status_code == 401
        assert fake.post_count == 1 and fake.requests[0].status == 401


def test_stream_is_openai_shaped_with_reasoning_tools_and_usage(fake):
    usage = {"prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8}
    fake.push(
        Reply(
            text="Hello world",
            reasoning="hmm",
            tool_calls=[{"name": "calculator", "arguments": {"expression": "1+1"}}],
            usage=usage,
            chunk_chars=3,
        )
    )
    headers = {"Authorization": "Bearer anything", "X-Trace": "t1"}
    with httpx.stream(
        "POST", f"{fake.base_url}/chat/completions", json=STREAM_BODY, headers=headers
    ) as response:
        assert response.headers["content-type"] == "text/event-stream"
        chunks = sse_chunks(list(response.iter_lines()))
    assert chunks[-1] == "[DONE]"
    assert chunks[-2]["choices"] == [] and chunks[-2]["usage"] == usage
    deltas = [c["choices"][0]["delta"] for c in chunks[:-2]]
    assert deltas[0] == {"role": "assistant", "content": ""}
    assert "".join(d.get("reasoning_content", "") for d in deltas) == "hmm"
    assert "".join(d.get("content") or "" for d in deltas) == "Hello world"
    calls = [d["tool_calls"][0] for d in deltas if "tool_calls" in d]
    assert calls[0]["function"] == {"name": "calculator", "arguments": ""}
    assert calls[0]["id"] and calls[0]["type"] == "function"
    args = "".join(c["function"]["arguments"] for c in calls[1:])
    assert json.loads(args) == {"expression": "1+1"}
    assert all(len(c["function"]["arguments"]) <= 3 for c in calls)
    assert chunks[-3]["choices"][0]["finish_reason"] == "tool_calls"
    record = fake.requests[0]
    assert record.body == STREAM_BODY and record.headers["x-trace"] == "t1"


def test_usage_frame_only_when_asked_and_present(fake):
    fake.push(Reply(text="a"), Reply(text="b", usage=None))
    without_option = {**STREAM_BODY, "stream_options": None}
    for body in (without_option, STREAM_BODY):
        with httpx.stream(
            "POST", f"{fake.base_url}/chat/completions", json=body
        ) as response:
            chunks = sse_chunks(list(response.iter_lines()))
        assert not any(isinstance(c, dict) and c.get("usage") for c in chunks)
        assert chunks[-1] == "[DONE]"


def test_queue_is_consumed_in_order_then_default(fake):
    fake.push(Reply(text="one"), Reply(text="two"))
    fake.default = Reply(text="fallback")
    texts = []
    for _ in range(3):
        with httpx.stream(
            "POST", f"{fake.base_url}/chat/completions", json=STREAM_BODY
        ) as response:
            texts.append(content_of(response.read()))
    assert texts == ["one", "two", "fallback"]
    assert fake.post_count == 3


def test_routed_replies_follow_the_last_user_message_whatever_the_order(fake):
    fake.route("for b", Reply(text="B1"), Reply(text="B2"))
    fake.route("for a", Reply(text="A1"))
    fake.push(Reply(text="queued"))

    def ask(*contents: str) -> str:
        messages = [{"role": "user", "content": c} for c in contents]
        messages.append({"role": "assistant", "content": "a fragment"})
        body = {**STREAM_BODY, "messages": messages}
        with httpx.stream(
            "POST", f"{fake.base_url}/chat/completions", json=body
        ) as response:
            return content_of(response.read())

    # The last *user* message decides, even with an assistant fragment after it.
    got = [ask("for b"), ask("for b", "for a"), ask("for a"), ask("for b")]
    assert got == ["B1", "A1", "queued", "B2"]
    fake.reset()
    assert ask("for b") == "Hello from the fake model."


def test_error_status_with_retry_after_and_body(fake):
    fake.push(
        Reply(status=429, retry_after=0.3),
        Reply(status=500, error_body={"error": {"message": "boom"}}),
    )
    first = httpx.post(f"{fake.base_url}/chat/completions", json=STREAM_BODY)
    second = httpx.post(f"{fake.base_url}/chat/completions", json=STREAM_BODY)
    assert first.status_code == 429 and first.headers["retry-after"] == "0.3"
    assert second.status_code == 500 and second.json()["error"]["message"] == "boom"
    assert [r.status for r in fake.requests] == [429, 500]


def test_cut_declares_a_length_it_never_meets(fake):
    fake.push(Reply(text="Hello, wide world", cut_after_chars=7))
    sock, head = raw_exchange(fake.port, STREAM_BODY)
    with sock:
        body = read_to_eof(sock)
    assert declared_length(head) > len(body)
    assert content_of(body) == "Hello, "
    assert b'finish_reason":"stop' not in body and b"[DONE]" not in body
    fake.wait_closed(0)
    assert fake.requests[0].closed_by == "server"
    with pytest.raises(httpx.RemoteProtocolError):
        fake.push(Reply(text="Hello", cut_after_chars=2))
        with httpx.stream(
            "POST", f"{fake.base_url}/chat/completions", json=STREAM_BODY
        ) as response:
            response.read()


def test_cut_at_zero_dies_before_any_content(fake):
    fake.push(Reply(text="Hello", reasoning="think", cut_after_chars=0))
    sock, head = raw_exchange(fake.port, STREAM_BODY)
    with sock:
        body = read_to_eof(sock)
    assert declared_length(head) > len(body)
    chunks = sse_chunks(body.decode().split("\n"))
    assert [c["choices"][0]["delta"] for c in chunks] == [
        {"role": "assistant", "content": ""}
    ]


def test_stall_holds_the_socket_until_the_client_closes(fake):
    fake.push(Reply(text="Hello world", stall_after_chars=5))
    sock, _ = raw_exchange(fake.port, STREAM_BODY)
    received = b""
    while content_of(received) != "Hello":
        received += sock.recv(65536)
    fake.wait_stalled(0)
    with pytest.raises(TimeoutError):
        fake.wait_closed(0, timeout=0.2)  # still open: the server only waits
    sock.close()
    assert fake.wait_closed(0, timeout=2) < 1.0
    assert fake.requests[0].closed_by == "client"


def test_a_hold_streams_its_chunks_then_waits_for_the_test(fake):
    go_on = threading.Event()
    fake.push(Reply(text="Hello world", chunk_chars=1, hold_after_chunks=6, hold=go_on))
    sock, _ = raw_exchange(fake.port, STREAM_BODY)
    with sock:
        received = b""
        fake.wait_held(0)  # the role frame and five characters are out
        while content_of(received) != "Hello":
            received += sock.recv(65536)
        assert fake.requests[0].closed_at is None
        go_on.set()
        received += read_to_eof(sock)
    assert content_of(received) == "Hello world"


def test_malformed_chunk_then_close(fake):
    fake.push(Reply(text="Hello", malformed_after_chars=2))
    sock, head = raw_exchange(fake.port, STREAM_BODY)
    with sock:
        body = read_to_eof(sock)
    assert declared_length(head) == len(body)  # only the chunk is broken
    assert body.endswith(b"data: {not json\n\n")
    assert content_of(body[: -len(b"data: {not json\n\n")]) == "He"


def test_pace_is_measured_on_the_server(fake):
    fake.push(Reply(text="x" * 10, chunk_chars=1, tokens_per_s=100))
    with httpx.stream(
        "POST", f"{fake.base_url}/chat/completions", json=STREAM_BODY
    ) as response:
        assert content_of(response.read()) == "x" * 10
    record = fake.requests[0]
    assert record.last_byte_at - record.received_at >= 0.09


def test_non_streaming_request_gets_a_completion(fake):
    fake.push(Reply(text="plain", reasoning="r"))
    response = httpx.post(
        f"{fake.base_url}/chat/completions", json={**STREAM_BODY, "stream": False}
    )
    message = response.json()["choices"][0]["message"]
    assert message == {
        "role": "assistant",
        "content": "plain",
        "reasoning_content": "r",
    }
    assert response.json()["usage"]["total_tokens"] == 46


def test_unknown_path_is_404(fake):
    assert httpx.get(f"{fake.base_url}/nope").status_code == 404


def interruptible() -> None:
    """In the child: Ctrl-C as at a terminal. A process started in the
    background of a script (as CI's passes are) inherits SIGINT ignored, and
    Python then installs no KeyboardInterrupt handler."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.slow
def test_management_command_serves_until_interrupted():
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "hermes_site.settings"}
    proc = subprocess.Popen(
        [sys.executable, "manage.py", "fake_llm", "--port", "0", "--text", "hi there"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        text=True,
        preexec_fn=interruptible,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        base_url = line.split(" at ")[1].split()[0]
        assert base_url.startswith("http://127.0.0.1:")
        assert httpx.get(f"{base_url}/models").json()["data"][0]["id"] == "fake-model"
        with httpx.stream(
            "POST", f"{base_url}/chat/completions", json=STREAM_BODY
        ) as response:
            assert content_of(response.read()) == "hi there"
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=5) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


@pytest.mark.slow
def test_management_command_speaks_the_anthropic_api_when_asked():
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "hermes_site.settings"}
    args = ["fake_llm", "--port", "0", "--text", "hi there", "--api", "anthropic"]
    proc = subprocess.Popen(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        text=True,
        preexec_fn=interruptible,
    )
    try:
        assert proc.stdout is not None
        base_url = proc.stdout.readline().split(" at ")[1].split()[0]
        body = {
            "model": "fake-model",
            "max_tokens": 16,
            "stream": True,
            "messages": [{"role": "user", "content": "hi"}],
        }
        headers = {"anthropic-version": "2023-06-01"}
        with httpx.stream(
            "POST", f"{base_url}/messages", json=body, headers=headers
        ) as response:
            frames = response.read().decode()
        assert "event: message_start" in frames and "event: message_stop" in frames
        texts = [
            json.loads(line[6:])["delta"]["text"]
            for line in frames.splitlines()
            if line.startswith("data: ") and '"text_delta"' in line
        ]
        assert "".join(texts) == "hi there"
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=5) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
