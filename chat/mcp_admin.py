"""The admin's read-only page of MCP tool servers: `/admin/mcp-servers/`
(docs/operating.md, "MCP tool servers").

Each configured server with its transport, bounds and approval policy. The
tools each server lists are asked for only on an explicit action (the page's
*List tools now* button, a POST), from a session opened for it and closed
again: a stdio server is a process this web process starts, so a plain view
(a reload, a prefetch, a crawler of the admin) starts none. The page is for
superusers only (docs/security.md, "The MCP servers page"): it shows commands
and starts processes. An entry's `env` values and any credential in its URL
or arguments are never shown (chat.redact).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from asgiref.sync import async_to_sync
from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseNotAllowed
from django.template.response import TemplateResponse
from mcp.types import Tool as MCPTool

from .mcp_servers import ServerConfig, configured_servers
from .mcp_tools import SEPARATOR, ServerUnavailable, list_server_tools
from .redact import redact


@dataclass(frozen=True)
class ServerReport:
    """What the page shows of one configured server."""

    server: ServerConfig
    tools: list[MCPTool] = field(default_factory=list)
    error: str = ""

    @property
    def target(self) -> str:
        if self.server.url:
            return redact(_without_userinfo(self.server.url))
        return redact(" ".join((self.server.command, *self.server.args)))

    @property
    def env_names(self) -> list[str]:
        return [name for name, _ in self.server.env]

    @property
    def header_names(self) -> list[str]:
        """Headers and the variables holding them, never their values."""
        return [f"{h} from {v}" for h, v in self.server.headers_env]

    @property
    def offered(self) -> list[tuple[str, str, list[str], str]]:
        """(name the model sees, description, parameter names, policy) of
        each tool the server lists."""
        return [
            (
                f"{self.server.name}{SEPARATOR}{tool.name}",
                tool.description or "",
                sorted((tool.input_schema or {}).get("properties", {})),
                self.server.policy(tool.name),
            )
            for tool in self.tools
        ]


async def server_reports() -> list[ServerReport]:
    """Every configured server, asked for its tools at once."""

    async def report(server: ServerConfig) -> ServerReport:
        try:
            return ServerReport(server, await list_server_tools(server))
        except ServerUnavailable as exc:
            return ServerReport(server, error=str(exc))

    return list(await asyncio.gather(*(report(s) for s in configured_servers())))


def _without_userinfo(url: str) -> str:
    scheme, sep, rest = url.partition("://")
    host, slash, path = rest.partition("/")
    return f"{scheme}{sep}{host.rpartition('@')[2]}{slash}{path}"


def may_see_servers(user) -> bool:
    """Superusers only: staff without it see neither the commands nor start
    the servers (the admin's own check lets every staff account in)."""
    return bool(user.is_active and user.is_superuser)


def mcp_servers_view(request: HttpRequest) -> HttpResponse:
    """GET: the configured servers, none started. POST (*List tools now*,
    CSRF-checked like any admin form): each server asked for its tools."""
    if not may_see_servers(request.user):
        raise PermissionDenied("the MCP servers page is for superusers")
    if request.method not in ("GET", "HEAD", "POST"):
        return HttpResponseNotAllowed(["GET", "HEAD", "POST"])
    listed = request.method == "POST"
    reports = (
        async_to_sync(server_reports)()
        if listed
        else [ServerReport(server) for server in configured_servers()]
    )
    context = {
        **admin.site.each_context(request),
        "title": "MCP tool servers",
        "reports": reports,
        "listed": listed,
    }
    return TemplateResponse(request, "admin/mcp_servers.html", context)
