"""MCP tool servers: their tools offered to the model beside the built-ins
(docs/architecture.md, "MCP tool servers").

Servers come from ``HERMES_MCP_SERVERS`` (checked by ``chat.checks``; an entry
with problems is left out): a stdio ``command`` the worker starts, or a
streamable HTTP ``url``. Through the official ``mcp`` SDK:

1. a server is connected lazily, on the first run that needs its tools, and
   the session is kept for the worker's later runs (one per event loop);
2. its tools are listed at each run's start and offered as
   ``<server>__<tool>`` with their input schemas (bounded in count and size);
   a kept session that cannot list them (the server died while idle) is
   replaced then;
3. a call is bounded by the server's ``timeout_s`` and its answer by
   ``max_output_chars``; a timeout, a tool error, an unreachable server or a
   session that died (the process crashed) all answer the model a tool error,
   never fail the run; a dead session is replaced on the next call;
4. ``approval`` (per server, and per tool in ``tool_approval``): ``allow``
   runs calls, ``deny`` does not offer the tool, ``ask`` offers it and each
   call waits for a person's decision (chat.approvals) before it reaches
   this module.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
import weakref
from dataclasses import dataclass, field
from typing import Any, Final

from mcp import Client, MCPError
from mcp.types import CONNECTION_CLOSED, CallToolResult, TextContent
from mcp.types import Tool as MCPTool

from .mcp_servers import ServerConfig, configured_servers
from .redact import redact

logger = logging.getLogger(__name__)

SEPARATOR: Final = "__"  # <server>__<tool>: OpenAI names allow [A-Za-z0-9_-]
MAX_TOOLS_PER_SERVER = 64  # a server listing more offers only its first ones
MAX_SCHEMA_BYTES = 16 * 1024  # one tool's input schema, as JSON
MAX_DESCRIPTION_CHARS = 1024  # each description is sent with every model call
MAX_LIST_PAGES = 8  # tools/list pages read per session: a paginator cannot loop
CONNECT_RETRY_S = 10.0  # a server that could not be reached is not retried sooner


class ServerUnavailable(Exception):
    """The server could not be reached or its session could not start."""


@dataclass
class _Session:
    """One server's MCP session in one event loop, held open by a task of its
    own: the SDK's task groups must be entered and left by the same task."""

    server: ServerConfig
    client: Client | None = None
    tools: dict[str, MCPTool] = field(default_factory=dict)
    task: asyncio.Task | None = None
    closing: asyncio.Event = field(default_factory=asyncio.Event)
    ready: asyncio.Future | None = None

    @property
    def alive(self) -> bool:
        return self.client is not None and not self.closing.is_set()

    async def relist(self) -> bool:
        """List the tools again; False if the server does not answer (it may
        have died while idle). The protocol's ping is gone as of 2026-07-28."""
        client = self.client
        if client is None:
            return False
        try:
            tools = await asyncio.wait_for(
                _list_tools(client), self.server.connect_timeout_s
            )
        except Exception:  # noqa: BLE001 - any failure means: start anew
            self.closing.set()
            return False
        self.tools = tools
        return True

    async def open(self) -> None:
        self.ready = asyncio.get_running_loop().create_future()
        self.task = asyncio.create_task(
            self._hold(), name=f"mcp-session-{self.server.name}"
        )
        try:
            await asyncio.wait_for(
                asyncio.shield(self.ready), self.server.connect_timeout_s
            )
        except TimeoutError:
            await self.close()
            raise ServerUnavailable(
                f"no answer within {self.server.connect_timeout_s:g} s"
            ) from None
        except Exception as exc:
            await self.close()
            raise ServerUnavailable(_describe(exc)) from exc
        except BaseException:  # the run was stopped: the cancel wins, unwaited
            self.task.cancel()  # its own cleanup ends a stdio server's process
            raise

    async def _hold(self) -> None:
        assert self.ready is not None
        try:
            async with self.server.client() as client:
                self.tools = await _list_tools(client)
                self.client = client
                self.ready.set_result(None)
                await self.closing.wait()
        except BaseException as exc:  # noqa: BLE001 - handed to whoever waits
            if not self.ready.done():
                self.ready.set_exception(
                    exc if isinstance(exc, Exception) else ServerUnavailable("stopped")
                )
            if isinstance(exc, Exception):
                logger.info(
                    "MCP server %s session ended: %s", self.server.name, _describe(exc)
                )
            else:
                raise
        finally:
            self.client = None
            self.closing.set()

    async def close(self) -> None:
        """End the session (the SDK stops a stdio server's process)."""
        self.closing.set()
        if self.task is not None and not self.task.done():
            try:
                await asyncio.wait_for(asyncio.shield(self.task), 5.0)
            except (TimeoutError, Exception):  # noqa: BLE001 - closing regardless
                self.task.cancel()
                await asyncio.wait({self.task})


