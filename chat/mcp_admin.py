"""The admin's read-only page of MCP tool servers: `/admin/mcp-servers/`
(docs/operating.md, "MCP tool servers").

Each configured server with its transport, bounds and approval policy, and the
tools it lists now, from a session opened for the page and closed again. An
entry's `env` values and any credential in its URL or arguments are never
shown (chat.redact).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from asgiref.sync import async_to_sync
from django.contrib import admin
from django.http import HttpRequest, HttpResponse
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


def mcp_servers_view(request: HttpRequest) -> HttpResponse:
    context = {
        **admin.site.each_context(request),
        "title": "MCP tool servers",
        "reports": async_to_sync(server_reports)(),
    }
    return TemplateResponse(request, "admin/mcp_servers.html", context)
