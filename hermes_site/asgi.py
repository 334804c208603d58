"""ASGI entry point: HTTP through Django, WebSockets through Channels.

Streaming requests (a run's SSE events, the notification stream) share one
thread for their short synchronous steps. Django's handler gives every request
a one-thread executor of its own that lives as long as the request does: for a
stream, a thread per open connection. These requests do their database work on
the journal's pool instead, so one shared thread is enough for what is left
(signals, middleware). docs/benchmarks.md measures the difference. Their
`send` also applies backpressure under daphne (hermes_site/backpressure.py).
"""

import functools
import os
import re
from concurrent.futures import ThreadPoolExecutor

from asgiref.sync import ThreadSensitiveContext, sync_to_async
from django.core import signals
from django.core.asgi import get_asgi_application
from django.core.exceptions import RequestAborted
from django.core.handlers.asgi import ASGIHandler, get_script_prefix
from django.http import HttpRequest, HttpResponseBase
from django.urls import set_script_prefix

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "hermes_site.settings")
get_asgi_application()  # sets Django up before the imports below

from channels.auth import AuthMiddlewareStack  # noqa: E402  (after Django setup)
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402

from chat.routing import websocket_urlpatterns  # noqa: E402
from chat.sse import SSEBody, SSEResponse, first_reads  # noqa: E402
from chat.ws_security import origin_checked  # noqa: E402
from hermes_site.backpressure import SSEFlow  # noqa: E402
from hermes_site.heap import (  # noqa: E402
    freeze_startup_heap,
    pace_full_collections,
)
from hermes_site.request_limits import RequestLimits, guard_daphne  # noqa: E402
from journal import dbpool  # noqa: E402

WARM_WAIT_S = 3.0  # at most, for the read pool's connections at start-up
STREAM_PATHS = re.compile(r"^/api/(runs/[^/]+/events|stream)/$")
_stream_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hermes-streams")


class HermesASGIHandler(ASGIHandler):
    async def stream(self, scope, flow: SSEFlow) -> SSEBody | None:
        """A streaming request: Django's request cycle up to the response (the
        middleware, the view). An `SSEResponse`'s body comes back, detached,
        to be served outside that cycle (`SSEBody.serve`): Django would keep
        the request, the resolver match, the middleware's closures, the
        response and two tasks for as long as a streaming body lasts
        (docs/benchmarks.md, finding 15). Any other response goes out here,
        as Django sends it.
        """
        async with ThreadSensitiveContext(executor=_stream_thread):
            request, response = await self._respond(scope, flow.receive)
            if response is None:
                return None
            try:
                if not isinstance(response, SSEResponse):
                    await self.send_response(response, flow.send)
                    return None
                start = _start_message(response)
                body = response.detach(request, start)
            finally:
                await sync_to_async(response.close)()
                _unlink(request, response)
        return body

    async def _respond(
        self, scope, receive
    ) -> tuple[HttpRequest | None, HttpResponseBase | None]:
        """What `ASGIHandler.handle` does before it sends: the request and its
        response (no request when it was refused), or no response when the
        client left first."""
        try:
            body_file = await self.read_body(receive)
        except RequestAborted:
            return None, None
        try:
            set_script_prefix(get_script_prefix(scope))
            await signals.request_started.asend(sender=self.__class__, scope=scope)
            request, error_response = self.create_request(scope, body_file)
            if request is None:
                return None, error_response
            return request, await self.run_get_response(request)
        finally:
            body_file.close()


def _unlink(*done: object) -> None:
    """Let go, now, of what a finished request cycle's objects hold.

    Django's request is in reference cycles (the middleware's lazy `user`
    and CSP nonce close over it, the messages storage points back at it),
    so once unreachable it waits for the collector's full pass; objects
    that outlive a young collection, as a request does while its view
    awaits the database, reach that pass only when the old generation has
    grown by a quarter (`hermes_site.heap`). Under a burst of new streams
    the requests' graphs piled up there: about 60 objects and 5 KiB per
    stream (docs/benchmarks.md, finding 19). Emptied, they are freed by
    reference counting as the handler returns.
    """
    for obj in done:
        if obj is not None:
            vars(obj).clear()


def _start_message(response: HttpResponseBase) -> dict:
    """`http.response.start` for a response, as `ASGIHandler.send_response`
    builds it."""
    headers = [_header(name, value) for name, value in response.items()]
    headers += [
        (b"Set-Cookie", cookie.output(header="").encode("ascii").strip())
        for cookie in response.cookies.values()
    ]
    return {
        "type": "http.response.start",
        "status": response.status_code,
        "headers": headers,
    }


@functools.lru_cache(maxsize=256)
def _header(name: str, value: str) -> tuple[bytes, bytes]:
    """A header, encoded once: the server keeps each open stream's headers,
    the same few for every stream, so they share their bytes."""
    return name.encode("ascii"), value.encode("latin1")


def warm_up() -> None:
    """Pay at start-up what a user's first request would pay: the URLconf and
    every view module it imports (the API, its schema, the tools), the stream
    path's modules, the channel layer, and the read pool's connections with
    their first statements. Without this the first stream after a start
    waited for those imports and connections (docs/benchmarks.md)."""
    from channels.layers import get_channel_layer
    from django.urls import get_resolver

    resolver = get_resolver()
    resolver.resolve("/api/stream/")
    resolver.resolve("/api/runs/warm-up/events/")
    get_channel_layer()
    warming = dbpool.readers.warm(first_reads)
    _stream_thread.submit(lambda: None).result()  # the shared thread, started
    freeze_startup_heap()
    pace_full_collections()
    # Bounded: a database out of reach delays the start by no more than this,
    # and the first request meets the outage as it would have.
    warming.wait(WARM_WAIT_S)


warm_up()

_http = HermesASGIHandler()
_router = ProtocolTypeRouter(
    {
        "http": _http,
        "websocket": origin_checked(
            AuthMiddlewareStack(URLRouter(websocket_urlpatterns))
        ),
    }
)


async def _site(scope, receive, send):
    """The site: streaming requests to `HermesASGIHandler.stream`, the rest
    through Channels' router (HTTP to Django, WebSockets to Channels)."""
    if scope["type"] == "http" and STREAM_PATHS.match(scope["path"]):
        flow = SSEFlow(receive, send)
        # Only the flow holds `receive` and `send` now: under daphne it lets
        # go of the request's input queue while the stream is served
        # (`SSEFlow.on_disconnect`), and nothing of the request cycle stays
        # (an idle stream's memory counts, docs/benchmarks.md).
        del receive, send
        body = await _http.stream(scope, flow)
        del scope
        if body is not None:
            await body.serve(flow.send, flow.on_disconnect)
        return None
    return await _router(scope, receive, send)


# Request bodies bounded per route before any view (or Django) reads them:
# as an ASGI middleware for servers that pass a body on as it arrives, and
# inside daphne, which reads a whole body before calling the application
# (hermes_site/request_limits.py).
guard_daphne()
application = RequestLimits(_site)
