"""Site-wide request guards that run before any view."""

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from django.http import JsonResponse


def _nul_in_url(request) -> bool:
    if "\x00" in request.path:
        return True
    return any(
        "\x00" in key or any("\x00" in v for v in values)
        for key, values in request.GET.lists()
    )


class RejectNulMiddleware:
    """A NUL byte in the path or query answers 400 before any view sees it.

    No URL of Hermes carries one, and PostgreSQL refuses it in a text value
    ("cannot contain NUL"), so a run id or `?q=` with `%00` would otherwise
    fail deep in a query: in the API, the admin's search, anywhere.
    """

    sync_capable = True
    async_capable = True

    def __init__(self, get_response):
        self.get_response = get_response
        self.is_async = iscoroutinefunction(get_response)
        if self.is_async:
            markcoroutinefunction(self)

    def __call__(self, request):
        if self.is_async:
            return self._acall(request)
        if _nul_in_url(request):
            return _refused()
        return self.get_response(request)

    async def _acall(self, request):
        if _nul_in_url(request):
            return _refused()
        return await self.get_response(request)


def _refused() -> JsonResponse:
    return JsonResponse({"error": "NUL character in the URL"}, status=400)
