"""The browser pages through Django's test client: sign-up, login, account, CSRF."""

import gzip
import os
from pathlib import Path

import brotli
import httpx
import pytest
from django.contrib.auth.models import Group
from django.contrib.staticfiles import finders
from django.test import Client
from rest_framework.authtoken.models import Token

from chat import views
from hermes_testing.harness import STRICT_CSP, csp_directives

PASSWORD = "correct horse battery staple"


def signup(client: Client, username: str):
    return client.post(
        "/accounts/signup/",
        {"username": username, "password1": PASSWORD, "password2": PASSWORD},
    )


@pytest.fixture
def no_env_signup(settings):
    settings.HERMES = {**settings.HERMES, "OPEN_SIGNUP": False}


@pytest.mark.django_db
def test_first_signup_becomes_admin_and_later_signups_are_refused(
    client, django_user_model, no_env_signup
):
    page = client.get("/accounts/signup/")
    assert page.status_code == 200
    assert b'data-testid="first-user-notice"' in page.content

    response = signup(client, "root")
    assert response.status_code == 302 and response.url == "/"
    admin = django_user_model.objects.get(username="root")
    assert admin.is_superuser and admin.is_staff
    assert client.get("/").status_code == 200  # signed in by the sign-up

    other = Client()
    assert other.get("/accounts/signup/").status_code == 403
    refused = signup(other, "mallory")
    assert refused.status_code == 403
    assert b"Sign-up is closed" in refused.content
    assert not django_user_model.objects.filter(username="mallory").exists()


@pytest.mark.django_db
def test_admin_opens_signup_and_later_users_are_not_admins(
    client, django_user_model, no_env_signup
):
    signup(client, "root")
    response = client.post("/accounts/", {"action": "signup", "open_signup": "on"})
    assert response.status_code == 302
    assert Group.objects.filter(name=views.SIGNUP_OPEN_GROUP).exists()

    response = signup(Client(), "second")
    assert response.status_code == 302
    second = django_user_model.objects.get(username="second")
    assert not second.is_superuser and not second.is_staff

    client.post("/accounts/", {"action": "signup"})  # unchecked: closed again
    assert signup(Client(), "third").status_code == 403


@pytest.mark.django_db
def test_only_an_admin_changes_signup(client, django_user_model, no_env_signup):
    django_user_model.objects.create_superuser("root", password=PASSWORD)
    django_user_model.objects.create_user("pat", password=PASSWORD)
    client.force_login(django_user_model.objects.get(username="pat"))
    response = client.post("/accounts/", {"action": "signup", "open_signup": "on"})
    assert response.status_code == 403
    assert not views.signup_is_open()


@pytest.mark.django_db
def test_env_flag_opens_signup(client, django_user_model, settings):
    django_user_model.objects.create_superuser("root", password=PASSWORD)
    settings.HERMES = {**settings.HERMES, "OPEN_SIGNUP": True}  # HERMES_OPEN_SIGNUP
    assert signup(client, "guest").status_code == 302
    assert not django_user_model.objects.get(username="guest").is_superuser


@pytest.mark.django_db
def test_signup_form_errors_are_shown(client, no_env_signup):
    response = client.post(
        "/accounts/signup/", {"username": "x", "password1": "a", "password2": "b"}
    )
    assert response.status_code == 200
    assert b'data-testid="field-errors"' in response.content


@pytest.mark.django_db
@pytest.mark.parametrize("path", ["/", "/c/1/", "/accounts/"])
def test_pages_require_login(client, path):
    response = client.get(path)
    assert response.status_code == 302
    assert response.url.startswith("/accounts/login/?next=")


@pytest.mark.slow
@pytest.mark.django_db
def test_login_then_chat_page_then_logout(client, django_user_model):
    django_user_model.objects.create_user("ann", password=PASSWORD)
    response = client.post(
        "/accounts/login/", {"username": "ann", "password": PASSWORD}
    )
    assert response.status_code == 302 and response.url == "/"

    page = client.get("/")
    assert page.status_code == 200
    body = page.content.decode()
    assert 'data-testid="composer-input"' in body
    assert "hermes/js/app.js" in body
    csp = page["Content-Security-Policy"]
    assert "script-src 'self'" in csp and "unsafe-inline" not in csp
    assert "onclick=" not in body and "<script>" not in body  # no inline script

    assert client.post("/accounts/logout/").status_code == 302
    assert client.get("/").status_code == 302


@pytest.mark.django_db
def test_chat_page_static_files_are_served(client, django_user_model):
    """The page's modules and vendored libraries load under any ASGI server."""
    for path in [
        "/static/hermes/js/app.js",
        "/static/hermes/css/app.css",
        "/static/vendor/marked/marked.esm.js",
        "/static/vendor/dompurify/purify.es.js",
        "/static/vendor/highlight/highlight.min.js",
    ]:
        response = client.get(path)
        assert response.status_code == 200, path
        assert response["Content-Type"].startswith(("text/javascript", "text/css")), (
            path
        )
    assert client.get("/static/../chat/views.py").status_code == 404
    assert client.get("/static/hermes/").status_code == 404


def test_static_files_over_asgi_revalidate_and_answer_304(server):
    """WhiteNoise under the real ASGI server: validators, no stale module."""
    url = f"{server.url}/static/hermes/js/app.js"
    first = httpx.get(url)
    assert first.status_code == 200 and first.content
    assert first.headers["Cache-Control"] == "max-age=0, public"
    assert first.headers["ETag"] and first.headers["Last-Modified"]
    assert "Access-Control-Allow-Origin" not in first.headers
    again = httpx.get(url, headers={"If-None-Match": first.headers["ETag"]})
    assert again.status_code == 304 and again.content == b""
    head = httpx.head(url)
    assert head.status_code == 200 and head.content == b""
    assert int(head.headers["Content-Length"]) == len(first.content)
    assert httpx.post(url).status_code == 405


