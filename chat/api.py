"""The REST API: sessions, messages, runs, cancel, status, events.json.
See docs/architecture.md §5.

Every view reaches its object through `chat.access`, so another user's run or
session answers 404. Bad input answers a 4xx JSON error naming the problem.
"""

import re

from django.conf import settings
from django.db.models import OuterRef, Prefetch, Subquery
from django.urls import reverse
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import generics, serializers, status
from rest_framework.exceptions import NotFound as HttpNotFound
from rest_framework.exceptions import ValidationError
from rest_framework.pagination import CursorPagination
from rest_framework.response import Response
from rest_framework.views import APIView

from journal import wire
from journal.cursor import Cursor, Verdict, decide_for_run
from journal.models import Run
from journal.store import read_after, run_summary

from . import api_schema, limits, pending, snapshot
from .access import NotFound, run_get_for_owner, session_get_for_owner
from .approvals import NotShown, NotWaiting, approval_decide, approval_pending
from .attachments import AttachmentRefused, has_images, pending_for
from .attachments import info as attachment_info
from .models import Attachment, ChatSession, Message, Turn, turn_of
from .providers import registry as providers
from .services import (
    IdempotencyMismatch,
    RetryRefused,
    RunConflict,
    idempotency_hash,
    run_cancel,
    run_start,
    session_create,
    session_delete,
    session_update,
)
from .sse import pruned_response
from .tree import Tree, branch_last_run, ids_in, message_select

IDEMPOTENCY_KEY_MAX = 200  # chat.Turn.idempotency_key's max_length
MESSAGE_ID_MAX = 2**63 - 1  # a BigAutoField; larger ids fail in the database
MESSAGE_POSITION = re.compile(r"[0-9]{1,18}")  # a BigAutoField id, ASCII digits


def _run_for(request, run_id: str) -> Run:
    try:
        return run_get_for_owner(run_id=run_id, user=request.user)
    except NotFound as exc:
        raise HttpNotFound(str(exc)) from None


def turn_summary(run: Run) -> dict:
    """The status document of `GET /api/runs/<id>/`: the journal's summary of
    the run and what the run means to chat (session, model, usage, …)."""
    summary = run_summary(run=run)
    turn = turn_of(run)
    summary.pop("subject")
    summary.update(
        session_id=turn.session_id if turn else None,
        model=turn.model if turn else "",
        provider=turn.provider if turn else "",
        usage=turn.usage if turn else {},
        diagnostics=turn.diagnostics if turn else {},
        pending_approval=(
            approval_pending(run_id=run.id)
            if run.status == Run.Status.WAITING
            else None
        ),
    )
    return summary


def _session_for(request, session_id) -> ChatSession:
    try:
        return session_get_for_owner(session_id=session_id, user=request.user)
    except NotFound as exc:
        raise HttpNotFound(str(exc)) from None


class SessionSerializer(serializers.ModelSerializer):
    # The queued or running run, if any: every tab's "running" mark on first load.
    active_run_id = serializers.SerializerMethodField()

    class Meta:
        model = ChatSession
        fields = [
            "id",
            "title",
            "model",
            "system_prompt",
            "archived",
            "pinned",
            "created_at",
            "updated_at",
            "active_run_id",
        ]
        read_only_fields = ["id", "created_at", "updated_at"]

    def get_active_run_id(self, session) -> str | None:
        return getattr(session, "active_run_id", None)

    def validate_model(self, value: str) -> str:
        if value and not providers.is_known_model(value):
            raise ValidationError(f"unknown model {value!r}")
        return value

    def validate_system_prompt(self, value: str) -> str:
        # Sent with every turn, so bounded like a message.
        limit = settings.HERMES["MAX_MESSAGE_CHARS"]
        if len(value) > limit:
            raise ValidationError(f"system prompt is longer than {limit} characters")
        return value


