"""Export and import of a session from the page (and any API client).

`GET /api/sessions/<id>/export/?as=json` is the `manage.py export_session`
file (JSON Lines, `chat.transfer`), `?as=markdown` a transcript to read (not
`format`: DRF reads that one to choose a renderer);
`POST /api/sessions/import/` takes such a JSON Lines file as the request body
and creates a new session of the caller from it. Both reach the session only
through `chat.access` (another user's session answers 404); an import is
bounded in size and messages (413 naming the limit), counts against the
per-user session limit (429) and is all or nothing (400 naming the line at
fault). Neither holds a file whole: the upload is copied in pieces to a
spooled file (memory up to `chat.transfer.SPOOL_BYTES`, then disk) and read
line by line (`chat.transfer.session_import`); an export streams CHUNK
messages a query.
"""

import tempfile
from collections.abc import AsyncIterator, Iterator

from asgiref.sync import sync_to_async
from django.conf import settings
from django.http import StreamingHttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import status
from rest_framework.parsers import BaseParser
from rest_framework.response import Response
from rest_framework.views import APIView

from . import api_schema, limits
from .api import SessionSerializer, _session_for
from .transfer import (
    SPOOL_BYTES,
    TransferError,
    session_export,
    session_import,
    session_markdown,
    text_source,
)

READ_BYTES = 64 * 1024  # what an upload is copied in
LINES_PER_STEP = 200  # export lines made per step of the database thread

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
        response = StreamingHttpResponse(
            _streamed(render(session=session)), content_type=content_type
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
    ) -> "Upload":
        return Upload.read_from(stream, settings.HERMES["IMPORT_MAX_BYTES"] + 1)


class Upload:
    """A request body copied in READ_BYTES pieces, at most `limit` bytes, to a
    file kept in memory up to SPOOL_BYTES and on disk beyond."""

    def __init__(self) -> None:
        self.file = tempfile.SpooledTemporaryFile(max_size=SPOOL_BYTES)
        self.size = 0

    @classmethod
    def read_from(cls, stream, limit: int) -> "Upload":
        upload = cls()
        while stream is not None and upload.size < limit:
            piece = stream.read(min(READ_BYTES, limit - upload.size))
            if not piece:
                break
            upload.file.write(piece)
            upload.size += len(piece)
        upload.file.seek(0)
        return upload


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
        try:
            declared = int(request.META.get("CONTENT_LENGTH") or 0)
        except ValueError:
            declared = 0
        # Read past Django's request-body cap (an export may be larger), but
        # never more than the import's own bound.
        upload = Upload() if declared > limit else request.data
        upload = upload if isinstance(upload, Upload) else Upload()  # no body
        with upload.file:
            if declared > limit or upload.size > limit:
                return Response(
                    {
                        "error": f"the file is larger than {limit} bytes",
                        "limit": "HERMES_IMPORT_MAX_BYTES",
                    },
                    status=status.HTTP_413_REQUEST_ENTITY_TOO_LARGE,
                )
            limits.check_session_count(user=request.user)  # or 429
            text = text_source(upload.file)
            try:
                session, count = session_import(owner=request.user, lines=text)
            except TransferError as exc:
                return _refused(exc)
            finally:
                text.detach()  # the upload's file is closed by its own `with`
        return Response(
            {"session": SessionSerializer(session).data, "messages": count},
            status=status.HTTP_201_CREATED,
        )


def _refused(exc: TransferError) -> Response:
    body = {"error": str(exc), "line": exc.line}
    if exc.limit:
        body["limit"] = exc.limit
    return Response(body, status=exc.status)


async def _streamed(lines: Iterator[str]) -> AsyncIterator[str]:
    """A sync export as an async stream: each step makes LINES_PER_STEP lines
    on the database thread, so the server sends as it reads (Django would
    read a sync iterator whole before sending anything under ASGI)."""

    def step() -> str:
        # `range` first: zip stops before taking a line it would drop.
        return "".join(
            line for _, line in zip(range(LINES_PER_STEP), lines, strict=False)
        )

    while True:
        part = await sync_to_async(step, thread_sensitive=True)()
        if not part:
            return
        yield part
