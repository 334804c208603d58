"""The WebSocket transport: `/ws/runs/<id>/?after_seq=` (DESIGN §5).

Same cursor rules and reading core as the SSE view; frames are JSON
`{id, seq, event, data}`. The replay runs in a task so the consumer keeps
handling the client (and its disconnect) meanwhile.
"""

import asyncio
from urllib.parse import parse_qsl

from channels.generic.websocket import AsyncWebsocketConsumer

from journal import dbpool
from journal.cursor import cursor_from_request
from journal.subscribe import subscribe

from .access import NotFound, run_get_for_owner, user_from_token_header

# Close codes in the 4000 range mirror the HTTP statuses of the SSE view.
CLOSE_UNAUTHORISED = 4401
CLOSE_NOT_FOUND = 4404
CLOSE_GONE = 4410


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
        run_id = self.scope["url_route"]["kwargs"]["run_id"]
        run, code = await dbpool.readers.run(_authorize, self.scope, run_id)
        # Accept before refusing: a close code (unlike a bare 403) tells the
        # client why, as the SSE view's status does.
        await self.accept()
        if run is None or run.pruned_at is not None:
            await self.close(code=code or CLOSE_GONE)
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
        if run.is_terminal and cursor.after_seq >= run.last_seq:
            await self.close(code=1000)
            return
        self.pump = asyncio.create_task(self._pump(run.id, cursor.after_seq))

    async def _pump(self, run_id: str, after_seq: int) -> None:
        async for batch in subscribe(run_id, after_seq=after_seq, idle_s=3600):
            for r in batch:
                await self.send(
                    text_data=(
                        f'{{"id":"{run_id}:{r.seq}","seq":{r.seq},'
                        f'"event":"{r.type}","data":{r.payload}}}'
                    )
                )
        await self.close(code=1000)

    async def disconnect(self, code):
        if self.pump is not None:
            self.pump.cancel()
            await asyncio.gather(self.pump, return_exceptions=True)

    async def receive(self, text_data=None, bytes_data=None):
        """Clients have nothing to say on this socket; input is ignored."""
