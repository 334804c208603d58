"""Access functions: the only way a view reaches a protected object.

Another user's run or session answers "not found", exactly as if it did not
exist. These are sync; async transports call them through `journal.dbpool`.
"""

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from importlib import import_module
from typing import TypeVar

from django.conf import settings
from django.contrib.auth import HASH_SESSION_KEY, SESSION_KEY, get_user, get_user_model
from django.contrib.auth.models import AnonymousUser
from django.utils.crypto import constant_time_compare
from rest_framework.authtoken.models import Token

from journal import dbpool
from journal.models import Run
from journal.outages import DATABASE, DATABASE_ERRORS, outage

from .models import ChatSession

T = TypeVar("T")
log = logging.getLogger(__name__)
RUN_ID_MAX = 40  # journal.Run.id's max_length


class NotFound(Exception):
    pass


def run_get_for_owner(*, run_id: str, user) -> Run:
    # PostgreSQL refuses NUL in text; no run id holds one (WebSocket paths
    # reach here without the HTTP middleware that turns it away).
    usable = user.pk and "\x00" not in run_id and len(run_id) <= RUN_ID_MAX
    run = owned_run(run_id, user.pk) if usable else None
    if run is None:
        raise NotFound(f"no run {run_id}")
    return run


def owned_run(run_id: str, owner_id: int) -> Run | None:
    return (
        Run.objects.select_related("turn").filter(id=run_id, owner_id=owner_id).first()
    )


def session_get_for_owner(*, session_id, user) -> ChatSession:
    try:
        pk = int(session_id)
    except (TypeError, ValueError):
        raise NotFound(f"no session {session_id}") from None
    session = ChatSession.objects.filter(pk=pk, owner_id=user.pk).first()
    if session is None:
        raise NotFound(f"no session {session_id}")
    return session


def user_from_token_header(header: str | None):
    """`Authorization: Token <key>` -> the active user, or None."""
    if not header:
        return None
    scheme, _, key = header.partition(" ")
    if scheme.lower() != "token" or not key.strip():
        return None
    token = Token.objects.select_related("user").filter(key=key.strip()).first()
    if token is None or not token.user.is_active:
        return None
    return token.user


def user_from_request(request):
    """A Django request's user: token header first, then the session cookie."""
    user = user_from_token_header(request.headers.get("Authorization"))
    if user is not None:
        return user
    user = get_user(request)
    return user if user.is_authenticated else AnonymousUser()


# --- credentials of an open stream ---------------------------------------------


@dataclass(frozen=True)
class Credential:
    """What authenticated a stream: its user, and the token or session it used.

    An open stream re-checks this every CREDENTIAL_CHECK_S seconds and ends
    when the same request would no longer authenticate as the same user: the
    token was rotated or deleted, the session logged out (or its password
    changed), the user deactivated.
    """

    user_id: int
    token_key: str = ""
    session_key: str = ""


def credential_of(
    *, user_id: int, authorization: str | None, session_key: str | None
) -> Credential:
    scheme, _, key = (authorization or "").partition(" ")
    token = key.strip() if scheme.lower() == "token" else ""
    return Credential(user_id, token, session_key or "")


def credential_of_request(request, user_id: int) -> Credential:
    return credential_of(
        user_id=user_id,
        authorization=request.headers.get("Authorization"),
        session_key=request.COOKIES.get(settings.SESSION_COOKIE_NAME),
    )


def credential_of_scope(scope, user_id: int) -> Credential:
    headers = dict(scope.get("headers", ()))
    session = scope.get("session")
    return credential_of(
        user_id=user_id,
        authorization=headers.get(b"authorization", b"").decode("latin-1"),
        session_key=getattr(session, "session_key", None),
    )


def credential_valid(credential: Credential) -> bool:
    """Would this credential still authenticate as its user? (sync: one or two
    indexed reads)."""
    user = get_user_model().objects.filter(pk=credential.user_id).first()
    if user is None or not user.is_active:
        return False
    if (
        credential.token_key
        and Token.objects.filter(key=credential.token_key, user_id=user.pk).exists()
    ):
        return True
    if credential.session_key:
        data = (
            import_module(settings.SESSION_ENGINE)
            .SessionStore(session_key=credential.session_key)
            .load()
        )
        return str(data.get(SESSION_KEY)) == str(user.pk) and constant_time_compare(
            data.get(HASH_SESSION_KEY, ""), user.get_session_auth_hash()
        )
    return False


SHARED_CHECK_S = 1.0  # streams of one credential share a check this recent (or
# half a check period, if shorter)

# (event loop, credential) -> (when, the check: running or done)
_checks: dict[tuple[int, Credential], tuple[float, asyncio.Future]] = {}


async def _still_valid(credential: Credential, every: float) -> bool:
    """The check, on the reader pool; while the database is down a credential
    cannot be judged, so the stream goes on (readers wait out outages).

    The streams of one credential (a user's tabs, a client's many streams)
    share a check that is running or at most `SHARED_CHECK_S` old, so a
    process makes about one query per credential and check period, not one
    per stream.
    """
    loop = asyncio.get_running_loop()
    key = (id(loop), credential)
    now = loop.time()
    shared = _checks.get(key)
    if shared is None or now - shared[0] > min(SHARED_CHECK_S, every / 2):
        if len(_checks) > 10_000:  # forget the old ones, whatever their loop
            for old in [k for k, (t, f) in _checks.items() if f.done()]:
                del _checks[old]
        shared = _checks[key] = (now, asyncio.ensure_future(_check(credential)))
    return await asyncio.shield(shared[1])