class MessageSerializer(serializers.ModelSerializer):
    """A message and its place in the session's tree (`chat.tree`): the
    context's `tree` is read once per page."""

    sibling_index = serializers.SerializerMethodField(
        help_text="1-based position among the versions beside it (its "
        "parent's children, oldest first)"
    )
    siblings = serializers.SerializerMethodField(
        help_text="how many versions there are (1: no other branch)"
    )
    sibling_ids = serializers.SerializerMethodField(
        help_text="the ids of its versions, itself included, oldest first"
    )
    active = serializers.SerializerMethodField(
        help_text="whether it is on the session's active branch"
    )
    attachments = serializers.SerializerMethodField(
        help_text="files sent with it (`GET /api/attachments/<id>/`): id, "
        "name, kind (`text` or `image`), mime, size and the `url` of its bytes"
    )

    class Meta:
        model = Message
        fields = [
            "id",
            "role",
            "content",
            "reasoning",
            "tool_calls",
            "tool_call_id",
            "run",
            "complete",
            "steer",
            "created_at",
            "parent",
            "sibling_index",
            "siblings",
            "sibling_ids",
            "active",
            "attachments",
        ]

    def _tree(self, message) -> Tree:
        tree = self.context.get("tree")
        if tree is None:
            tree = self.context["tree"] = Tree.of_session(message.session_id)
        return tree

    def get_sibling_index(self, message) -> int:
        return self._tree(message).siblings(message.pk)[0]

    def get_siblings(self, message) -> int:
        return self._tree(message).siblings(message.pk)[1]

    def get_sibling_ids(self, message) -> list[int]:
        return self._tree(message).versions(message.pk)

    def get_attachments(self, message) -> list[dict]:
        return [attachment_info(a) for a in message.attachments.all()]

    def get_active(self, message) -> bool:
        active = self.context.get("active")
        if active is None:
            active = self.context["active"] = set(self._tree(message).active_path())
        return message.pk in active


class SessionList(generics.ListCreateAPIView):
    serializer_class = SessionSerializer

    def get_queryset(self):
        active = Run.objects.filter(turn__session=OuterRef("pk"), status__in=Run.ACTIVE)
        queryset = ChatSession.objects.filter(
            owner=self.request.user, archived=False
        ).annotate(active_run_id=Subquery(active.values("id")[:1]))
        queryset = queryset.order_by("-pinned", "-updated_at")
        query = self.request.query_params.get("q", "").strip()
        if query:
            queryset = queryset.filter(title__icontains=query)
        return queryset

    def perform_create(self, serializer):
        limits.check_session_count(user=self.request.user)  # or 429
        data = serializer.validated_data
        serializer.instance = session_create(owner=self.request.user, **data)


class SessionDetail(generics.RetrieveUpdateDestroyAPIView):
    serializer_class = SessionSerializer

    def get_object(self):
        return _session_for(self.request, self.kwargs["session_id"])

    def perform_update(self, serializer):
        serializer.instance = session_update(
            session=serializer.instance, **serializer.validated_data
        )

    def perform_destroy(self, instance):
        session_delete(session=instance)

    def retrieve(self, request, *args, **kwargs):
        session = self.get_object()
        # The active branch's newest run, ended or not: what Retry (`retry_of`)
        # may name, even when it left no message to find it by.
        last_run_id = branch_last_run(session_id=session.pk)
        return Response(
            {
                **self.get_serializer(session).data,
                **snapshot.session_live(session),
                "last_run_id": last_run_id,
                "pending_messages": pending.pending_of(session_id=session.pk),
            }
        )


class MessagePagination(CursorPagination):
    page_size = 100
    ordering = "id"

    def decode_cursor(self, request):
        """DRF's cursor, whose position (a message id) must be a plain integer.

        DRF passes the position to the query as it comes; a forged cursor with
        `p=abc` (or 30 digits) would fail in the database instead of here.
        """
        cursor = super().decode_cursor(request)
        if cursor is not None and cursor.position is not None:
            if not MESSAGE_POSITION.fullmatch(cursor.position):
                raise HttpNotFound(self.invalid_cursor_message)
        return cursor

    def get_paginated_response_schema(self, schema):
        paginated = super().get_paginated_response_schema(schema)
        paginated["properties"]["runs"] = {
            "type": "object",
            "additionalProperties": {"type": "object"},
            "description": "the status document (as `GET /api/runs/<id>/`) of "
            "each run whose messages are on this page, by run id",
        }
        return paginated


