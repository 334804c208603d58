"""The parts of the OpenAPI schema that are not DRF views.

The two SSE endpoints are plain async Django views (a DRF view would hold a
thread per open stream), so drf-spectacular cannot see them; this hook
describes them. OpenAPI has no words for a WebSocket: `/ws/runs/{run_id}/`
is described in the schema's description (`WEBSOCKET_DESCRIPTION`).
"""

from typing import Any

WEBSOCKET_DESCRIPTION = """

## WebSocket: `/ws/runs/{run_id}/`

The same events as the SSE stream, one JSON text frame each:
`{"id": "<run_id>:<seq>", "seq": <seq>, "event": "<type>", "data": {…}}`.
The cursor is `?after_seq=<seq>` or `?after_event_id=<run_id>:<seq>` (or a
`Last-Event-ID` header); an unusable cursor replays from the start. Clients
send nothing. Authentication: the session cookie (browsers; the handshake's
`Origin` must be this site's, scheme and port included) or an
`Authorization: Token <key>` header. Close codes: 1000 after the run's `end`
event; 4401 not authenticated (or the credential was revoked while open);
4404 no such run of yours; 4410 the run's events were pruned.
"""

_AUTH: list[dict[str, list[str]]] = [{"cookieAuth": []}, {"tokenAuth": []}]
_ERROR = {
    "content": {
        "application/json": {
            "schema": {
                "type": "object",
                "properties": {"error": {"type": "string"}},
                "required": ["error"],
            }
        }
    }
}
_SSE = {
    "content": {
        "text/event-stream": {
            "schema": {
                "type": "string",
                "description": "`id: <run_id>:<seq>`, `event: <type>`, "
                "`data: <json>` frames; `: keepalive` comments",
            }
        }
    }
}


def _run_events() -> dict[str, Any]:
    return {
        "get": {
            "operationId": "api_runs_events_stream",
            "summary": "Follow a run's events (Server-Sent Events)",
            "description": (
                "Replays the run's journal after the cursor, then follows it "
                "live, with no gap and no duplicate; the stream ends after the "
                "`end` event. Query parameters win over `Last-Event-ID`; a "
                "cursor that cannot be used replays from the start."
            ),
            "tags": ["api"],
            "security": _AUTH,
            "parameters": [
                {
                    "name": "run_id",
                    "in": "path",
                    "required": True,
                    "schema": {"type": "string"},
                },
                {"name": "after_seq", "in": "query", "schema": {"type": "integer"}},
                {
                    "name": "after_event_id",
                    "in": "query",
                    "schema": {"type": "string"},
                    "description": "`<run_id>:<seq>`",
                },
                {
                    "name": "Last-Event-ID",
                    "in": "header",
                    "schema": {"type": "string"},
                    "description": "sent by EventSource on reconnect",
                },
            ],
            "responses": {
                "200": {"description": "the event stream", **_SSE},
                "204": {"description": "the cursor is at a finished run's end"},
                "401": {"description": "not authenticated", **_ERROR},
                "404": {"description": "no such run of yours", **_ERROR},
                "410": {"description": "the run's events were pruned", **_ERROR},
            },
        }
    }


def _user_stream() -> dict[str, Any]:
    return {
        "get": {
            "operationId": "api_stream",
            "summary": "The user's notifications (Server-Sent Events)",
            "description": (
                "`session` and `run` events (created, updated, deleted, run "
                "started and finished) for every tab of the user; not journaled, "
                "a reconnecting client refetches the session list. Each `data` "
                "has `action` and `session_id`; a run's also `run_id`, and a "
                "finished run's `status` and `subject` (`chat.session:<id>`)."
            ),
            "tags": ["api"],
            "security": _AUTH,
            "responses": {
                "200": {"description": "the event stream", **_SSE},
                "401": {"description": "not authenticated", **_ERROR},
            },
        }
    }


def add_stream_endpoints(result, generator, request, public):
    """drf-spectacular postprocessing hook: the SSE paths and the WebSocket."""
    result.setdefault("paths", {})
    result["paths"]["/api/runs/{run_id}/events/"] = _run_events()
    result["paths"]["/api/stream/"] = _user_stream()
    return result
