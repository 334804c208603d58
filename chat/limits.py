"""Per-user limits: one user cannot starve the others (docs/security.md, "Limits").

Each limit is a setting in ``settings.HERMES`` (``HERMES_*`` in the
environment). Over a limit the API answers 429 with ``Retry-After`` and a JSON
body naming it: ``{"error": ..., "limit": ..., "retry_after": s}``.

- ``requests``: a DRF throttle per signed-in user, counted in the default
  cache. (Every API endpoint needs login, and DRF checks permissions before
  throttles, so requests without a user never get this far; login attempts
  have their own protection.)
- ``runs_per_minute``: runs a user started in the last 60 s, counted in the
  database, so every web process sees the same count. The count that decides
  is taken in the transaction that creates the run, after locking the
  user's row (SQLite's ``IMMEDIATE`` transactions serialise writers), so
  parallel requests cannot all pass it; a queued message (``chat.pending``)
  starts its run only under the same count, and waits while it is full.
- ``sessions``: sessions a user owns, counted in the database.
- ``streams``: open SSE and WebSocket streams of a user, counted in this web
  process (a stream lives in one process; a count there needs no shared state
  that a crashed process could leave behind). Behind K processes a user may
  hold K times the limit. A WebSocket over it is closed with code 4429.
- Concurrent runs are not refused: the worker's fair claim
  (``journal.leases.run_claim_next``) leaves a user's extra runs queued while
  other users' runs go first.
"""

from __future__ import annotations

import contextvars
import math
import threading
import weakref
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.signals import request_finished, request_started
from django.db import connection
from django.db.models import Count
from django.db.models.signals import pre_save
from django.http import JsonResponse
from django.utils import timezone
from rest_framework.exceptions import Throttled
from rest_framework.throttling import UserRateThrottle

from journal.models import Run

from .models import ChatSession

CLOSE_TOO_MANY_STREAMS = 4429  # the 4000 range mirrors HTTP statuses (4429: 429)
STREAM_RETRY_AFTER_S = 5  # a slot frees when one of the user's streams closes
SESSIONS_RETRY_AFTER_S = 60  # a slot frees only when the user deletes a session
RUN_WINDOW_S = 60


def _limit(name: str) -> Any:
    return settings.HERMES[name]


class LimitExceeded(Throttled):
    """A per-user limit: 429, ``Retry-After``, and the limit's name in the body."""

    def __init__(self, limit: str, message: str, retry_after: float):
        super().__init__(wait=max(1, math.ceil(retry_after)), detail=message)
        self.limit = limit


def throttled_body(exc: Throttled) -> dict[str, Any]:
    """The JSON body of a 429, for the API's exception handler."""
    seconds = getattr(exc, "wait", None)  # set by Throttled, unknown to the stubs
    wait = math.ceil(seconds) if seconds is not None else None
    if isinstance(exc, LimitExceeded):
        return {"error": str(exc.detail), "limit": exc.limit, "retry_after": wait}
    rate = _limit("USER_REQUEST_RATE")
    return {
        "error": f"too many requests (limit {rate}); retry in {wait} s",
        "limit": "requests",
        "retry_after": wait,
    }


class UserRequestThrottle(UserRateThrottle):
    """Requests per signed-in user: ``HERMES_USER_REQUEST_RATE``."""

    def get_rate(self) -> str:
        return _limit("USER_REQUEST_RATE")


# The owner whose next run's creation counts it under the lock (see
# `check_run_rate`); set in the request's own context, used once.
_run_rate_armed: contextvars.ContextVar[int | None] = contextvars.ContextVar(
    "hermes_run_rate_armed", default=None
)


def check_run_rate(*, user) -> None:
    """Raise ``LimitExceeded`` if ``user`` started too many runs in the last
    minute.

    This early look refuses most requests over the limit before anything
    else is read, but parallel requests may all pass it: it also arms the
    count that decides, taken when this request's run is created, in the
    transaction that creates it (`_count_run_at_creation`).
    """
    wait = run_rate_wait(user.pk)
    if wait is not None:
        raise _run_rate_exceeded(wait)
    _run_rate_armed.set(user.pk)


def run_rate_wait(owner_id: int) -> float | None:
    """None if user `owner_id` may start a run now, else the seconds until
    the oldest of their last `USER_RUNS_PER_MINUTE` runs leaves the window.

    In a transaction, call `lock_run_rate` first: then the answer holds
    until that transaction ends."""
    limit = _limit("USER_RUNS_PER_MINUTE")
    since = timezone.now() - timedelta(seconds=RUN_WINDOW_S)
    recent = Run.objects.filter(owner_id=owner_id, created_at__gte=since)
    started = list(
        recent.order_by("-created_at").values_list("created_at", flat=True)[:limit]
    )
    if len(started) < limit:
        return None
    # The oldest of the last `limit` runs leaves the window first.
    return max(0.0, (started[-1] - since).total_seconds())


def lock_run_rate(owner_id: int) -> None:
    """In a transaction: take user `owner_id`'s turn at starting runs, so
    that a count (`run_rate_wait`) and the run it lets in commit before the
    next start of theirs counts. On PostgreSQL the user's row is locked
    (transactions of other users go on); on SQLite the write transaction
    (`IMMEDIATE`) already serialises every writer."""
    if connection.features.has_select_for_update and connection.in_atomic_block:
        list(
            get_user_model()
            .objects.select_for_update()
            .filter(pk=owner_id)
            .values_list("pk", flat=True)
        )


