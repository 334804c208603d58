"""Response shapes of the API, for the OpenAPI schema (`/api/schema/`).

The views answer plain dicts; these serializers only describe them, so
`/api/docs/` and clients generated from the schema know every field.
"""

from drf_spectacular.utils import inline_serializer
from rest_framework import serializers

ERROR = inline_serializer(
    "Error",
    {
        "error": serializers.CharField(help_text="what was wrong, in words"),
    },
)

RUN_CONFLICT = inline_serializer(
    "RunConflict",
    {
        "error": serializers.CharField(),
        "run_id": serializers.CharField(help_text="the session's active run"),
    },
)

RUN_STARTED = inline_serializer(
    "RunStarted",
    {
        "run_id": serializers.CharField(),
        "stream_url": serializers.CharField(help_text="SSE of the run's events"),
        "status_url": serializers.CharField(),
    },
)


ACTIVE_BRANCH = inline_serializer(
    "ActiveBranch",
    {
        "session_id": serializers.IntegerField(),
        "active": serializers.ListField(
            child=serializers.IntegerField(),
            help_text="the active branch's message ids, first to last",
        ),
    },
)


RUN_SUMMARY = inline_serializer(
    "RunSummary",
    {
        "id": serializers.CharField(),
        "session_id": serializers.IntegerField(allow_null=True),
        "status": serializers.ChoiceField(
            [
                "queued",
                "running",
                "waiting",
                "completed",
                "failed",
                "cancelled",
                "interrupted",
            ]
        ),
        "pending_approval": serializers.DictField(
            allow_null=True,
            help_text="the tool call waiting for a decision: tool_call_id, name, "
            "args, expires_at (null unless the run is waiting)",
        ),
        "terminal": serializers.BooleanField(),
        "terminal_state": serializers.CharField(),
        "last_seq": serializers.IntegerField(),
        "last_event_id": serializers.CharField(allow_null=True),
        "replay_available": serializers.BooleanField(),
        "worker_alive": serializers.BooleanField(),
        "model": serializers.CharField(),
        "provider": serializers.CharField(),
        "usage": serializers.DictField(),
        "diagnostics": serializers.DictField(),
        "error": inline_serializer(
            "RunError",
            {
                "category": serializers.CharField(),
                "message": serializers.CharField(
                    help_text="the provider's message, secrets redacted, "
                    "at most 500 characters"
                ),
            },
            allow_null=True,
        ),
    },
)

RUN_CANCELLED = inline_serializer(
    "RunCancelRequested",
    {
        "run_id": serializers.CharField(),
        "cancel_requested": serializers.BooleanField(),
    },
)

APPROVAL_DECISION = inline_serializer(
    "ApprovalDecision",
    {
        "decision": serializers.ChoiceField(
            ["approve", "deny", "always"],
            help_text="`always`: approve, and let this tool run unasked in the "
            "run's session from now on",
        ),
        "note": serializers.CharField(
            required=False, help_text="optional, shown to the model with a denial"
        ),
    },
)

APPROVAL_DECIDED = inline_serializer(
    "ApprovalDecided",
    {
        "run_id": serializers.CharField(),
        "tool_call_id": serializers.CharField(),
        "name": serializers.CharField(),
        "decision": serializers.ChoiceField(["approve", "deny"]),
        "note": serializers.CharField(required=False),
        "always": serializers.BooleanField(required=False),
    },
)

PENDING_MESSAGE = inline_serializer(
    "PendingMessage",
    {
        "id": serializers.IntegerField(),
        "kind": serializers.ChoiceField(
            ["queue", "steer"],
            help_text="`queue`: the next turn, when the active run ends; "
            "`steer`: into the active run, at its next model-call boundary",
        ),
        "state": serializers.ChoiceField(
            ["pending", "started", "landed", "cancelled"],
            help_text="`started`: a queued message became a run "
            "(`delivered_run_id`); `landed`: a steer was journaled in its run",
        ),
        "content": serializers.CharField(),
        "run_id": serializers.CharField(
            allow_null=True, help_text="a steer: the run it steers"
        ),
        "delivered_run_id": serializers.CharField(allow_null=True),
        "created_at": serializers.DateTimeField(),
    },
)

PENDING_LIST = inline_serializer(
    "PendingMessages",
    {"results": serializers.ListField(child=PENDING_MESSAGE)},
)

PENDING_CREATE = inline_serializer(
    "PendingMessageCreate",
    {
        "content": serializers.CharField(help_text="the message, not blank"),
        "kind": serializers.ChoiceField(
            ["queue", "steer"], required=False, help_text="default `queue`"
        ),
        "run_id": serializers.CharField(
            required=False,
            help_text="the run you mean (optional): 409 unless it is still the "
            "session's active run",
        ),
        "model": serializers.CharField(
            required=False, help_text="a queued message's model"
        ),
    },
)

EVENTS = inline_serializer(
    "RunEvent",
    {
        "id": serializers.CharField(help_text="`<run_id>:<seq>`"),
        "seq": serializers.IntegerField(),
        "event": serializers.CharField(
            help_text="start, token, reasoning, tool, tool_complete, "
            "approval_request, approval, steer, status, upstream, usage, error, end"
        ),
        "data": serializers.DictField(),
    },
    many=True,
)

EVENTS_PAGE = inline_serializer(
    "RunEventsPage",
    {
        "run_id": serializers.CharField(),
        "status": serializers.CharField(),
        "last_seq": serializers.IntegerField(),
        "events": EVENTS,
        "next_after_seq": serializers.IntegerField(allow_null=True),
    },
)

MODELS = inline_serializer(
    "ModelChoices",
    {
        "models": inline_serializer(
            "ModelChoice",
            {
                "id": serializers.CharField(),
                "provider": serializers.CharField(),
                "kind": serializers.CharField(
                    help_text="the API it speaks: demo, openai, anthropic, responses"
                ),
                "vision": serializers.BooleanField(
                    help_text="whether it takes images (attachments)"
                ),
            },
            many=True,
        ),
        "default": serializers.CharField(),
    },
)


SESSION_IMPORTED = inline_serializer(
    "SessionImported",
    {
        "session": serializers.DictField(help_text="the new session, as listed"),
        "messages": serializers.IntegerField(help_text="messages imported"),
    },
)
