"""The Hermes ASGI application under tracemalloc, for the idle-stream bench.

`GET /bench/snapshot?label=<name>` takes a tracemalloc snapshot in the server;
`GET /bench/diff?a=<name>&b=<name>&top=<n>` answers, as JSON, the allocations
live in `b` and not in `a` grouped by the line that made them (size and count
differences, largest first), and the total. Every other request goes to
`hermes_site.asgi.application` unchanged. Served with
`python -m daphne … bench.traced_asgi:application`; never deployed. Tracing
costs memory and CPU itself: RSS is measured on the plain application.
"""

import sys
import tracemalloc
from pathlib import Path
from urllib.parse import parse_qs

tracemalloc.start(12)  # before Hermes is imported: its modules' allocations too

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402

from hermes_site.asgi import application as hermes  # noqa: E402

_snapshots: dict[str, tracemalloc.Snapshot] = {}
_IGNORE = [
    tracemalloc.Filter(False, tracemalloc.__file__),
    tracemalloc.Filter(False, "<frozen importlib._bootstrap*>"),
]


def _diff(a: str, b: str, top: int) -> dict:
    before, after = _snapshots[a], _snapshots[b]
    stats = after.compare_to(before, "traceback")
    rows = []
    for stat in stats[:top]:
        frames = [f"{f.filename}:{f.lineno}" for f in stat.traceback]
        rows.append(
            {
                "size_diff": stat.size_diff,
                "count_diff": stat.count_diff,
                "traceback": frames,
            }
        )
    total = sum(s.size_diff for s in stats)
    return {"total_diff": total, "rows": rows}


async def application(scope, receive, send):
    if scope["type"] != "http" or not scope["path"].startswith("/bench/"):
        # Holding none of these here: Hermes lets go of what it no longer needs.
        served = hermes(scope, receive, send)
        del scope, receive, send
        return await served
    query = {k: v[0] for k, v in parse_qs(scope["query_string"].decode()).items()}
    if scope["path"] == "/bench/snapshot":
        import gc

        gc.collect()
        _snapshots[query["label"]] = tracemalloc.take_snapshot().filter_traces(_IGNORE)
        await common.send_json(send, {})
    else:
        await common.send_json(
            send, _diff(query["a"], query["b"], int(query.get("top", "30")))
        )
