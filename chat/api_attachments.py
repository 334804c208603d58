"""Attachments over the API (`chat.attachments`; docs/architecture.md §5).

Upload first, then send: `POST /api/attachments/` (multipart, field `file`)
checks and stores one file of the caller and answers its id; a run's body
names those ids in `attachments` (`chat.api.SessionRuns`). `GET
/api/attachments/<id>/` describes one, `DELETE` drops one not sent yet, and
`GET /api/attachments/<id>/content/` serves its bytes. Only the owner reaches
an attachment: anyone else's id answers 404 like a missing one.

The bytes are served as what they were checked to be (an image type told by
its bytes, or UTF-8 plain text), with `nosniff`, a CSP that runs nothing and
a sandbox, so a file is never taken for a page.
"""

from urllib.parse import quote

from django.http import HttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import serializers, status
from rest_framework.exceptions import NotFound as HttpNotFound
from rest_framework.parsers import MultiPartParser
from rest_framework.response import Response
from rest_framework.views import APIView

from . import api_schema
from .attachments import AttachmentRefused, file_bytes, info, max_bytes, upload, usage
from .models import Attachment

ID = 2**63 - 1  # a BigAutoField; larger ids fail in the database
MULTIPART_SLACK = 64 * 1024  # a request's bytes besides the file's own
SERVED_CSP = "default-src 'none'; sandbox"

ATTACHMENT = inline_serializer(
    "Attachment",
    {
        "id": serializers.IntegerField(),
        "name": serializers.CharField(),
        "kind": serializers.ChoiceField(choices=Attachment.Kind.values),
        "mime": serializers.CharField(help_text="told by the bytes for an image"),
        "size": serializers.IntegerField(help_text="bytes"),
        "url": serializers.CharField(help_text="its bytes (owner only)"),
    },
)
LIMIT_ERROR = inline_serializer(
    "AttachmentError",
    {
        "error": serializers.CharField(help_text="what was wrong, in words"),
        "limit": serializers.CharField(
            required=False, help_text="the setting that bounds it"
        ),
    },
)


def attachment_for(request, attachment_id) -> Attachment:
    """The caller's attachment, or 404 (also for anyone else's)."""
    text = str(attachment_id)
    found = None
    if text.isascii() and text.isdigit() and 0 < int(text) <= ID:
        found = Attachment.objects.filter(pk=int(text), owner=request.user).first()
    if found is None:
        raise HttpNotFound(f"no attachment {attachment_id}")
    return found


def refused(exc: AttachmentRefused) -> Response:
    return Response(exc.body(), status=exc.status)


STORAGE = inline_serializer(
    "Storage",
    {
        "used_bytes": serializers.IntegerField(
            help_text="file bytes stored (a file kept by several messages once)"
        ),
        "limit_bytes": serializers.IntegerField(
            help_text="`HERMES_USER_MAX_STORED_BYTES`: past it an upload or an "
            "import with files answers 413"
        ),
    },
)


class AttachmentUpload(APIView):
    parser_classes = [MultiPartParser]

    @extend_schema(
        summary="The file bytes you store, and the most you may",
        description="The account page's usage line. Files are stored once "
        "however many messages keep them (an edited question keeps its "
        "version's files without a copy); deleting chats frees their files.",
        responses={200: STORAGE},
        operation_id="attachments_usage",  # not the file download's id
    )
    def get(self, request):
        return Response(usage(owner=request.user))

    @extend_schema(
        summary="Upload a file to send with a message",
        description=(
            "One file, multipart field `file`. Text and code (by extension or "
            "`text/*`, valid UTF-8) are inlined into the prompt; PNG, JPEG, "
            "GIF and WebP images (told by their bytes) go to models that take "
            "images (`vision` in `GET /api/models/`). Name the answered `id` "
            "in a run's `attachments`. 413 over `HERMES_ATTACHMENT_MAX_BYTES` "
            "(or a text file over `HERMES_MAX_MESSAGE_CHARS`, or past the "
            "bytes one user may store, `HERMES_USER_MAX_STORED_BYTES`), 415 "
            "for a type not taken, 429 with too many uploads not sent yet; "
            "each error names its `limit`."
        ),
        request={
            "multipart/form-data": {
                "type": "object",
                "properties": {"file": {"type": "string", "format": "binary"}},
                "required": ["file"],
            }
        },
        responses={
            201: ATTACHMENT,
            400: LIMIT_ERROR,
            413: LIMIT_ERROR,
            415: LIMIT_ERROR,
            429: LIMIT_ERROR,
        },
    )
    def post(self, request):
        limit = max_bytes()
        declared = request.META.get("CONTENT_LENGTH") or "0"
        if declared.isdigit() and int(declared) > limit + MULTIPART_SLACK:
            return refused(_too_large(limit))  # not read at all
        upload_file = request.FILES.get("file")
        if upload_file is None:
            return Response(
                {"error": "send the file as multipart form field `file`"},
                status=status.HTTP_400_BAD_REQUEST,
            )
        if upload_file.size > limit:
            return refused(_too_large(limit, upload_file.name))
        try:
            attachment = upload(
                owner=request.user,
                name=upload_file.name or "file",
                declared=upload_file.content_type or "",
                data=upload_file.read(),
            )
        except AttachmentRefused as exc:
            return refused(exc)
        return Response(info(attachment), status=status.HTTP_201_CREATED)


def _too_large(limit: int, name: str = "the file") -> AttachmentRefused:
    return AttachmentRefused(
        f"{name}: more than the {limit} bytes a file may have",
        status=413,
        limit="HERMES_ATTACHMENT_MAX_BYTES",
    )


class AttachmentDetail(APIView):
    @extend_schema(
        summary="An attachment's name, kind, type and size",
        responses={200: ATTACHMENT, 404: api_schema.ERROR},
    )
    def get(self, request, attachment_id):
        return Response(info(attachment_for(request, attachment_id)))

    @extend_schema(
        summary="Remove an upload not sent yet",
        responses={204: None, 404: api_schema.ERROR, 409: api_schema.ERROR},
    )
    def delete(self, request, attachment_id):
        attachment = attachment_for(request, attachment_id)
        if attachment.message_id is not None:
            return Response(
                {"error": "this file was sent with a message; it stays with it"},
                status=status.HTTP_409_CONFLICT,
            )
        attachment.delete()
        return Response(status=status.HTTP_204_NO_CONTENT)


class AttachmentContent(APIView):
    @extend_schema(
        summary="An attachment's bytes (an image, or UTF-8 text)",
        responses={
            (200, "image/*"): OpenApiTypes.BINARY,
            (200, "text/plain"): OpenApiTypes.STR,
            404: api_schema.ERROR,
        },
    )
    def get(self, request, attachment_id):
        attachment = attachment_for(request, attachment_id)
        image = attachment.kind == Attachment.Kind.IMAGE
        response = HttpResponse(
            file_bytes(attachment),
            content_type=attachment.mime if image else "text/plain; charset=utf-8",
        )
        disposition = "inline" if image else "attachment"
        response["Content-Disposition"] = (
            f"{disposition}; filename*=UTF-8''{quote(attachment.name, safe='')}"
        )
        response["X-Content-Type-Options"] = "nosniff"
        response["Content-Security-Policy"] = SERVED_CSP
        response["Cache-Control"] = "private, max-age=86400"
        return response
