"""Idle SSE connections: server memory and threads per connection.

N readers attach to one running run that receives no events (its lease is an
hour away, so nobody settles it). The server (`daphne hermes_site.asgi:application`,
web only) is measured after each step: VmRSS and Threads from /proc/<pid>/status,
open file descriptors. Per-connection costs are the slope from the baseline
(one connection already open, so the run's hub exists) to N connections.
Readers authenticate as API users do: `Authorization: Token <key>` (DRF).

A second server runs under tracemalloc (`bench/traced_asgi.py`): snapshots
with one and with `TRACED` connections open, and the allocations the extra
connections hold, per connection and grouped by the line that made them.

    python bench/bench_idle.py [--backend embedded|scaleout|both] [--quick]
"""

import argparse
import asyncio
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402
from clients import http_json  # noqa: E402

TRACED = 200  # connections of the tracemalloc server
# Connections opened together and closed before the baseline: what a server
# pays once, on its first requests (each database reader thread's connection
# and caches), is then not counted per connection.
WARM_UP = 8
SETTLE_S = 2.0  # after a step: requests reach their subscription, allocator settles


class _Idle:
    """An SSE connection that has received its `retry:` head and then waits."""

    def __init__(self, port: int, token: str, run_id: str):
        self.conn = common.SSEConn(port, f"/api/runs/{run_id}/events/", token)
        self.ready = asyncio.Event()
        self.task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        try:
            await self.conn.open()
            async for chunk in self.conn.chunks():
                if b"retry:" in chunk:
                    self.ready.set()
        finally:
            self.ready.set()

    def close(self) -> None:
        self.task.cancel()
        self.conn.close()


def _sample(server) -> dict:
    return {
        "rss_kib": server.rss_kib(),
        "threads": server.threads(),
        "fds": server.fds(),
    }


async def _warm_up(port: int, token: str, run_id: str) -> None:
    wave = [_Idle(port, token, run_id) for _ in range(WARM_UP)]
    await asyncio.wait_for(asyncio.gather(*(c.ready.wait() for c in wave)), 60)
    for c in wave:
        c.close()


async def _measure(
    server, port: int, token: str, run_id: str, steps: list[int]
) -> dict:
    await _warm_up(port, token, run_id)
    conns = [_Idle(port, token, run_id)]
    await conns[0].ready.wait()
    await asyncio.sleep(SETTLE_S)
    base = _sample(server)
    points = [{"connections": 1, **base}]
    for target in steps:
        while len(conns) < target:
            wave = [
                _Idle(port, token, run_id) for _ in range(min(50, target - len(conns)))
            ]
            conns += wave
            await asyncio.wait_for(asyncio.gather(*(c.ready.wait() for c in wave)), 60)
        await asyncio.sleep(SETTLE_S)
        points.append({"connections": target, **_sample(server)})
        print(points[-1], flush=True)
    alive = sum(1 for c in conns if not c.task.done())
    for c in conns:
        c.close()
    await asyncio.sleep(SETTLE_S + 1)
    after = {"connections": 0, **_sample(server)}
    return {"base": base, "points": points, "alive_at_end": alive, "after_close": after}


def _variant(env, token, run_id, steps, app):
    port = common.free_port()
    server = common.daphne(env, port, app)
    try:
        return asyncio.run(_measure(server, port, token, run_id, steps))
    finally:
        server.stop()


async def _traced(server, port: int, token: str, run_id: str) -> dict:
    await _warm_up(port, token, run_id)
    conns = [_Idle(port, token, run_id)]
    await conns[0].ready.wait()
    await asyncio.sleep(SETTLE_S)
    await http_json(port, "GET", "/bench/snapshot?label=one", token)
    while len(conns) < TRACED:
        wave = [_Idle(port, token, run_id) for _ in range(min(50, TRACED - len(conns)))]
        conns += wave
        await asyncio.wait_for(asyncio.gather(*(c.ready.wait() for c in wave)), 60)
    await asyncio.sleep(SETTLE_S)
    await http_json(port, "GET", "/bench/snapshot?label=many", token)
    _, diff = await http_json(port, "GET", "/bench/diff?a=one&b=many&top=400", token)
    for c in conns:
        c.close()
    return diff


def _short(frame: str) -> str:
    """A frame's file:line relative to the project or to site-packages."""
    if "/site-packages/" in frame:
        return frame.split("/site-packages/")[-1]
    root = str(common.ROOT) + "/"
    return frame[len(root) :] if frame.startswith(root) else frame.split("/")[-1]


