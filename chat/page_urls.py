"""URLs of the browser pages (the chat page, sign-up, login, account)."""

urlpatterns: list = []
