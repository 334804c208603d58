"""Start-up's objects stay out of full collections and full collections are
paced (hermes_site/heap.py), and a stream's request cycle is freed without
them (hermes_site/asgi.py)."""

import gc
import threading
import time

import httpx
from django.http import HttpRequest, HttpResponseBase

from chat.sse import SSEResponse
from hermes_site import heap
from hermes_testing.harness import running_run


def test_the_web_app_start_up_freezes_its_heap(transactional_db):
    import hermes_site.asgi  # here, not at collection: loading it warms the pools

    gc.unfreeze()
    assert gc.get_freeze_count() == 0
    hermes_site.asgi.warm_up()  # what loading the ASGI module runs
    assert gc.get_freeze_count() > 10_000
    gc.collect()
    assert gc.get_freeze_count() > 10_000  # a full pass leaves them frozen
    # and its full collections are paced (HERMES_GC_FULL_EVERY_S, 60 s)
    assert gc.get_threshold()[2] == heap.UNREACHED


def test_full_collections_come_from_the_pacing_thread_only():
    """Paced, the collector's own rule never calls a full pass (its oldest
    threshold is out of reach) and the pacing thread runs one each interval;
    unpaced, the collector's threshold is back."""
    heap.unpace_full_collections()
    own = gc.get_threshold()
    passes: list[str] = []
    paced = threading.Event()

    def seen(phase: str, info: dict) -> None:
        if phase == "stop" and info["generation"] == 2:
            passes.append(threading.current_thread().name)
            if len(passes) >= 2:
                paced.set()

    assert heap.pace_full_collections(0) is False
    assert gc.get_threshold() == own
    try:
        assert heap.pace_full_collections(0.05) is True
        assert gc.get_threshold() == (*own[:2], heap.UNREACHED)
        gc.callbacks.append(seen)  # from here no thread's own full pass
        assert paced.wait(30)
    finally:
        heap.unpace_full_collections()
        if seen in gc.callbacks:
            gc.callbacks.remove(seen)
    assert set(passes) == {"hermes-gc-full"}
    assert gc.get_threshold() == own


def _requests_and_responses() -> list:
    # By type, not isinstance: a lazy object would set itself up.
    return [
        o
        for o in gc.get_objects()
        if issubclass(type(o), HttpRequest | HttpResponseBase)
    ]


def _left_by_stream(path: str, seen: set[int]) -> list[str]:
    """The request and response objects made since `seen` that a stream for
    `path` left: its request, an SSE response, or either as the handler
    empties them. Another client's request to the same server (a page left
    open by an earlier test, say) is none of these."""
    return [
        type(o).__name__
        for o in _requests_and_responses()
        if id(o) not in seen
        and (not vars(o) or isinstance(o, SSEResponse) or vars(o).get("path") == path)
    ]


def test_a_stream_lets_go_of_its_request_without_the_collector(server, alice):
    """Once a stream's head is out, its request cycle (the request, the
    response, what the middleware hung on them) is freed by reference
    counting: no collection runs, and no request or response is left.

    The wait is for the threads that ran the cycle's synchronous steps: a
    thread hands a result back, waking the handler, before it returns from
    the job that holds the call's arguments (the standard library's executor
    does), so on a busy machine one may still hold the last of them when the
    head arrives. Without the handler's unlinking the request cycle is never
    freed, and the wait ends at its bound."""
    run = running_run(alice[0])
    path = f"/api/runs/{run.id}/events/"
    heap.unpace_full_collections()  # its thread collects even when disabled
    gc.collect()
    gc.disable()  # from here only reference counting frees anything
    try:
        # Held, so that no new object takes the address of one seen here.
        before = _requests_and_responses()
        seen = {id(o) for o in before}
        with (
            httpx.Client(timeout=30) as client,
            client.stream("GET", server.url + path, headers=alice[1]) as response,
        ):
            assert response.status_code == 200
            assert next(response.iter_raw()).startswith(b"retry:")
            deadline = time.monotonic() + 10
            while (left := _left_by_stream(path, seen)) and time.monotonic() < deadline:
                time.sleep(0.05)
    finally:
        gc.enable()
        heap.pace_full_collections()
    assert left == []
