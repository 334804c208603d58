"""The MCP tool servers Hermes is configured with (``HERMES_MCP_SERVERS``),
and how a session to one is opened (docs/operating.md, "MCP tool servers").

Entries are checked by ``chat.checks.mcp_server_problems``; one with problems
is left out. A stdio server gets only its entry's ``env`` over the SDK's
minimal environment; an HTTP server's ``headers_env`` names, per header, the
variable holding its value (a token), read when a session opens, so a secret
is never in the settings, the admin or the logs.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import create_mcp_http_client, streamable_http_client

from .checks import mcp_server_problems

DEFAULT_TIMEOUT_S = 30.0
DEFAULT_CONNECT_TIMEOUT_S = 10.0
DEFAULT_MAX_OUTPUT_CHARS = 20_000
# Larger caps are lowered to this: a tool result is journaled whole in one
# event (as chat.tools.MAX_RESULT_CHARS for the built-ins).
MAX_OUTPUT_CHARS = 20_000


class MissingVariable(Exception):
    """A variable ``headers_env`` names is not set in the environment."""


@dataclass(frozen=True)
class ServerConfig:
    """One valid ``HERMES_MCP_SERVERS`` entry (hashable: it keys its sessions)."""

    name: str
    command: str = ""
    args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    cwd: str | None = None
    url: str = ""
    headers_env: tuple[tuple[str, str], ...] = ()
    timeout_s: float = DEFAULT_TIMEOUT_S
    connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S
    max_output_chars: int = DEFAULT_MAX_OUTPUT_CHARS
    approval: str = "allow"
    #: Per-tool policies over ``approval``, by the server's own tool name.
    tool_approval: tuple[tuple[str, str], ...] = ()

    def policy(self, tool: str) -> str:
        """``allow``, ``ask`` or ``deny`` for the server's tool ``tool``."""
        return dict(self.tool_approval).get(tool, self.approval)

    @property
    def offers_any(self) -> bool:
        """Whether any tool of the server may be offered (not all denied)."""
        return self.approval != "deny" or any(
            policy != "deny" for _, policy in self.tool_approval
        )

    @property
    def transport(self) -> str:
        return "stdio" if self.command else "http"

    @classmethod
    def from_entry(cls, item: dict[str, Any]) -> ServerConfig:
        return cls(
            name=item["name"],
            command=item.get("command", ""),
            args=tuple(item.get("args", ())),
            env=tuple(sorted(item.get("env", {}).items())),
            cwd=item.get("cwd"),
            url=item.get("url", ""),
            headers_env=tuple(sorted(item.get("headers_env", {}).items())),
            timeout_s=float(item.get("timeout_s", DEFAULT_TIMEOUT_S)),
            connect_timeout_s=float(
                item.get("connect_timeout_s", DEFAULT_CONNECT_TIMEOUT_S)
            ),
            max_output_chars=min(
                int(item.get("max_output_chars", DEFAULT_MAX_OUTPUT_CHARS)),
                MAX_OUTPUT_CHARS,
            ),
            approval=item.get("approval", "allow"),
            tool_approval=tuple(sorted(item.get("tool_approval", {}).items())),
        )

    def client(self) -> Client:
        """An SDK client of this server, not yet connected (no response cache:
        a run's start asks for the tools as they are now)."""
        if self.command:
            stdio = StdioServerParameters(
                command=self.command,
                args=list(self.args),
                env=dict(self.env) or None,
                cwd=self.cwd,
            )
            return Client(stdio, cache=None)
        if not self.headers_env:
            return Client(self.url, cache=None)
        return Client(_http_transport(self.url, self._headers()), cache=None)

    def _headers(self) -> dict[str, str]:
        headers = {}
        for header, variable in self.headers_env:
            value = os.environ.get(variable)
            if value is None:
                raise MissingVariable(f"the variable {variable} is not set")
            headers[header] = value
        return headers


@asynccontextmanager
async def _http_transport(url: str, headers: dict[str, str]) -> AsyncIterator[Any]:
    """Streamable HTTP with headers of our own: the SDK leaves a client it was
    given open, so this one is closed here."""
    async with create_mcp_http_client(headers=headers) as http:
        async with streamable_http_client(url, http_client=http) as streams:
            yield streams


def configured_servers() -> list[ServerConfig]:
    """The usable entries of ``HERMES_MCP_SERVERS``, in order, names unique."""
    entries = settings.HERMES.get("MCP_SERVERS") or []
    if not isinstance(entries, list):
        return []
    servers: dict[str, ServerConfig] = {}
    for item in entries:
        if not mcp_server_problems(item):
            server = ServerConfig.from_entry(item)
            servers.setdefault(server.name, server)  # the check warns of a repeat
    return list(servers.values())