def _holders(diff: dict, n: int) -> tuple[str, float]:
    """What the extra connections hold, by the innermost line of Hermes that
    led to the allocation, else the innermost line of a library."""
    root = str(common.ROOT) + "/"
    per: dict[str, list[float]] = {}
    for row in diff["rows"]:
        frames = list(reversed(row["traceback"]))  # innermost first
        ours = [
            f
            for f in frames
            if f.startswith(root) and "/bench/" not in f and "-packages/" not in f
        ]
        libs = [f for f in frames if "/site-packages/" in f]
        key = _short((ours or libs or frames)[0])
        key = key if ours else f"{key} (library)"
        acc = per.setdefault(key, [0.0, 0.0])
        acc[0] += row["size_diff"] / n / 1024
        acc[1] += row["count_diff"] / n
    rows = sorted(per.items(), key=lambda kv: -kv[1][0])[:15]
    table = common.md_table(
        ["held through", "KiB per connection", "objects per connection"],
        [[k, v[0], v[1]] for k, v in rows],
    )
    return table, diff["total_diff"] / n / 1024


def run(args):
    env = common.child_env()
    owner, token = common.make_user("idler")
    run_id = common.running_run(owner).id
    common.close_db()
    steps = [100, 250, 500] if args.quick else [100, 250, 500, 1000]
    result = _variant(env, token, run_id, steps, "hermes_site.asgi:application")
    table, rows = _table(result)
    print(table)
    port = common.free_port()
    # tracing slows the imports down several times
    traced = common.daphne(env, port, "bench.traced_asgi:application", timeout=300)
    try:
        diff = asyncio.run(_traced(traced, port, token, run_id))
    finally:
        traced.stop()
    holders, traced_kib = _holders(diff, TRACED - 1)
    print(holders)
    base, after = result["base"], result["after_close"]
    at500 = next(r for r in rows if r[0] == 500)
    markdown = f"""{table}

Baseline (after {WARM_UP} connections opened together and closed, one
connection open, the hub of the run exists): RSS
{base["rss_kib"] / 1024:.1f} MiB, {base["threads"]} threads. After all connections
closed: RSS {after["rss_kib"] / 1024:.1f} MiB, {after["threads"]} threads,
{after["fds"]} fds. All {result["alive_at_end"]} connections were still open at the end.

Targets at 500 connections: ≤ 20 KiB each (issue 11; was ≤ 55) —
{"met" if at500[2] <= 20 else "missed"} ({at500[2]:.1f} KiB); no thread each —
{"met" if at500[5] < 0.05 else "missed"}
({at500[5]:.2f} threads per connection). Per-connection figures are the slope
from the baseline, measured {SETTLE_S:g} s after each step ("since the step
before": the slope from the step before); RSS counts the thread stacks
actually touched, not their reserved virtual size. The warm-up's memory, freed
when it closed, can serve the first connections measured: at most about
{WARM_UP} connections' worth ({WARM_UP * 20 / 500:.1f} KiB per connection at
500). Without a shared thread for streaming requests (`hermes_site/asgi.py`),
Django's handler gives each request a one-thread executor for as long as it
lives: 1.00 thread and 62.9 KiB per idle stream were measured that way (see
Findings).

Python allocations held per idle connection (tracemalloc, {TRACED} connections
against 1, after a garbage collection): {traced_kib:.1f} KiB in all; the
largest holders, by the innermost line of Hermes on the allocation's path
(else of a library):

{holders}

The rest of the RSS per connection is outside Python's allocator (the kernel's
socket, the allocator's own overhead and fragmentation)."""
    return markdown, {"product": result, "traced_kib": traced_kib, "diff": diff}


def _table(result) -> tuple[str, list]:
    base, rows = result["base"], []
    before = result["points"][0]
    for p in result["points"][1:]:
        n = p["connections"] - 1
        rows.append(
            [
                p["connections"],
                round(p["rss_kib"] / 1024, 1),
                (p["rss_kib"] - base["rss_kib"]) / n,
                (p["rss_kib"] - before["rss_kib"])
                / (p["connections"] - before["connections"]),
                p["threads"],
                (p["threads"] - base["threads"]) / n,
                p["fds"],
            ]
        )
        before = p
    table = common.md_table(
        [
            "idle connections",
            "server RSS MiB",
            "KiB per connection",
            "KiB per connection, since the step before",
            "server threads",
            "threads per connection",
            "open fds",
        ],
        rows,
    )
    return table, rows


if __name__ == "__main__":
    common.bench_main("idle", run, argparse.ArgumentParser(description=__doc__))
