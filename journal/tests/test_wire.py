"""`journal.wire`: the bytes every transport sends, and the events page's rules."""

import json

import pytest

from journal import wire
from journal.cursor import parse_event_id
from journal.store import Record, encode
from journal.wire import (
    AFTER_SEQ_MAX,
    EVENTS_PAGE_DEFAULT,
    EVENTS_PAGE_MAX,
    KEEPALIVE,
    BadPageParam,
    PageParams,
    event_id,
    json_event,
    json_frame,
    page,
    parse_page_params,
    sse_comment,
    sse_frame,
    sse_frames,
    sse_message,
    sse_retry,
    unusable_cursor_note,
)

RUN = "run_01ABC"
TOKEN = Record(3, "token", encode({"text": 'say "hi"\nthen\r\nbye \u2028 é'}))


def parse_sse(text: str) -> list[dict]:
    """A small reader of the SSE format: one dict of fields per dispatched event."""
    events: list[dict] = []
    fields: dict[str, str] = {}
    for line in text.split("\n"):
        if line == "":
            if fields:
                events.append(fields)
            fields = {}
        elif not line.startswith(":"):
            name, _, value = line.partition(": ")
            fields[name] = fields[name] + "\n" + value if name in fields else value
    assert fields == {}, "the text must end at a frame boundary"
    return events


def test_sse_frame_is_one_event_with_id_type_and_the_payload_as_journaled():
    frame = sse_frame(RUN, TOKEN)
    assert frame == f"id: {RUN}:3\nevent: token\ndata: {TOKEN.payload}\n\n"
    [event] = parse_sse(frame)
    assert event == {"id": f"{RUN}:3", "event": "token", "data": TOKEN.payload}
    assert json.loads(event["data"]) == {"text": 'say "hi"\nthen\r\nbye \u2028 é'}
    assert parse_event_id(event["id"], run_id=RUN) == (3, "")


def test_sse_frames_concatenate_frames_in_order():
    records = [Record(1, "start", encode({"model": "m"})), TOKEN]
    text = sse_frames(RUN, records)
    assert text == sse_frame(RUN, records[0]) + sse_frame(RUN, records[1])
    assert [e["id"] for e in parse_sse(text)] == [f"{RUN}:1", f"{RUN}:3"]
    assert sse_frames(RUN, []) == ""


def test_comments_retry_and_keepalive_dispatch_no_event():
    note = unusable_cursor_note("event id of another run")
    assert note == (
        ": cursor unusable (event id of another run); replaying from the start\n\n"
    )
    # A comment is one line whatever it is given: it cannot forge a frame.
    forged = sse_comment("x\n\nevent: end\ndata: {}\r\nmore")
    assert forged.count("\n") == 2 and forged.endswith("\n\n")
    assert parse_sse(KEEPALIVE + note + forged) == []
    assert sse_retry(2500) == "retry: 2500\n\n"


def test_sse_message_has_no_id_and_json_data():
    text = sse_message("session", {"id": 7, "title": 'a "b"\nc'})
    [event] = parse_sse(text)
    assert "id" not in event and event["event"] == "session"
    assert json.loads(event["data"]) == {"id": 7, "title": 'a "b"\nc'}
    assert sse_message("hello", {}) == "event: hello\ndata: {}\n\n"


def test_json_frame_is_valid_json_with_the_payload_embedded():
    frame = json_frame(RUN, TOKEN)
    assert json.loads(frame) == {
        "id": f"{RUN}:3",
        "seq": 3,
        "event": "token",
        "data": json.loads(TOKEN.payload),
    }
    assert "\n" not in frame  # one line: `replay_run --format jsonl` relies on it
    assert json.loads(frame) == json_event(RUN, TOKEN)


def test_json_frame_escapes_the_event_type():
    odd = Record(1, 'to"ken\\', encode({}))
    assert json.loads(json_frame(RUN, odd))["event"] == 'to"ken\\'


