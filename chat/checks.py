"""System checks of the chat app's settings (`manage.py check`, and every command
that starts Hermes: `serve`, `worker`, `migrate`).

`HERMES_PROVIDERS` is parsed in settings; its entries are checked here, so a
missing key is one clear message at startup instead of an error on every use.
An entry with errors is left out of the provider registry. `HERMES_MCP_SERVERS`
is checked the same way; an entry with errors is left out (chat.mcp_tools).
"""

import re

from django.conf import settings
from django.core.checks import CheckMessage, Error, Warning, register

PROVIDER_KINDS = ("openai", "anthropic", "responses")  # chat/providers/registry.py
#: Settings of one kind of provider, passed to it as keyword arguments.
PROVIDER_OPTIONS = {
    "max_tokens": PROVIDER_KINDS,  # an answer's output limit, in tokens
    "http_retries": PROVIDER_KINDS,  # rule 1's retries before response headers
    "retry_budget_s": PROVIDER_KINDS,  # rule 1's waits, Retry-After included
    "continuation": ("openai",),  # how a resume asks to continue (CONTINUATIONS)
    "thinking_budget": ("anthropic",),
    "reasoning_summary": ("responses",),
}
REASONING_SUMMARIES = ("auto", "concise", "detailed")
#: How an OpenAI-compatible server is asked to continue a cut answer: the
#: conversation ends in the partial assistant message (`prefill`, which
#: servers that continue a final assistant message do), plus vLLM's and
#: SGLang's `continue_final_message` flags (`continue_final_message`).
CONTINUATIONS = ("prefill", "continue_final_message")
PROVIDER_KEYS = {
    "name",
    "kind",
    "base_url",
    "api_key_env",
    "models",
    "vision",
    *PROVIDER_OPTIONS,
}


def provider_entry_problems(item: object) -> list[str]:
    """What makes one `HERMES_PROVIDERS` entry unusable (empty: it is usable)."""
    if not isinstance(item, dict):
        return ["is not a JSON object"]
    problems = [
        f"needs {key!r}, a non-empty string"
        for key in ("name", "base_url")
        if not isinstance(item.get(key), str) or not item[key]
    ]
    if item.get("name") == "demo":
        problems.append("may not be named 'demo' (the built-in demo provider)")
    if not isinstance(item.get("api_key_env", ""), str):
        problems.append("'api_key_env' must be a string, the name of a variable")
    kind = item.get("kind", "openai")
    if kind not in PROVIDER_KINDS:
        problems.append(f"'kind' must be one of {list(PROVIDER_KINDS)}, not {kind!r}")
    for key, owners in PROVIDER_OPTIONS.items():
        value = item.get(key)
        if value is None:
            continue
        if kind not in owners:
            problems.append(f"{key!r} applies to kind {owners[0]!r} only")
        elif key == "reasoning_summary":
            if value not in REASONING_SUMMARIES:
                problems.append(f"{key!r} must be one of {list(REASONING_SUMMARIES)}")
        elif key == "continuation":
            if value not in CONTINUATIONS:
                problems.append(f"{key!r} must be one of {list(CONTINUATIONS)}")
        elif key == "retry_budget_s":
            if not _number(value) or value <= 0:
                problems.append(f"{key!r} must be a positive number of seconds")
        elif key == "http_retries":
            if not _whole(value) or value < 0:
                problems.append(f"{key!r} must be a whole number, 0 or more")
        elif not _whole(value) or value < 1:
            problems.append(f"{key!r} must be a positive whole number")
    vision = item.get("vision", False)
    if not isinstance(vision, bool) and not (
        isinstance(vision, list) and all(isinstance(m, str) for m in vision)
    ):
        problems.append(
            "'vision' must be true, false or a list of the model names that take images"
        )
    models = item.get("models", [])
    if not isinstance(models, list) or not all(isinstance(m, str) for m in models):
        problems.append("'models' must be a list of strings")
    return problems


