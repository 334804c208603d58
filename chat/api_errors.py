"""JSON errors for the API: every failure answers a 4xx naming the problem."""

from rest_framework.exceptions import Throttled
from rest_framework.views import exception_handler as drf_exception_handler

from .limits import throttled_body


def exception_handler(exc, context):
    response = drf_exception_handler(exc, context)
    if response is not None and isinstance(exc, Throttled):
        response.data = throttled_body(exc)  # 429: which limit, and when to retry
    elif (
        response is not None
        and isinstance(response.data, dict)
        and "detail" in response.data
    ):
        response.data = {
            "error": str(response.data["detail"]),
            **{k: v for k, v in response.data.items() if k != "detail"},
        }
    elif response is not None:
        response.data = {"error": "invalid input", "fields": response.data}
    return response
