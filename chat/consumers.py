"""The WebSocket transport: `/ws/runs/<id>/?after_seq=` (docs/architecture.md §5).

Same cursor rules and reading core as the SSE view; frames are JSON
`{id, seq, event, data}`. The replay runs in a task so the consumer keeps
handling the client (and its disconnect) meanwhile.

While the database is away a handshake is accepted and closed with 1013 (try
again later), the SSE view's 503, and the outage is logged once per process
(journal.outages): whether the consumer's own read failed or Channels'
session and auth middleware did before it (`outage_guarded`). A socket already
following a run stays open and gets `KEEPALIVE_FRAME` while the journal
cannot be read.
"""

import asyncio
import logging
from urllib.parse import parse_qsl

from channels.generic.websocket import AsyncWebsocketConsumer
from django.conf import settings

from hermes_site.backpressure import (
    CLOSE_TOO_SLOW,
    _daphne_protocol_of,
    let_websocket_close_after_flush,
    too_slow_reason,
    transport_of,
    wait_drained,
)
from journal import dbpool, wire
from journal.cursor import Verdict, cursor_from_request, decide_for_run
from journal.outages import DATABASE, DATABASE_ERRORS, outage
from journal.subscribe import subscribe_frames

from . import limits
from .access import (
    NotFound,
    credential_of_scope,
    run_get_for_owner,
    until_revoked,
    user_from_token_header,
)

log = logging.getLogger(__name__)

# Close codes in the 4000 range mirror the HTTP statuses of the SSE view.
CLOSE_UNAUTHORISED = 4401
CLOSE_NOT_FOUND = 4404
CLOSE_GONE = 4410
CLOSE_TRY_AGAIN = 1013  # the database is unavailable: reconnect shortly
# Sent every HERMES_SSE_KEEPALIVE_S of silence while the journal cannot be
# read (the SSE view's keepalive comment): no id and no seq, for clients to
# skip; a client that hears nothing for long knows the server is gone.
KEEPALIVE_FRAME = '{"event": "keepalive"}'
# Outcomes that end the socket before any frame (the SSE view's 410 and 204).
CLOSE_FOR = {Verdict.GONE: CLOSE_GONE, Verdict.DONE: 1000}


async def close_try_again(send) -> None:
    """Close an accepted socket with 1013 (RFC 6455: try again later).

    autobahn, under daphne, refuses to send any code but 1000 and 3000-4999
    (an exception, which daphne answers with 1011 and an ERROR with a
    traceback); its frame-level close sends the registered code as it is.
    """
    protocol = _daphne_protocol_of(send)
    if protocol is not None and hasattr(protocol, "sendCloseFrame"):
        protocol.sendCloseFrame(code=CLOSE_TRY_AGAIN, isReply=False)
    else:
        await send({"type": "websocket.close", "code": CLOSE_TRY_AGAIN})


CONNECTING = 1  # autobahn's WebSocketProtocol.STATE_CONNECTING


def outage_guarded(application):
    """Wrap the WebSocket stack: a database outage met before the consumer
    (Channels' session and auth middleware read the session and the user)
    is answered as the consumer answers one, 1013 after accept, and logged
    once per outage instead of an ERROR with a traceback per handshake."""

    async def guarded(scope, receive, send):
        try:
            return await application(scope, receive, send)
        except DATABASE_ERRORS as exc:
            protocol = _daphne_protocol_of(send)
            handshaking = protocol is None or protocol.state == CONNECTING
            if not dbpool.is_connection_error(exc) or not handshaking:
                raise
            outage(DATABASE).failed("websocket connect", exc)
        message = await receive()  # the handshake, not read by anyone yet
        if message.get("type") != "websocket.connect":
            return
        await send({"type": "websocket.accept"})
        await close_try_again(send)
        try:  # the client's close answers ours
            async with asyncio.timeout(GUARD_CLOSE_WAIT_S):
                while (await receive()).get("type") != "websocket.disconnect":
                    pass
        except TimeoutError:
            pass

    return guarded