async def _list_tools(client: Client) -> dict[str, MCPTool]:
    tools: dict[str, MCPTool] = {}
    cursor: str | None = None
    for _ in range(MAX_LIST_PAGES):
        page = await client.list_tools(cursor=cursor)
        for tool in page.tools:
            if len(tools) < MAX_TOOLS_PER_SERVER:
                tools.setdefault(tool.name, tool)
        cursor = page.next_cursor
        if cursor is None or len(tools) >= MAX_TOOLS_PER_SERVER:
            break
    return tools


class _Pool:
    """The sessions of one event loop, keyed by server configuration."""

    def __init__(self) -> None:
        self.sessions: dict[ServerConfig, _Session] = {}
        # When a server last failed to connect, and why (repeated until retried).
        self.failed: dict[ServerConfig, tuple[float, str]] = {}
        self.locks: dict[ServerConfig, asyncio.Lock] = {}

    async def session(self, server: ServerConfig, *, relist: bool = False) -> _Session:
        """A live session of ``server``, opened (or reopened) if need be; with
        ``relist`` (a run's start), a kept session lists its tools again, and
        is replaced if it cannot."""
        current = self.sessions.get(server)
        if current is not None and current.alive:
            if not relist or await current.relist():
                return current
        async with self.locks.setdefault(server, asyncio.Lock()):
            current = self.sessions.get(server)
            if current is not None and current.alive:
                return current
            when, why = self.failed.get(server, (0.0, ""))
            if why and time.monotonic() - when < CONNECT_RETRY_S:
                raise ServerUnavailable(why)
            fresh = _Session(server)
            try:
                await fresh.open()
            except ServerUnavailable as exc:
                self.failed[server] = (time.monotonic(), str(exc))
                raise
            self.failed.pop(server, None)
            self.sessions[server] = fresh
            return fresh

    async def close(self) -> None:
        sessions, self.sessions = list(self.sessions.values()), {}
        await asyncio.gather(*(s.close() for s in sessions))


_POOLS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Pool] = (
    weakref.WeakKeyDictionary()
)


def _pool() -> _Pool:
    loop = asyncio.get_running_loop()
    pool = _POOLS.get(loop)
    if pool is None:
        pool = _POOLS[loop] = _Pool()
    return pool


async def close_sessions() -> None:
    """End this event loop's MCP sessions (a worker stopping; tests)."""
    pool = _POOLS.pop(asyncio.get_running_loop(), None)
    if pool is not None:
        await pool.close()


def owns(name: str) -> bool:
    """Whether a tool name the model called is an MCP tool's."""
    return SEPARATOR in name


async def tools_schema() -> list[dict[str, Any]]:
    """OpenAI ``tools`` entries of every reachable, not denied server.

    Connects the servers that have no session yet, at once; a server that
    cannot be reached offers nothing to this run (logged) and is tried again
    by a later run.
    """
    servers = [s for s in configured_servers() if s.offers_any]
    sessions = await asyncio.gather(
        *(_pool().session(s, relist=True) for s in servers), return_exceptions=True
    )
    schema: list[dict[str, Any]] = []
    for server, session in zip(servers, sessions, strict=True):
        if isinstance(session, BaseException):
            logger.warning("MCP server %s left out: %s", server.name, session)
            continue
        for tool in session.tools.values():
            entry = _entry(server, tool) if server.policy(tool.name) != "deny" else None
            if entry is not None:
                schema.append(entry)
    return schema