@extend_schema(
    parameters=[
        OpenApiParameter(
            "branch",
            str,
            enum=["all", "active"],
            required=False,
            description="`active`: only the messages of the active branch; "
            "`all` (default): every version of every message",
        )
    ]
)
class SessionMessages(generics.ListAPIView):
    serializer_class = MessageSerializer
    pagination_class = MessagePagination

    def get_queryset(self):
        session = _session_for(self.request, self.kwargs["session_id"])
        branch = self.request.query_params.get("branch", "all")
        if branch not in ("all", "active"):
            raise ValidationError({"branch": "must be `all` or `active`"})
        self.tree = Tree.of_session(session.pk)
        files = Prefetch("attachments", queryset=Attachment.objects.defer("data"))
        messages = session.messages.prefetch_related(files)
        if branch == "active":
            # One parameter however long the branch (`chat.tree.ids_in`).
            return messages.filter(pk__in=ids_in(self.tree.active_path()))
        return messages.all()

    def get_serializer_context(self):
        context = super().get_serializer_context()
        tree = getattr(self, "tree", None)
        if tree is not None:
            context["tree"] = tree
        return context

    def list(self, request, *args, **kwargs):
        """A page of messages, with the status of each run they belong to: a
        reloaded page gives every answer its footer (outcome, model, usage,
        tokens/s) without a request per run."""
        response = super().list(request, *args, **kwargs)
        ids = {m["run"] for m in response.data["results"] if m["run"]}
        runs = Run.objects.filter(id__in=ids).select_related("turn")
        response.data["runs"] = {run.id: turn_summary(run) for run in runs}
        return response


class MessageSelect(APIView):
    @extend_schema(
        summary="Make the branch through a message the active one",
        description=(
            "Shows (and sends to the model next) the version of the "
            "conversation that passes through this message: it and its "
            "ancestors become the selected children of their parents; below "
            "it, the versions selected last stay. Answers the new active "
            "branch's message ids, first to last."
        ),
        request=None,
        responses={200: api_schema.ACTIVE_BRANCH, 404: api_schema.ERROR},
    )
    def post(self, request, session_id, message_id):
        session = _session_for(request, session_id)
        message = (
            session.messages.filter(pk=message_id).first()
            if MESSAGE_POSITION.fullmatch(str(message_id))
            else None
        )
        if message is None:
            raise HttpNotFound(f"no message {message_id} in this session")
        path = message_select(message=message)
        return Response({"session_id": session.pk, "active": path})


class ModelList(APIView):
    @extend_schema(responses={200: api_schema.MODELS})
    def get(self, request):
        return Response(
            {
                "models": providers.model_choices(),
                "default": providers.default_model(),
                # Per provider: whether its `GET /models` works ("failing": the
                # last good list is served; docs/operating.md).
                "providers": providers.listing_status(),
            }
        )


class RunCreateSerializer(serializers.Serializer):
    content = serializers.CharField(
        required=False,
        allow_blank=True,
        trim_whitespace=False,
        help_text="the user's next message (or give `retry_of`); may be "
        "empty when it has `attachments`",
    )
    attachments = serializers.ListField(
        child=serializers.IntegerField(min_value=1, max_value=MESSAGE_ID_MAX),
        required=False,
        help_text=(
            "with `content`: ids of the caller's uploads (`POST "
            "/api/attachments/`) sent with it, at most "
            "`HERMES_ATTACHMENT_MAX_FILES`; images only to a model that takes "
            "them (`vision` in `GET /api/models/`)"
        ),
    )
    retry_of = serializers.CharField(
        required=False,
        max_length=40,
        help_text=(
            "instead of `content`: the id of the active branch's latest run, whose "
            "question is answered again by a new run (no second copy of it)"
        ),
    )
    regenerate = serializers.IntegerField(
        required=False,
        min_value=1,
        max_value=MESSAGE_ID_MAX,
        help_text=(
            "instead of `content`: the id of a user message of this session, "
            "answered again by a new run; its answer is a new branch beside "
            "the earlier ones"
        ),
    )
    edit_of = serializers.IntegerField(
        required=False,
        min_value=1,
        max_value=MESSAGE_ID_MAX,
        help_text=(
            "with `content`: the id of a user message this one replaces; it "
            "becomes a new branch beside it (the earlier version is kept)"
        ),
    )
    model = serializers.CharField(required=False, allow_blank=True)

    def validate(self, attrs: dict) -> dict:
        if "edit_of" in attrs and "content" not in attrs:
            raise ValidationError("`edit_of` needs `content`, the edited message")
        if attrs.get("attachments") and ("retry_of" in attrs or "regenerate" in attrs):
            raise ValidationError(
                {"attachments": ["go with `content` (a new or edited message)"]}
            )
        if attrs.get("attachments") and "content" not in attrs:
            attrs["content"] = ""  # files alone are a message too
        if "content" in attrs and not attrs["content"].strip():
            if not attrs.get("attachments"):
                raise ValidationError({"content": ["message is empty"]})
        given = [
            name for name in ("content", "retry_of", "regenerate") if name in attrs
        ]
        if len(given) != 1:
            raise ValidationError(
                "give either `content` or `retry_of` or `regenerate`, one of them"
            )
        return attrs

    def validate_content(self, value: str) -> str:
        limit = settings.HERMES["MAX_MESSAGE_CHARS"]
        if len(value) > limit:
            raise ValidationError(f"message is longer than {limit} characters")
        return value

    def validate_model(self, value: str) -> str:
        if value and not providers.is_known_model(value):
            raise ValidationError(f"unknown model {value!r}")
        return value