async def _check(credential: Credential) -> bool:
    try:
        return await dbpool.readers.run(credential_valid, credential)
    except DATABASE_ERRORS as exc:
        if not dbpool.is_connection_error(exc):
            raise
        outage(DATABASE).failed("credential check", exc)
        return True


_ITEM, _END = object(), object()


class _Handoff:
    """One item at a time from one task to another: what `asyncio.Queue(1)`
    does, without its four deques (kept by every open stream)."""

    __slots__ = ("_item", "_full", "_waiter")

    def __init__(self):
        self._item: tuple = ()
        self._full = False
        self._waiter: asyncio.Future | None = None

    async def put(self, item: tuple) -> None:
        while self._full:
            await self._wait()
        self.replace(item)

    async def get(self) -> tuple:
        while not self._full:
            await self._wait()
        item, self._item, self._full = self._item, (), False
        self._wake()
        return item

    def replace(self, item: tuple) -> None:
        """Put `item` now, dropping one not taken yet."""
        self._item, self._full = item, True
        self._wake()

    def _wait(self) -> asyncio.Future:
        self._waiter = asyncio.get_running_loop().create_future()
        return self._waiter

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)
        self._waiter = None


async def until_revoked(
    stream: AsyncIterator[T], credential: Credential, revoked: list[bool]
) -> AsyncIterator[T]:
    """Items of `stream` while `credential` stays valid; ends when it is not.

    Checks every HERMES["CREDENTIAL_CHECK_S"] seconds, whether or not the
    stream is busy, on the journal's reader pool; appends True to `revoked`
    when it ends the stream for that reason.
    """
    every = settings.HERMES["CREDENTIAL_CHECK_S"]
    # One task reads the stream and one checks the credential, for the
    # stream's whole life: not a task and a timer per item (hundreds of
    # streams of a few items a second each; docs/benchmarks.md). The reader
    # runs at most one item ahead of what was yielded.
    items = _Handoff()

    async def read() -> None:
        try:
            async for item in stream:
                await items.put((_ITEM, item))
        except Exception as exc:  # raised where the stream is consumed
            await items.put((exc, None))
        else:
            await items.put((_END, None))

    async def watch() -> None:
        while await _still_valid_after(credential, every):
            pass
        revoked.append(True)
        reader.cancel()
        items.replace((_END, None))  # wake the consumer with the end

    reader = asyncio.ensure_future(read())
    watcher = asyncio.ensure_future(watch())
    try:
        while True:
            kind, item = await items.get()
            if kind is _END:
                return
            if kind is not _ITEM:
                raise kind
            yield item
    finally:
        for task in (watcher, reader):
            task.cancel()
        await asyncio.gather(watcher, reader, return_exceptions=True)
        aclose = getattr(stream, "aclose", None)
        if aclose is not None:
            await aclose()


class _Watch:
    """One credential's periodic check, shared by its streams in one loop."""

    __slots__ = ("streams", "task")

    def __init__(self) -> None:
        self.streams: set[Callable[[], None]] = set()
        self.task: asyncio.Task | None = None


# (event loop, credential) -> its watch, while a stream of it is open
_watches: dict[tuple[int, Credential], _Watch] = {}


def watch_credential(credential: Credential, revoke: Callable[[], None]) -> None:
    """Call `revoke()` once if `credential` stops authenticating its user.

    What `until_revoked` does for one stream with two tasks of its own, for
    every stream of the credential with one task: the check every
    HERMES["CREDENTIAL_CHECK_S"] seconds, on the reader pool. A stream that
    ends calls `unwatch_credential` with the same `revoke`.
    """
    loop = asyncio.get_running_loop()
    key = (id(loop), credential)
    watch = _watches.get(key)
    if watch is None:
        watch = _watches[key] = _Watch()
        every = settings.HERMES["CREDENTIAL_CHECK_S"]
        watch.task = loop.create_task(_watching(key, watch, every))
    watch.streams.add(revoke)


def unwatch_credential(credential: Credential, revoke: Callable[[], None]) -> None:
    key = (id(asyncio.get_running_loop()), credential)
    watch = _watches.get(key)
    if watch is None:
        return
    watch.streams.discard(revoke)
    if not watch.streams:
        del _watches[key]
        if watch.task is not None:
            watch.task.cancel()


async def _watching(key: tuple[int, Credential], watch: _Watch, every: float) -> None:
    while True:
        try:
            if not await _still_valid_after(key[1], every):
                break
        except Exception:  # a bug, not an outage: the streams stay watched
            log.exception("credential check failed; checking again")
    if _watches.get(key) is watch:
        del _watches[key]
    streams, watch.streams = watch.streams, set()
    for revoke in streams:
        revoke()


async def _still_valid_after(credential: Credential, every: float) -> bool:
    await asyncio.sleep(every)
    return await _still_valid(credential, every)
