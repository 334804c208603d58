from journal.cursor import Cursor, Outcome, Verdict, cursor_from_request, decide

RUN = "run_01ABC"


def resolve(query=None, header=None, last_seq=10):
    return cursor_from_request(
        query=query or {}, last_event_id=header, run_id=RUN, last_seq=last_seq
    )


def test_query_parameters_resume():
    assert resolve({"after_seq": "4"}) == Cursor(4)
    assert resolve({"after_event_id": f"{RUN}:7"}) == Cursor(7)


def test_header_alone_resumes():
    assert resolve(header=f"{RUN}:5") == Cursor(5)


def test_query_wins_over_header_by_presence_even_unparsable():
    assert resolve({"after_seq": "abc"}, header=f"{RUN}:5").after_seq == 0
    assert resolve({"after_seq": "2"}, header=f"{RUN}:5") == Cursor(2)


def test_no_cursor_means_from_the_start():
    assert resolve() == Cursor(0)


def test_unusable_cursors_replay_from_start_and_say_why():
    for query, header in [
        ({"after_event_id": "run_OTHER:3"}, None),
        ({"after_event_id": "garbage"}, None),
        ({"after_seq": "-1"}, None),
        ({"after_seq": "11"}, None),
        ({}, f"{RUN}:x"),
        ({}, f"{RUN}:99"),
    ]:
        cursor = resolve(query, header)
        assert cursor.after_seq == 0 and cursor.unusable_reason, (query, header)


def test_cursor_at_the_last_seq_is_kept():
    assert resolve({"after_seq": "10"}) == Cursor(10)


def test_non_ascii_and_huge_digits_replay_from_the_start():
    """`str.isdigit` accepts these; `int` raises on them (or on > 4,300 digits)."""
    huge = "9" * 5000
    for raw in ["²", "①", "٣", "1²", huge, "0" * 4400 + "1"]:
        for query, header in [
            ({"after_seq": raw}, None),
            ({"after_event_id": f"{RUN}:{raw}"}, None),
            ({}, f"{RUN}:{raw}"),
        ]:
            cursor = resolve(query, header)
            assert cursor == Cursor(0, cursor.unusable_reason), (query, header)
            assert cursor.unusable_reason


# --- the outcome table (docs/architecture.md §5) -----------------------------


def outcome(cursor, *, pruned=False, terminal=True, last_seq=10):
    return decide(pruned=pruned, terminal=terminal, last_seq=last_seq, cursor=cursor)


def test_pruned_is_gone_whatever_the_cursor():
    for cursor in [Cursor(0), Cursor(10), Cursor(0, "malformed event id")]:
        for terminal in (True, False):
            assert outcome(cursor, pruned=True, terminal=terminal).verdict is (
                Verdict.GONE
            )


def test_finished_run_read_to_its_end_is_done():
    assert outcome(Cursor(10)) == Outcome(Verdict.DONE, 10)
    assert outcome(Cursor(12)).verdict is Verdict.DONE  # past the end
    # An empty finished run has nothing for any reader, even one starting over.
    assert outcome(Cursor(0, "cursor beyond the journal"), last_seq=0).verdict is (
        Verdict.DONE
    )


def test_a_live_run_streams_even_from_its_last_seq():
    assert outcome(Cursor(10), terminal=False) == Outcome(Verdict.STREAM, 10)


def test_otherwise_stream_from_the_cursor():
    assert outcome(Cursor(0)) == Outcome(Verdict.STREAM, 0)
    assert outcome(Cursor(9)) == Outcome(Verdict.STREAM, 9)


def test_unusable_cursor_streams_from_zero_with_a_note():
    cursor = resolve({"after_seq": "99"})
    assert outcome(cursor) == Outcome(Verdict.STREAM, 0, "cursor beyond the journal")
    cursor = resolve(header="run_OTHER:3")
    assert outcome(cursor, terminal=False) == Outcome(
        Verdict.STREAM, 0, "event id of another run"
    )