def test_event_id_round_trips_through_the_cursor_parser():
    assert event_id(RUN, 42) == f"{RUN}:42"
    assert parse_event_id(event_id(RUN, 42), run_id=RUN) == (42, "")


def test_page_document_and_its_next_cursor():
    records = [Record(s, "token", encode({"text": str(s)})) for s in (4, 5)]
    full = page(run_id=RUN, status="running", last_seq=9, records=records, limit=2)
    assert full == {
        "run_id": RUN,
        "status": "running",
        "last_seq": 9,
        "events": [json_event(RUN, r) for r in records],
        "next_after_seq": 5,
    }
    short = page(run_id=RUN, status="completed", last_seq=5, records=records, limit=3)
    assert short["next_after_seq"] is None
    empty = page(run_id=RUN, status="completed", last_seq=5, records=[], limit=3)
    assert empty["events"] == [] and empty["next_after_seq"] is None


def test_page_params_defaults_and_good_values():
    assert parse_page_params({}) == PageParams(0, EVENTS_PAGE_DEFAULT)
    assert parse_page_params({"after_seq": " 7 ", "limit": "1"}) == PageParams(7, 1)
    assert parse_page_params(
        {"after_seq": str(AFTER_SEQ_MAX), "limit": str(EVENTS_PAGE_MAX)}
    ) == PageParams(AFTER_SEQ_MAX, EVENTS_PAGE_MAX)


@pytest.mark.parametrize(
    "query,name,problem",
    [
        ({"after_seq": "x"}, "after_seq", "must be an integer, got 'x'"),
        ({"after_seq": "-1"}, "after_seq", f"must be between 0 and {AFTER_SEQ_MAX}"),
        ({"after_seq": str(AFTER_SEQ_MAX + 1)}, "after_seq", "must be between"),
        ({"after_seq": "²"}, "after_seq", "must be an integer"),
        ({"after_seq": "9" * 5000}, "after_seq", "must be an integer"),
        ({"after_seq": ""}, "after_seq", "must be an integer"),
        ({"limit": "0"}, "limit", f"must be between 1 and {EVENTS_PAGE_MAX}"),
        ({"limit": str(EVENTS_PAGE_MAX + 1)}, "limit", "must be between"),
        ({"limit": "lots"}, "limit", "must be an integer"),
        ({"limit": "1.5"}, "limit", "must be an integer"),
    ],
)
def test_bad_page_params_are_refused_by_name_never_clamped(query, name, problem):
    with pytest.raises(BadPageParam) as caught:
        parse_page_params(query)
    assert caught.value.name == name and problem in caught.value.problem
    body = caught.value.body()
    assert body == {
        "error": f"{name} {caught.value.problem}",
        "fields": {name: [caught.value.problem]},
    }
    assert len(body["error"]) < 120  # a huge input is not echoed back whole


def test_formats_write_sse_frames_joined_and_json_frames_one_each():
    records = [Record(i, "token", encode({"text": f"t{i}"})) for i in range(1, 4)]
    sse = wire.SSE.writes([wire.SSE.frame(RUN, r) for r in records])
    assert sse == [sse_frames(RUN, records).encode()]
    json_frames = [wire.JSON_FRAMES.frame(RUN, r) for r in records]
    assert wire.JSON_FRAMES.writes(json_frames) == [json_frame(RUN, r) for r in records]
    # A page encoded at once is byte for byte the frames encoded one by one.
    assert wire.SSE.encode(RUN, records) == sse
    assert wire.JSON_FRAMES.encode(RUN, records) == json_frames
    assert wire.SSE.encode(RUN, []) == [b""]
    # The template the database fills in for journal pages makes the same frame.
    assert "".join(wire.SSE_TEMPLATE % (RUN, *r) for r in records) == sse_frames(
        RUN, records
    )
    assert wire.JSON_FRAMES.template is None  # one message each: never joined