@pytest.fixture
def collected(settings, tmp_path):
    """`collectstatic` into a folder of this test's, as `make run` does (only
    the page's own files: compressing every library's takes a while)."""
    from django.core.management import call_command

    settings.STATIC_ROOT = tmp_path / "static"
    others = ["admin", "drf_spectacular_sidecar", "rest_framework", "vendor"]
    call_command(
        "collectstatic", interactive=False, verbosity=0, ignore_patterns=others
    )
    return settings.STATIC_ROOT


def test_collected_files_are_served_compressed_unless_older_than_their_source(
    collected,
):
    """The async path (as under daphne or uvicorn), over `collectstatic`'s copies."""
    from asgiref.sync import async_to_sync
    from django.test import AsyncClient

    path = "/static/hermes/js/app.js"
    assert (collected / "hermes/js/app.js.br").exists()
    assert (collected / "hermes/js/app.js.gz").exists()

    def get(encoding: str):
        return async_to_sync(AsyncClient().get)(
            path, headers={"Accept-Encoding": encoding}
        )

    source = finders.find("hermes/js/app.js")
    plain = Path(source).read_bytes()
    br = get("gzip, br")
    assert br["Content-Encoding"] == "br" and br["Vary"] == "Accept-Encoding"
    assert brotli.decompress(br.content) == plain
    gz = get("gzip")
    assert gz["Content-Encoding"] == "gzip"
    assert gzip.decompress(gz.content) == plain
    assert get("identity").content == plain

    old = Path(source).stat().st_mtime - 60  # a copy from before the last edit
    os.utime(collected / "hermes/js/app.js", (old, old))
    stale = get("gzip, br")
    assert "Content-Encoding" not in stale and stale.content == plain


@pytest.mark.django_db
def test_account_page_creates_a_token_shown_once(client, django_user_model):
    user = django_user_model.objects.create_user("ann", password=PASSWORD)
    client.force_login(user)
    page = client.get("/accounts/")
    assert b'data-testid="no-token"' in page.content

    made = client.post("/accounts/", {"action": "token"})
    assert made.status_code == 200
    key = Token.objects.get(user=user).key
    assert key.encode() in made.content
    assert made["Cache-Control"] == "no-store"

    later = client.get("/accounts/")
    assert key.encode() not in later.content  # shown once, never again
    assert key[: views.TOKEN_SHOWN_CHARS].encode() in later.content

    replaced = client.post("/accounts/", {"action": "token"})
    new_key = Token.objects.get(user=user).key
    assert new_key != key and new_key.encode() in replaced.content
    assert Token.objects.filter(user=user).count() == 1

    api = Client().get("/api/sessions/", HTTP_AUTHORIZATION=f"Token {new_key}")
    assert api.status_code == 200


@pytest.mark.django_db
def test_forms_enforce_csrf(django_user_model, no_env_signup):
    user = django_user_model.objects.create_user("ann", password=PASSWORD)
    strict = Client(enforce_csrf_checks=True)

    page = strict.get("/accounts/login/")
    assert b"csrfmiddlewaretoken" in page.content
    login = strict.post("/accounts/login/", {"username": "ann", "password": PASSWORD})
    assert login.status_code == 403

    strict.force_login(user)
    for path, data in [
        ("/accounts/", {"action": "token"}),
        ("/accounts/logout/", {}),
    ]:
        assert strict.post(path, data).status_code == 403, path
    assert not Token.objects.filter(user=user).exists()

    account = strict.get("/accounts/")
    assert account.content.count(b"csrfmiddlewaretoken") >= 2  # token form, logout form
    chat = strict.get("/")
    assert b"csrfmiddlewaretoken" in chat.content  # the logout form
    token = strict.cookies["csrftoken"].value
    ok = strict.post("/accounts/", {"action": "token", "csrfmiddlewaretoken": token})
    assert ok.status_code == 200 and Token.objects.filter(user=user).exists()


@pytest.mark.django_db
def test_signup_enforces_csrf(no_env_signup):
    strict = Client(enforce_csrf_checks=True)
    assert b"csrfmiddlewaretoken" in strict.get("/accounts/signup/").content
    response = strict.post(
        "/accounts/signup/",
        {"username": "root", "password1": PASSWORD, "password2": PASSWORD},
    )
    assert response.status_code == 403


@pytest.mark.django_db
def test_signed_in_user_visiting_signup_goes_to_chat(client, django_user_model):
    client.force_login(django_user_model.objects.create_user("ann", password=PASSWORD))
    assert client.get("/accounts/signup/").url == "/"


@pytest.mark.django_db
def test_login_page_links_to_signup_only_while_open(
    client, django_user_model, no_env_signup
):
    assert b'data-testid="signup-link"' in client.get("/accounts/login/").content
    django_user_model.objects.create_superuser("root", password=PASSWORD)
    assert b'data-testid="signup-link"' not in client.get("/accounts/login/").content


@pytest.mark.django_db
def test_every_answer_carries_the_strict_content_security_policy(
    client, django_user_model
):
    """Pages, forms, the admin and the API alike: the policy is site-wide."""
    anonymous = ["/accounts/login/", "/accounts/signup/", "/admin/login/"]
    for path in anonymous:
        assert csp_directives(client.get(path)["Content-Security-Policy"]) == (
            STRICT_CSP
        ), path
    client.force_login(django_user_model.objects.create_user("ann"))
    for path in ["/", "/accounts/", "/api/sessions/"]:
        response = client.get(path)
        assert response.status_code == 200, path
        assert csp_directives(response["Content-Security-Policy"]) == STRICT_CSP
