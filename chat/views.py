"""The browser pages: the chat page, sign-up, the account page.
See docs/architecture.md §5.

The chat page is a shell; everything on it is drawn by the modules under
`static/hermes/js/` from the JSON API, with the same session cookie and CSRF
token as these forms. Login and logout are django.contrib.auth's own views.

Sign-up: the first account becomes the admin (superuser). After that sign-up is
closed unless the `HERMES_OPEN_SIGNUP` environment flag is set or an admin opens
it on the account page; that switch is the existence of the auth `Group` named
`SIGNUP_OPEN_GROUP`, so it needs no model of its own and survives restarts.
"""

from django import forms
from django.conf import settings
from django.contrib.auth import get_user_model, login
from django.contrib.auth import views as auth_views
from django.contrib.auth.decorators import login_required
from django.contrib.auth.forms import UserCreationForm
from django.contrib.auth.models import Group, User
from django.db import transaction
from django.http import HttpRequest, HttpResponse, HttpResponseForbidden
from django.shortcuts import redirect, render
from django.views.decorators.http import require_http_methods
from rest_framework.authtoken.models import Token

from chat import attachments

SIGNUP_OPEN_GROUP = "hermes:signup-open"  # exists while an admin keeps sign-up open
TOKEN_SHOWN_CHARS = 6  # of a stored key, enough to tell keys apart, useless to steal


def signup_is_open() -> bool:
    """Open to the first user; then only if the env flag or an admin says so."""
    if not get_user_model().objects.exists():
        return True
    if settings.HERMES["OPEN_SIGNUP"]:
        return True
    return Group.objects.filter(name=SIGNUP_OPEN_GROUP).exists()


def signup_set_open(*, is_open: bool) -> None:
    if is_open:
        Group.objects.get_or_create(name=SIGNUP_OPEN_GROUP)
    else:
        Group.objects.filter(name=SIGNUP_OPEN_GROUP).delete()


def user_signup(*, form: UserCreationForm):
    """Create the account of a valid sign-up form; None if sign-up closed meanwhile.

    The first account becomes the admin. Two sign-ups racing on an empty
    database both pass the "no user yet" check, so the decision is taken again
    after commit, on the lowest primary key: exactly one becomes the admin and
    the other, if sign-up is closed, is removed again.
    """
    users = get_user_model().objects
    with transaction.atomic():
        user = form.save()
    first_pk = users.order_by("pk").values_list("pk", flat=True).first()
    if user.pk == first_pk:
        users.filter(pk=user.pk).update(is_superuser=True, is_staff=True)
        user.refresh_from_db()
        return user
    if not signup_is_open():
        user.delete()
        return None
    return user


class SignupForm(UserCreationForm):
    class Meta(UserCreationForm.Meta):  # type: ignore[name-defined]
        model = get_user_model()
        fields = ("username",)


class LoginView(auth_views.LoginView):
    """django.contrib.auth's login, linking to sign-up only while it is open."""

    redirect_authenticated_user = True

    def get_context_data(self, **kwargs):
        return {**super().get_context_data(**kwargs), "signup_open": signup_is_open()}


@login_required
def chat_page(request: HttpRequest, session_id: int | None = None) -> HttpResponse:
    """The chat UI; `/c/<id>/` opens that session (the page checks it exists).
    The attachment limits let the page refuse what the server would."""
    hermes = settings.HERMES
    return render(
        request,
        "chat/index.html",
        {
            "initial_session_id": session_id or "",
            "attachment_max_files": hermes["ATTACHMENT_MAX_FILES"],
            "attachment_max_bytes": hermes["ATTACHMENT_MAX_BYTES"],
        },
    )


@require_http_methods(["GET", "POST"])
def signup(request: HttpRequest) -> HttpResponse:
    if request.user.is_authenticated:
        return redirect("chat")
    if not signup_is_open():
        return render(request, "registration/signup_closed.html", status=403)
    form = SignupForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        user = user_signup(form=form)
        if user is None:
            return render(request, "registration/signup_closed.html", status=403)
        login(request, user, backend="django.contrib.auth.backends.ModelBackend")
        return redirect("chat")
    first = not get_user_model().objects.exists()
    return render(
        request, "registration/signup.html", {"form": form, "first_user": first}
    )


class SignupSwitchForm(forms.Form):
    open_signup = forms.BooleanField(required=False)


class SignedInRequest(HttpRequest):
    user: User  # what `login_required` lets through


@login_required
@require_http_methods(["GET", "POST"])
def account(request: SignedInRequest) -> HttpResponse:
    """The account page: make (or replace) the API token; admins open sign-up.

    A new key is shown once, in the answer to the POST that made it, never on a
    later page: afterwards only its first characters are shown.
    """
    new_key = ""
    if request.method == "POST":
        action = request.POST.get("action")
        if action == "token":
            with transaction.atomic():
                Token.objects.filter(user=request.user).delete()
                new_key = Token.objects.create(user=request.user).key
        elif action == "signup":
            if not request.user.is_superuser:
                return HttpResponseForbidden("only an admin can change sign-up")
            form = SignupSwitchForm(request.POST)
            form.is_valid()
            signup_set_open(is_open=form.cleaned_data.get("open_signup", False))
            return redirect("account")
    token = Token.objects.filter(user=request.user).first()
    response = render(
        request,
        "chat/account.html",
        {
            "new_key": new_key,
            "token_prefix": token.key[:TOKEN_SHOWN_CHARS]
            if token and not new_key
            else "",
            "signup_open": signup_is_open(),
            "signup_env": settings.HERMES["OPEN_SIGNUP"],
            "storage": attachments.usage(owner=request.user),
        },
    )
    response["Cache-Control"] = "no-store"  # a page that may carry a new key
    return response
