"""A database outage answers 503 with `Retry-After`, never a 500.

An `EventSource` that gets a 500 gives up for good; clients, proxies and the
chat page all know that a 503 with `Retry-After` means "come back soon". Three
hooks turn the errors of a database that is down or restarting
(`journal.dbpool.is_connection_error`: not an error of the request itself,
such as a limit of the server exceeded) into that answer:

- `DatabaseOutageMiddleware.process_exception`: any view, DRF's included (DRF
  re-raises what its exception handler leaves alone, and
  `chat.api_errors.exception_handler` leaves these alone);
- `handler500`: what escapes a middleware before any view ran (sessions,
  authentication);
- every failure is counted by `journal.outages` (one log line per outage and
  one when it recovers), instead of a traceback per request.
"""

import sys

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from django.http import HttpRequest, JsonResponse
from django.views.defaults import server_error

from journal import dbpool
from journal.outages import DATABASE, outage

RETRY_AFTER_S = 5  # a restart usually takes seconds; EventSource retries about then


def outage_response() -> JsonResponse:
    response = JsonResponse(
        {
            "error": "the database is unavailable; retry shortly",
            "retry_after_s": RETRY_AFTER_S,
        },
        status=503,
        headers={"Retry-After": str(RETRY_AFTER_S), "Cache-Control": "no-store"},
    )
    # Counted by journal.outages (one line per outage), not one error per request.
    response._has_been_logged = True  # type: ignore[attr-defined]
    return response


def _database_outage(exception: BaseException) -> bool:
    if dbpool.is_connection_error(exception):
        outage(DATABASE).failed("request", exception)
        return True
    return False


class DatabaseOutageMiddleware:
    """Views that hit a database outage answer 503 (see the module docstring)."""

    sync_capable = True
    async_capable = True

    def __init__(self, get_response):
        self.get_response = get_response
        if iscoroutinefunction(get_response):
            markcoroutinefunction(self)

    def __call__(self, request: HttpRequest):
        # Async: a coroutine the caller awaits; the hook below does the work.
        return self.get_response(request)

    def process_exception(self, request: HttpRequest, exception: Exception):
        return outage_response() if _database_outage(exception) else None


def handler500(request: HttpRequest):
    """Django's 500 view: a database outage that escaped the views is a 503."""
    exception = sys.exc_info()[1]
    if exception is not None and _database_outage(exception):
        return outage_response()
    return server_error(request)
