"""The project's loopback model server as a benchmark helper process.

`FakeLLM` from `hermes_testing.fake_llm`, plus two things a benchmark needs:

- a gate: streaming requests wait at it until it opens, so that every reader is
  attached before the first token is sent and many runs start together;
- send times: the CLOCK_MONOTONIC nanosecond at which each content frame was
  written to the socket, keyed by the token index written in its text
  (`" w<index>"`, one token per frame).

It prints `FAKE <base_url>` and then answers one JSON line per command line on
stdin: `default <json Reply kwargs>`, `gate open|close`, `wait <posts> <timeout>`,
`dump`, `quit`. Not a test and not product code.
"""

import asyncio
import json
import re
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from hermes_testing.fake_llm import FakeLLM, Reply, _StreamWriter  # noqa: E402

TOKEN_INDEX = re.compile(rb'"content":" w(\d+)"')


def token_text(count: int, width: int = 4) -> tuple[str, int]:
    """A reply of `count` tokens " w0000" …, and the chunk size of one per frame."""
    return "".join(f" w{i:0{width}d}" for i in range(count)), width + 2


class _TimedStreamWriter(_StreamWriter):
    """`_StreamWriter` recording a send time per content frame."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.sent: dict[int, int] = {}

    def sending(self, frame: bytes) -> None:
        match = TOKEN_INDEX.search(frame)
        if match:
            self.sent[int(match.group(1))] = time.monotonic_ns()


class BenchLLM(FakeLLM):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.gate = asyncio.Event()
        self.gate.set()
        self.sent: dict[int, dict[int, int]] = {}
        self.stream_started: dict[int, int] = {}

    async def _chat(self, rec, reply, authorised, reader, writer):
        await self.gate.wait()
        streaming = authorised and reply is not None and reply.status == 200
        if not (streaming and rec.body.get("stream")):
            return await super()._chat(rec, reply, authorised, reader, writer)
        stream = _TimedStreamWriter(self, rec, reply, reader, writer)
        self.stream_started[rec.index] = time.monotonic_ns()
        closed = await stream.run()
        self.sent[rec.index] = stream.sent
        return False, closed

    def set_gate(self, is_open: bool) -> None:
        done = threading.Event()

        def flip():
            (self.gate.set if is_open else self.gate.clear)()
            done.set()

        assert self._loop is not None, "not started"
        self._loop.call_soon_threadsafe(flip)
        done.wait(5)


def _marker(rec) -> str:
    users = [m.get("content", "") for m in rec.messages if m.get("role") == "user"]
    return users[-1] if users else ""


def main() -> None:
    fake = BenchLLM(models=["fake-model"])
    fake.start()
    print(f"FAKE {fake.base_url}", flush=True)
    for line in sys.stdin:
        word, _, rest = line.strip().partition(" ")
        answer: dict
        if word == "default":
            fake.default = Reply(**json.loads(rest))
            answer = {"ok": True}
        elif word == "gate":
            fake.set_gate(rest == "open")
            answer = {"ok": True, "open": rest == "open"}
        elif word == "wait":
            count, timeout = rest.split()
            try:
                fake.wait_requests(int(count), float(timeout))
            except TimeoutError:
                pass
            answer = {"posts": fake.post_count}
        elif word == "dump":
            answer = {
                "requests": [
                    {
                        "index": r.index,
                        "marker": _marker(r),
                        "received_ns": int(r.received_at * 1e9),
                        "stream_started_ns": fake.stream_started.get(r.index),
                        "sent": fake.sent.get(r.index, {}),
                    }
                    for r in fake.requests
                ]
            }
        elif word == "quit":
            print(json.dumps({"ok": True}), flush=True)
            break
        else:
            answer = {"error": f"unknown command {word!r}"}
        print(json.dumps(answer), flush=True)
    fake.stop()


if __name__ == "__main__":
    main()
