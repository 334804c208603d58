"""``manage.py check_upstream`` against the project's loopback model server.

The fake answers every scenario the way it is scripted (it keeps no model), so
each test scripts what a kind of server does and reads the table's rows.
"""

from __future__ import annotations

import socket
import threading
import time
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from chat.providers import conformance as c
from hermes_testing.fake_llm import FakeLLM, Reply

STORY_TEXT = (
    "Old Tomas kept the light on the rocks at the edge of the bay. Every night "
    "a grey cat climbed the stairs with him and watched the lamp turn."
)
LONG_TEXT = " ".join(["The caravan crossed one more dune under the stars."] * 8)
WEATHER_CALL = {"name": "get_weather", "arguments": {"city": "Paris"}}


def table(url: str, **options) -> dict[str, tuple[str, str, str]]:
    """The command's markdown rows: scenario → (result, seen, set in Hermes)."""
    out = StringIO()
    call_command("check_upstream", url, format="markdown", stdout=out, **options)
    rows = {}
    for line in out.getvalue().splitlines():
        if not line.startswith("| ") or line.startswith("| scenario "):
            continue
        cells = [cell.strip() for cell in line.strip("|").split(" | ")]
        scenario, result, seen, advice = cells
        rows[scenario] = (result, seen, advice)
    return rows


def release_when_listed(fake: FakeLLM, hold: threading.Event, count: int) -> None:
    """Set ``hold`` once the fake has answered ``count`` model listings (the
    listing sent while the held answer streams), or after 30 s."""

    def watch() -> None:
        deadline = time.monotonic() + 30
        while fake.models_answered < count and time.monotonic() < deadline:
            time.sleep(0.01)
        hold.set()

    threading.Thread(target=watch, daemon=True).start()


def script_conforming(fake: FakeLLM) -> threading.Event:
    """A server that does everything Hermes wants; the hold keeps the answer
    streaming until the listing sent during it was answered."""
    cut = len(STORY_TEXT[: c.CUT_CHARS])
    fake.route(
        c.STORY,
        Reply(text=STORY_TEXT[:20], finish_reason="length"),  # finish: length
        Reply(text=STORY_TEXT),  # cut and resume: the whole answer
        Reply(text=STORY_TEXT),  # … read in part
        Reply(text=STORY_TEXT[cut:]),  # … continued where it was cut (prefill)
        Reply(text=STORY_TEXT[cut:]),  # … and with continue_final_message
    )
    hold = threading.Event()
    fake.route(
        c.LONG,
        Reply(text=LONG_TEXT),  # stop
        # The listing: held until it was answered, then paced, so the answer
        # goes on well after the listing's answer reached the client.
        Reply(text=LONG_TEXT, hold_after_chunks=3, hold=hold, tokens_per_s=100),
        Reply(text=LONG_TEXT),  # long answer
    )
    fake.route(c.WEATHER, Reply(tool_calls=[WEATHER_CALL]))
    return hold