class SessionRuns(APIView):
    @extend_schema(
        summary="Start a run: the model's next turn in this session",
        description=(
            "Queues a run and answers at once; follow it on `stream_url` (SSE), "
            "`/ws/runs/{run_id}/` (WebSocket) or `status_url`. The body is "
            "`{content}` (a new user message) or `{retry_of: <run_id>}` (Retry: a "
            "new run answers the question of the active branch's latest run again, "
            "without a second copy of it; 400 if that run is not this session's, "
            "409 if it is not the latest or still active), or `{regenerate: "
            "<message_id>}` (a new answer to that user message, beside the "
            "earlier ones), or `{content, edit_of: <message_id>}` (an edited "
            "question beside that user message, then its answer). 400 if the "
            "message is not a user message of this session. A retry with the "
            "same `Idempotency-Key` and the same body gets the same run (200); "
            "the key used for another body or session answers 422."
        ),
        request=RunCreateSerializer,
        parameters=[
            OpenApiParameter(
                "Idempotency-Key",
                location="header",
                required=False,
                description="at most 200 characters; bound to session and body",
            )
        ],
        responses={
            201: api_schema.RUN_STARTED,
            200: api_schema.RUN_STARTED,
            400: api_schema.ERROR,
            404: api_schema.ERROR,
            409: api_schema.RUN_CONFLICT,
            422: api_schema.ERROR,
        },
    )
    def post(self, request, session_id):
        session = _session_for(request, session_id)
        limits.check_run_rate(user=request.user)  # or 429
        body = RunCreateSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        model = (
            body.validated_data.get("model")
            or session.model
            or providers.default_model()
        )
        key = request.headers.get("Idempotency-Key", "").strip()
        if len(key) > IDEMPOTENCY_KEY_MAX:
            raise ValidationError(
                {
                    "Idempotency-Key": f"longer than {IDEMPOTENCY_KEY_MAX} characters"
                    f" ({len(key)})"
                }
            )
        ids = body.validated_data.get("attachments") or []
        replay = (
            bool(key)
            and Turn.objects.filter(owner=request.user, idempotency_key=key).exists()
        )  # its files were taken by the run it answers with
        if ids and not replay:
            try:
                files = pending_for(owner=request.user, ids=ids)
            except AttachmentRefused as exc:
                return Response(exc.body(), status=exc.status)
            if has_images(files) and not providers.takes_images(model):
                names = ", ".join(f.name for f in files if f.kind == "image")
                return Response(
                    {
                        "error": f"model {model!r} does not take images ({names});"
                        " choose a model that does, or send text files only",
                        "limit": "vision",
                    },
                    status=status.HTTP_400_BAD_REQUEST,
                )
        try:
            run, created = run_start(
                session=session,
                content=body.validated_data.get("content", ""),
                retry_of=body.validated_data.get("retry_of", ""),
                regenerate=body.validated_data.get("regenerate"),
                edit_of=body.validated_data.get("edit_of"),
                attachments=ids,
                model=model,
                provider=providers.provider_name_for(model),
                idempotency_key=key,
                idempotency_hash=idempotency_hash(
                    session_id=session.pk, body=body.validated_data
                ),
            )
        except RunConflict as exc:
            return Response(
                {"error": str(exc), "run_id": exc.run_id},
                status=status.HTTP_409_CONFLICT,
            )
        except RetryRefused as exc:
            return Response({"error": str(exc)}, status=exc.status)
        except IdempotencyMismatch as exc:
            return Response(
                {"error": str(exc), "idempotency_key": key},
                status=status.HTTP_422_UNPROCESSABLE_ENTITY,
            )
        return Response(
            {
                "run_id": run.id,
                "stream_url": reverse("api-run-events", args=[run.id]),
                "status_url": reverse("api-run", args=[run.id]),
            },
            status=status.HTTP_201_CREATED if created else status.HTTP_200_OK,
        )


