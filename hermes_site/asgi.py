"""ASGI entry point: HTTP through Django, WebSockets through Channels.

Streaming requests (a run's SSE events, the notification stream) share one
thread for their short synchronous steps. Django's handler gives every request
a one-thread executor of its own that lives as long as the request does: for a
stream, a thread per open connection. These requests do their database work on
the journal's pool instead, so one shared thread is enough for what is left
(signals, middleware). docs/benchmarks.md measures the difference. Their
`send` also applies backpressure under daphne (hermes_site/backpressure.py).
"""

import os
import re
from concurrent.futures import ThreadPoolExecutor

from asgiref.sync import ThreadSensitiveContext
from django.core.asgi import get_asgi_application
from django.core.handlers.asgi import ASGIHandler

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "hermes_site.settings")
get_asgi_application()  # sets Django up before the imports below

from channels.auth import AuthMiddlewareStack  # noqa: E402  (after Django setup)
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402

from chat.routing import websocket_urlpatterns  # noqa: E402
from chat.ws_security import origin_checked  # noqa: E402
from hermes_site.backpressure import SSEFlow  # noqa: E402
from hermes_site.heap import freeze_startup_heap  # noqa: E402

STREAM_PATHS = re.compile(r"^/api/(runs/[^/]+/events|stream)/$")
_stream_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hermes-streams")


class HermesASGIHandler(ASGIHandler):
    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and STREAM_PATHS.match(scope["path"]):
            flow = SSEFlow(receive, send)
            async with ThreadSensitiveContext(executor=_stream_thread):
                await self.handle(scope, flow.receive, flow.send)
        else:
            await super().__call__(scope, receive, send)


def warm_up() -> None:
    """Pay at start-up what a user's first request would pay: the URLconf and
    every view module it imports (the API, its schema, the tools), the stream
    path's modules and the channel layer. Without this the first stream after
    a start waited for those imports (docs/benchmarks.md)."""
    from channels.layers import get_channel_layer
    from django.urls import get_resolver

    resolver = get_resolver()
    resolver.resolve("/api/stream/")
    resolver.resolve("/api/runs/warm-up/events/")
    get_channel_layer()
    _stream_thread.submit(lambda: None).result()  # the shared thread, started
    freeze_startup_heap()


warm_up()

application = ProtocolTypeRouter(
    {
        "http": HermesASGIHandler(),
        "websocket": origin_checked(
            AuthMiddlewareStack(URLRouter(websocket_urlpatterns))
        ),
    }
)
