"""The fold of a journal (`journal.fold`): parts in journal order, statuses,
usage added once, the end state; and the same result one event at a time."""

import json

import pytest

from hermes_testing.journals import JOURNALS
from journal.fold import Fold, usage_sum
from journal.store import Record


def fold_all(journal) -> dict:
    fold = Fold()
    for seq, (kind, data) in enumerate(journal, start=1):
        fold.add(kind, data, seq)
    return fold.turn()


def test_tool_cards_stay_where_they_streamed_between_text():
    turn = fold_all(JOURNALS["tools-between-text"])
    assert [
        (p["kind"], p.get("text", p.get("tool_call_id"))) for p in turn["parts"]
    ] == [
        ("reasoning", "Compute first."),
        ("text", "Let me compute. What "),
        ("tool", "call_1"),
        ("tool", "call_2"),
        ("reasoning", "Now answer."),
        ("text", "you are seeing: 42."),
        ("tool", "call_9"),
        ("text", " Done."),
    ]
    calc, clock, late = (p for p in turn["parts"] if p["kind"] == "tool")
    assert calc == {
        "kind": "tool",
        "tool_call_id": "call_1",
        "name": "calculator",
        "args": '{"expression": "6*7"}',  # the repeated call changed nothing
        "result": "42",
        "is_error": False,
        "duration_ms": 3.5,
    }
    assert (clock["result"], clock["is_error"], clock["duration_ms"]) == (
        "no clock",
        True,
        1,
    )
    assert (late["args"], late["result"]) == ("", "late")
    assert turn["usage"] == {"input_tokens": 30, "output_tokens": 8}
    assert turn["end"]["status"] == "completed" and turn["error"] is None
    assert turn["model"] == "fake-model" and turn["last_seq"] == 15


def test_text_joins_and_empty_deltas_add_nothing():
    fold = Fold()
    for kind, data in JOURNALS["plain-text"]:
        fold.add(kind, data)
    assert fold.turn()["parts"] == [
        {"kind": "text", "text": "Hello, world.\n\n```py\nprint(1)\n```\n"}
    ]
    assert fold.text == "Hello, world.\n\n```py\nprint(1)\n```\n"


def test_statuses_in_order_and_each_resume_marks_where_the_text_went_on():
    turn = fold_all(JOURNALS["cut-and-resume"])
    statuses = [
        "Retry attempt: stream-resume 1/3; body cut",
        "Retry attempt: stream-resume 2/3; idle timeout",
    ]
    texts = [p["text"] for p in turn["parts"] if p["kind"] == "text"]
    assert "".join(texts) == "Durable streams keep every word, always."
    assert [p["kind"] for p in turn["parts"]] == [
        "text",
        "resume",
        "text",
        "resume",
        "text",
    ]
    assert [p["text"] for p in turn["parts"] if p["kind"] == "resume"] == statuses
    assert turn["statuses"] == statuses


def test_the_error_event_wins_over_the_ends_and_the_ends_is_kept_alone():
    failed = fold_all(JOURNALS["failed"])
    assert failed["error"] == {
        "category": "network",
        "message": "peer closed",
        "retryable": True,
    }
    assert failed["end"]["terminal_state"] == "provider-error"
    lost = fold_all(JOURNALS["failed-end-only"])
    assert lost["error"] == {"category": "worker", "message": "the worker stopped"}
    assert lost["parts"] == [] and lost["usage"] is None


def test_usage_of_several_events_is_added_once():
    turn = fold_all(JOURNALS["usage-in-several-events"])
    assert turn["usage"] == {
        "input_tokens": 30,
        "output_tokens": 12,
        "total_tokens": 42,
    }


def test_usage_sum_merges_nested_counts_and_keeps_other_values():
    total = usage_sum(None, {"prompt_tokens": 3, "details": {"cached": 1}, "id": "a"})
    total = usage_sum(total, {"prompt_tokens": 4, "details": {"cached": 2}, "id": "b"})
    assert total == {"prompt_tokens": 7, "details": {"cached": 3}, "id": "b"}
    assert usage_sum(total, None) is total
    assert usage_sum(None, None) is None


@pytest.mark.parametrize("name", sorted(JOURNALS))
def test_feeding_records_one_at_a_time_folds_the_same(name):
    journal = JOURNALS[name]
    fold = Fold()
    for seq, (kind, data) in enumerate(journal, start=1):
        fold.feed(Record(seq, kind, json.dumps(data)))
    assert fold.turn() == fold_all(journal)
    assert fold.last_seq == len(journal)


def test_a_forgotten_tool_card_joins_the_text_around_it_and_stays_known():
    fold = Fold()
    fold.add("token", {"text": "a"})
    card = fold.add("tool", {"tool_call_id": "c", "name": "n", "args": "{}"})
    fold.add("token", {"text": "b"})
    assert card is not None
    fold.forget_tool(card)
    assert fold.turn()["parts"] == [{"kind": "text", "text": "ab"}]
    fold.add(
        "tool_complete",
        {
            "tool_call_id": "c",
            "name": "n",
            "result": "r",
            "is_error": False,
            "duration_ms": 1,
        },
    )
    assert fold.turn()["parts"] == [{"kind": "text", "text": "ab"}]


def test_steers_are_parts_of_their_own_never_joined():
    fold = Fold()
    fold.add("token", {"text": "a"})
    fold.add("steer", {"text": "s1"})
    card = fold.add("tool", {"tool_call_id": "c", "name": "n", "args": "{}"})
    fold.add("steer", {"text": "s2"})
    fold.add("token", {"text": "b"})
    assert [p["kind"] for p in fold.parts] == ["text", "steer", "tool", "steer", "text"]
    assert fold.text == "ab"
    assert card is not None
    fold.forget_tool(card)  # two steers around a dropped card stay two
    assert fold.turn()["parts"] == [
        {"kind": "text", "text": "a"},
        {"kind": "steer", "text": "s1"},
        {"kind": "steer", "text": "s2"},
        {"kind": "text", "text": "b"},
    ]
