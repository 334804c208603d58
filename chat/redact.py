"""Redaction of provider messages before they are journaled, shown or logged.

A provider's error body is text from outside: some echo the API key they were
sent (whole, or masked as `sk-W****3210`), a proxy may send a Python traceback
with its server's file paths. Every `ProviderError` message goes through
`redact()` (chat/providers/base.py), so the journal, the run's status, the
streams, the admin and the logs only ever see the cleaned, bounded text.
"""

from __future__ import annotations

import re

from django.conf import settings

MESSAGE_MAX_CHARS = 500
REDACTED = "[redacted]"
MIN_SECRET_CHARS = 6  # shorter configured "secrets" would redact ordinary words

# Shapes of credentials, whoever they belong to.
_PATTERNS = [
    # `Bearer <token>` / `Basic <token>` in an echoed header.
    re.compile(r"(?i)\b(bearer|basic)\s+[^\s\"',;]+"),
    # OpenAI-style keys, masked ones included: sk-…, sk-proj-…, sk-W****3210.
    re.compile(r"\bsk-[A-Za-z0-9_*\-.]{3,}"),
    # `api_key=…`, `"token": "…"`, `password: …`: keep the name, drop the value.
    re.compile(
        r"(?i)\b((?:api[_-]?key|access[_-]?token|token|secret|password|authorization)"
        r"[\"']?\s*[:=]\s*[\"']?)[^\s\"',;}]+"
    ),
    # Any masked key: a few characters, a run of asterisks, a few more.
    re.compile(r"[A-Za-z0-9_\-]{2,}\*{3,}[A-Za-z0-9_\-]*"),
    # Long opaque tokens (40+ key-like characters) of any provider.
    re.compile(r"\b[A-Za-z0-9_\-]{40,}\b"),
]


def configured_secrets() -> list[str]:
    """Every provider API key this process knows: settings and each provider's."""
    from chat.providers import registry  # late: the registry imports providers

    keys = {settings.HERMES.get("OPENAI_API_KEY", "")}
    try:
        keys.update(config.api_key for config in registry.configs().values())
    except (KeyError, TypeError, AttributeError):  # a malformed HERMES_PROVIDERS
        pass
    return sorted(
        (k for k in keys if len(k) >= MIN_SECRET_CHARS), key=len, reverse=True
    )


def redact(text: str, *, limit: int = MESSAGE_MAX_CHARS) -> str:
    """`text` without configured secrets or key-shaped strings, cut to `limit`."""
    for secret in configured_secrets():
        text = text.replace(secret, REDACTED)
    for pattern in _PATTERNS:
        text = pattern.sub(_keep_name, text)
    if len(text) > limit:
        text = text[: limit - 1].rstrip() + "…"
    return text


def _keep_name(match: re.Match) -> str:
    if match.re.groups:  # the patterns whose first group names the secret
        name = match.group(1)
        if name.lower() in ("bearer", "basic"):
            return f"{name} {REDACTED}"
        return f"{name}{REDACTED}"
    return REDACTED
