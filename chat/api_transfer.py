"""Export and import of a session from the page (and any API client).

`GET /api/sessions/<id>/export/?as=json` is the `manage.py export_session`
file (JSON Lines, `chat.transfer`), `?as=markdown` a transcript to read (not
`format`: DRF reads that one to choose a renderer);
`POST /api/sessions/import/` takes such a JSON Lines file as the request body
and creates a new session of the caller from it. Both reach the session only
through `chat.access` (another user's session answers 404); an import is
bounded in size (413), counts against the per-user session limit (429) and is
all or nothing (400 naming the line at fault).
"""

from django.conf import settings
from django.http import HttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import status
from rest_framework.parsers import BaseParser
from rest_framework.response import Response
from rest_framework.views import APIView

from . import api_schema, limits
from .api import SessionSerializer, _session_for
from .transfer import TransferError, session_export, session_import, session_markdown

FORMATS = {
    # format: (renderer, content type, file extension)
    "json": (session_export, "application/x-ndjson; charset=utf-8", "jsonl"),
    "markdown": (session_markdown, "text/markdown; charset=utf-8", "md"),
}


class SessionExport(APIView):
    @extend_schema(
        summary="A session as a file: the project's JSON Lines, or Markdown",
        parameters=[
            OpenApiParameter(
                "as",
                str,
                enum=list(FORMATS),
                required=False,
                description="`json` (default): what `manage.py export_session` "
                "writes and the import reads; `markdown`: a transcript to read",
            )
        ],
        responses={
            (200, "application/x-ndjson"): OpenApiTypes.STR,
            (200, "text/markdown"): OpenApiTypes.STR,
            400: api_schema.ERROR,
            404: api_schema.ERROR,
        },
    )
    def get(self, request, session_id):
        session = _session_for(request, session_id)
        kind = request.query_params.get("as", "json")
        if kind not in FORMATS:
            return Response(
                {"error": f"`as` must be one of {', '.join(FORMATS)}, not {kind!r}"},
                status=status.HTTP_400_BAD_REQUEST,
            )
        render, content_type, extension = FORMATS[kind]
        response = HttpResponse(
            "".join(render(session=session)), content_type=content_type
        )
        name = f"hermes-session-{session.pk}.{extension}"
        response["Content-Disposition"] = f'attachment; filename="{name}"'
        response["Cache-Control"] = "no-store"  # a whole conversation
        return response


class RawFileParser(BaseParser):
    """A request body of any type, as bytes: at most the import's bound and one
    byte more, so an oversize file is told apart without being read whole.
    (A parser, not `request.read()`: DRF's CSRF check reads the body through
    the parsers before the view runs.)"""

    media_type = "*/*"

    # DRF's stubs want a mapping back; DRF itself hands any result on as
    # `request.data`.
    def parse(  # type: ignore[override]
        self, stream, media_type=None, parser_context=None
    ) -> bytes:
        return stream.read(settings.HERMES["IMPORT_MAX_BYTES"] + 1)


class SessionImport(APIView):
    parser_classes = [RawFileParser]

    @extend_schema(
        summary="Create a session from an export (the JSON Lines of `as=json`)",
        description=(
            "The request body is the file itself (any content type: "
            "`application/octet-stream`, `application/x-ndjson`…), at most "
            "`HERMES_IMPORT_MAX_BYTES` (413 beyond). All or nothing: a bad line "
            "answers 400 naming it, and nothing is kept."
        ),
        request={"application/octet-stream": OpenApiTypes.BINARY},
        responses={
            201: api_schema.SESSION_IMPORTED,
            400: api_schema.ERROR,
            413: api_schema.ERROR,
            429: api_schema.ERROR,
        },
    )
    def post(self, request):
        limit = settings.HERMES["IMPORT_MAX_BYTES"]
        declared = int(request.META.get("CONTENT_LENGTH") or 0)
        # Read past Django's request-body cap (an export may be larger), but
        # never more than the import's own bound.
        data = b"" if declared > limit else request.data
        data = data if isinstance(data, bytes) else b""  # no body: no bytes
        if declared > limit or len(data) > limit:
            return Response(
                {"error": f"the file is larger than {limit} bytes"},
                status=status.HTTP_413_REQUEST_ENTITY_TOO_LARGE,
            )
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            return _bad(f"the file is not UTF-8 text (byte {exc.start})", line=0)
        limits.check_session_count(user=request.user)  # or 429
        try:
            session, count = session_import(owner=request.user, lines=text.splitlines())
        except TransferError as exc:
            return _bad(str(exc), line=exc.line)
        return Response(
            {"session": SessionSerializer(session).data, "messages": count},
            status=status.HTTP_201_CREATED,
        )


def _bad(message: str, *, line: int) -> Response:
    return Response(
        {"error": message, "line": line}, status=status.HTTP_400_BAD_REQUEST
    )
