"""Helpers of the admin tests of both apps: the queries a page makes, and who
may not see it."""

from django.db import connection
from django.test.utils import CaptureQueriesContext


def page_queries(client, url: str) -> list[str]:
    """The SQL of one GET of `url`, once per-process caches (content types,
    permissions) are warm."""
    client.get(url)
    with CaptureQueriesContext(connection) as captured:
        response = client.get(url)
    assert response.status_code == 200
    return [q["sql"] for q in captured]


def assert_closed_to_others(client, urls: list[str], user, django_user_model) -> None:
    """An ordinary account is sent to the admin's login for every url; staff
    without permissions get 403 on all but the first (the admin's index)."""
    client.force_login(user)
    for url in urls:
        response = client.get(url)
        assert (
            response.status_code == 302 and "/admin/login/" in response["Location"]
        ), url
    staff = django_user_model.objects.create_user(
        "staff", password="pw-staffstaff", is_staff=True
    )
    client.force_login(staff)
    for url in urls[1:]:
        assert client.get(url).status_code == 403, url
