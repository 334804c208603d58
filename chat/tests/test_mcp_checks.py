"""The `HERMES_MCP_SERVERS` system check, and bad entries left out of the
servers Hermes connects (chat.mcp_tools.configured_servers)."""

import pytest
from django.core.management import call_command
from django.core.management.base import SystemCheckError

from chat.checks import check_mcp_servers
from chat.mcp_tools import configured_servers

STDIO = {"name": "files", "command": "mcp-files", "args": ["/srv"], "env": {"A": "1"}}
HTTP = {
    "name": "web-search",
    "url": "http://127.0.0.1:9/mcp",
    "approval": "ask",
    "headers_env": {"Authorization": "SEARCH_AUTH"},
}


def _use(settings, entries) -> None:
    settings.HERMES = {**settings.HERMES, "MCP_SERVERS": entries}


def test_well_formed_servers_pass_with_their_defaults(settings):
    _use(settings, [STDIO, {**HTTP, "timeout_s": 5, "max_output_chars": 100}])
    assert check_mcp_servers() == []
    files, search = configured_servers()
    assert (files.transport, files.args, files.env) == (
        "stdio",
        ("/srv",),
        (("A", "1"),),
    )
    assert (files.timeout_s, files.max_output_chars, files.approval) == (
        30.0,
        20_000,
        "allow",
    )
    assert (search.transport, search.approval, search.timeout_s) == ("http", "ask", 5)
    assert search.headers_env == (("Authorization", "SEARCH_AUTH"),)
    assert search.max_output_chars == 100


def test_an_output_cap_past_one_event_is_lowered(settings):
    _use(settings, [{**STDIO, "max_output_chars": 10**9}])
    assert check_mcp_servers() == []
    assert configured_servers()[0].max_output_chars == 20_000


def test_a_tool_policy_overrides_its_server(settings):
    entry = {**STDIO, "approval": "deny", "tool_approval": {"read": "allow"}}
    _use(settings, [entry])
    assert check_mcp_servers() == []
    (files,) = configured_servers()
    assert (files.policy("read"), files.policy("write"), files.offers_any) == (
        "allow",
        "deny",
        True,
    )


@pytest.mark.parametrize(
    ("entry", "problem"),
    [
        ({"command": "x"}, "needs a 'name'"),
        ({"name": "a__b", "command": "x"}, "needs a 'name'"),
        ({"name": "n"}, "exactly one of 'command'"),
        ({"name": "n", "command": "x", "url": "http://h/"}, "exactly one of"),
        ({"name": "n", "url": "ftp://h/"}, "'url' must be an http"),
        ({"name": "n", "command": "x", "args": "a b"}, "'args' must be a list"),
        ({"name": "n", "command": "x", "env": {"A": 1}}, "'env' must be"),
        ({"name": "n", "command": "x", "timeout_s": 0}, "'timeout_s' must be"),
        ({"name": "n", "command": "x", "max_output_chars": True}, "'max_output_chars'"),
        ({"name": "n", "command": "x", "approval": "maybe"}, "'approval' must be"),
        ({"name": "n", "command": "x", "headers_env": {"A": "V"}}, "for a 'url'"),
        ({"name": "n", "url": "http://h/", "headers_env": {"A": ""}}, "'headers_env'"),
        (
            {"name": "n", "command": "x", "tool_approval": {"t": "no"}},
            "'tool_approval'",
        ),
        ("files", "is not a JSON object"),
    ],
)
def test_a_bad_entry_is_an_error_and_left_out(settings, entry, problem):
    _use(settings, [entry, STDIO])
    messages = check_mcp_servers()
    assert [m.id for m in messages] == ["hermes.E004"]
    assert problem in messages[0].msg and "HERMES_MCP_SERVERS[0]" in messages[0].msg
    assert [s.name for s in configured_servers()] == ["files"]


def test_unknown_keys_and_repeated_names_are_warnings(settings):
    _use(settings, [{**STDIO, "tols": []}, {**HTTP, "name": "files"}])
    assert [m.id for m in check_mcp_servers()] == ["hermes.W003", "hermes.W004"]
    (kept,) = configured_servers()
    assert kept.transport == "stdio"  # the first entry of a name wins


def test_not_a_list_is_an_error_and_nothing_is_connected(settings):
    _use(settings, {"name": "files"})
    assert [m.id for m in check_mcp_servers()] == ["hermes.E003"]
    assert configured_servers() == []
    with pytest.raises(SystemCheckError, match="HERMES_MCP_SERVERS"):
        call_command("check")
