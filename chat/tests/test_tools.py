"""The tool registry: safe built-ins on by default, others only when enabled."""

from __future__ import annotations

import asyncio
import json
from datetime import datetime
from typing import Any

import pytest

from chat import tools
from chat.tools import Tool, ToolError, calculate, run_tool, tools_schema
from hermes_testing import tool_doubles
from hermes_testing.api import new_session, start_run, stream
from hermes_testing.fake_llm import Reply
from journal.fold import Fold


@pytest.fixture
def machine_tool():
    """A tool that would touch the machine, registered for one test."""
    tool = tools.register(
        Tool(
            name="read_file",
            description="Read a file.",
            func=tool_doubles.read_file,
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
    tools.register(Tool(name="crash", description="", func=tool_doubles.crash))
    try:
        assert call("crash", enabled=["crash"]) == ("error: RuntimeError: kaput", True)
    finally:
        tools.unregister("crash")


def test_duplicate_names_are_refused():
    with pytest.raises(ValueError):
        tools.register(Tool(name="calculator", description="", func=lambda a: ""))


@pytest.mark.parametrize(
    ("expression", "refusal"),
    [
        ("round(1, -10**9)", "at most 1000 digits"),
        ("round(1, -4*10**7)", "at most 1000 digits"),
        ("round(2.5, 10**9)", "at most 1000 digits"),
        ("10 ** 10 ** 10", "too large"),
        ("2 ** 10001", "too large"),
        ("(-3) ** 7000", "too large"),
        ("10**3000 * 10**3000", "too large"),
        ("(10**3000 + 1) * (10**3000 + 1) * 7", "too large"),
        ("-" * 300 + "1", "nested deeper"),
        ("abs(" * 60 + "1" + ")" * 60, "nested deeper"),
        ("1 << 10**9", "unsupported"),
        ("factorial(10**6)", "unsupported"),
        ("'a' * 10**9", "unsupported"),
    ],
)
def test_calculator_refuses_oversized_steps_before_doing_them(expression, refusal):
    """Each would hold the GIL for seconds to minutes if computed."""
    result, is_error = call("calculator", {"expression": expression})
    assert is_error and refusal in result, result


def test_calculator_results_stay_printable():
    result, is_error = call("calculator", {"expression": "2 ** 9999 - 1"})
    assert not is_error and result == str(2**9999 - 1)
    assert call("calculator", {"expression": "round(123456, -3)"}) == ("123000", False)


@pytest.fixture
def flawed_tools():
    names = []
    for func in (tool_doubles.gil_bomb, tool_doubles.memory_bomb):
        tools.register(Tool(name=func.__name__, description="", func=func))
        names.append(func.__name__)
    tools.register(
        Tool(name="exit_process", description="", func=tool_doubles.exit_process)
    )
    names.append("exit_process")
    yield names
    for name in names:
        tools.unregister(name)


@pytest.mark.slow
def test_a_runaway_tool_is_killed_at_its_timeout(flawed_tools):
    result, is_error = call("gil_bomb", enabled=flawed_tools, timeout=1)
    assert is_error and result == "error: gil_bomb took longer than 1 s and was stopped"
    # The pool replaced the killed process: the next call is answered.
    assert call("calculator", {"expression": "6*7"}) == ("42", False)


def test_a_tool_past_its_memory_limit_fails_alone(flawed_tools, settings):
    result, is_error = call("memory_bomb", enabled=flawed_tools, timeout=30)
    limit = settings.HERMES["TOOL_MEMORY_MB"]
    assert is_error
    assert result == f"error: memory_bomb ran out of memory (limit {limit} MiB)"


def test_a_tool_whose_process_dies_is_reported(flawed_tools):
    result, is_error = call("exit_process", enabled=flawed_tools, timeout=30)
    assert is_error and result.startswith("error: exit_process was stopped:"), result
    assert call("calculator", {"expression": "1+1"}) == ("2", False)


def test_calls_past_the_per_step_cap_are_refused_unrun(settings):
    settings.HERMES = {**settings.HERMES, "MAX_TOOL_CALLS_PER_STEP": 3}
    args = {"expression": "6*7"}
    assert [call("calculator", args, call_index=i) for i in range(3)] == [
        ("42", False)
    ] * 3
    result, is_error = call("calculator", args, call_index=3)
    assert is_error and "at most 3 tool calls per model step" in result
    assert "call 4" in result


def test_cancelling_a_call_kills_its_process(settings, tmp_path):
    """One tool process: if the cancelled call's process were left spinning,
    the next call would wait for it far past the bound below."""
    from chat import toolpool
    from hermes_testing.harness import wait_until

    toolpool.shutdown()
    settings.HERMES = {**settings.HERMES, "TOOL_PROCESSES": 1}
    tools.register(
        Tool(name="spin", description="", func=tool_doubles.spin_after_marker)
    )
    marker = tmp_path / "running"

    async def scenario() -> tuple[str, bool]:
        spinning = asyncio.create_task(
            run_tool(
                "spin",
                json.dumps({"marker": str(marker)}),
                enabled=["spin"],
                timeout=600,  # only the cancel can end it within the test
            )
        )
        await asyncio.to_thread(wait_until, marker.exists, 60)
        spinning.cancel()
        await asyncio.gather(spinning, return_exceptions=True)
        answer = run_tool("calculator", '{"expression": "6*7"}', timeout=30)
        return await asyncio.wait_for(answer, 60)

    try:
        assert asyncio.run(scenario()) == ("42", False)
    finally:
        tools.unregister("spin")
        toolpool.shutdown()


@pytest.mark.slow
def test_each_call_has_an_id_of_its_own_in_the_run_and_the_model_gets_its_own(
    server, alice, fake_llm, live_worker
):
    """The fake numbers its ids per response (`call_fake_0` every step), and a
    step may repeat one: each call is journaled under an id unique in its run
    before it runs (one card each), and the model is answered under its ids."""

    def calc(expression: str, **call: str) -> dict:
        args = json.dumps({"expression": expression})
        return {**call, "name": "calculator", "arguments": args}

    fake_llm.push(
        Reply(tool_calls=[calc("1+1")]),  # call_fake_0
        Reply(tool_calls=[calc("2+2"), calc("3+3", id="call_fake_0")]),
        Reply(text="Done."),
    )
    run_id = start_run(server, alice[1], new_session(server, alice[1]), "sums")
    events = stream(server, alice[1], run_id)
    assert events[-1][2]["status"] == "completed"
    announced: list[str] = []
    for _, kind, data in events:
        if kind == "tool":
            announced.append(data["tool_call_id"])
        elif kind == "tool_complete":
            assert data["tool_call_id"] == announced[-1]  # announced, then run
    assert len(set(announced)) == 3 and announced[0] == "call_fake_0"
    fold = Fold()
    for _, kind, data in events:
        fold.add(kind, data)
    cards = [p for p in fold.turn()["parts"] if p["kind"] == "tool"]
    assert [c["result"] for c in cards] == ["2", "4", "6"]
    sent = fake_llm.requests[2].messages
    assert [m["tool_call_id"] for m in sent if m["role"] == "tool"] == [
        "call_fake_0",
        "call_fake_0",
        "call_fake_0",
    ]
    assert [m["content"] for m in sent if m["role"] == "tool"] == ["2", "4", "6"]
