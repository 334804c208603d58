"""Hooks of the login throttle (django-axes; settings: HERMES_LOGIN_*)."""

import hashlib

from axes.handlers.database import AxesDatabaseHandler  # type: ignore[import-untyped]
from axes.helpers import get_client_username  # type: ignore[import-untyped]
from axes.models import AccessAttempt  # type: ignore[import-untyped]
from django.conf import settings
from django.db import connections, router, transaction
from django.db.models import F
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


class CountedGuessHandler(AxesDatabaseHandler):
    """django-axes's database handler, with each guess counted before the
    password is checked (`AXES_HANDLER`; docs/security.md, "Login
    throttling").

    Axes checks the count before a password check and records a failure
    after it: a burst of parallel guesses all passed the check before any
    was recorded (9 guesses against a limit of 5). Here the check is also a
    reservation: in one short transaction, serialised per username and
    address (an advisory lock on PostgreSQL; SQLite's `IMMEDIATE`
    transactions serialise writers), the failures are summed as axes sums
    them and, below the limit, one more is added for the guess about to be
    checked. A guess that fails turns its reservation into axes's record of
    the failure in one transaction (the reservation taken away, axes's own
    count added, its lock-out decided on that count); one that succeeds
    resets the count as before. So a parallel burst gets at most the limit
    of guesses. A guess that neither fails nor succeeds (the request died
    between) stays counted as a failure until the cool-off.
    """

    def is_allowed(self, request, credentials: dict | None = None) -> bool:
        with transaction.atomic(using=router.db_for_write(AccessAttempt)):
            _serialise(request, credentials)
            if not super().is_allowed(request, credentials):
                return False
            if self.is_whitelisted(request, credentials):
                return True  # axes records nothing for it: nothing to reserve
            _reserve(request, credentials)
        return True

    def user_login_failed(self, sender, credentials: dict, request=None, **kwargs):
        if request is None or not getattr(request, RESERVED, False):
            return super().user_login_failed(sender, credentials, request, **kwargs)
        setattr(request, RESERVED, False)
        with transaction.atomic(using=router.db_for_write(AccessAttempt)):
            _serialise(request, credentials)
            _attempts_of(request, credentials).filter(
                failures_since_start__gt=0
            ).update(failures_since_start=F("failures_since_start") - 1)
            return super().user_login_failed(sender, credentials, request, **kwargs)


RESERVED = "hermes_guess_reserved"


def _attempts_of(request, credentials):
    """The row axes records this client's failures in (username, address
    and user agent, as `AxesDatabaseHandler.user_login_failed` keys it)."""
    return AccessAttempt.objects.filter(
        username=get_client_username(request, credentials),
        ip_address=request.axes_ip_address,
        user_agent=request.axes_user_agent,
    )


def _serialise(request, credentials) -> None:
    """Within a transaction: wait for any other guess of this username from
    this address to be counted first. On SQLite the transaction itself does
    it (`IMMEDIATE`: one writer at a time)."""
    connection = connections[router.db_for_write(AccessAttempt)]
    if connection.vendor != "postgresql":
        return
    who = f"{get_client_username(request, credentials)}\0{request.axes_ip_address}"
    digest = hashlib.blake2b(who.encode("utf-8", "replace"), digest_size=4).digest()
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_advisory_xact_lock(%s, %s)",
            [LOCK_CLASS, int.from_bytes(digest, "big", signed=True)],
        )


LOCK_CLASS = 0x4C47  # the advisory lock space of login guesses ("LG")


def _reserve(request, credentials) -> None:
    """One more failure counted for the guess about to be checked, on the
    row axes will record its failure in. Expired rows were cleaned by the
    check (`clean_expired_user_attempts`), so an old count does not come
    back."""
    AxesDatabaseHandler().clean_expired_user_attempts(request, credentials)
    attempt, created = AccessAttempt.objects.get_or_create(
        username=get_client_username(request, credentials),
        ip_address=request.axes_ip_address,
        user_agent=request.axes_user_agent,
        defaults={
            "get_data": "",
            "post_data": "",
            "http_accept": request.axes_http_accept,
            "path_info": request.axes_path_info,
            "failures_since_start": 1,
            "attempt_time": request.axes_attempt_time,
        },
    )
    if not created:
        AccessAttempt.objects.filter(pk=attempt.pk).update(
            failures_since_start=F("failures_since_start") + 1,
            attempt_time=request.axes_attempt_time,
        )
    setattr(request, RESERVED, True)
