"""What an OpenAI-compatible server does in the cases Hermes depends on.

``manage.py check_upstream URL`` runs :func:`check` and prints its rows as a
table (docs/providers.md keeps the tables of the servers tested so far). Each
scenario sends a few bounded requests to ``URL`` only, with a deadline of its
own, and says what it saw and what that means for Hermes:

- ``listing``: ``GET /models`` answers, and lists the model
- ``stream``: a streamed answer arrives and reports a ``finish_reason``
- ``finish: length``: a small ``max_tokens`` ends an answer with ``length``
- ``usage``: ``stream_options.include_usage`` brings a usage report
- ``stop``: closing a stream mid-answer, then a new request is answered promptly
- ``tools``: a tool call is streamed when tools are offered
- ``listing during a stream``: a ``GET /models`` while an answer streams
  leaves that answer whole (llama-cpp-python's default ``interrupt_requests``
  ends it with ``[DONE]`` and no ``finish_reason``)
- ``cut and resume``: an answer read in part and closed, then asked again with
  the partial as the final assistant message: continued, or a new answer
- ``long answer``: a long answer streams to its end
- ``two user messages`` / ``two assistant messages``: whether the chat
  template accepts repeated roles

Requests ask for greedy sampling (``temperature: 0``, a fixed ``seed``) so
that the resume can be compared with the uncut answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import textwrap
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import aiohttp

from chat.providers.http import SSEDecoder, describe, detail

OK = "ok"
NOTE = "note"
FAIL = "fail"
SKIPPED = "skipped"

CONNECT_TIMEOUT_S = 10.0
LISTING_TIMEOUT_S = 15.0
IDLE_TIMEOUT_S = 60.0  # no byte for this long ends a request
ERROR_BODY_LIMIT = 4096
SEED = 7

GREETING = "Say hello in one short sentence."
STORY = "Write a short story about a lighthouse keeper and a cat."
LONG = (
    "Write a long, detailed story about a journey across a desert, in many paragraphs."
)
WEATHER = "What is the weather in Paris right now? Use the get_weather tool."
SHORT = "Answer with one word: what colour is the sky?"

#: Content characters read before the ``stop`` and ``cut and resume``
#: scenarios close their stream, and before the listing is sent.
CUT_CHARS = 40
LISTING_AFTER_CHARS = 8
STREAM_MAX_TOKENS = 200
STORY_MAX_TOKENS = 160
RESUME_MAX_TOKENS = 80
LENGTH_MAX_TOKENS = 8
LONG_MAX_TOKENS = 1024
SHORT_MAX_TOKENS = 24

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "description": "The city"}},
            "required": ["city"],
        },
    },
}

LLAMA_CPP_INTERRUPT = "llama-cpp-python: start it with --interrupt_requests False"


class UpstreamError(Exception):
    """The server cannot be checked at all (unreachable, refuses the key, …)."""


@dataclass
class Row:
    """One line of the table."""

    scenario: str
    result: str  # OK, NOTE, FAIL or SKIPPED
    seen: str
    advice: str = ""


@dataclass
class Seen:
    """What one streamed request brought."""

    status: int | None = None
    error: str = ""  # an error status's text, a transport fault or a timeout
    content: str = ""
    reasoning: str = ""
    finish: str | None = None
    done: bool = False  # ``data: [DONE]`` arrived
    ended: bool = False  # the body ended (the server finished it)
    closed: bool = False  # the checker closed it on purpose
    usage: dict[str, Any] | None = None
    usage_frame: bool = False  # usage came in a frame of its own (no choices)
    tool_calls: dict[int, dict[str, str]] = field(default_factory=dict)
    frames: int = 0
    malformed: int = 0
    stream_error: str = ""  # an ``error`` object inside the stream
    cut: str = ""  # the stream's transport fault or timeout, after headers
    first_content_s: float | None = None
    elapsed_s: float = 0.0

    @property
    def ok_status(self) -> bool:
        return self.status == 200 and not self.error

    def ending(self) -> str:
        """How the stream ended, in words."""
        if self.closed:
            return "closed by the checker"
        parts = [f"finish_reason {self.finish}" if self.finish else "no finish_reason"]
        parts.append("[DONE]" if self.done else "no [DONE]")
        if self.cut:
            parts.append(f"body cut ({self.cut})")
        elif not self.ended:
            parts.append("body not ended")
        if self.stream_error:
            parts.append(f"error in the stream: {short(self.stream_error, 80)}")
        return ", ".join(parts)


Action = Callable[[], Coroutine[Any, Any, Any]]


def short(text: str, limit: int = 60) -> str:
    """``text`` on one line, cut to ``limit`` characters, quoted."""
    flat = " ".join(text.split())
    if len(flat) > limit:
        flat = flat[: limit - 1] + "…"
    return json.dumps(flat, ensure_ascii=False)


def secs(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f} s"


class Checker:
    """Runs the scenarios against one server and model (see the module doc)."""

    def __init__(
        self,
        base_url: str,
        *,
        model: str | None = None,
        api_key: str | None = None,
        scenario_timeout: float = 180.0,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.model = model or ""
        self.api_key = api_key
        self.scenario_timeout = scenario_timeout
        self.rows: list[Row] = []
        self.baseline_first_s: float | None = None
        self._http: aiohttp.ClientSession | None = None

    # --- HTTP ------------------------------------------------------------------
    def headers(self) -> dict[str, str]:
        headers = {"Accept": "text/event-stream"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        return headers

    @property
    def http(self) -> aiohttp.ClientSession:
        assert self._http is not None, "use `async with Checker(...)`"
        return self._http

    async def __aenter__(self) -> Checker:
        timeout = aiohttp.ClientTimeout(
            total=None, connect=CONNECT_TIMEOUT_S, sock_read=IDLE_TIMEOUT_S
        )
        # No proxies from the environment: only the given URL is contacted.
        self._http = aiohttp.ClientSession(timeout=timeout)
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        if self._http is not None:
            await self._http.close()
            self._http = None

    async def get_models(self, base_url: str | None = None) -> tuple[int, Any, str]:
        """``GET /models``: status, JSON (or None) and the error text."""
        url = f"{(base_url or self.base_url)}/models"
        async with asyncio.timeout(LISTING_TIMEOUT_S):
            async with self.http.get(url, headers=self.headers()) as response:
                data = await response.content.read(1 << 20)
                status = response.status
        try:
            payload = json.loads(data)
        except ValueError:
            payload = None
        return status, payload, "" if status == 200 else detail(data)

    def body(
        self,
        messages: list[dict[str, Any]],
        max_tokens: int,
        **extra: Any,
    ) -> dict[str, Any]:
        return {
            "model": self.model,
            "messages": messages,
            "stream": True,
            "stream_options": {"include_usage": True},
            "max_tokens": max_tokens,
            "temperature": 0,
            "seed": SEED,
            **extra,
        }

    async def stream(
        self,
        body: dict[str, Any],
        *,
        close_after_chars: int | None = None,
        at_chars: int | None = None,
        action: Action | None = None,
        limit_s: float | None = None,
    ) -> tuple[Seen, asyncio.Task[Any] | None]:
        """POST one streamed request and read it to its end (or close it after
        ``close_after_chars`` content characters). ``action`` is started once
        ``at_chars`` content characters arrived, and runs while the stream is
        read on; its task is returned (never awaited here)."""
        seen = Seen()
        task: asyncio.Task[Any] | None = None
        started = time.monotonic()
        url = f"{self.base_url}/chat/completions"
        try:
            async with asyncio.timeout(limit_s or self.scenario_timeout):
                async with self.http.post(
                    url, json=body, headers=self.headers()
                ) as response:
                    seen.status = response.status
                    if response.status != 200:
                        raw = await response.content.read(ERROR_BODY_LIMIT)
                        seen.error = f"HTTP {response.status}: {detail(raw)}"
                        return seen, None
                    decoder = SSEDecoder()
                    async for chunk in response.content.iter_any():
                        for _event, data in decoder.feed(chunk):
                            self._frame(seen, data, started)
                            chars = len(seen.content)
                            if action and task is None and chars >= (at_chars or 0):
                                task = asyncio.create_task(action())
                            if close_after_chars is not None:
                                seen.closed = chars >= close_after_chars
                                if seen.closed:
                                    break  # what is shown: up to this frame
                        if seen.closed:
                            response.close()  # the server sees the socket close
                            break
                    else:
                        seen.ended = True
        except TimeoutError:
            fault = f"no end within {limit_s or self.scenario_timeout:g} s"
            self._fault(seen, fault)
        except aiohttp.ClientError as exc:
            self._fault(seen, describe(exc))
        finally:
            seen.elapsed_s = time.monotonic() - started
        return seen, task

    @staticmethod
    def _fault(seen: Seen, fault: str) -> None:
        """A fault before the stream began is an error; after, a cut."""
        if seen.status == 200:
            seen.cut = fault
        else:
            seen.error = fault

    @staticmethod
    def _frame(seen: Seen, data: str, started: float) -> None:
        seen.frames += 1
        if data.strip() == "[DONE]":
            seen.done = True
            return
        try:
            chunk = json.loads(data)
        except ValueError:
            seen.malformed += 1
            return
        if not isinstance(chunk, dict):
            seen.malformed += 1
            return
        if chunk.get("error"):
            error = chunk["error"]
            message = error.get("message") if isinstance(error, dict) else error
            seen.stream_error = str(message)
        choices = chunk.get("choices") or []
        usage = chunk.get("usage")
        if isinstance(usage, dict) and usage:
            seen.usage = usage
            seen.usage_frame = not choices
        for choice in choices:
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            content = delta.get("content")
            if isinstance(content, str) and content:
                if seen.first_content_s is None:
                    seen.first_content_s = time.monotonic() - started
                seen.content += content
            reasoning = delta.get("reasoning_content") or delta.get("reasoning")
            if isinstance(reasoning, str):
                seen.reasoning += reasoning
            for call in delta.get("tool_calls") or ():
                slot = seen.tool_calls.setdefault(
                    int(call.get("index", 0)), {"id": "", "name": "", "arguments": ""}
                )
                function = call.get("function") or {}
                slot["id"] = slot["id"] or str(call.get("id") or "")
                slot["name"] += function.get("name") or ""
                slot["arguments"] += function.get("arguments") or ""
            if choice.get("finish_reason"):
                seen.finish = str(choice["finish_reason"])

    # --- the run -----------------------------------------------------------------
    async def run(self) -> list[Row]:
        """Every scenario, in order; the listing first (it may raise
        :class:`UpstreamError`: nothing else can be checked then)."""
        await self.listing()
        scenarios: list[tuple[str, Callable[[], Awaitable[None]]]] = [
            ("stream", self.plain_stream),
            ("finish: length", self.finish_length),
            ("stop", self.stop),
            ("tools", self.tools),
            ("listing during a stream", self.listing_during_stream),
            ("cut and resume", self.cut_and_resume),
            ("long answer", self.long_answer),
            ("two user messages", self.two_users),
            ("two assistant messages", self.two_assistants),
        ]
        for name, scenario in scenarios:
            try:
                await scenario()
            except Exception as exc:  # one scenario's surprise ends only it
                self.add(name, FAIL, f"the check itself failed: {describe(exc)}")
        return self.rows

    def add(self, scenario: str, result: str, seen: str, advice: str = "") -> None:
        self.rows.append(Row(scenario, result, seen, advice))

    def add_broken(self, scenario: str, seen: Seen) -> None:
        """A request that got no stream at all."""
        self.add(scenario, FAIL, seen.error or seen.stream_error or "no stream")

    async def listing(self) -> None:
        try:
            status, payload, error = await self.get_models()
        except TimeoutError as exc:
            raise UpstreamError(
                f"{self.base_url} did not answer GET /models within "
                f"{LISTING_TIMEOUT_S:g} s"
            ) from exc
        except aiohttp.ClientError as exc:
            raise UpstreamError(
                f"cannot reach {self.base_url}: {describe(exc)}"
            ) from exc
        if status in (401, 403):
            raise UpstreamError(
                f"{self.base_url} refused the request (HTTP {status}: {error}); "
                "give its key with --api-key-env NAME"
            )
        if status == 404 and not urlsplit(self.base_url).path.rstrip("/").endswith(
            "/v1"
        ):
            hint = f"{self.base_url}/v1"
            with contextlib.suppress(TimeoutError, aiohttp.ClientError):
                if (await self.get_models(hint))[0] == 200:
                    raise UpstreamError(
                        f"{self.base_url}/models is not found (HTTP 404) but "
                        f"{hint}/models answers: the base URL must end in /v1 "
                        f"(OPENAI_BASE_URL={hint})"
                    )
            raise UpstreamError(
                f"{self.base_url}/models is not found (HTTP 404); an "
                "OpenAI-compatible base URL usually ends in /v1"
            )
        ids: list[str] = []
        if status == 200:
            with contextlib.suppress(KeyError, TypeError):
                ids = [str(m["id"]) for m in payload["data"]]
        if not self.model:
            if not ids:
                keyless = status >= 500 and not self.api_key
                raise UpstreamError(
                    f"GET {self.base_url}/models listed no model "
                    f"(HTTP {status}{': ' + error if error else ''}); "
                    "name one with --model"
                    + (
                        "; a server that needs a key may fail so without one: "
                        "--api-key-env NAME"
                        if keyless
                        else ""
                    )
                )
            self.model = ids[0]
        listed = ", ".join(ids[:5]) + (", …" if len(ids) > 5 else "")
        if status != 200:
            self.add(
                "listing",
                FAIL,
                f"GET /models: HTTP {status}: {error}",
                "name the model in HERMES_MODELS (the picker cannot list it)",
            )
        elif self.model in ids:
            self.add("listing", OK, f"{len(ids)} model(s): {listed}")
        else:
            self.add(
                "listing",
                NOTE,
                f"{len(ids)} model(s): {listed}; {self.model} is not listed",
                f"name {self.model} in HERMES_MODELS",
            )

    async def plain_stream(self) -> None:
        messages = [{"role": "user", "content": GREETING}]
        seen, _ = await self.stream(self.body(messages, STREAM_MAX_TOKENS))
        if not seen.ok_status:
            self.add_broken("stream", seen)
            self.add("usage", SKIPPED, "no stream to look at")
            return
        self.baseline_first_s = seen.first_content_s
        what = (
            f"{len(seen.content)} chars, first after {secs(seen.first_content_s)}, "
            f"{seen.ending()}"
        )
        if seen.content and seen.finish:
            self.add("stream", OK, what)
        elif seen.content:
            self.add(
                "stream",
                FAIL,
                what,
                "an answer without a finish_reason reads as cut upstream",
            )
        else:
            self.add("stream", FAIL, f"no content; {what}")
        if seen.usage is None:
            self.add(
                "usage",
                NOTE,
                "no usage report with stream_options.include_usage",
                "none: token counts stay empty (HERMES_RUN_MAX_TOKENS counts nothing)",
            )
        else:
            keys = ("prompt_tokens", "completion_tokens", "total_tokens")
            numbers = ", ".join(f"{k} {seen.usage.get(k)}" for k in keys)
            where = "a frame of its own" if seen.usage_frame else "a chunk with choices"
            self.add("usage", OK, f"{numbers}, in {where}")

    async def finish_length(self) -> None:
        messages = [{"role": "user", "content": STORY}]
        seen, _ = await self.stream(self.body(messages, LENGTH_MAX_TOKENS))
        if not seen.ok_status:
            self.add_broken("finish: length", seen)
            return
        what = (
            f"max_tokens {LENGTH_MAX_TOKENS}: {len(seen.content)} chars, "
            f"{seen.ending()}"
        )
        if seen.finish == "length":
            self.add("finish: length", OK, what)
        else:
            self.add(
                "finish: length",
                NOTE,
                what,
                "an answer cut by HERMES_MAX_OUTPUT_TOKENS would read as complete",
            )

    async def stop(self) -> None:
        messages = [{"role": "user", "content": LONG}]
        seen, _ = await self.stream(
            self.body(messages, LONG_MAX_TOKENS), close_after_chars=CUT_CHARS
        )
        if not seen.ok_status:
            self.add_broken("stop", seen)
            return
        if not seen.closed:
            self.add(
                "stop",
                NOTE,
                f"the answer ended ({len(seen.content)} chars) before the "
                f"checker could close it; {seen.ending()}",
            )
            return
        after = [{"role": "user", "content": SHORT}]
        started = time.monotonic()
        nxt, _ = await self.stream(self.body(after, SHORT_MAX_TOKENS))
        if not nxt.ok_status:
            self.add(
                "stop",
                FAIL,
                f"closed after {len(seen.content)} chars; the next request "
                f"failed: {nxt.error or nxt.stream_error}",
            )
            return
        first = nxt.first_content_s
        baseline = self.baseline_first_s
        what = (
            f"closed after {len(seen.content)} chars; the next answer's first "
            f"text after {secs(first)} (a fresh one: {secs(baseline)}), "
            f"{nxt.ending()}"
        )
        took = first if first is not None else time.monotonic() - started
        if baseline is not None and took > 3 * baseline + 2.0:
            self.add(
                "stop",
                NOTE,
                what,
                "the server went on with the abandoned answer first",
            )
        else:
            self.add("stop", OK, what)

    async def tools(self) -> None:
        messages = [{"role": "user", "content": WEATHER}]
        body = self.body(messages, STREAM_MAX_TOKENS, tools=[WEATHER_TOOL])
        seen, _ = await self.stream(body)
        if not seen.ok_status:
            self.add(
                "tools",
                FAIL,
                f"tools refused: {seen.error or seen.stream_error}",
                "HERMES_RUN_MAX_TOOL_CALLS=0 offers no tools",
            )
            return
        calls = [seen.tool_calls[i] for i in sorted(seen.tool_calls)]
        if not calls:
            self.add(
                "tools",
                NOTE,
                f"no tool call: text {short(seen.content, 50)}, {seen.ending()}",
                "the model answers in text; tools are not called",
            )
            return
        call = calls[0]
        try:
            json.loads(call["arguments"] or "{}")
            args_ok = True
        except ValueError:
            args_ok = False
        what = (
            f"{len(calls)} call(s): {call['name']}({short(call['arguments'], 40)})"
            f"{'' if call['id'] else ', no id'}, {seen.ending()}"
        )
        if call["name"] == "get_weather" and args_ok and seen.finish:
            self.add("tools", OK, what)
        else:
            self.add(
                "tools",
                FAIL,
                what + ("" if args_ok else "; arguments are not JSON"),
            )

    async def listing_during_stream(self) -> None:
        messages = [{"role": "user", "content": LONG}]
        listed: dict[str, Any] = {}

        async def list_models() -> None:
            began = time.monotonic()
            try:
                status, _payload, _error = await self.get_models()
                listed["status"] = status
            except (TimeoutError, aiohttp.ClientError) as exc:
                listed["status"] = describe(exc)
            listed["took"] = time.monotonic() - began
            listed["at"] = time.monotonic()

        started = time.monotonic()
        seen, task = await self.stream(
            self.body(messages, STREAM_MAX_TOKENS),
            at_chars=LISTING_AFTER_CHARS,
            action=list_models,
        )
        stream_end = started + seen.elapsed_s
        if task is not None:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(LISTING_TIMEOUT_S + 1):
                    await task
        if not seen.ok_status:
            self.add_broken("listing during a stream", seen)
            return
        if task is None:
            self.add(
                "listing during a stream",
                SKIPPED,
                f"the answer ended with {len(seen.content)} chars, before the "
                "listing could be sent",
            )
            return
        when = ""
        if "at" in listed:
            late = listed["at"] >= stream_end
            when = " (after the answer ended)" if late else " (while it streamed)"
        what = (
            f"GET /models after {LISTING_AFTER_CHARS} chars: "
            f"{listed.get('status', 'no answer')} in {secs(listed.get('took'))}"
            f"{when}; the answer: {len(seen.content)} chars, {seen.ending()}"
        )
        if seen.finish:
            self.add("listing during a stream", OK, what)
        elif seen.done:
            self.add(
                "listing during a stream",
                FAIL,
                what + ": cut by the listing",
                LLAMA_CPP_INTERRUPT
                + " (any request, a listing too, ends a running answer)",
            )
        else:
            self.add("listing during a stream", FAIL, what)

    async def cut_and_resume(self) -> None:
        """Both ways Hermes can ask for a continuation (``HERMES_CONTINUATION``):
        the history ending in the partial (``prefill``), and the same with
        vLLM's and SGLang's flags (``continue_final_message``)."""
        name = "cut and resume"
        question = [{"role": "user", "content": STORY}]
        whole, _ = await self.stream(self.body(question, STORY_MAX_TOKENS))
        if not whole.ok_status:
            self.add_broken(name, whole)
            return
        cut, _ = await self.stream(
            self.body(question, STORY_MAX_TOKENS), close_after_chars=CUT_CHARS
        )
        if not cut.ok_status:
            self.add_broken(name, cut)
            return
        if not cut.closed:
            self.add(
                name,
                SKIPPED,
                f"the answer ended with {len(cut.content)} chars, too short to cut",
            )
            return
        partial = cut.content
        history = [*question, {"role": "assistant", "content": partial}]
        styles: dict[str, str] = {}
        seen_parts = []
        for style, extra in CONTINUATION_STYLES.items():
            resumed, _ = await self.stream(
                self.body(history, RESUME_MAX_TOKENS, **extra)
            )
            if not resumed.ok_status:
                styles[style] = "refused"
                problem = resumed.error or resumed.stream_error
                seen_parts.append(f"{style}: refused ({short(problem, 60)})")
                continue
            styles[style] = resume_style(whole.content, partial, resumed.content)
            seen_parts.append(f"{style}: {short(resumed.content, 36)}, {styles[style]}")
        what = f"cut after {len(partial)} chars ({short(partial[-24:], 30)}); " + (
            "; ".join(seen_parts)
        )
        if not whole.content.startswith(partial):
            what += " (the uncut answer differed: sampling is not deterministic)"
        working = [style for style, found in styles.items() if found == CONTINUES]
        if working:
            self.add(
                name,
                OK,
                what,
                f'HERMES_CONTINUATION={working[0]} (or "continuation" in the '
                "provider's HERMES_PROVIDERS entry)",
            )
        else:
            self.add(
                name,
                NOTE,
                what,
                "no continuation: a resumed answer starts anew after the cut text "
                "(the answer marks where it resumed; regenerate it)",
            )

    async def long_answer(self) -> None:
        messages = [{"role": "user", "content": LONG}]
        seen, _ = await self.stream(self.body(messages, LONG_MAX_TOKENS))
        if not seen.ok_status:
            self.add_broken("long answer", seen)
            return
        rate = len(seen.content) / seen.elapsed_s if seen.elapsed_s else 0.0
        usage = (seen.usage or {}).get("completion_tokens")
        what = (
            f"max_tokens {LONG_MAX_TOKENS}: {len(seen.content)} chars"
            f"{f' ({usage} tokens)' if usage is not None else ''} in "
            f"{secs(seen.elapsed_s)} ({rate:.0f} chars/s), {seen.ending()}"
        )
        if seen.finish:
            self.add("long answer", OK, what)
        else:
            self.add("long answer", FAIL, what)

    async def repeated(self, name: str, messages: list[dict[str, Any]]) -> None:
        seen, _ = await self.stream(self.body(messages, SHORT_MAX_TOKENS))
        if not seen.ok_status or seen.stream_error:
            self.add(
                name,
                FAIL,
                f"refused: {seen.error or seen.stream_error}",
                "none: Hermes joins consecutive messages of one role",
            )
        elif seen.finish:
            self.add(
                name,
                OK,
                f"accepted: {short(seen.content, 40)}, {seen.ending()}",
            )
        else:
            self.add(name, FAIL, f"{len(seen.content)} chars, {seen.ending()}")

    async def two_users(self) -> None:
        await self.repeated(
            "two user messages",
            [
                {"role": "user", "content": "Hello."},
                {"role": "user", "content": SHORT},
            ],
        )

    async def two_assistants(self) -> None:
        await self.repeated(
            "two assistant messages",
            [
                {"role": "user", "content": "Hello."},
                {"role": "assistant", "content": "Hello! How"},
                {"role": "assistant", "content": " can I help?"},
                {"role": "user", "content": SHORT},
            ],
        )


#: Each value of ``HERMES_CONTINUATION`` and what it adds to a resume's body.
CONTINUATION_STYLES: dict[str, dict[str, Any]] = {
    "prefill": {},
    "continue_final_message": {
        "continue_final_message": True,
        "add_generation_prompt": False,
    },
}
CONTINUES = "continues the partial"
RESTARTS = "starts the same answer again"
NEW = "starts a new answer"


def resume_style(whole: str, partial: str, resumed: str) -> str:
    """Whether ``resumed`` continues ``partial`` (an uncut answer ``whole``
    tells what would have followed), repeats the answer from its start, or is
    another answer."""
    if not resumed.strip():
        return "sends no text"
    head = resumed.lstrip()
    if whole.startswith(partial):
        rest = whole[len(partial) :].lstrip()
        probe = min(12, len(rest), len(head))
        if probe and head[:probe] == rest[:probe]:
            return CONTINUES
    start = partial.lstrip()
    probe = min(12, len(start), len(head))
    if probe and head[:probe] == start[:probe]:
        return RESTARTS
    return NEW


async def check(
    base_url: str,
    *,
    model: str | None = None,
    api_key: str | None = None,
    scenario_timeout: float = 180.0,
) -> tuple[str, list[Row]]:
    """Run every scenario; the model checked and the rows.

    Raises :class:`UpstreamError` when the server cannot be checked at all.
    """
    async with Checker(
        base_url, model=model, api_key=api_key, scenario_timeout=scenario_timeout
    ) as checker:
        rows = await checker.run()
        return checker.model, rows


HEADERS = ("scenario", "result", "seen", "set in Hermes")


def render_markdown(rows: list[Row]) -> str:
    def cell(text: str) -> str:
        return text.replace("|", "\\|").replace("\n", " ") or " "

    lines = ["| " + " | ".join(HEADERS) + " |", "|" + "---|" * len(HEADERS)]
    for row in rows:
        cells = (row.scenario, row.result, row.seen, row.advice)
        lines.append("| " + " | ".join(cell(c) for c in cells) + " |")
    return "\n".join(lines) + "\n"


def render_table(rows: list[Row]) -> str:
    """A plain-text table; the long columns are wrapped at word boundaries."""
    widths = (24, 7, 60, 44)
    table = [HEADERS] + [(r.scenario, r.result, r.seen, r.advice) for r in rows]
    out: list[str] = []
    for index, cells in enumerate(table):
        wrapped = [
            textwrap.wrap(c, w) or [""] for c, w in zip(cells, widths, strict=True)
        ]
        for line in range(max(map(len, wrapped))):
            parts = [
                (col[line] if line < len(col) else "").ljust(w)
                for col, w in zip(wrapped, widths, strict=True)
            ]
            out.append("  ".join(parts).rstrip())
        if index == 0:
            out.append("  ".join("-" * w for w in widths))
    return "\n".join(out) + "\n"
