"""Start-up's objects stay out of full collections (hermes_site/heap.py), and a
stream's request cycle is freed without them (hermes_site/asgi.py)."""

import gc

import httpx
from django.http import HttpRequest, HttpResponseBase

import hermes_site.asgi
from hermes_testing.harness import running_run


def test_the_web_app_start_up_freezes_its_heap():
    gc.unfreeze()
    assert gc.get_freeze_count() == 0
    hermes_site.asgi.warm_up()  # what loading the ASGI module runs
    assert gc.get_freeze_count() > 10_000
    gc.collect()
    assert gc.get_freeze_count() > 10_000  # a full pass leaves them frozen


def _requests_and_responses() -> list:
    # By type, not isinstance: a lazy object would set itself up.
    return [
        o
        for o in gc.get_objects()
        if issubclass(type(o), HttpRequest | HttpResponseBase)
    ]


def test_a_stream_lets_go_of_its_request_without_the_collector(server, alice):
    """Once a stream's head is out, its request cycle (the request, the
    response, what the middleware hung on them) is already gone, freed by
    reference counting: no collection has run, and no request is left."""
    run = running_run(alice[0])
    url = f"{server.url}/api/runs/{run.id}/events/"
    gc.collect()
    gc.disable()  # from here only reference counting frees anything
    try:
        # Held, so that no new object takes the address of one seen here.
        before = _requests_and_responses()
        with (
            httpx.Client(timeout=30) as client,
            client.stream("GET", url, headers=alice[1]) as response,
        ):
            assert response.status_code == 200
            assert next(response.iter_raw()).startswith(b"retry:")
            seen = {id(o) for o in before}
            left = [
                type(o).__name__ for o in _requests_and_responses() if id(o) not in seen
            ]
    finally:
        gc.enable()
    assert left == []
