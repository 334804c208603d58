"""`/static/` through WhiteNoise, in every ASGI server (daphne, uvicorn).

WhiteNoise answers GET and HEAD with `ETag`, `Last-Modified`, `304`s, ranges,
the `Cache-Control` of `WHITENOISE_MAX_AGE`, and a `.br` or `.gz` copy beside
the file when the client accepts it (`collectstatic` writes them, see
`STORAGES` in settings). A path it does not know goes on to Django, which
answers 404: odd paths such as `/static/..` or a NUL byte never reach the
filesystem.

Files are indexed at start-up from two places: `STATIC_ROOT` (collected and
compressed by `collectstatic`; `make run` does that before `serve`) and the
static finders (the source folders, so a checkout works without collecting).
A collected file is served only while it is at least as new as its source:
a source edited after the last `collectstatic` is served from the source,
uncompressed, instead of a stale copy.

WhiteNoise's middleware is synchronous; under ASGI Django would call it in a
thread, and every request, streams included, would queue for that thread
before reaching its async view. `StaticFilesMiddleware` is async-capable: a
request that is not for a static file goes straight to the next handler, and
a file is opened and read in a worker thread.
"""

import os
import time

from asgiref.sync import iscoroutinefunction, markcoroutinefunction, sync_to_async
from django.http import HttpResponse
from whitenoise.middleware import WhiteNoiseMiddleware


class StaticFilesMiddleware(WhiteNoiseMiddleware):
    sync_capable = True
    async_capable = True

    def __init__(self, get_response):
        super().__init__(get_response)
        self.is_async = iscoroutinefunction(get_response)
        if self.is_async:
            markcoroutinefunction(self)

    def __call__(self, request):
        if self.is_async:
            return self._acall(request)
        return super().__call__(request)

    async def _acall(self, request):
        if self.autorefresh:
            static_file = await sync_to_async(self.find_file)(request.path_info)
        else:
            static_file = self.files.get(request.path_info)
        if static_file is None:
            return await self.get_response(request)
        return await sync_to_async(_whole, thread_sensitive=False)(static_file, request)

    def add_files(self, root, prefix=None):
        """`STATIC_ROOT` before any `collectstatic` is simply not there yet."""
        if self.autorefresh or os.path.isdir(root):
            super().add_files(root, prefix)

    def add_files_from_finders(self):
        """The sources, except where the collected copy is as new as they are."""
        collected = dict(self.files)
        super().add_files_from_finders()
        for url, copy in collected.items():
            source = self.files.get(url)
            if source is not copy and _mtime(copy) >= _mtime(source):
                self.files[url] = copy


def _mtime(static_file) -> float:
    """When the file was last written (its `Last-Modified`), 0 if unknown."""
    stamp = getattr(static_file, "last_modified", None)
    return time.mktime(stamp) if stamp else 0.0


def _whole(static_file, request) -> HttpResponse:
    """WhiteNoise's answer, with the file read whole (static files are small):
    Django's ASGI handler would consume a file iterator through a thread and
    warn on every request."""
    answer = static_file.get_response(request.method, request.META)
    if answer.file is None:
        body = b""
    else:
        with answer.file:
            body = answer.file.read()
    response = HttpResponse(body, status=int(answer.status))
    del response["Content-Type"]
    for key, value in answer.headers:
        response[key] = value
    return response