def owners_at_run_rate():
    """A subquery of the users at `USER_RUNS_PER_MINUTE` now (for
    `chat.pending.deliver_stranded`, which passes their sessions over)."""
    since = timezone.now() - timedelta(seconds=RUN_WINDOW_S)
    return (
        Run.objects.filter(created_at__gte=since)
        .values("owner_id")
        .annotate(started=Count("id"))
        .filter(started__gte=_limit("USER_RUNS_PER_MINUTE"))
        .values("owner_id")
    )


def _run_rate_exceeded(wait: float) -> LimitExceeded:
    limit = _limit("USER_RUNS_PER_MINUTE")
    return LimitExceeded(
        "runs_per_minute",
        f"you started {limit} runs in the last minute, the most allowed; "
        f"retry in {max(1, math.ceil(wait))} s",
        wait,
    )


def _count_run_at_creation(sender, instance: Run, raw: bool = False, **kwargs) -> None:
    """The count that decides a request's run (armed by `check_run_rate`):
    taken as the run is inserted, in the transaction that inserts it
    (`chat.services.run_start`'s), after the user's turn is taken. Over the
    limit, ``LimitExceeded`` rolls that transaction back: no run, no
    message, a 429. Runs the request did not arm (a worker's, a title's, a
    test's) are not looked at."""
    owner_id = _run_rate_armed.get()
    if raw or owner_id is None or not instance._state.adding:
        return
    if instance.owner_id != owner_id:
        return
    _run_rate_armed.set(None)
    lock_run_rate(owner_id)
    wait = run_rate_wait(owner_id)
    if wait is not None:
        raise _run_rate_exceeded(wait)


pre_save.connect(
    _count_run_at_creation, sender=Run, dispatch_uid="chat.limits.run_rate"
)


def _disarm(sender, **kwargs) -> None:
    """A request's arming ends with it (where requests share a context, as
    the test client's do, a refused request's must not reach the next)."""
    _run_rate_armed.set(None)


request_started.connect(_disarm, dispatch_uid="chat.limits.disarm_started")
request_finished.connect(_disarm, dispatch_uid="chat.limits.disarm_finished")


def check_session_count(*, user) -> None:
    """Raise ``LimitExceeded`` if ``user`` already owns the most sessions allowed."""
    limit = _limit("USER_MAX_SESSIONS")
    if ChatSession.objects.filter(owner=user).count() >= limit:
        raise LimitExceeded(
            "sessions",
            f"you have {limit} sessions, the most allowed; delete some to start "
            "another",
            SESSIONS_RETRY_AFTER_S,
        )


# --- open streams ---------------------------------------------------------------

_open_streams: dict[int, int] = {}
_streams_lock = threading.Lock()


class StreamSlot:
    """One of a user's open streams in this process; ``release`` is idempotent."""

    def __init__(self, user_id: int):
        self.user_id = user_id
        self._held = True

    def release(self) -> None:
        with _streams_lock:
            if not self._held:
                return
            self._held = False
            left = _open_streams.get(self.user_id, 1) - 1
            if left > 0:
                _open_streams[self.user_id] = left
            else:
                _open_streams.pop(self.user_id, None)


def stream_slot_acquire(user_id: int) -> StreamSlot | None:
    """A stream slot for ``user_id``, or None when the user holds the limit."""
    with _streams_lock:
        held = _open_streams.get(user_id, 0)
        if held >= _limit("USER_MAX_STREAMS"):
            return None
        _open_streams[user_id] = held + 1
    return StreamSlot(user_id)


def open_streams(user_id: int) -> int:
    with _streams_lock:
        return _open_streams.get(user_id, 0)


def _streams_message() -> str:
    return (
        f"too many open streams (limit {_limit('USER_MAX_STREAMS')}); "
        "close another tab or stream first"
    )


class _Held:
    """The response body, holding the slot until it ends, however it ends:
    exhausted or cancelled (``__anext__``), closed by Django (``close``), or
    never iterated at all (the finalizer)."""

    def __init__(self, inner: AsyncIterator, slot: StreamSlot):
        self._inner, self._slot = inner, slot
        weakref.finalize(self, slot.release)

    def __aiter__(self) -> _Held:
        return self

    async def __anext__(self) -> Any:
        try:
            return await anext(self._inner)
        except BaseException:
            self._slot.release()
            raise

    def close(self) -> None:
        self._slot.release()


def streams_refusal() -> JsonResponse:
    """For an SSE view: the 429 when the user has no stream slot left."""
    refusal = JsonResponse(
        {
            "error": _streams_message(),
            "limit": "streams",
            "retry_after": STREAM_RETRY_AFTER_S,
        },
        status=429,
    )
    refusal["Retry-After"] = str(STREAM_RETRY_AFTER_S)
    return refusal


def held(body: AsyncIterator, slot: StreamSlot) -> AsyncIterator:
    """``body`` holding ``slot`` until it ends, however it ends."""
    return _Held(body, slot)


async def hold_ws_slot(consumer, user_id: int) -> StreamSlot | None:
    """For an accepted WebSocket: a stream slot, or None after closing the
    socket with ``CLOSE_TOO_MANY_STREAMS``. Release it in ``disconnect``."""
    slot = stream_slot_acquire(user_id)
    if slot is None:
        await consumer.close(code=CLOSE_TOO_MANY_STREAMS, reason=_streams_message())
    return slot
