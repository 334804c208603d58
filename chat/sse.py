"""The SSE transport: `GET /api/runs/<id>/events/` (docs/architecture.md §5).

Parses, authorises and serialises; reading is `journal.subscribe`. Database
work goes through the shared pool so a streaming request holds no connection.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import TypeVar, cast

from channels.layers import get_channel_layer
from django.conf import settings
from django.http import (
    HttpResponse,
    HttpResponseBase,
    HttpResponseNotAllowed,
    JsonResponse,
    StreamingHttpResponse,
)
from django.urls import reverse
from django.views.decorators.csrf import csrf_exempt

from journal import dbpool, wire
from journal.cursor import Verdict, cursor_from_request, decide_for_run
from journal.outages import CHANNEL_LAYER, Backoff, outage
from journal.publish import owner_group
from journal.store import read_after, run_state
from journal.subscribe import subscribe_frames

from . import limits
from .access import (
    NotFound,
    credential_of_request,
    owned_run,
    run_get_for_owner,
    until_revoked,
    unwatch_credential,
    user_from_request,
    user_from_token_header,
    watch_credential,
)
from .models import session_of_subject, turn_of


class SSEResponse(StreamingHttpResponse):
    """An SSE stream (`SSEBody`) as a Django response.

    Any ASGI handler can iterate it as a streaming response; the body's
    guard is then `until_revoked`, two tasks per stream. The site's handler
    instead closes the response (Django's request cycle ends there) and
    `serve`s its detached body (hermes_site/asgi.py): an idle stream then
    holds no request, response, middleware or handler task, and each frame
    takes fewer steps to its reader (docs/benchmarks.md, finding 15).
    """

    def __init__(self, frames: AsyncGenerator[str | bytes], credential, slot):
        self.body: SSEBody | None = SSEBody(frames, credential, slot)
        super().__init__(_Guarded(self.body), content_type="text/event-stream")
        self["Cache-Control"] = "no-cache"
        self["X-Accel-Buffering"] = "no"  # no proxy buffering of a live stream

    def detach(self, request, start: dict) -> SSEBody:
        """The body, to serve once this response and `request` are closed
        (Django closes the request with the response; a GET's request has
        nothing to close later), beginning with `start`, the response's
        `http.response.start`."""
        self._resource_closers.remove(request.close)  # type: ignore[attr-defined]
        request.close()
        body, self.body = self.body, None
        assert body is not None, "detached once"
        body.start = start
        return body

    def close(self) -> None:
        if self.body is not None:  # never served: its slot goes with it
            self.body.slot.release()
        super().close()


class SSEBody:
    """An SSE body, guarded by the credential that opened it (it ends when the
    token or session is revoked, `chat.access.Credential`) and holding one of
    the user's stream slots (`chat.limits`) until it ends."""

    __slots__ = ("frames", "credential", "slot", "start")

    def __init__(self, frames: AsyncGenerator[str | bytes], credential, slot):
        self.frames, self.credential, self.slot = frames, credential, slot
        self.start: dict | None = None  # `http.response.start`, until sent

    async def serve(self, send, on_disconnect) -> None:
        """Send `start` (`http.response.start`) and the body from the calling
        task until it ends, the client leaves or the credential is revoked.
        `on_disconnect(left)` calls `left` when the client leaves and returns
        what stops that (`hermes_site.backpressure.SSEFlow.on_disconnect`);
        the credential's check is shared by its streams
        (`chat.access.watch_credential`)."""
        serving = _Serving(asyncio.current_task())
        unwatch_client = on_disconnect(serving.gone)
        watch_credential(self.credential, serving)
        try:
            start, self.start = self.start, None
            assert start is not None, "detached with its start"
            await send(start)
            del start  # sent: an idle stream holds no copy of its headers
            async for chunk in self.frames:
                body = chunk.encode() if isinstance(chunk, str) else chunk
                del chunk  # nothing sent stays held while the stream waits
                await send(
                    {"type": "http.response.body", "body": body, "more_body": True}
                )
                del body
                if serving.ended:  # in case a library swallowed its cancellation
                    break
        except asyncio.CancelledError:
            if not serving.ours():
                raise
        finally:
            ended = serving.finish()  # no cancellation by the guards after this
            unwatch_credential(self.credential, serving)
            unwatch_client()
            self.slot.release()
            await self.frames.aclose()
        if ended != _GONE:
            await send({"type": "http.response.body"})

    def guarded(self) -> AsyncIterator:
        """The body for any other handler: `until_revoked`, holding the slot."""
        return limits.held(until_revoked(self.frames, self.credential, []), self.slot)


_GONE, _REVOKED, _DONE = "the client left", "revoked", "done"


class _Serving:
    """`SSEBody.serve`'s guards: the client leaving, the credential revoked
    (calling it revokes). Either cancels the serving task once."""

    __slots__ = ("task", "ended")

    def __init__(self, task):
        self.task, self.ended = task, ""

    def __call__(self) -> None:
        self.stop(_REVOKED)

    def stop(self, why: str) -> None:
        if not self.ended:
            self.ended = why
            self.task.cancel()

    def ours(self) -> bool:
        """A cancellation of ours alone (not also the server's, at shutdown)."""
        return bool(self.ended) and self.task.uncancel() == 0

    def finish(self) -> str:
        self.ended = self.ended or _DONE
        return self.ended

    def gone(self) -> None:
        self.stop(_GONE)


class _Guarded:
    """`SSEResponse`'s streaming content: `SSEBody.guarded`, built on the first
    read, so a body that is `serve`d never builds it."""

    __slots__ = ("sse", "body")

    def __init__(self, sse: SSEBody):
        self.sse, self.body = sse, None

    def __aiter__(self):
        return self

    async def __anext__(self):
        if self.body is None:
            self.body = self.sse.guarded()
        return await anext(self.body)


SSE_METHODS = ("GET", "HEAD")


_View = TypeVar("_View", bound=Callable[..., Awaitable[HttpResponseBase]])


def get_or_head(view: _View) -> _View:
    """A stream answers GET, and HEAD with its head and no body (no stream
    is opened, no slot held); any other method 405 with `Allow`, before the
    CSRF check (which would answer 403 for some methods and let OPTIONS and
    TRACE open a stream). Exempt from CSRF: the view takes no other method."""

    @csrf_exempt
    @functools.wraps(view)
    async def checked(request, *args, **kwargs) -> HttpResponseBase:
        if request.method not in SSE_METHODS:
            return HttpResponseNotAllowed(SSE_METHODS)
        response = await view(request, *args, **kwargs)
        if request.method == "HEAD" and isinstance(response, SSEResponse):
            head = HttpResponse(status=response.status_code)
            for name, value in response.items():
                head[name] = value
            response.close()  # never served: its slot goes with it
            return head
        return response

    return cast(_View, checked)


def _authorize(request, run_id: str):
    user = user_from_request(request)
    if not user.is_authenticated:
        return None, JsonResponse({"error": "authentication required"}, status=401)
    try:
        return run_get_for_owner(run_id=run_id, user=user), None
    except NotFound:
        return None, JsonResponse({"error": f"no run {run_id}"}, status=404)


def first_reads() -> None:
    """The reads of a stream's first request (the user's token, the run, the
    run's state, its journal), asked for keys that match nothing. A server
    asks them on each database thread as it starts (hermes_site/asgi.py): a
    thread's first statements of each kind cost several times what later
    ones do, and a user's first stream would pay for them."""
    user_from_token_header("Token -")
    owned_run("-", 0)
    run_state(run_id="-")
    read_after(run_id="-", after_seq=0)


def pruned_response(run) -> JsonResponse:
    turn = turn_of(run)
    return JsonResponse(
        {
            "error": "this run's events were pruned by retention",
            "run_id": run.id,
            "session_id": turn.session_id if turn else None,
            "transcript_url": (
                reverse("api-session-messages", args=[turn.session_id])
                if turn
                else None
            ),
        },
        status=410,
    )


@get_or_head
async def run_events(request, run_id: str):
    run, error = await dbpool.readers.run(_authorize, request, run_id)
    if error is not None:
        return error
    cursor = cursor_from_request(
        query=request.GET,
        last_event_id=request.headers.get("Last-Event-ID"),
        run_id=run.id,
        last_seq=run.last_seq,
    )
    outcome = decide_for_run(run, cursor)
    if outcome.verdict is Verdict.GONE:
        return pruned_response(run)
    if outcome.verdict is Verdict.DONE:
        return HttpResponse(status=204)  # stops EventSource from retrying
    slot = limits.stream_slot_acquire(run.owner_id)
    if slot is None:
        return limits.streams_refusal()
    frames = _frames(run.id, outcome.after_seq, outcome.note)
    return SSEResponse(frames, credential_of_request(request, run.owner_id), slot)


async def _frames(run_id: str, after_seq: int, note: str):
    hermes = settings.HERMES
    head = wire.sse_retry(hermes["SSE_RETRY_MS"])
    if note:
        head += wire.unusable_cursor_note(note)
    yield head
    # Writes of about 32 KiB (wire.SSE): the server's backpressure acts
    # between them. Live ones are shared by every reader of the run's hub.
    async for writes in subscribe_frames(
        run_id, wire.SSE, after_seq=after_seq, idle_s=hermes["SSE_KEEPALIVE_S"]
    ):
        if not writes:
            yield wire.KEEPALIVE
            continue
        for chunk in writes:
            yield chunk
        del writes, chunk  # nothing sent stays held while the stream waits


def _authenticated_user_id(request) -> int | None:
    user = user_from_request(request)
    return user.pk if user.is_authenticated else None


@get_or_head
async def user_stream(request):
    """`GET /api/stream/`: the user's notifications (sessions, run start/finish).

    Not journaled: a tab that reconnects refetches the session list instead.
    """
    user_id = await dbpool.readers.run(_authenticated_user_id, request)
    if user_id is None:
        return JsonResponse({"error": "authentication required"}, status=401)
    slot = limits.stream_slot_acquire(user_id)
    if slot is None:
        return limits.streams_refusal()
    frames = _notifications(user_id)
    return SSEResponse(frames, credential_of_request(request, user_id), slot)


def for_page(data: dict) -> dict:
    """A notification as the page reads it: a run's journal `subject` (the end
    of a run, from `journal.publish`) also as the `session_id` it names."""
    if "subject" in data and "session_id" not in data:
        return {**data, "session_id": session_of_subject(data["subject"])}
    return data


async def _notifications(user_id: int):
    """The user's notifications; rejoins the group after a channel-layer outage.

    While the layer is down the stream sends keepalives and rejoins with
    backoff; notifications published meanwhile are lost (they are not
    journaled), so a rejoin tells the page to refetch, as a reconnect does.
    """
    hermes = settings.HERMES
    keepalive_s = hermes["SSE_KEEPALIVE_S"]
    layer = get_channel_layer()
    group = owner_group(user_id)
    channel: str | None = None
    backoff = Backoff(first=0.2, cap=5.0)
    try:
        yield wire.sse_retry(hermes["SSE_RETRY_MS"]) + wire.sse_message("hello", {})
        while True:
            if channel is None:
                try:
                    channel = await layer.new_channel()
                    await layer.group_add(group, channel)
                except Exception as exc:
                    outage(CHANNEL_LAYER).failed("notification join", exc)
                    channel = None
                    yield wire.KEEPALIVE
                    await asyncio.sleep(min(backoff.next_delay(), keepalive_s))
                    continue
                if backoff.attempt:  # back after an outage: refetch what was missed
                    outage(CHANNEL_LAYER).recovered()
                    yield wire.sse_message("hello", {})
                backoff.reset()
            try:
                # asyncio.timeout: wait_for can swallow the stream's cancellation
                async with asyncio.timeout(keepalive_s):
                    message = await layer.receive(channel)
            except TimeoutError:
                yield wire.KEEPALIVE
                continue
            except Exception as exc:
                outage(CHANNEL_LAYER).failed("notification receive", exc)
                channel = None
                backoff.next_delay()  # marks the outage for the rejoin above
                continue
            yield wire.sse_message(message["event"], for_page(message["data"]))
    finally:
        if channel is not None:
            try:
                await layer.group_discard(group, channel)
            except Exception as exc:  # the membership expires on its own
                outage(CHANNEL_LAYER).failed("group discard", exc)
