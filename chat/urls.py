from django.urls import path

from . import api, sse

urlpatterns = [
    path("api/models/", api.ModelList.as_view(), name="api-models"),
    path("api/stream/", sse.user_stream, name="api-stream"),
    path("api/sessions/", api.SessionList.as_view(), name="api-sessions"),
    path(
        "api/sessions/<str:session_id>/",
        api.SessionDetail.as_view(),
        name="api-session",
    ),
    path(
        "api/sessions/<str:session_id>/messages/",
        api.SessionMessages.as_view(),
        name="api-session-messages",
    ),
    path(
        "api/sessions/<str:session_id>/runs/",
        api.SessionRuns.as_view(),
        name="api-session-runs",
    ),
    path("api/runs/<str:run_id>/", api.RunDetail.as_view(), name="api-run"),
    path(
        "api/runs/<str:run_id>/cancel/", api.RunCancel.as_view(), name="api-run-cancel"
    ),
    path("api/runs/<str:run_id>/events/", sse.run_events, name="api-run-events"),
    path(
        "api/runs/<str:run_id>/events.json",
        api.RunEventsJson.as_view(),
        name="api-run-events-json",
    ),
]
