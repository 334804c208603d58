"""A small MCP tool server for tests, over stdio or streamable HTTP.

Run as ``python -m hermes_testing.mcp_server stdio`` or
``python -m hermes_testing.mcp_server http PORT [TOKEN]`` (with a token, every
HTTP request must carry ``Authorization: Bearer TOKEN``). Its tools stand for the
servers Hermes must survive: ``echo`` and ``add`` work, ``hang`` never
answers, ``crash`` ends the server's process mid-call, ``huge`` answers far
more text than any model should read, ``fail`` answers a tool error. No
Django imports: it runs as a process of its own.
"""

from __future__ import annotations

import asyncio
import os
import sys
from typing import Any, Literal

import uvicorn
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

HUGE_CHARS = 2_000_000  # far past any output cap Hermes keeps


def echo(text: str) -> str:
    """Answer the text it was given."""
    return f"echo: {text}"


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


async def hang() -> str:
    """Never answers."""
    await asyncio.Event().wait()
    return "unreachable"


def crash() -> str:
    """Ends the server's process in the middle of the call."""
    os._exit(3)


def huge() -> str:
    """Answers two million characters."""
    return "x" * HUGE_CHARS


def fail(reason: str = "it went wrong") -> str:
    """Answers a tool error."""
    raise ToolError(reason)


def pid() -> int:
    """The process id of the server, to tell restarts apart."""
    return os.getpid()


def build(log_level: Literal["INFO", "WARNING"]) -> MCPServer:
    """The server with its tools registered."""
    server = MCPServer("hermes-test-tools", log_level=log_level)
    for tool in (echo, add, hang, crash, huge, fail, pid):
        server.tool(description=tool.__doc__)(tool)
    return server


def _require_token(app: Any, token: str) -> Any:
    """The ASGI app, answering 401 to an HTTP request without ``Bearer token``."""
    expected = f"Bearer {token}".encode()

    async def guarded(scope: dict, receive: Any, send: Any) -> None:
        if (
            scope["type"] == "http"
            and dict(scope["headers"]).get(b"authorization") != expected
        ):
            await send({"type": "http.response.start", "status": 401, "headers": []})
            await send({"type": "http.response.body", "body": b"no token"})
            return
        await app(scope, receive, send)

    return guarded


def main(argv: list[str]) -> None:
    if argv[:1] != ["http"]:
        build("WARNING").run("stdio")
        return
    app = build("INFO").streamable_http_app()
    if len(argv) > 2:  # http PORT TOKEN: every request must carry the token
        app = _require_token(app, argv[2])
    # uvicorn says "Uvicorn running on" when it is ready.
    uvicorn.run(app, host="127.0.0.1", port=int(argv[1]), log_level="info")


if __name__ == "__main__":
    main(sys.argv[1:])
