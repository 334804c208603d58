"""``manage.py fake_llm``: run a loopback model server (``--api`` picks which).

Point Hermes at it with ``OPENAI_BASE_URL=<printed url>`` to demo or benchmark
streaming without a real model. Runs until Ctrl-C.
"""

from __future__ import annotations

import asyncio
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from hermes_testing.fake_anthropic import AnthropicReply, FakeAnthropic
from hermes_testing.fake_llm import FakeLLM, Reply
from hermes_testing.fake_responses import FakeResponses, ResponsesReply

DEMO_TEXT = (
    "This is the Hermes fake model. It streams this paragraph at a steady pace "
    "so that you can watch tokens arrive, reload the page, and see nothing lost."
)

SERVERS: dict[str, tuple[type[FakeLLM], type[Reply]]] = {
    "openai": (FakeLLM, Reply),
    "anthropic": (FakeAnthropic, AnthropicReply),
    "responses": (FakeResponses, ResponsesReply),
}


class Command(BaseCommand):
    help = "Serve the fake OpenAI-compatible model until interrupted."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=8001, help="0 = any free")
        parser.add_argument("--tokens-per-s", type=float, default=50.0)
        parser.add_argument("--chunk-chars", type=int, default=4)
        parser.add_argument("--text", default=DEMO_TEXT, help="every reply's text")
        parser.add_argument("--reasoning", default="", help="reasoning sent first")
        parser.add_argument("--model", action="append", dest="models")
        parser.add_argument("--api-key", default=None, help="require this bearer key")
        parser.add_argument(
            "--api",
            choices=sorted(SERVERS),
            default="openai",
            help="the API to speak: chat completions, Anthropic Messages, Responses",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if not 0 <= options["port"] <= 65535:
            raise CommandError("--port must be 0-65535")
        if options["tokens_per_s"] < 0:
            raise CommandError("--tokens-per-s must be >= 0 (0 = unpaced)")
        server, reply = SERVERS[options["api"]]
        fake = server(
            models=options["models"] or ["fake-model"],
            api_key=options["api_key"],
            default=reply(
                text=options["text"],
                reasoning=options["reasoning"],
                chunk_chars=options["chunk_chars"],
                tokens_per_s=options["tokens_per_s"] or None,
            ),
        )

        def announce(url: str) -> None:
            self.stdout.write(f"Fake LLM serving at {url} (Ctrl-C to stop)")
            self.stdout.flush()

        try:
            asyncio.run(
                fake.serve_forever(options["host"], options["port"], on_ready=announce)
            )
        except KeyboardInterrupt:
            self.stdout.write("Fake LLM stopped.")
        except OSError as exc:
            raise CommandError(f"cannot serve on {options['host']}: {exc}") from exc
