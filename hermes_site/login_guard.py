"""Hooks of the login throttle (django-axes; settings: HERMES_LOGIN_*)."""

from django.conf import settings
from django.http import HttpRequest, HttpResponse


def client_ip(request: HttpRequest) -> str | None:
    """The client's address: a proxy's header when one is configured, else the peer.

    Only set HERMES_LOGIN_CLIENT_IP_HEADER behind a proxy that overwrites that
    header; otherwise a client could name any address it likes.
    """
    header = settings.HERMES_LOGIN_CLIENT_IP_HEADER
    if header:
        value = request.META.get(header, "").split(",")[0].strip()
        if value:
            return value
    return request.META.get("REMOTE_ADDR")


def locked_out(request: HttpRequest, original_response=None, credentials=None):
    """429 with `Retry-After`, in words a person reads on the login page."""
    minutes = settings.AXES_COOLOFF_TIME * 60
    response = HttpResponse(
        "Too many failed logins for this account from your address. "
        f"Try again in {minutes:g} minutes.",
        status=429,
        content_type="text/plain; charset=utf-8",
    )
    response["Retry-After"] = str(round(minutes * 60))
    return response