@pytest.mark.slow
def test_a_server_that_does_everything_hermes_wants(fake_llm):
    cut = c.CUT_CHARS
    hold = script_conforming(fake_llm)
    release_when_listed(fake_llm, hold, 2)  # the first listing, then this one

    rows = table(fake_llm.base_url, model="fake-model")

    assert list(rows) == [
        "listing",
        "stream",
        "usage",
        "finish: length",
        "stop",
        "tools",
        "listing during a stream",
        "cut and resume",
        "long answer",
        "two user messages",
        "two assistant messages",
    ]
    assert {name: row[0] for name, row in rows.items()} == dict.fromkeys(rows, "ok")
    assert "2 model(s): fake-model, other-model" in rows["listing"][1]
    assert "finish_reason stop, [DONE]" in rows["stream"][1]
    assert "prompt_tokens 12, completion_tokens 34" in rows["usage"][1]
    assert "a frame of its own" in rows["usage"][1]
    assert "finish_reason length" in rows["finish: length"][1]
    assert f"closed after {c.CUT_CHARS} chars" in rows["stop"][1]
    assert 'get_weather("{\\"city\\": \\"Paris\\"}")' in rows["tools"][1]
    assert "finish_reason tool_calls" in rows["tools"][1]
    listing = rows["listing during a stream"][1]
    assert "GET /models after 8 chars: 200" in listing
    assert "(while it streamed)" in listing
    assert f"the answer: {len(LONG_TEXT)} chars, finish_reason stop" in listing
    _, seen, advice = rows["cut and resume"]
    assert f"prefill: {c.short(STORY_TEXT[cut:], 36)}, {c.CONTINUES}" in seen
    assert f"continue_final_message: {c.short(STORY_TEXT[cut:], 36)}" in seen
    assert advice.startswith("HERMES_CONTINUATION=prefill ")
    assert f"{len(LONG_TEXT)} chars (34 tokens)" in rows["long answer"][1]
    # What each request carried.
    bodies = [r.body for r in fake_llm.requests]
    assert all(
        b["stream"] and b["stream_options"] == {"include_usage": True} for b in bodies
    )
    assert [
        b["max_tokens"] for b in bodies if b["messages"][-1]["content"] == c.STORY
    ] == [
        c.LENGTH_MAX_TOKENS,
        c.STORY_MAX_TOKENS,
        c.STORY_MAX_TOKENS,
    ]
    prefill, flagged = [b for b in bodies if b["messages"][-1]["role"] == "assistant"]
    for resume in (prefill, flagged):
        assert resume["messages"] == [
            {"role": "user", "content": c.STORY},
            {"role": "assistant", "content": STORY_TEXT[: c.CUT_CHARS]},
        ]
    assert "continue_final_message" not in prefill
    assert flagged["continue_final_message"] is True
    assert flagged["add_generation_prompt"] is False
    (tools,) = [b for b in bodies if "tools" in b]
    assert tools["tools"] == [c.WEATHER_TOOL]
    roles = [[m["role"] for m in b["messages"]] for b in bodies[-2:]]
    assert roles == [["user", "user"], ["user", "assistant", "assistant", "user"]]


def test_the_stop_closes_the_stream_and_the_next_request_is_answered(fake_llm):
    hold = threading.Event()
    fake_llm.route(c.LONG, Reply(text=LONG_TEXT, hold_after_chunks=12, hold=hold))
    try:
        rows = table(fake_llm.base_url)
    finally:
        hold.set()
    stopped = next(
        r for r in fake_llm.requests if r.body["messages"][-1]["content"] == c.LONG
    )
    assert stopped.closed_by == "client"
    assert rows["stop"][0] == "ok"
    assert "the next answer's first text after" in rows["stop"][1]


def test_a_server_that_differs_says_what_to_set(fake_llm):
    fake_llm.route(c.GREETING, Reply(text="Hi there.", usage=None))
    fake_llm.route(c.STORY, Reply(text=STORY_TEXT))  # finish: stop, not length
    # The cut and the resume: the resume starts the same answer again, and
    # vLLM's flags are refused.
    fake_llm.route(c.STORY, *[Reply(text=STORY_TEXT)] * 3)
    fake_llm.route(
        c.STORY,
        Reply(status=400, error_body={"error": {"message": "unknown field"}}),
    )
    fake_llm.route(
        c.WEATHER,
        Reply(status=400, error_body={"error": {"message": "tools are not supported"}}),
    )
    # The listing's stream is cut (no finish_reason, no [DONE]).
    fake_llm.route(
        c.LONG,
        Reply(text=LONG_TEXT),
        Reply(text=LONG_TEXT, cut_after_chars=30, tokens_per_s=100),
        Reply(text=LONG_TEXT),
    )
    fake_llm.route(
        c.SHORT,
        Reply(text="Blue."),  # after the stop
        Reply(
            status=400,
            error_body={"error": {"message": "Conversation roles must alternate"}},
        ),
    )

    rows = table(fake_llm.base_url)

    assert rows["usage"][0] == "note"
    assert "no usage report" in rows["usage"][1]
    assert rows["finish: length"][0] == "note"
    assert "finish_reason stop" in rows["finish: length"][1]
    assert rows["tools"] == (
        "fail",
        "tools refused: HTTP 400: tools are not supported",
        "HERMES_RUN_MAX_TOOL_CALLS=0 offers no tools",
    )
    result, seen, _ = rows["listing during a stream"]
    assert result == "fail"
    assert "no finish_reason, no [DONE], body cut" in seen
    result, seen, advice = rows["cut and resume"]
    assert result == "note"
    assert f"prefill: {c.short(STORY_TEXT, 36)}, {c.RESTARTS}" in seen
    assert 'continue_final_message: refused ("HTTP 400: unknown field")' in seen
    assert advice.startswith("no continuation: a resumed answer starts anew")
    assert rows["two user messages"] == (
        "fail",
        "refused: HTTP 400: Conversation roles must alternate",
        "none: Hermes joins consecutive messages of one role",
    )
    assert rows["two assistant messages"][0] == "ok"


