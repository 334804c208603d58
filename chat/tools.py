"""Tools the model may call (docs/architecture.md §6, "Tools").

A process-wide registry of :class:`Tool`. The built-ins touch nothing outside
the process: ``current_time`` and ``calculator`` (arithmetic parsed with
``ast``, never ``eval``). A tool that touches the machine (files, shell,
network) must be registered with ``safe=False`` and stays off unless the admin
lists it in ``settings.HERMES["TOOLS"]``; when that setting is absent, exactly
the safe built-ins are enabled.

``run_tool`` never raises for a tool's failure: it returns ``(text, True)`` so
the model sees the error and the turn goes on. Sync tools run in a tool
process (``chat.toolpool``) that is killed when it runs too long, with bounded
memory and CPU; a model step gets at most ``HERMES_MAX_TOOL_CALLS_PER_STEP``
calls, the rest answer an error. The calculator also bounds every operation's
size before doing it, so an expression is refused rather than computed slowly.
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

from . import toolpool

logger = logging.getLogger(__name__)

MAX_RESULT_CHARS = 20_000  # keeps one tool result from flooding the context
MAX_EXPRESSION_CHARS = 500
# Every integer the calculator makes stays under this many bits: 3,011 digits,
# below Python's 4,300-digit int-to-str limit, and each operation on such
# operands takes microseconds.
MAX_INT_BITS = 10_000
MAX_ROUND_DIGITS = 1_000  # round(x, n): 10**n is computed for negative n
MAX_DEPTH = 50  # nesting of the expression tree; the parser allows ~200 parens

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


def _settings() -> dict[str, Any]:
    return getattr(settings, "HERMES", {}) if settings.configured else {}


def step_cap_refusal(call_index: int) -> str | None:
    """The error for a call past ``HERMES_MAX_TOOL_CALLS_PER_STEP`` (0-based index)."""
    cap = _settings().get("MAX_TOOL_CALLS_PER_STEP", 8)
    if call_index < cap:
        return None
    return (
        f"error: not run: at most {cap} tool calls per model step "
        f"(this was call {call_index + 1}); ask for the rest in the next step"
    )


async def run_tool(
    name: str,
    args_json: str,
    *,
    enabled: Collection[str] | None = None,
    timeout: float | None = None,
    call_index: int = 0,
) -> tuple[str, bool]:
    """Run tool ``name`` on its JSON arguments; returns ``(result, is_error)``.

    A tool that is unknown or not enabled (the model may invent names), bad
    JSON, a ``ToolError``, any other exception, a timeout and a call past the
    per-step cap (``call_index`` counts from 0 within one model step) all come
    back as ``is_error=True`` with a message for the model. Sync tools run in
    a tool process that is killed after ``timeout`` seconds (default
    ``HERMES_TOOL_TIMEOUT_S``), so none can stall the event loop.
    """
    hermes = _settings()
    refusal = step_cap_refusal(call_index)
    if refusal is not None:
        return refusal, True
    if timeout is None:
        timeout = hermes.get("TOOL_TIMEOUT_S", 10.0)
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
            result = await toolpool.run_isolated(tool.func, args, timeout=timeout)
    except ToolError as exc:
        return f"error: {exc}", True
    except TimeoutError:
        return f"error: {name} took longer than {timeout:g} s and was stopped", True
    except MemoryError:
        limit = hermes.get("TOOL_MEMORY_MB")
        return f"error: {name} ran out of memory (limit {limit} MiB)", True
    except toolpool.ToolKilled as exc:
        return f"error: {name} was stopped: {exc}", True
    except Exception as exc:  # a tool's bug is reported to the model, not the run
        logger.warning("tool %s failed: %s: %s", name, type(exc).__name__, exc)
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
    math functions and ``pi``/``e``. Anything else is a ``ToolError``, and so
    is any step whose size is past the bounds above: the check comes before
    the work, so no expression runs long."""
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise ToolError(f"expression longer than {MAX_EXPRESSION_CHARS} chars")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except (SyntaxError, RecursionError, MemoryError) as exc:
        raise ToolError(f"not an arithmetic expression: {exc}") from exc
    try:
        return _eval(tree.body, 0)
    except (ArithmeticError, ValueError, TypeError) as exc:
        raise ToolError(f"{type(exc).__name__}: {exc}") from exc


def _eval(node: ast.AST, depth: int) -> Any:
    if depth > MAX_DEPTH:
        raise ToolError(f"expression nested deeper than {MAX_DEPTH} levels")
    depth += 1
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return _bounded(node.value)
    if isinstance(node, ast.Name) and node.id in _CONSTANTS:
        return _CONSTANTS[node.id]
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_eval(node.operand, depth))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _eval(node.left, depth), _eval(node.right, depth)
        if isinstance(node.op, ast.Pow):
            _check_power(left, right)
        return _bounded(_BINARY[type(node.op)](left, right))
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in _FUNCTIONS
        and not node.keywords
    ):
        args = [_eval(arg, depth) for arg in node.args]
        if node.func.id == "round":
            _check_round(args)
        return _bounded(_FUNCTIONS[node.func.id](*args))
    raise ToolError(f"unsupported syntax: {ast.dump(node)[:80]}")


def _bounded(value: Any) -> Any:
    """Refuse an integer past ``MAX_INT_BITS`` (operands stay small, so the
    next operation on it is cheap)."""
    if isinstance(value, int) and value.bit_length() > MAX_INT_BITS:
        raise ToolError(f"result too large (over {MAX_INT_BITS} bits)")
    return value


def _check_power(base: Any, exponent: Any) -> None:
    ints = isinstance(base, int) and isinstance(exponent, int)
    if ints and abs(base) > 1 and exponent * math.log2(abs(base)) > MAX_INT_BITS:
        raise ToolError(f"result too large (over {MAX_INT_BITS} bits)")


def _check_round(args: list[Any]) -> None:
    """``round(1, -10**9)`` computes 10**(10**9) while holding the GIL."""
    if len(args) == 2 and isinstance(args[1], int):
        if abs(args[1]) > MAX_ROUND_DIGITS:
            raise ToolError(f"round() takes at most {MAX_ROUND_DIGITS} digits")


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
