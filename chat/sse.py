"""The SSE transport: `GET /api/runs/<id>/events/` (DESIGN §5).

Parses, authorises and serialises; reading is `journal.subscribe`. Database
work goes through the shared pool so a streaming request holds no connection.
"""

import asyncio
import json

from channels.layers import get_channel_layer
from django.conf import settings
from django.http import HttpResponse, JsonResponse, StreamingHttpResponse
from django.urls import reverse

from journal import dbpool
from journal.cursor import cursor_from_request
from journal.publish import owner_group
from journal.subscribe import subscribe

from .access import NotFound, run_get_for_owner, user_from_request


def _authorize(request, run_id: str):
    user = user_from_request(request)
    if not user.is_authenticated:
        return None, JsonResponse({"error": "authentication required"}, status=401)
    try:
        return run_get_for_owner(run_id=run_id, user=user), None
    except NotFound:
        return None, JsonResponse({"error": f"no run {run_id}"}, status=404)


def pruned_response(run) -> JsonResponse:
    return JsonResponse(
        {
            "error": "this run's events were pruned by retention",
            "run_id": run.id,
            "session_id": run.session_id,
            "transcript_url": (
                reverse("api-session-messages", args=[run.session_id])
                if run.session_id
                else None
            ),
        },
        status=410,
    )


async def run_events(request, run_id: str):
    run, error = await dbpool.readers.run(_authorize, request, run_id)
    if error is not None:
        return error
    if run.pruned_at is not None:
        return pruned_response(run)
    cursor = cursor_from_request(
        query=request.GET,
        last_event_id=request.headers.get("Last-Event-ID"),
        run_id=run.id,
        last_seq=run.last_seq,
    )
    if run.is_terminal and cursor.after_seq >= run.last_seq:
        return HttpResponse(status=204)  # stops EventSource from retrying
    response = StreamingHttpResponse(
        _frames(run.id, cursor.after_seq, cursor.unusable_reason),
        content_type="text/event-stream",
    )
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"  # no proxy buffering of a live stream
    return response


async def _frames(run_id: str, after_seq: int, unusable_reason: str):
    hermes = settings.HERMES
    head = f"retry: {hermes['SSE_RETRY_MS']}\n\n"
    if unusable_reason:
        head += f": cursor unusable ({unusable_reason}); replaying from the start\n\n"
    yield head
    async for batch in subscribe(
        run_id, after_seq=after_seq, idle_s=hermes["SSE_KEEPALIVE_S"]
    ):
        if not batch:
            yield ": keepalive\n\n"
            continue
        yield "".join(
            f"id: {run_id}:{r.seq}\nevent: {r.type}\ndata: {r.payload}\n\n"
            for r in batch
        )


def _authenticated_user_id(request) -> int | None:
    user = user_from_request(request)
    return user.pk if user.is_authenticated else None


async def user_stream(request):
    """`GET /api/stream/`: the user's notifications (sessions, run start/finish).

    Not journaled: a tab that reconnects refetches the session list instead.
    """
    user_id = await dbpool.readers.run(_authenticated_user_id, request)
    if user_id is None:
        return JsonResponse({"error": "authentication required"}, status=401)
    response = StreamingHttpResponse(
        _notifications(user_id), content_type="text/event-stream"
    )
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"
    return response


async def _notifications(user_id: int):
    hermes = settings.HERMES
    layer = get_channel_layer()
    channel = await layer.new_channel()
    group = owner_group(user_id)
    await layer.group_add(group, channel)
    try:
        yield f"retry: {hermes['SSE_RETRY_MS']}\n\nevent: hello\ndata: {{}}\n\n"
        while True:
            try:
                message = await asyncio.wait_for(
                    layer.receive(channel), hermes["SSE_KEEPALIVE_S"]
                )
            except TimeoutError:
                yield ": keepalive\n\n"
                continue
            yield f"event: {message['event']}\ndata: {json.dumps(message['data'])}\n\n"
    finally:
        await layer.group_discard(group, channel)