def test_a_server_that_continues_only_with_the_flags(fake_llm):
    cut = c.CUT_CHARS
    fake_llm.route(
        c.STORY,
        Reply(text=STORY_TEXT),  # finish: length
        Reply(text=STORY_TEXT),  # the whole answer
        Reply(text=STORY_TEXT),  # read in part
        Reply(text="Hello! How can I help you today?"),  # prefill: a new answer
        Reply(text=STORY_TEXT[cut:]),  # continue_final_message: continued
    )
    rows = table(fake_llm.base_url)
    result, seen, advice = rows["cut and resume"]
    assert result == "ok"
    assert f'prefill: "Hello! How can I help you today?", {c.NEW}' in seen
    assert advice.startswith("HERMES_CONTINUATION=continue_final_message ")


def test_the_resume_style_is_told_from_the_uncut_answer():
    whole = "Once upon a time there was a cat who lived by the sea."
    partial = whole[:20]
    assert c.resume_style(whole, partial, whole[20:]) == c.CONTINUES
    assert c.resume_style(whole, partial, " " + whole[20:]) == c.CONTINUES
    assert c.resume_style(whole, partial, whole) == c.RESTARTS
    assert c.resume_style(whole, partial, "Hello! How can I help?") == c.NEW
    assert c.resume_style(whole, partial, "  ") == "sends no text"


def test_an_unlisted_model_is_named_and_the_plain_table_prints(fake_llm):
    out = StringIO()
    call_command("check_upstream", fake_llm.base_url, model="unlisted", stdout=out)
    text = out.getvalue()
    assert text.startswith(f"{fake_llm.base_url} · model unlisted\n")
    assert "unlisted is not listed" in text
    assert "HERMES_MODELS" in text
    header = text.splitlines()[2]
    assert header.split() == ["scenario", "result", "seen", "set", "in", "Hermes"]


def test_a_failing_listing_without_a_key_suggests_one(fake_llm):
    fake_llm.models_fault = 500
    with pytest.raises(CommandError, match="needs a key may fail so"):
        call_command("check_upstream", fake_llm.base_url)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_an_unreachable_url_is_a_command_error():
    url = f"http://127.0.0.1:{free_port()}/v1"
    with pytest.raises(CommandError, match=f"cannot reach {url}"):
        call_command("check_upstream", url)


def test_a_url_without_v1_gets_a_hint(fake_llm):
    bare = fake_llm.base_url.removesuffix("/v1")
    with pytest.raises(CommandError, match="the base URL must end in /v1"):
        call_command("check_upstream", bare)
    with pytest.raises(CommandError, match="is not an http"):
        call_command("check_upstream", "127.0.0.1:8080")


def test_the_key_comes_from_the_named_variable(monkeypatch):
    with FakeLLM(api_key="sk-local") as fake:
        with pytest.raises(CommandError, match="--api-key-env"):
            call_command("check_upstream", fake.base_url)
        with pytest.raises(CommandError, match="UPSTREAM_KEY is not set"):
            call_command("check_upstream", fake.base_url, api_key_env="UPSTREAM_KEY")
        monkeypatch.setenv("UPSTREAM_KEY", "sk-local")
        rows = table(fake.base_url, api_key_env="UPSTREAM_KEY")
        assert rows["stream"][0] == "ok"
        assert all(
            r.headers["authorization"] == "Bearer sk-local" for r in fake.requests
        )
