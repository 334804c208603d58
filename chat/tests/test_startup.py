"""A server pays at start-up what a user's first stream would otherwise pay:
the database pools' connections and their first statements
(hermes_site.asgi.warm_up, journal.dbpool.DBPool.warm)."""

from chat.sse import first_reads
from hermes_testing.harness import connections_opened, read_sse, running_run
from journal import dbpool
from journal.store import append


def test_the_reads_a_server_warms_up_with_are_valid(transactional_db):
    first_reads()  # every statement runs (a failure at start-up is only logged)


def test_a_first_stream_after_start_up_opens_no_database_connection(server, alice):
    import hermes_site.asgi

    dbpool.shutdown()  # as a new process has them: no thread, no connection
    with connections_opened() as names:
        hermes_site.asgi.warm_up()  # waits for the read pool, within a bound
    assert sorted(names) == [f"hermes-db-read-{i}" for i in range(dbpool.READ_THREADS)]
    run = running_run(alice[0])
    append(run_id=run.id, token=1, events=[("start", {})])
    with connections_opened() as names:
        result = read_sse(
            f"{server.url}/api/runs/{run.id}/events/", headers=alice[1], max_events=1
        )
    assert result.status == 200
    assert [event for _id, event, _data in result.events] == ["start"]
    assert names == []