def _whole(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


@register()
def check_providers(app_configs=None, **kwargs) -> list[CheckMessage]:
    entries = settings.HERMES.get("PROVIDERS", [])
    if not isinstance(entries, list):
        return [
            Error(
                "HERMES_PROVIDERS must be a JSON list of provider objects.",
                hint='e.g. [{"name": "local", "base_url": "http://127.0.0.1:11434/v1"}]',
                id="hermes.E001",
            )
        ]
    messages: list[CheckMessage] = []
    seen: set[str] = set()
    for index, item in enumerate(entries):
        label = f"HERMES_PROVIDERS[{index}]"
        for problem in provider_entry_problems(item):
            messages.append(
                Error(
                    f"{label} {problem}; this provider is left out.",
                    hint='Each entry: {"name", "kind", "base_url", "api_key_env",'
                    ' "models"}.',
                    id="hermes.E002",
                )
            )
        if isinstance(item, dict):
            messages += _entry_warnings(
                item, label, PROVIDER_KEYS, seen, ("W001", "W002"), "provider", "last"
            )
    return messages


@register()
def check_base_urls(app_configs=None, **kwargs) -> list[CheckMessage]:
    """A base URL that does not end in `/v1` is the commonest first-try
    mistake: every chat then fails with HTTP 404 (docs/providers.md)."""
    urls = [("OPENAI_BASE_URL", settings.HERMES.get("OPENAI_BASE_URL") or "")]
    entries = settings.HERMES.get("PROVIDERS", [])
    for index, item in enumerate(entries if isinstance(entries, list) else []):
        if isinstance(item, dict) and isinstance(item.get("base_url"), str):
            urls.append((f"HERMES_PROVIDERS[{index}] base_url", item["base_url"]))
    return [
        Warning(
            f"{name} is {url!r}, which does not end in /v1.",
            hint="OpenAI-compatible servers (llama.cpp, vLLM, Ollama, LiteLLM) "
            "serve their API under /v1: e.g. http://127.0.0.1:8080/v1.",
            id="hermes.W010",
        )
        for name, url in urls
        if url and not url.rstrip("/").endswith("/v1")
    ]


MCP_KEYS = {
    "name",
    "command",
    "args",
    "env",
    "cwd",
    "url",
    "headers_env",
    "timeout_s",
    "connect_timeout_s",
    "max_output_chars",
    "approval",
    "tool_approval",
}
MCP_APPROVALS = ("allow", "ask", "deny")
_MCP_NAME = re.compile(r"[A-Za-z0-9-]+(_[A-Za-z0-9-]+)*")  # no "__": it separates


def mcp_server_problems(item: object) -> list[str]:
    """What makes one `HERMES_MCP_SERVERS` entry unusable (empty: it is usable)."""
    if not isinstance(item, dict):
        return ["is not a JSON object"]
    problems = []
    name = item.get("name")
    if not isinstance(name, str) or len(name) > 32 or not _MCP_NAME.fullmatch(name):
        problems.append(
            "needs a 'name' of at most 32 letters, digits, '-' or single '_'"
        )
    command, url = item.get("command"), item.get("url")
    if (command is None) == (url is None):
        problems.append("needs exactly one of 'command' (stdio) or 'url' (HTTP)")
    if command is not None and (not isinstance(command, str) or not command):
        problems.append("'command' must be a non-empty string")
    if url is not None and (
        not isinstance(url, str) or not url.startswith(("http://", "https://"))
    ):
        problems.append("'url' must be an http:// or https:// URL")
    args = item.get("args", [])
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        problems.append("'args' must be a list of strings")
    env = item.get("env", {})
    if not isinstance(env, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in env.items()
    ):
        problems.append("'env' must be an object of strings")
    headers = item.get("headers_env", {})
    if not isinstance(headers, dict) or not all(
        isinstance(k, str) and isinstance(v, str) and v for k, v in headers.items()
    ):
        problems.append("'headers_env' must map header names to variable names")
    elif headers and url is None:
        problems.append("'headers_env' is for a 'url' server")
    if not isinstance(item.get("cwd", ""), str):
        problems.append("'cwd' must be a string")
    for key in ("timeout_s", "connect_timeout_s", "max_output_chars"):
        value = item.get(key, 1)
        if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
            problems.append(f"{key!r} must be a positive number")
    if item.get("approval", "allow") not in MCP_APPROVALS:
        problems.append("'approval' must be 'allow', 'ask' or 'deny'")
    per_tool = item.get("tool_approval", {})
    if not isinstance(per_tool, dict) or not all(
        isinstance(k, str) and v in MCP_APPROVALS for k, v in per_tool.items()
    ):
        problems.append("'tool_approval' must map tool names to allow, ask or deny")
    return problems


@register()
def check_mcp_servers(app_configs=None, **kwargs) -> list[CheckMessage]:
    entries = settings.HERMES.get("MCP_SERVERS", [])
    if not isinstance(entries, list):
        return [
            Error(
                "HERMES_MCP_SERVERS must be a JSON list of server objects.",
                hint='e.g. [{"name": "files", "command": "mcp-files", "args": []}]',
                id="hermes.E003",
            )
        ]
    messages: list[CheckMessage] = []
    seen: set[str] = set()
    for index, item in enumerate(entries):
        label = f"HERMES_MCP_SERVERS[{index}]"
        messages += [
            Error(
                f"{label} {problem}; this server is left out.",
                hint="Each entry: a name, and a command (with args, env, cwd) "
                "or a url (with headers_env); optional timeout_s, "
                "connect_timeout_s, max_output_chars, approval, tool_approval.",
                id="hermes.E004",
            )
            for problem in mcp_server_problems(item)
        ]
        if isinstance(item, dict):
            messages += _entry_warnings(
                item, label, MCP_KEYS, seen, ("W003", "W004"), "server", "first"
            )
    return messages


def _entry_warnings(
    item: dict,
    label: str,
    known: frozenset[str] | set[str],
    seen: set[str],
    ids: tuple[str, str],
    what: str,
    wins: str,
) -> list[CheckMessage]:
    """Unknown keys and a repeated name in one entry of a JSON list setting."""
    warnings: list[CheckMessage] = []
    unknown = sorted(set(item) - known)
    if unknown:
        warnings.append(
            Warning(
                f"{label} has unknown keys {unknown}; they are ignored.",
                hint=f"Known keys: {sorted(known)}.",
                id=f"hermes.{ids[0]}",
            )
        )
    name = item.get("name")
    if isinstance(name, str) and name in seen:
        warnings.append(
            Warning(
                f"{label} repeats the {what} name {name!r}; the {wins} wins.",
                id=f"hermes.{ids[1]}",
            )
        )
    if isinstance(name, str):
        seen.add(name)
    return warnings
