"""URLs of the browser pages (the chat page, sign-up, login, account).

Static files: `manage.py serve` wraps the site in `ASGIStaticFilesHandler`,
which answers `/static/` before these patterns are reached. Under any other
ASGI server (uvicorn in the tests, a bare daphne) the last pattern serves them
from the same finders, so the page works however the site is run; a proxy in
front may still serve `STATIC_ROOT` itself after `collectstatic`.
"""

from django.conf import settings
from django.contrib.auth import views as auth_views
from django.urls import path, re_path

from . import views

urlpatterns = [
    path("", views.chat_page, name="chat"),
    path("c/<int:session_id>/", views.chat_page, name="chat-session"),
    path("accounts/signup/", views.signup, name="signup"),
    path("accounts/login/", views.with_csp(views.LoginView.as_view()), name="login"),
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("accounts/", views.account, name="account"),
    re_path(
        rf"^{settings.STATIC_URL.lstrip('/')}(?P<path>.*)$",
        views.static_file,
    ),
]
