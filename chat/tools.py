"""Tools the model may call (DESIGN §6, "Tools").

A process-wide registry of :class:`Tool`. The built-ins touch nothing outside
the process: ``current_time`` and ``calculator`` (arithmetic parsed with
``ast``, never ``eval``). A tool that touches the machine (files, shell,
network) must be registered with ``safe=False`` and stays off unless the admin
lists it in ``settings.HERMES["TOOLS"]``; when that setting is absent, exactly
the safe built-ins are enabled.

``run_tool`` never raises for a tool's failure: it returns ``(text, True)`` so
the model sees the error and the turn goes on.
"""

from __future__ import annotations

import ast
import asyncio
import inspect
import json
import logging
import math
import operator
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from django.conf import settings

logger = logging.getLogger(__name__)

TOOL_TIMEOUT_S = 30.0  # a tool is a step of a live turn; the user is waiting
MAX_RESULT_CHARS = 20_000  # keeps one tool result from flooding the context
MAX_EXPRESSION_CHARS = 500
MAX_POWER_BITS = 100_000  # 2**100000 is fine; 9**9**9 would hang the worker

ToolFunc = Callable[[dict[str, Any]], Any | Awaitable[Any]]


class ToolError(Exception):
    """A failure whose message is meant for the model (bad arguments …)."""


