"""A journal writer in a process of its own, for the scale-out fan-out bench.

Reads `write <run> <n> <batch> <end 0|1>` lines on stdin and answers each with
one JSON line of commit times (see `common.write_batches`); `quit` ends it.
Publishes through the Redis channel layer, as a `manage.py worker` would.
"""

import asyncio
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402


async def main() -> None:
    common.setup_django()
    from journal import dbpool

    loop = asyncio.get_running_loop()
    print("WRITER ready", flush=True)
    while line := await loop.run_in_executor(None, sys.stdin.readline):
        word, *rest = line.split()
        if word == "quit":
            break
        run_id, n, batch, end = rest
        commits = await common.write_batches(run_id, int(n), int(batch), end=end == "1")
        print(json.dumps({"commits": commits}), flush=True)
    dbpool.shutdown()


if __name__ == "__main__":
    asyncio.run(main())