class PendingCreateSerializer(serializers.Serializer):
    content = serializers.CharField(allow_blank=False, trim_whitespace=False)
    kind = serializers.ChoiceField(["queue", "steer"], default="queue")
    run_id = serializers.CharField(required=False, max_length=40)
    model = serializers.CharField(required=False, allow_blank=True)

    validate_model = RunCreateSerializer.validate_model

    def validate_content(self, value: str) -> str:
        if not value.strip():
            raise ValidationError("message is empty")
        limit = settings.HERMES["MAX_MESSAGE_CHARS"]
        if len(value) > limit:
            raise ValidationError(f"message is longer than {limit} characters")
        return value


class SessionPending(APIView):
    @extend_schema(
        summary="The session's pending messages (queued, or steers not landed)",
        responses={200: api_schema.PENDING_LIST, 404: api_schema.ERROR},
    )
    def get(self, request, session_id):
        session = _session_for(request, session_id)
        return Response({"results": pending.pending_of(session_id=session.pk)})

    @extend_schema(
        summary="Queue a message for the next turn, or steer the running one",
        description=(
            "Only while the session has an active run (409 otherwise: start a "
            "run instead). `kind: queue` (default): the message starts the "
            "session's next turn when the active run ends, however it ends "
            "(completed, failed, stopped); several start one after another, "
            "oldest first. `kind: steer`: the message is sent to the running "
            "turn at its next model-call boundary (after the tool step in "
            "progress), journaled there as a `steer` event; if the run ends "
            "first, it is queued instead. Both can be cancelled until then."
        ),
        request=api_schema.PENDING_CREATE,
        responses={
            201: api_schema.PENDING_MESSAGE,
            400: api_schema.ERROR,
            404: api_schema.ERROR,
            409: api_schema.ERROR,
            429: api_schema.ERROR,
        },
    )
    def post(self, request, session_id):
        session = _session_for(request, session_id)
        body = PendingCreateSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        model = data.get("model") or session.model or providers.default_model()
        try:
            item = pending.pending_add(
                session=session,
                kind=data["kind"],
                content=data["content"],
                model=model,
                provider=providers.provider_name_for(model),
                run_id=data.get("run_id", ""),
            )
        except pending.NoActiveRun:
            return Response(
                {"error": "no run in progress to queue behind or steer"},
                status=status.HTTP_409_CONFLICT,
            )
        except pending.TooManyPending:
            raise limits.LimitExceeded(
                "pending",
                f"this chat already has {pending.MAX_PENDING} pending messages",
                retry_after=5,
            ) from None
        return Response(pending.as_json(item), status=status.HTTP_201_CREATED)


