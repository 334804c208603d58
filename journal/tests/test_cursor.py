from journal.cursor import Cursor, cursor_from_request

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
