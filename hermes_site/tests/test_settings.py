"""Settings in one place: every variable is read by hermes_site/settings.py."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from hermes_site.database_url import postgres_url, unix_socket_dir
from hermes_testing.private_servers import PrivatePostgres

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("chat", "journal", "hermes_site")
# Reads allowed outside settings.py: Django's settings-module default, and the
# provider key looked up by the variable name HERMES_PROVIDERS gives.
ALLOWED = {
    "hermes_site/asgi.py": 'os.environ.setdefault("DJANGO_SETTINGS_MODULE"',
    # Secrets named by a variable are read where they are used, so they never
    # sit in the settings object: a provider's key, an MCP server's headers.
    "chat/providers/registry.py": "os.environ.get(self.api_key_env",
    "chat/mcp_servers.py": "os.environ.get(variable)",
    # check_upstream's --api-key-env names the variable holding the key.
    "chat/management/commands/check_upstream.py": "os.environ.get(options",
}
ENV_READ = re.compile(r"os\.environ|getenv\(|environ\.Env\(")


def _manage(*args: str, **env: str) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if not k.startswith("HERMES_")}
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_product_code_reads_the_environment_only_in_settings():
    offenders = []
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            rel = path.relative_to(ROOT).as_posix()
            if "/tests/" in rel or "/testing" in rel or "/migrations/" in rel:
                continue  # test harnesses start processes with their own env
            if rel == "hermes_site/settings.py":
                continue
            for number, line in enumerate(path.read_text().splitlines(), 1):
                if ENV_READ.search(line) and ALLOWED.get(rel, "\0") not in line:
                    offenders.append(f"{rel}:{number}: {line.strip()}")
    assert offenders == []


SHOW = (
    "from django.conf import settings as s; h = s.HERMES;"
    "print('=>', h['OPEN_SIGNUP'], h['MODELS'], [p['name'] for p in h['PROVIDERS']])"
)


def _shown(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 0, result.stderr
    return next(x for x in result.stdout.splitlines() if x.startswith("=> "))[3:]


def test_every_variable_settings_read_is_in_the_readme_table():
    source = (ROOT / "hermes_site" / "settings.py").read_text()
    read = set(re.findall(r'env(?:\.\w+)?\(\s*"([A-Z][A-Z0-9_]+)"', source))
    assert len(read) > 30
    readme = (ROOT / "README.md").read_text()
    rows = [line for line in readme.splitlines() if line.startswith("| `")]
    documented = {name for row in rows for name in re.findall(r"`([A-Z_]+)`", row)}
    assert sorted(read - documented) == []


@pytest.mark.slow
def test_variables_reach_settings_parsed():
    assert _shown(_manage("shell", "-c", SHOW)) == "False [] []"
    shown = _manage(
        "shell",
        "-c",
        SHOW,
        HERMES_OPEN_SIGNUP="yes",
        HERMES_MODELS=" a, b ,",
        HERMES_PROVIDERS='[{"name": "local", "base_url": "http://127.0.0.1:9/v1"}]',
    )
    assert _shown(shown) == "True ['a', 'b'] ['local']"


def test_providers_that_are_not_json_stop_startup_naming_the_variable():
    result = _manage("check", HERMES_PROVIDERS='[{"name": ')
    assert result.returncode != 0
    assert "HERMES_PROVIDERS is not valid JSON" in result.stderr


@pytest.mark.slow
def test_a_provider_missing_a_key_fails_the_system_check_by_name():
    result = _manage("check", HERMES_PROVIDERS='[{"name": "local"}]')
    assert result.returncode != 0
    assert "hermes.E002" in result.stderr
    assert "HERMES_PROVIDERS[0] needs 'base_url'" in result.stderr


def test_a_socket_url_as_libpq_writes_it_names_the_socket_directory():
    assert (
        unix_socket_dir("postgres://u@%2Frun%2FPostgreSQL:5433/h") == "/run/PostgreSQL"
    )
    assert unix_socket_dir("postgresql://%2ftmp%2fpg/h") == "/tmp/pg"
    assert unix_socket_dir("postgres://u:p@127.0.0.1:5432/h") is None
    assert unix_socket_dir("postgres://u@/run/postgresql/h") is None  # environ's own
    assert unix_socket_dir("sqlite:////tmp/%2Fx.db") is None
    assert unix_socket_dir("") is None
    assert unix_socket_dir(postgres_url("u", "/run/pg", 5432, "h")) == "/run/pg"


SHOW_CONNECTION = (
    "from django.db import connection; connection.ensure_connection();"
    "print('=>', connection.connection.info.host, connection.connection.info.port)"
)


@pytest.mark.chaos
@pytest.mark.skipif(
    not PrivatePostgres.available(), reason="PostgreSQL server binaries are missing"
)
def test_postgresql_is_reached_over_its_unix_socket():
    with PrivatePostgres() as pg:
        shown = _manage("shell", "-c", SHOW_CONNECTION, DATABASE_URL=pg.socket_url)
        assert _shown(shown) == f"{pg.socket_dir} {pg.port}"
