"""Access functions: the only way a view reaches a protected object.

Another user's run or session answers "not found", exactly as if it did not
exist. These are sync; async transports call them through `journal.dbpool`.
"""

from django.contrib.auth import get_user
from django.contrib.auth.models import AnonymousUser
from rest_framework.authtoken.models import Token

from journal.models import Run

from .models import ChatSession


class NotFound(Exception):
    pass


def run_get_for_owner(*, run_id: str, user) -> Run:
    run = Run.objects.filter(id=run_id, owner_id=user.pk).first() if user.pk else None
    if run is None:
        raise NotFound(f"no run {run_id}")
    return run


def session_get_for_owner(*, session_id, user) -> ChatSession:
    try:
        pk = int(session_id)
    except (TypeError, ValueError):
        raise NotFound(f"no session {session_id}") from None
    session = ChatSession.objects.filter(pk=pk, owner_id=user.pk).first()
    if session is None:
        raise NotFound(f"no session {session_id}")
    return session


def user_from_token_header(header: str | None):
    """`Authorization: Token <key>` -> the active user, or None."""
    if not header:
        return None
    scheme, _, key = header.partition(" ")
    if scheme.lower() != "token" or not key.strip():
        return None
    token = Token.objects.select_related("user").filter(key=key.strip()).first()
    if token is None or not token.user.is_active:
        return None
    return token.user


def user_from_request(request):
    """A Django request's user: token header first, then the session cookie."""
    user = user_from_token_header(request.headers.get("Authorization"))
    if user is not None:
        return user
    user = get_user(request)
    return user if user.is_authenticated else AnonymousUser()
