"""Deployment hardening: `check --deploy` is clean with the documented TLS
settings, and local state (database, secret key, exports) is private from
its first byte.
"""

import json
import os
import stat
import subprocess
import sys

import pytest
from django.conf import settings

from chat.models import ChatSession, Message

# The environment docs/security.md tells an operator behind a TLS proxy to set.
DEPLOY_ENV = {
    "HERMES_SECURE_COOKIES": "true",
    "HERMES_SSL_REDIRECT": "true",
    "HERMES_HSTS_SECONDS": "31536000",
    "HERMES_HSTS_INCLUDE_SUBDOMAINS": "true",
    "HERMES_HSTS_PRELOAD": "true",
    "HERMES_SECURE_PROXY_SSL_HEADER": "HTTP_X_FORWARDED_PROTO,https",
    "HERMES_ALLOWED_HOSTS": "chat.example.org",
    "HERMES_CSRF_TRUSTED_ORIGINS": "https://chat.example.org",
}


def manage(*args: str, env: dict, umask: int | None = None):
    # The child uses the SQLite file it is given, never the suite's DATABASE_URL
    # (CI's PostgreSQL pass sets one, naming a database nobody made for this).
    base = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PYTEST", "HERMES_"))
        and k not in ("DATABASE_URL", "REDIS_URL")
    }
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=settings.BASE_DIR,
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=300,
        umask=-1 if umask is None else umask,
    )


@pytest.mark.slow
def test_check_deploy_is_clean_with_the_documented_settings(tmp_path):
    private = {"HERMES_VAR_DIR": str(tmp_path)}
    done = manage(
        "check", "--deploy", "--fail-level", "WARNING", env={**DEPLOY_ENV, **private}
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "no issues" in done.stdout
    # Without them the same check complains about each.
    bare = manage("check", "--deploy", "--fail-level", "WARNING", env=private)
    assert bare.returncode != 0
    for code in ["W004", "W008", "W012", "W016"]:
        assert f"security.{code}" in bare.stderr + bare.stdout, code


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


@pytest.mark.slow
def test_database_and_secret_key_are_created_0600_even_with_umask_0(tmp_path):
    db = tmp_path / "db.sqlite3"
    env = {
        "HERMES_VAR_DIR": str(tmp_path / "var"),
        "HERMES_SQLITE_PATH": str(db),
    }
    done = manage("migrate", "--noinput", env=env, umask=0)
    assert done.returncode == 0, done.stderr[-2000:]
    assert mode(db) == 0o600
    assert mode(tmp_path / "var" / "secret_key") == 0o600
    assert mode(tmp_path / "var") == 0o700
    for extra in tmp_path.glob("db.sqlite3-*"):  # WAL and shared memory
        assert mode(extra) == 0o600, extra.name


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_exports_are_created_0600(tmp_path, alice):
    session = ChatSession.objects.create(owner=alice[0], title="private")
    Message.objects.create(session=session, role="user", content="my secret plan")
    out = tmp_path / "export.jsonl"
    done = manage(
        "export_session",
        str(session.pk),
        "--output",
        str(out),
        env=_same_database(),
        umask=0,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert mode(out) == 0o600
    assert "my secret plan" in out.read_text()
    assert json.loads(out.read_text().splitlines()[0])


def _same_database() -> dict:
    from hermes_testing.harness import subprocess_env

    child = subprocess_env()
    return {k: child[k] for k in ("HERMES_SQLITE_PATH", "DATABASE_URL") if k in child}