GUARD_CLOSE_WAIT_S = 10.0


def _authorize(scope, run_id: str):
    user = scope.get("user")
    if user is None or not user.is_authenticated:
        headers = dict(scope.get("headers", ()))
        raw = headers.get(b"authorization", b"").decode("latin-1")
        user = user_from_token_header(raw)
        if user is None:
            return None, CLOSE_UNAUTHORISED
    try:
        return run_get_for_owner(run_id=run_id, user=user), 0
    except NotFound:
        return None, CLOSE_NOT_FOUND


class RunEventsConsumer(AsyncWebsocketConsumer):
    # This consumer reads runs through journal hubs, not a channel of its own.
    channel_layer_alias = "hermes-consumers-have-no-layer"

    async def connect(self):
        self.pump: asyncio.Task | None = None
        self.slot: limits.StreamSlot | None = None
        run_id = self.scope["url_route"]["kwargs"]["run_id"]
        try:
            run, code = await dbpool.readers.run(_authorize, self.scope, run_id)
        except DATABASE_ERRORS as exc:  # the SSE view's 503
            if not dbpool.is_connection_error(exc):
                raise
            outage(DATABASE).failed("websocket connect", exc)
            run, code = None, CLOSE_TRY_AGAIN
        # Accept before refusing: a close code (unlike a bare 403) tells the
        # client why, as the SSE view's status does.
        await self.accept()
        if run is None:
            if code == CLOSE_TRY_AGAIN:
                await close_try_again(self.base_send)
            else:
                await self.close(code=code)
            return
        headers = dict(self.scope.get("headers", ()))
        last_event_id = headers.get(b"last-event-id", b"").decode("latin-1") or None
        cursor = cursor_from_request(
            query=dict(
                parse_qsl(self.scope.get("query_string", b"").decode("latin-1"))
            ),
            last_event_id=last_event_id,
            run_id=run.id,
            last_seq=run.last_seq,
        )
        outcome = decide_for_run(run, cursor)
        if outcome.verdict in CLOSE_FOR:  # journal.cursor's outcome table
            await self.close(code=CLOSE_FOR[outcome.verdict])
            return
        self.slot = await limits.hold_ws_slot(self, run.owner_id)  # or 4429
        if self.slot is None:
            return
        self.credential = credential_of_scope(self.scope, run.owner_id)
        self.pump = asyncio.create_task(self._pump(run.id, outcome.after_seq))

    async def _pump(self, run_id: str, after_seq: int) -> None:
        # Under daphne, frames wait while this client has too much unsent
        # (hermes_site/backpressure.py); one that stays behind is closed.
        transport = transport_of(self.base_send)
        let_websocket_close_after_flush(self.base_send)  # the close waits its turn
        revoked: list[bool] = []  # ends the stream when the credential goes
        # Frames shared by every reader of the run's hub (wire.JSON_FRAMES).
        batches = subscribe_frames(
            run_id,
            wire.JSON_FRAMES,
            after_seq=after_seq,
            idle_s=settings.HERMES["SSE_KEEPALIVE_S"],
        )
        async for batch in until_revoked(batches, self.credential, revoked):
            if not batch and outage(DATABASE).down:  # the journal is unreadable
                await self.send(text_data=KEEPALIVE_FRAME)
            for frame in batch:
                await self.send(text_data=frame)
                pending = await wait_drained(transport)
                if pending:
                    reason = too_slow_reason(pending)
                    log.info("websocket closed: %s", reason)
                    await self.close(code=CLOSE_TOO_SLOW, reason=reason[:120])
                    return
        await self.close(code=CLOSE_UNAUTHORISED if revoked else 1000)

    async def disconnect(self, code):
        if self.slot is not None:
            self.slot.release()
        if self.pump is not None:
            self.pump.cancel()
            await asyncio.gather(self.pump, return_exceptions=True)

    async def receive(self, text_data=None, bytes_data=None):
        """Clients have nothing to say on this socket; input is ignored."""
