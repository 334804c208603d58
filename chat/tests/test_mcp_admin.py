"""The admin's page of MCP tool servers (chat.mcp_admin): each configured
server with the tools it lists now, secrets left out."""

import socket
import sys

from django.conf import settings as django_settings

SECRET = "s3cret-value-of-the-env"


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


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
    response = admin_client.get("/admin/mcp-servers/")
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
