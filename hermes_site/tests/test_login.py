"""Login throttling and password rules, over a real socket.

Wrong passwords for one account from one address are refused (429, with
`Retry-After`) after HERMES_LOGIN_FAILURE_LIMIT tries, on the site's login and
the admin's, parallel tries included; the lock covers that account only.
Sign-up refuses numeric passwords and passwords like the username.
"""

import threading
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from django.conf import settings

from chat.views import SIGNUP_OPEN_GROUP
from hermes_testing.harness import wait_until

PASSWORD = "correct horse battery staple"


def login(server, path: str, username: str, password: str) -> httpx.Response:
    with httpx.Client(base_url=server.url) as client:
        client.get(path)
        return client.post(
            path,
            data={
                "username": username,
                "password": password,
                "csrfmiddlewaretoken": client.cookies["csrftoken"],
            },
            headers={"Referer": server.url + path},
        )


@pytest.mark.slow
@pytest.mark.parametrize("path", ["/accounts/login/", "/admin/login/"])
def test_repeated_wrong_passwords_lock_that_account_out(
    server, transactional_db, django_user_model, path
):
    django_user_model.objects.create_superuser("root", "", PASSWORD)
    django_user_model.objects.create_superuser("other", "", PASSWORD)
    limit = settings.AXES_FAILURE_LIMIT
    for attempt in range(limit - 1):
        response = login(server, path, "root", f"wrong-{attempt}")
        assert response.status_code == 200, attempt  # the form again, with an error
    refused = login(server, path, "root", "wrong-last")
    assert refused.status_code == 429
    assert int(refused.headers["Retry-After"]) > 0
    assert "Too many failed logins" in refused.text
    # Locked: even the right password is refused now.
    assert login(server, path, "root", PASSWORD).status_code == 429
    # Another account from the same address is not.
    assert login(server, path, "other", PASSWORD).status_code == 302


@pytest.mark.slow
def test_a_success_before_the_limit_resets_the_count(
    server, transactional_db, django_user_model
):
    django_user_model.objects.create_user("ann", password=PASSWORD)
    for _ in range(2):
        for attempt in range(settings.AXES_FAILURE_LIMIT - 1):
            login(server, "/accounts/login/", "ann", f"wrong-{attempt}")
        assert login(server, "/accounts/login/", "ann", PASSWORD).status_code == 302


def signup(server, username: str, password: str) -> httpx.Response:
    with httpx.Client(base_url=server.url) as client:
        client.get("/accounts/signup/")
        return client.post(
            "/accounts/signup/",
            data={
                "username": username,
                "password1": password,
                "password2": password,
                "csrfmiddlewaretoken": client.cookies["csrftoken"],
            },
            headers={"Referer": server.url + "/accounts/signup/"},
        )


@pytest.mark.parametrize(
    "username,password,needle",
    [
        ("dora", "83749201", "entirely numeric"),
        ("dorathea1", "dorathea1", "too similar to the username"),
        ("dora", "password123", "too common"),
        ("dora", "x7#kq", "too short"),
    ],
)
@pytest.mark.slow
def test_signup_refuses_weak_passwords(
    server, transactional_db, django_user_model, username, password, needle
):
    from django.contrib.auth.models import Group

    django_user_model.objects.create_superuser("root", "", PASSWORD)
    Group.objects.create(name=SIGNUP_OPEN_GROUP)
    response = signup(server, username, password)
    assert response.status_code == 200
    assert needle in response.text
    assert not django_user_model.objects.filter(username=username).exists()
    assert signup(server, username, PASSWORD).status_code == 302


BURST = 12


@pytest.mark.slow
def test_a_parallel_burst_gets_at_most_the_limit_of_guesses(
    server, transactional_db, django_user_model, monkeypatch
):
    """Every guess of a burst reaches the server before any is checked: the
    password checks are held until each request is either being checked or
    answered, so all of them passed the throttle's look at the count at the
    same time. Only `AXES_FAILURE_LIMIT` passwords may be checked."""
    from axes.models import AccessAttempt  # type: ignore[import-untyped]

    django_user_model.objects.create_user("burst", password=PASSWORD)
    limit = settings.AXES_FAILURE_LIMIT
    assert BURST > 2 * limit
    checks = []
    answered = []
    lock = threading.Lock()
    release = threading.Event()
    real_check = django_user_model.check_password

    def held_check(user, raw_password):
        with lock:
            checks.append(raw_password)
        release.wait(60)
        return real_check(user, raw_password)

    monkeypatch.setattr(django_user_model, "check_password", held_check)
    clients = []
    for _ in range(BURST):
        client = httpx.Client(base_url=server.url, timeout=90)
        client.get("/accounts/login/")
        clients.append(client)

    def guess(n: int) -> int:
        client = clients[n]
        response = client.post(
            "/accounts/login/",
            data={
                "username": "burst",
                "password": f"wrong-{n}",
                "csrfmiddlewaretoken": client.cookies["csrftoken"],
            },
            headers={"Referer": server.url + "/accounts/login/"},
        )
        with lock:
            answered.append(response.status_code)
        return response.status_code

    try:
        with ThreadPoolExecutor(BURST) as pool:
            futures = [pool.submit(guess, n) for n in range(BURST)]

            def settled() -> bool:
                with lock:
                    return len(checks) + len(answered) == BURST

            wait_until(settled, timeout=60)
            release.set()
            codes = [f.result(90) for f in futures]
    finally:
        release.set()
        for client in clients:
            client.close()
    assert len(checks) <= limit, f"{len(checks)} guesses checked, limit {limit}"
    assert codes.count(429) >= BURST - limit
    # Each checked guess is recorded (refused ones too: axes restarts the
    # cool-off on a try during a lock-out).
    failures = AccessAttempt.objects.filter(username="burst")
    assert sum(a.failures_since_start for a in failures) >= len(checks)
    # Locked now, even with the right password.
    assert login(server, "/accounts/login/", "burst", PASSWORD).status_code == 429
