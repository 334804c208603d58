"""URLs of the browser pages (the chat page, sign-up, login, account).

`/static/` is answered before any of these, by WhiteNoise in the middleware
(`hermes_site.static_files`), under any ASGI server.
"""

from django.contrib.auth import views as auth_views
from django.urls import path

from . import views

urlpatterns = [
    path("", views.chat_page, name="chat"),
    path("c/<int:session_id>/", views.chat_page, name="chat-session"),
    path("accounts/signup/", views.signup, name="signup"),
    path("accounts/login/", views.LoginView.as_view(), name="login"),
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("accounts/", views.account, name="account"),
]
