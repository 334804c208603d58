"""The tool registry: safe built-ins on by default, others only when enabled."""

from __future__ import annotations

import asyncio
import json
from datetime import datetime
from typing import Any

import pytest

from chat import tools
from chat.tools import Tool, ToolError, calculate, run_tool, tools_schema


@pytest.fixture
def machine_tool():
    """A tool that would touch the machine, registered for one test."""
    tool = tools.register(
        Tool(
            name="read_file",
            description="Read a file.",
            func=lambda args: "secret contents",
            safe=False,
        )
    )
    yield tool
    tools.unregister(tool.name)


def call(name: str, args: object = None, **kwargs: Any) -> tuple[str, bool]:
    raw = args if isinstance(args, str) else json.dumps(args or {})
    return asyncio.run(run_tool(name, raw, **kwargs))


def test_defaults_are_the_safe_builtins(settings, machine_tool):
    settings.HERMES = {k: v for k, v in settings.HERMES.items() if k != "TOOLS"}
    assert tools.enabled_tool_names() == ["current_time", "calculator"]
    names = [t["function"]["name"] for t in tools_schema()]
    assert names == ["current_time", "calculator"]
    result, is_error = call("read_file")
    assert is_error and "no tool" in result


def test_admin_can_enable_a_machine_tool(settings, machine_tool):
    settings.HERMES = {**settings.HERMES, "TOOLS": ["calculator", "read_file"]}
    assert tools.enabled_tool_names() == ["calculator", "read_file"]
    assert call("read_file") == ("secret contents", False)
    assert call("current_time")[1] is True  # not listed, so off


def test_schema_is_openai_shaped():
    (schema,) = tools_schema(["calculator"])
    assert schema["type"] == "function"
    function = schema["function"]
    assert function["name"] == "calculator" and function["description"]
    assert function["parameters"]["required"] == ["expression"]


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ("1 + 2 * 3", "7"),
        ("(2 + 3) * 4 ** 2", "80"),
        ("7 // 2 + 7 % 2", "4"),
        ("-3 / 2", "-1.5"),
        ("sqrt(16) + abs(-1)", "5.0"),
        ("round(pi, 2)", "3.14"),
        ("2 ** 100", str(2**100)),
    ],
)
def test_calculator(expression, expected):
    assert call("calculator", {"expression": expression}) == (expected, False)


@pytest.mark.parametrize(
    "expression",
    [
        "__import__('os').system('true')",
        "open('/etc/passwd')",
        "(1).__class__",
        "x",
        "[1, 2]",
        "9 ** 9 ** 9",
        "1 / 0",
        "sqrt(-1)",
        "1 +",
        "True + 1",
        "1" * 600,
    ],
)
def test_calculator_refuses_what_is_not_safe_arithmetic(expression):
    result, is_error = call("calculator", {"expression": expression})
    assert is_error and result.startswith("error:")


def test_calculate_raises_tool_error():
    with pytest.raises(ToolError):
        calculate("len('abc')")


def test_current_time_in_a_zone():
    result, is_error = call("current_time", {"timezone": "Europe/Paris"})
    assert not is_error
    stamp = datetime.fromisoformat(result.split(" ")[0])
    assert stamp.tzinfo is not None and "Europe/Paris" in result
    assert call("current_time", {"timezone": "Mars/Olympus"})[1] is True


def test_bad_arguments_come_back_as_errors():
    assert call("calculator", "{not json")[1] is True
    assert call("calculator", "[1]")[1] is True
    assert call("calculator", {})[1] is True
    assert call("calculator", "")[1] is True  # no arguments at all
    assert call("nope")[1] is True


def test_async_tools_and_timeouts():
    async def slow(args):
        await asyncio.sleep(10)

    async def echo(args):
        return {"echo": args}

    tools.register(Tool(name="slow", description="", func=slow))
    tools.register(Tool(name="echo", description="", func=echo))
    try:
        assert call("echo", {"a": 1}, enabled=["echo"]) == ('{"echo": {"a": 1}}', False)
        result, is_error = call("slow", enabled=["slow"], timeout=0.05)
        assert is_error and "longer than" in result
    finally:
        tools.unregister("slow")
        tools.unregister("echo")


def test_a_crashing_tool_is_reported_not_raised():
    def crash(args):
        raise RuntimeError("kaput")

    tools.register(Tool(name="crash", description="", func=crash))
    try:
        assert call("crash", enabled=["crash"]) == ("error: RuntimeError: kaput", True)
    finally:
        tools.unregister("crash")


def test_duplicate_names_are_refused():
    with pytest.raises(ValueError):
        tools.register(Tool(name="calculator", description="", func=lambda a: ""))
