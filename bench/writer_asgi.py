"""The Hermes ASGI application plus one benchmark-only route, for the fan-out bench.

On the embedded backend the in-memory channel layer exists only inside the
server process, so a writer whose doorbell readers should hear must run there.
`GET /bench/write?run=<id>&n=<events>&batch=<size>&end=0|1` appends and publishes
in the server's own event loop (see `common.write_batches`) and answers the
commit times as JSON. Every other request goes to `hermes_site.asgi.application`
unchanged. Served with `python -m daphne … writer_asgi:application` from
`bench/`; never deployed.
"""

import sys
from pathlib import Path
from urllib.parse import parse_qs

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402

from hermes_site.asgi import application as hermes  # noqa: E402


async def application(scope, receive, send):
    if scope["type"] != "http" or scope["path"] != "/bench/write":
        return await hermes(scope, receive, send)
    query = {k: v[0] for k, v in parse_qs(scope["query_string"].decode()).items()}
    commits = await common.write_batches(
        query["run"], int(query["n"]), int(query["batch"]), end=query.get("end") == "1"
    )
    await common.send_json(send, {"commits": commits})
