"""`make bench` touches only what it made: its own database and key prefix on
the configured servers, removed afterwards; anything else it refuses to drop.

Runs against private PostgreSQL and Redis servers (never the shared ones).
"""

import importlib
import os
import re
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest
import redis

from hermes_testing.private_servers import PrivatePostgres, PrivateRedis

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(
    not (PrivatePostgres.available() and PrivateRedis.available()),
    reason="needs the PostgreSQL server binaries and redis-server",
)


@pytest.fixture
def bench(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    with PrivatePostgres() as pg, PrivateRedis() as rd:
        module = importlib.import_module("common")
        monkeypatch.setattr(module, "DATABASE_URL", pg.url)
        monkeypatch.setattr(module, "REDIS_URL", rd.url)
        yield module, pg, rd


def _databases(url: str) -> set[str]:
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute("SELECT datname FROM pg_database").fetchall()
    return {name for (name,) in rows}


@pytest.mark.slow
def test_scaleout_bench_makes_and_removes_only_its_own_database_and_keys(bench):
    common, pg, rd = bench
    with psycopg.connect(pg.url, autocommit=True) as conn:
        conn.execute("CREATE DATABASE hermes_bench")  # what the old bench dropped
    keys = redis.Redis.from_url(rd.url)
    keys.set("asgi:group:someone-else", "kept")
    keys.set("hermes_bench_1_00000000:x", "kept")
    before = _databases(pg.url)

    with common.prepared("scaleout") as env:
        name = env["DATABASE_URL"].rsplit("/", 1)[1]
        assert re.fullmatch(rf"hermes_bench_{os.getpid()}_[0-9a-f]{{8}}", name)
        assert _databases(pg.url) == before | {name}
        with psycopg.connect(env["DATABASE_URL"]) as conn:  # migrated
            assert conn.execute("SELECT count(*) FROM journal_run").fetchone() == (0,)
        prefix = env["HERMES_CHANNEL_PREFIX"]
        assert prefix == f"{name}:" and env["REDIS_URL"] == rd.url
        joined = subprocess.run(
            [
                sys.executable,
                "manage.py",
                "shell",
                "-c",
                "from asgiref.sync import async_to_sync as s;"
                "from channels.layers import get_channel_layer as g;"
                "s(g().group_add)('bench-group', 'specific.a!b')",
            ],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert joined.returncode == 0, joined.stderr
        ours = [k.decode() for k in keys.scan_iter(match=f"{prefix}*")]
        assert ours == [f"{prefix}:group:bench-group"]

    assert _databases(pg.url) == before
    assert list(keys.scan_iter(match=f"{prefix}*")) == []
    assert keys.get("asgi:group:someone-else") == b"kept"
    assert keys.get("hermes_bench_1_00000000:x") == b"kept"
    keys.close()


@pytest.mark.slow
def test_bench_refuses_to_drop_what_it_did_not_create(bench):
    common, pg, rd = bench
    with psycopg.connect(pg.url, autocommit=True) as conn:
        conn.execute("CREATE DATABASE hermes_bench")
    redis.Redis.from_url(rd.url).set("asgi:x", "kept")
    with pytest.raises(RuntimeError, match="refusing to drop database 'hermes_bench'"):
        common.drop_database("hermes_bench")
    with pytest.raises(RuntimeError, match="refusing to delete keys 'asgi'"):
        common.delete_keys("asgi")
    assert "hermes_bench" in _databases(pg.url)
    assert redis.Redis.from_url(rd.url).get("asgi:x") == b"kept"


def test_scaleout_needs_the_configured_servers(bench, monkeypatch):
    common, _, _ = bench
    assert common.scaleout_available() is None
    monkeypatch.setattr(common, "DATABASE_URL", "")
    assert "set DATABASE_URL" in common.scaleout_available()
