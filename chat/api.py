"""The REST API (DESIGN §5): sessions, messages, runs, cancel, status, events.json.

Every view reaches its object through `chat.access`, so another user's run or
session answers 404. Bad input answers a 4xx JSON error naming the problem.
"""

import json

from django.conf import settings
from django.db.models import OuterRef, Subquery
from django.urls import reverse
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import generics, serializers, status
from rest_framework.exceptions import NotFound as HttpNotFound
from rest_framework.exceptions import ValidationError
from rest_framework.pagination import CursorPagination
from rest_framework.response import Response
from rest_framework.views import APIView

from journal.models import Run
from journal.store import read_after, run_summary

from . import snapshot
from .access import NotFound, run_get_for_owner, session_get_for_owner
from .models import ChatSession, Message
from .providers import registry as providers
from .services import (
    RunConflict,
    run_cancel,
    run_start,
    session_create,
    session_delete,
    session_update,
)
from .sse import pruned_response

EVENTS_PAGE_MAX = 5000


def _run_for(request, run_id: str) -> Run:
    try:
        return run_get_for_owner(run_id=run_id, user=request.user)
    except NotFound as exc:
        raise HttpNotFound(str(exc)) from None


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


class MessageSerializer(serializers.ModelSerializer):
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
            "created_at",
        ]


class SessionList(generics.ListCreateAPIView):
    serializer_class = SessionSerializer

    def get_queryset(self):
        active = Run.objects.filter(session=OuterRef("pk"), status__in=Run.ACTIVE)
        queryset = ChatSession.objects.filter(
            owner=self.request.user, archived=False
        ).annotate(active_run_id=Subquery(active.values("id")[:1]))
        query = self.request.query_params.get("q", "").strip()
        if query:
            queryset = queryset.filter(title__icontains=query)
        return queryset

    def perform_create(self, serializer):
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
        return Response(
            {**self.get_serializer(session).data, **snapshot.session_live(session)}
        )


class MessagePagination(CursorPagination):
    page_size = 100
    ordering = "id"


class SessionMessages(generics.ListAPIView):
    serializer_class = MessageSerializer
    pagination_class = MessagePagination

    def get_queryset(self):
        return _session_for(self.request, self.kwargs["session_id"]).messages.all()


class ModelList(APIView):
    def get(self, request):
        return Response(
            {"models": providers.model_choices(), "default": providers.default_model()}
        )


class RunCreateSerializer(serializers.Serializer):
    content = serializers.CharField(allow_blank=False, trim_whitespace=False)
    model = serializers.CharField(required=False, allow_blank=True)

    def validate_content(self, value: str) -> str:
        if not value.strip():
            raise ValidationError("message is empty")
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
        request=RunCreateSerializer,
        parameters=[
            OpenApiParameter("Idempotency-Key", location="header", required=False)
        ],
    )
    def post(self, request, session_id):
        session = _session_for(request, session_id)
        body = RunCreateSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        model = (
            body.validated_data.get("model")
            or session.model
            or providers.default_model()
        )
        key = request.headers.get("Idempotency-Key", "").strip()[:200]
        try:
            run, created = run_start(
                session=session,
                content=body.validated_data["content"],
                model=model,
                provider=providers.provider_name_for(model),
                idempotency_key=key,
            )
        except RunConflict as exc:
            return Response(
                {"error": str(exc), "run_id": exc.run_id},
                status=status.HTTP_409_CONFLICT,
            )
        return Response(
            {
                "run_id": run.id,
                "stream_url": reverse("api-run-events", args=[run.id]),
                "status_url": reverse("api-run", args=[run.id]),
            },
            status=status.HTTP_201_CREATED if created else status.HTTP_200_OK,
        )


class RunDetail(APIView):
    def get(self, request, run_id):
        return Response(run_summary(run=_run_for(request, run_id)))


class RunCancel(APIView):
    def post(self, request, run_id):
        run = _run_for(request, run_id)
        if run.is_terminal:
            return Response(
                {"error": f"run already ended ({run.status})", **run_summary(run=run)},
                status=status.HTTP_409_CONFLICT,
            )
        run_cancel(run=run)
        return Response({"run_id": run.id, "cancel_requested": True}, status=202)


def _int_param(request, name: str, default: int, lo: int, hi: int) -> int:
    raw = request.query_params.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ValidationError({name: f"must be an integer, got {raw!r}"}) from None
    if not lo <= value <= hi:
        raise ValidationError({name: f"must be between {lo} and {hi}"})
    return value


class RunEventsJson(APIView):
    @extend_schema(
        parameters=[
            OpenApiParameter("after_seq", int, required=False),
            OpenApiParameter("limit", int, required=False),
        ]
    )
    def get(self, request, run_id):
        run = _run_for(request, run_id)
        if run.pruned_at is not None:
            return pruned_response(run)
        after_seq = _int_param(request, "after_seq", 0, 0, 2**31)
        limit = _int_param(request, "limit", 1000, 1, EVENTS_PAGE_MAX)
        records = read_after(run_id=run.id, after_seq=after_seq, limit=limit)
        events = [
            {
                "id": f"{run.id}:{r.seq}",
                "seq": r.seq,
                "event": r.type,
                "data": json.loads(r.payload),
            }
            for r in records
        ]
        return Response(
            {
                "run_id": run.id,
                "status": run.status,
                "last_seq": run.last_seq,
                "events": events,
                "next_after_seq": records[-1].seq if len(records) == limit else None,
            }
        )
