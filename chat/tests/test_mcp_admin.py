"""The admin's page of MCP tool servers (chat.mcp_admin): each configured
server, and on the page's explicit action the tools it lists now, secrets
left out; for superusers only."""

import socket
import sys

import pytest
from django.conf import settings as django_settings

SECRET = "s3cret-value-of-the-env"


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.slow
def test_the_page_lists_servers_and_their_tools_without_secrets(admin_client, settings):
    url = f"http://user:hunter22@127.0.0.1:{_closed_port()}/mcp"
    settings.HERMES = {
        **settings.HERMES,
        "MCP_SERVERS": [
            {
                "name": "local",
                "command": sys.executable,
                "args": ["-m", "hermes_testing.mcp_server", "stdio"],
                "cwd": str(django_settings.BASE_DIR),
                "env": {"TOOL_TOKEN": SECRET},
                "approval": "ask",
                "tool_approval": {"add": "allow"},
            },
            {"name": "gone", "url": url, "connect_timeout_s": 2},
        ],
    }
    response = admin_client.post("/admin/mcp-servers/")
    assert response.status_code == 200
    page = response.content.decode()
    reports = {r.server.name: r for r in response.context["reports"]}
    assert [(name, policy) for name, _, _, policy in reports["local"].offered][:2] == [
        ("local__echo", "ask"),
        ("local__add", "allow"),
    ]
    assert "<code>local__add</code>" in page and "Add two integers." in page
    assert "approval: ask" in page
    assert "TOOL_TOKEN (values not shown)" in page and SECRET not in page
    assert reports["gone"].tools == [] and reports["gone"].error
    assert "hunter22" not in page and f"127.0.0.1:{url.split(':')[-1]}" in page


def test_the_page_is_for_staff_only(client, django_user_model):
    client.force_login(django_user_model.objects.create_user("carol"))
    response = client.get("/admin/mcp-servers/")
    assert response.status_code == 302 and "/admin/login/" in response["Location"]


def _staff(django_user_model, name: str, **flags):
    return django_user_model.objects.create_user(name, is_staff=True, **flags)


def test_staff_without_superuser_may_not_see_or_start_servers(
    client, django_user_model, settings, tmp_path
):
    marker = tmp_path / "started"
    settings.HERMES = {**settings.HERMES, "MCP_SERVERS": [_marking_server(marker)]}
    client.force_login(_staff(django_user_model, "stan"))
    for method in (client.get, client.post):
        response = method("/admin/mcp-servers/")
        assert response.status_code == 403
        assert b"mark" not in response.content
    assert not marker.exists()


def _marking_server(marker) -> dict:
    """A stdio entry whose process leaves `marker` behind when started."""
    return {
        "name": "mark",
        "command": sys.executable,
        "args": ["-c", f"open({str(marker)!r}, 'w').close()"],
        "connect_timeout_s": 10,
    }


def test_a_plain_view_starts_no_server_and_the_action_does(
    admin_client, settings, tmp_path
):
    marker = tmp_path / "started"
    settings.HERMES = {**settings.HERMES, "MCP_SERVERS": [_marking_server(marker)]}
    shown = admin_client.get("/admin/mcp-servers/")
    assert shown.status_code == 200
    page = shown.content.decode()
    assert "mark" in page and 'data-testid="mcp-list-tools"' in page
    assert not marker.exists()  # the page was drawn without starting it
    listed = admin_client.post("/admin/mcp-servers/")
    assert listed.status_code == 200
    # The process ran (and ended at once: the server is reported unavailable).
    assert marker.exists()
    assert listed.context["reports"][0].error
