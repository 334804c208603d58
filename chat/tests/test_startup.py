"""A server pays at start-up what a user's first stream would otherwise pay:
the database pools' connections and their first statements
(hermes_site.asgi.warm_up, journal.dbpool.DBPool.warm)."""

import threading

import httpx
from django.db.backends.signals import connection_created

from chat.sse import first_reads
from hermes_testing.harness import running_run
from journal import dbpool
from journal.store import append


def test_the_reads_a_server_warms_up_with_are_valid(transactional_db):
    first_reads()  # every statement runs (a failure at start-up is only logged)


def test_a_first_stream_after_start_up_opens_no_database_connection(server, alice):
    import hermes_site.asgi

    dbpool.shutdown()  # as a new process has them: no thread, no connection
    names: list[str] = []

    def note(sender, **kwargs):
        names.append(threading.current_thread().name)

    connection_created.connect(note, weak=False)
    try:
        hermes_site.asgi.warm_up()  # waits for the read pool, within a bound
        assert sorted(names) == [
            f"hermes-db-read-{i}" for i in range(dbpool.READ_THREADS)
        ]
        run = running_run(alice[0])
        append(run_id=run.id, token=1, events=[("start", {})])
        names.clear()
        with (
            httpx.Client(timeout=30) as client,
            client.stream(
                "GET", f"{server.url}/api/runs/{run.id}/events/", headers=alice[1]
            ) as response,
        ):
            assert response.status_code == 200
            assert b"event: start" in b"".join(_until_event(response))
    finally:
        connection_created.disconnect(note)
    assert names == []


def _until_event(response):
    for chunk in response.iter_raw():
        yield chunk
        if b"\nevent: " in chunk or chunk.startswith(b"event: "):
            return