def _entry(server: ServerConfig, tool: MCPTool) -> dict[str, Any] | None:
    name = f"{server.name}{SEPARATOR}{tool.name}"
    parameters = tool.input_schema or {"type": "object", "properties": {}}
    if not _valid_tool_name(name):
        logger.warning("MCP tool %r left out: not a usable tool name", name)
        return None
    if len(json.dumps(parameters)) > MAX_SCHEMA_BYTES:
        logger.warning("MCP tool %s left out: schema too large", name)
        return None
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": (tool.description or tool.title or "")[
                :MAX_DESCRIPTION_CHARS
            ],
            "parameters": parameters,
        },
    }


_TOOL_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")  # what OpenAI-compatible APIs take


def _valid_tool_name(name: str) -> bool:
    return _TOOL_NAME.fullmatch(name) is not None


async def call_tool(name: str, args_json: str) -> tuple[str, bool]:
    """Call MCP tool ``<server>__<tool>``; returns ``(result, is_error)``.

    Never raises for the server's or the tool's failure (module doc, rule 3).
    """
    server_name, _, tool_name = name.partition(SEPARATOR)
    server = next((s for s in configured_servers() if s.name == server_name), None)
    policy = server.policy(tool_name) if server is not None else "deny"
    if server is None or policy == "deny":
        return f"error: no tool named {name!r} is available", True
    try:
        args = json.loads(args_json) if args_json.strip() else {}
    except ValueError as exc:
        return f"error: arguments are not valid JSON ({exc})", True
    if not isinstance(args, dict):
        return "error: arguments must be a JSON object", True
    try:
        session = await _pool().session(server)
    except ServerUnavailable as exc:
        return f"error: tool server {server.name!r} is unavailable: {exc}", True
    if tool_name not in session.tools:
        return f"error: no tool named {name!r} is available", True
    return await _call(session, tool_name, args)


async def _call(session: _Session, tool: str, args: dict) -> tuple[str, bool]:
    server = session.server
    client = session.client
    if client is None:
        return f"error: tool server {server.name!r} closed the session", True
    try:
        result = await asyncio.wait_for(
            client.call_tool(tool, args), timeout=server.timeout_s
        )
    except TimeoutError:
        return (
            f"error: {server.name}{SEPARATOR}{tool} took longer than "
            f"{server.timeout_s:g} s and was stopped",
            True,
        )
    except MCPError as exc:
        if exc.code == CONNECTION_CLOSED:
            session.closing.set()  # the next call starts a new session
            return (
                f"error: tool server {server.name!r} closed the session during "
                "the call (its process may have crashed); it is restarted on "
                "the next call",
                True,
            )
        return f"error: {_describe(exc)}", True
    except Exception as exc:  # the transport's failure, reported to the model
        session.closing.set()
        logger.warning("MCP server %s call failed: %s", server.name, _describe(exc))
        return f"error: tool server {server.name!r} failed: {_describe(exc)}", True
    return _capped(_text_of(result), server.max_output_chars), bool(result.is_error)


def _text_of(result: CallToolResult) -> str:
    """What the model reads of a result: its text blocks; other blocks named."""
    parts = []
    for block in result.content:
        if isinstance(block, TextContent):
            parts.append(block.text)
        else:
            mime = getattr(block, "mime_type", None) or getattr(block, "uri", "")
            parts.append(f"[{block.type} {mime}]".replace(" ]", "]"))
    if not parts and result.structured_content is not None:
        parts.append(json.dumps(result.structured_content, default=str))
    return "\n".join(parts)


def _capped(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return text[:limit] + f"\n[truncated: {limit} of {len(text)} chars]"


def _describe(exc: BaseException) -> str:
    """An exception as one line for the model, the admin and the logs: a URL's
    credentials or a key a server echoed are redacted (chat.redact)."""
    return redact(_name(exc))


def _name(exc: BaseException) -> str:
    if isinstance(exc, BaseExceptionGroup):
        return "; ".join(_name(e) for e in exc.exceptions)
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


async def list_server_tools(server: ServerConfig) -> list[MCPTool]:
    """``server``'s tools, from a session of its own that is closed again
    (for the admin, which must not start a worker's sessions)."""
    session = _Session(server)
    await session.open()  # ServerUnavailable when it cannot
    try:
        return list(session.tools.values())
    finally:
        await session.close()
