"""``manage.py check_upstream URL``: what an OpenAI-compatible server does.

A thin shell over ``chat.providers.conformance``: runs its scenarios against
``URL`` (the base URL Hermes would be given, e.g. ``http://127.0.0.1:8080/v1``)
and prints a table of what each one saw and what to set in Hermes
(docs/providers.md).
"""

from __future__ import annotations

import asyncio
import os
from typing import Any
from urllib.parse import urlsplit

from django.core.management.base import BaseCommand, CommandError, CommandParser

from chat.providers.conformance import (
    UpstreamError,
    check,
    render_markdown,
    render_table,
)


class Command(BaseCommand):
    help = (
        "Run a fixed set of scenarios (stream, finish reasons, usage, stop, tools, "
        "a listing during a stream, a cut and a resume, a long answer, repeated "
        "roles) against an OpenAI-compatible server and print what it does."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("url", metavar="URL", help="the base URL, ending in /v1")
        parser.add_argument(
            "--model", default=None, help="the model to use (default: the first listed)"
        )
        parser.add_argument(
            "--api-key-env",
            metavar="NAME",
            default=None,
            help="the environment variable holding the server's key",
        )
        parser.add_argument("--format", choices=("table", "markdown"), default="table")
        parser.add_argument(
            "--scenario-timeout",
            type=float,
            default=180.0,
            metavar="SECONDS",
            help="the longest any one request may take (default 180)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        url = options["url"]
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise CommandError(f"{url!r} is not an http(s) URL")
        if options["scenario_timeout"] <= 0:
            raise CommandError("--scenario-timeout must be > 0")
        api_key = None
        if options["api_key_env"]:
            api_key = os.environ.get(options["api_key_env"])
            if not api_key:
                raise CommandError(f"{options['api_key_env']} is not set")
        try:
            model, rows = asyncio.run(
                check(
                    url,
                    model=options["model"],
                    api_key=api_key,
                    scenario_timeout=options["scenario_timeout"],
                )
            )
        except UpstreamError as exc:
            raise CommandError(str(exc)) from exc
        render = render_markdown if options["format"] == "markdown" else render_table
        self.stdout.write(f"{url} · model {model}\n\n" + render(rows), ending="")
