"""`GET /api/search/?q=&page=`: message text across the caller's own sessions.

Hits come from `chat.search.message_search` (FTS5 on SQLite, full-text search
on PostgreSQL), newest first, PAGE_SIZE a page; `next` is the following page's
URL or null. Each hit's `snippet` is HTML-escaped text whose only markup is
`<mark>` around the words found.
"""

import re
from urllib.parse import urlencode

from drf_spectacular.utils import OpenApiParameter, extend_schema, inline_serializer
from rest_framework import serializers, status
from rest_framework.response import Response
from rest_framework.views import APIView

from . import api_schema
from .search import message_search

PAGE_SIZE = 20
MAX_PAGE = 50  # deeper than 1,000 hits, a narrower query serves better
QUERY_MAX = 200  # characters; only the first words count anyway
PAGE = re.compile(r"[0-9]{1,6}")

HIT = inline_serializer(
    "SearchHit",
    {
        "session_id": serializers.IntegerField(),
        "session_title": serializers.CharField(),
        "message_id": serializers.IntegerField(),
        "role": serializers.CharField(),
        "created_at": serializers.DateTimeField(),
        "snippet": serializers.CharField(
            help_text="HTML: escaped text, <mark> around the words found"
        ),
    },
)
SEARCH_PAGE = inline_serializer(
    "SearchPage",
    {
        "query": serializers.CharField(),
        "page": serializers.IntegerField(),
        "next": serializers.CharField(allow_null=True),
        "results": serializers.ListField(child=HIT),
    },
)


class MessageSearch(APIView):
    @extend_schema(
        summary="Search the text of your messages",
        parameters=[
            OpenApiParameter("q", str, required=True, description="words to find"),
            OpenApiParameter("page", int, required=False, description="from 1"),
        ],
        responses={200: SEARCH_PAGE, 400: api_schema.ERROR},
    )
    def get(self, request):
        query = request.query_params.get("q", "").strip()
        if len(query) > QUERY_MAX:
            return _bad(f"`q` is longer than {QUERY_MAX} characters")
        raw_page = request.query_params.get("page", "1")
        # ASCII digits only: `str.isdigit` also takes "²", which int() refuses.
        if not PAGE.fullmatch(raw_page) or not 1 <= int(raw_page) <= MAX_PAGE:
            return _bad(f"`page` must be a whole number from 1 to {MAX_PAGE}")
        page = int(raw_page)
        hits = message_search(
            user=request.user,
            query=query,
            limit=PAGE_SIZE + 1,
            offset=(page - 1) * PAGE_SIZE,
        )
        more = len(hits) > PAGE_SIZE and page < MAX_PAGE
        following = request.build_absolute_uri(
            request.path + "?" + _params(query, page + 1)
        )
        return Response(
            {
                "query": query,
                "page": page,
                "next": following if more else None,
                "results": [
                    {
                        "session_id": hit.session_id,
                        "session_title": hit.session_title,
                        "message_id": hit.message_id,
                        "role": hit.role,
                        "created_at": hit.created_at,
                        "snippet": hit.snippet,
                    }
                    for hit in hits[:PAGE_SIZE]
                ],
            }
        )


def _params(query: str, page: int) -> str:
    return urlencode({"q": query, "page": page})


def _bad(message: str) -> Response:
    return Response({"error": message}, status=status.HTTP_400_BAD_REQUEST)