@dataclass(frozen=True)
class Tool:
    """A callable the model may invoke; ``parameters`` is its JSON schema."""

    name: str
    description: str
    func: ToolFunc
    parameters: dict[str, Any] = field(
        default_factory=lambda: {"type": "object", "properties": {}}
    )
    #: False for anything that touches the machine: never enabled by default.
    safe: bool = True

    def schema(self) -> dict[str, Any]:
        """The OpenAI ``tools`` entry for this tool."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": self.parameters,
            },
        }


_REGISTRY: dict[str, Tool] = {}


def register(tool: Tool, *, replace: bool = False) -> Tool:
    """Add ``tool`` to the registry; a second tool of the same name is an error."""
    if tool.name in _REGISTRY and not replace:
        raise ValueError(f"tool {tool.name!r} is already registered")
    _REGISTRY[tool.name] = tool
    return tool


def unregister(name: str) -> None:
    _REGISTRY.pop(name, None)


def get_tool(name: str) -> Tool | None:
    return _REGISTRY.get(name)


def enabled_tool_names() -> list[str]:
    """Names enabled by ``HERMES["TOOLS"]``, else every safe registered tool."""
    hermes = getattr(settings, "HERMES", {}) if settings.configured else {}
    configured = hermes.get("TOOLS")
    if configured is None:
        return [name for name, tool in _REGISTRY.items() if tool.safe]
    return [name for name in configured if name in _REGISTRY]


def tools_schema(names: Collection[str] | None = None) -> list[dict[str, Any]]:
    """OpenAI ``tools`` JSON for ``names`` (default: the enabled tools)."""
    chosen = enabled_tool_names() if names is None else names
    return [_REGISTRY[name].schema() for name in chosen if name in _REGISTRY]


async def run_tool(
    name: str,
    args_json: str,
    *,
    enabled: Collection[str] | None = None,
    timeout: float = TOOL_TIMEOUT_S,
) -> tuple[str, bool]:
    """Run tool ``name`` on its JSON arguments; returns ``(result, is_error)``.

    A tool that is unknown or not enabled (the model may invent names), bad
    JSON, a ``ToolError``, any other exception and a timeout all come back as
    ``is_error=True`` with a message for the model. Sync tools run in a
    thread so a slow one cannot stall the event loop.
    """
    allowed = enabled_tool_names() if enabled is None else enabled
    tool = _REGISTRY.get(name)
    if tool is None or name not in allowed:
        return f"error: no tool named {name!r} is available", True
    try:
        args = json.loads(args_json) if args_json.strip() else {}
    except ValueError as exc:
        return f"error: arguments are not valid JSON ({exc})", True
    if not isinstance(args, dict):
        return "error: arguments must be a JSON object", True
    try:
        if inspect.iscoroutinefunction(tool.func):
            result = await asyncio.wait_for(tool.func(args), timeout)
        else:
            result = await asyncio.wait_for(asyncio.to_thread(tool.func, args), timeout)
    except ToolError as exc:
        return f"error: {exc}", True
    except TimeoutError:
        return f"error: {name} took longer than {timeout:g} s", True
    except Exception as exc:  # a tool's bug is reported to the model, not the run
        logger.exception("tool %s failed", name)
        return f"error: {type(exc).__name__}: {exc}", True
    text = result if isinstance(result, str) else json.dumps(result, default=str)
    if len(text) > MAX_RESULT_CHARS:
        text = text[:MAX_RESULT_CHARS] + f"\n[truncated at {MAX_RESULT_CHARS} chars]"
    return text, False


# --- built-ins -------------------------------------------------------------------


def current_time(args: dict[str, Any]) -> str:
    """The current time, ISO 8601, in ``timezone`` (IANA name, default UTC)."""
    zone_name = args.get("timezone") or "UTC"
    try:
        zone = UTC if zone_name == "UTC" else ZoneInfo(str(zone_name))
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise ToolError(f"unknown time zone {zone_name!r}") from exc
    now = datetime.now(zone)
    return f"{now.isoformat(timespec='seconds')} ({now:%A}, {zone_name})"


_BINARY: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY: dict[type[ast.unaryop], Callable[[Any], Any]] = {
    ast.UAdd: operator.pos,
    ast.USub: operator.neg,
}
_FUNCTIONS: dict[str, Callable[..., Any]] = {
    "abs": abs,
    "round": round,
    "min": min,
    "max": max,
    "sqrt": math.sqrt,
    "log": math.log,
    "exp": math.exp,
    "sin": math.sin,
    "cos": math.cos,
    "tan": math.tan,
}
_CONSTANTS = {"pi": math.pi, "e": math.e}


def calculate(expression: str) -> int | float:
    """Evaluate arithmetic: numbers, + - * / // % **, parentheses, a few
    math functions and ``pi``/``e``. Anything else is a ``ToolError``."""
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise ToolError(f"expression longer than {MAX_EXPRESSION_CHARS} chars")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as exc:
        raise ToolError(f"not an arithmetic expression: {exc.msg}") from exc
    try:
        return _eval(tree.body)
    except (ArithmeticError, ValueError, TypeError) as exc:
        raise ToolError(f"{type(exc).__name__}: {exc}") from exc


def _eval(node: ast.AST) -> Any:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.Name) and node.id in _CONSTANTS:
        return _CONSTANTS[node.id]
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_eval(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Pow):
            _check_power(left, right)
        return _BINARY[type(node.op)](left, right)
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in _FUNCTIONS
        and not node.keywords
    ):
        return _FUNCTIONS[node.func.id](*(_eval(arg) for arg in node.args))
    raise ToolError(f"unsupported syntax: {ast.dump(node)[:80]}")


def _check_power(base: Any, exponent: Any) -> None:
    ints = isinstance(base, int) and isinstance(exponent, int)
    if ints and abs(base) > 1 and exponent * math.log2(abs(base)) > MAX_POWER_BITS:
        raise ToolError("result too large")


def calculator(args: dict[str, Any]) -> str:
    expression = args.get("expression")
    if not isinstance(expression, str) or not expression.strip():
        raise ToolError("give the arithmetic as a string in 'expression'")
    result = calculate(expression)
    try:
        return str(result)
    except ValueError as exc:  # int too long to print (PEP 651 limit)
        raise ToolError("result too large to print") from exc


register(
    Tool(
        name="current_time",
        description="Current date and time, ISO 8601, in an IANA time zone.",
        func=current_time,
        parameters={
            "type": "object",
            "properties": {
                "timezone": {
                    "type": "string",
                    "description": "IANA zone such as Europe/Paris; default UTC",
                }
            },
        },
    )
)
register(
    Tool(
        name="calculator",
        description=(
            "Exact arithmetic: + - * / // % **, parentheses, "
            "abs round min max sqrt log exp sin cos tan, pi, e."
        ),
        func=calculator,
        parameters={
            "type": "object",
            "properties": {
                "expression": {"type": "string", "description": "e.g. (2+3)*4**2"}
            },
            "required": ["expression"],
        },
    )
)
