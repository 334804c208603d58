from django.urls import path

from . import api, api_attachments, api_search, api_transfer, sse

urlpatterns = [
    path("api/models/", api.ModelList.as_view(), name="api-models"),
    path("api/stream/", sse.user_stream, name="api-stream"),
    path("api/search/", api_search.MessageSearch.as_view(), name="api-search"),
    path(
        "api/attachments/",
        api_attachments.AttachmentUpload.as_view(),
        name="api-attachments",
    ),
    path(
        "api/attachments/<str:attachment_id>/",
        api_attachments.AttachmentDetail.as_view(),
        name="api-attachment",
    ),
    path(
        "api/attachments/<str:attachment_id>/content/",
        api_attachments.AttachmentContent.as_view(),
        name="api-attachment-content",
    ),
    path("api/sessions/", api.SessionList.as_view(), name="api-sessions"),
    path(
        "api/sessions/import/",
        api_transfer.SessionImport.as_view(),
        name="api-session-import",
    ),
    path(
        "api/sessions/<str:session_id>/export/",
        api_transfer.SessionExport.as_view(),
        name="api-session-export",
    ),
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
        "api/sessions/<str:session_id>/messages/<str:message_id>/select/",
        api.MessageSelect.as_view(),
        name="api-message-select",
    ),
    path(
        "api/sessions/<str:session_id>/pending/",
        api.SessionPending.as_view(),
        name="api-session-pending",
    ),
    path(
        "api/sessions/<str:session_id>/pending/<str:pending_id>/",
        api.PendingDetail.as_view(),
        name="api-pending",
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
    path(
        "api/runs/<str:run_id>/approval/",
        api.RunApproval.as_view(),
        name="api-run-approval",
    ),
    path("api/runs/<str:run_id>/events/", sse.run_events, name="api-run-events"),
    path(
        "api/runs/<str:run_id>/events.json",
        api.RunEventsJson.as_view(),
        name="api-run-events-json",
    ),
]