class PendingDetail(APIView):
    @extend_schema(
        summary="Cancel a pending message",
        description="204 once cancelled; 409 if it already started or landed.",
        request=None,
        responses={204: None, 404: api_schema.ERROR, 409: api_schema.ERROR},
    )
    def delete(self, request, session_id, pending_id):
        session = _session_for(request, session_id)
        if not MESSAGE_POSITION.fullmatch(str(pending_id)):
            raise HttpNotFound(f"no pending message {pending_id}")
        try:
            pending.pending_cancel(session=session, pending_id=int(pending_id))
        except pending.PendingMessage.DoesNotExist:
            raise HttpNotFound(f"no pending message {pending_id}") from None
        except pending.NotPending as exc:
            return Response(
                {"error": str(exc), "state": exc.state},
                status=status.HTTP_409_CONFLICT,
            )
        return Response(status=status.HTTP_204_NO_CONTENT)


class RunDetail(APIView):
    @extend_schema(
        summary="A run's status, usage and diagnostics",
        responses={200: api_schema.RUN_SUMMARY, 404: api_schema.ERROR},
    )
    def get(self, request, run_id):
        return Response(turn_summary(_run_for(request, run_id)))


class RunCancel(APIView):
    @extend_schema(
        summary="Ask a run to stop",
        request=None,
        responses={
            202: api_schema.RUN_CANCELLED,
            404: api_schema.ERROR,
            409: api_schema.ERROR,
        },
    )
    def post(self, request, run_id):
        run = _run_for(request, run_id)
        if run.is_terminal:
            return Response(
                {"error": f"run already ended ({run.status})", **turn_summary(run)},
                status=status.HTTP_409_CONFLICT,
            )
        run_cancel(run=run)
        return Response({"run_id": run.id, "cancel_requested": True}, status=202)


class RunApproval(APIView):
    @extend_schema(
        summary="Approve or deny the tool call a run waits for",
        request=api_schema.APPROVAL_DECISION,
        responses={
            202: api_schema.APPROVAL_DECIDED,
            400: api_schema.ERROR,
            404: api_schema.ERROR,
            409: api_schema.ERROR,
        },
    )
    def post(self, request, run_id):
        run = _run_for(request, run_id)
        body = request.data if isinstance(request.data, dict) else {}
        decision, note = body.get("decision"), body.get("note", "")
        shown = body.get("tool_call_id")  # the call the person was shown, if named
        if decision not in ("approve", "deny", "always"):
            return Response(
                {"error": "decision must be 'approve', 'deny' or 'always'"},
                status=status.HTTP_400_BAD_REQUEST,
            )
        if not isinstance(note, str) or "\x00" in note:
            return Response(
                {"error": "note must be text"}, status=status.HTTP_400_BAD_REQUEST
            )
        if shown is not None and not isinstance(shown, str):
            return Response(
                {"error": "tool_call_id must be text"},
                status=status.HTTP_400_BAD_REQUEST,
            )
        try:
            decided = approval_decide(
                run=run,
                approve=decision != "deny",
                note=note.strip(),
                always=decision == "always",
                tool_call_id=shown,
            )
        except NotShown:
            return Response(
                {"error": "the run waits for a decision on another tool call"},
                status=status.HTTP_409_CONFLICT,
            )
        except NotWaiting:
            return Response(
                {"error": "the run is not waiting for an approval"},
                status=status.HTTP_409_CONFLICT,
            )
        return Response({"run_id": run.id, **decided}, status=202)


class RunEventsJson(APIView):
    @extend_schema(
        summary="A page of a run's journal, as JSON",
        parameters=[
            OpenApiParameter("after_seq", int, required=False),
            OpenApiParameter("limit", int, required=False),
        ],
        responses={
            200: api_schema.EVENTS_PAGE,
            400: api_schema.ERROR,
            404: api_schema.ERROR,
            410: api_schema.ERROR,
        },
    )
    def get(self, request, run_id):
        run = _run_for(request, run_id)
        try:
            params = wire.parse_page_params(request.query_params)
        except wire.BadPageParam as exc:
            return Response(exc.body(), status=status.HTTP_400_BAD_REQUEST)
        # A page past a finished run's end is an empty page, not a 204.
        outcome = decide_for_run(run, Cursor(params.after_seq))
        if outcome.verdict is Verdict.GONE:
            return pruned_response(run)
        records = read_after(
            run_id=run.id, after_seq=params.after_seq, limit=params.limit
        )
        return Response(
            wire.page(
                run_id=run.id,
                status=run.status,
                last_seq=run.last_seq,
                records=records,
                limit=params.limit,
            )
        )
