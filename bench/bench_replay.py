"""Replay of a long run over SSE to one reader: events/s, first event, server memory.

Runs of 10,000 and 100,000 `token` events (~20-byte text, appended with
`journal.store.append` in batches of 1,000, then an `end`) are read from seq 0
by one raw-socket reader from a fresh daphne process each. The server's peak
RSS (VmHWM) is read before and after, to show that memory does not grow with
the run's length.

    python bench/bench_replay.py [--backend embedded|scaleout|both] [--quick]
"""

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

TEXT = "tok-" * 5  # ~20 bytes
APPEND_BATCH = 1000


def _make_run(owner, n: int) -> str:
    from journal.store import append

    run = common.running_run(owner)
    batch = [("token", {"text": TEXT})] * APPEND_BATCH
    for done in range(0, n, APPEND_BATCH):
        append(run_id=run.id, token=1, events=batch[: min(APPEND_BATCH, n - done)])
    append(
        run_id=run.id,
        token=1,
        events=[("end", {"status": "completed", "terminal_state": "completed"})],
    )
    return run.id


async def replay_once(port: int, token: str, run_id: str, *, first_only: bool = False):
    """Read the whole run; returns (events, seconds to first event, seconds total).

    Counts frames by their blank-line terminator (JSON data has no raw newline)
    and checks that the stream ends with the run's `end`.
    """
    conn = common.SSEConn(port, f"/api/runs/{run_id}/events/", token)
    t0 = time.perf_counter()
    await conn.open()
    frames, first, tail, prev_nl = 0, None, b"", False
    async for chunk in conn.chunks():
        frames += chunk.count(b"\n\n") + (prev_nl and chunk[:1] == b"\n")
        prev_nl = chunk[-1:] == b"\n"
        if first is None and b"\nevent: " in chunk:
            first = time.perf_counter() - t0
            if first_only:
                break
        tail = (tail + chunk)[-400:]
    total = time.perf_counter() - t0
    conn.close()
    if first_only:
        return 0, first, total
    events = frames - 1  # the `retry:` head
    if b"\nevent: end\n" not in tail:
        raise AssertionError(f"stream did not end with `end`: {tail[-200:]!r}")
    return events, first, total


def _measure(
    env,
    token: str,
    run_id: str,
    warm_run: str,
    n: int,
    repeats: int,
    probes: int,
    label: str,
    app: str = "hermes_site.asgi:application",
):
    port = common.free_port()
    server = common.daphne(env, port, app)
    try:
        # The server's first streaming request: what it still pays after start-up.
        cold_first = asyncio.run(replay_once(port, token, warm_run))[1]
        base_rss, base_hwm = server.rss_kib(), server.hwm_kib()
        rates, firsts = [], []
        profiler = common.Profiler(server.pid, f"replay-{label}-{n}")
        cpu_before = server.cpu_s()
        for _ in range(repeats):
            events, first, total = asyncio.run(replay_once(port, token, run_id))
            assert events == n + 1, (events, n + 1)
            rates.append(events / total)
            firsts.append(first)
        cpu_per_event = (server.cpu_s() - cpu_before) / (repeats * (n + 1))
        profiler.stop()
        for _ in range(probes):  # time to first event, stream abandoned after it
            firsts.append(
                asyncio.run(replay_once(port, token, run_id, first_only=True))[1]
            )
        time.sleep(0.3)
        return {
            "events": n + 1,
            "events_per_s_median": statistics.median(rates),
            "events_per_s_best": max(rates),
            "server_cpu_us_per_event": cpu_per_event * 1e6,
            "first_event_ms_p50": common.pct(firsts, 50) * 1e3,
            "first_event_ms_max": max(firsts) * 1e3,
            "first_request_first_event_ms": cold_first * 1e3,
            "rss_base_kib": base_rss,
            "hwm_base_kib": base_hwm,
            "hwm_after_kib": server.hwm_kib(),
            "rss_after_kib": server.rss_kib(),
            "threads_after": server.threads(),
        }
    finally:
        server.stop()


def _analyze() -> None:
    """What autovacuum does within a minute or so of a large insert (PostgreSQL)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("ANALYZE journal_event")


def run(args):
    env = common.child_env()
    backend = args.backend
    owner, token = common.make_user("replayer")
    sizes = [10_000, 100_000] if args.quick else [10_000, 100_000, 1_000_000]
    repeats, probes = (3, 10) if args.quick else (5, 20)
    warm = _make_run(owner, 100)
    t = time.perf_counter()
    runs = {n: _make_run(owner, n) for n in sizes}
    print(
        f"journal written: {sum(sizes) + 2} events in {time.perf_counter() - t:.1f} s",
        flush=True,
    )
    common.close_db()
    product = "hermes_site.asgi:application"
    passes = [("", None, product)]
    if backend == "scaleout":
        whatif = "bench.whatif:application"
        passes = [
            ("fresh statistics (no ANALYZE yet)", None, product),
            ("fresh statistics, what-if bounded-read", None, whatif),
            ("after ANALYZE", _analyze, product),
        ]
    rows, result = [], {"rows": []}
    for stats, before, app in passes:
        if before is not None:
            before()
            common.close_db()
        slow = stats.startswith(
            "fresh statistics ("
        )  # O(run length) pages: keep it short
        for n in sizes:
            code = "whatif" if app != product else "product"
            label = f"{backend}-{'analyzed' if before else 'fresh'}-{code}"
            server_env = (
                common.child_env(HERMES_WHATIF="bounded-read")
                if app != product
                else env
            )
            r = _measure(
                server_env,
                token,
                runs[n],
                warm,
                n,
                2 if slow else repeats,
                5 if slow else probes,
                label,
                app,
            )
            r["stats"] = stats
            result["rows"].append(r)
            row = [
                r["events"],
                round(r["events_per_s_median"]),
                round(r["events_per_s_best"]),
                round(r["server_cpu_us_per_event"], 2),
                r["first_event_ms_p50"],
                r["first_event_ms_max"],
                r["first_request_first_event_ms"],
                round(r["hwm_base_kib"] / 1024, 1),
                round(r["hwm_after_kib"] / 1024, 1),
                round((r["hwm_after_kib"] - r["hwm_base_kib"]) / 1024, 1),
                r["threads_after"],
            ]
            rows.append(([stats] if stats else []) + row)
            print(rows[-1], flush=True)
    headers = [
        "events in run",
        "events/s (median)",
        "events/s (best)",
        "server CPU µs per event",
        "first event p50 ms",
        "first event max ms",
        "first request after start: first event ms",
        "server peak RSS before MiB",
        "after MiB",
        "growth MiB",
        "server threads",
    ]
    table = common.md_table(
        (["planner statistics"] if backend == "scaleout" else []) + headers, rows
    )
    print(table)
    final = [r for r in result["rows"] if r["stats"] == passes[-1][0]]
    big = next(r for r in final if r["events"] == 100_001)
    growths = ", ".join(
        f"{r['events'] - 1:,} events "
        f"{(r['hwm_after_kib'] - r['hwm_base_kib']) / 1024:+.1f} MiB"
        for r in final
    )
    rate, first = big["events_per_s_median"], big["first_event_ms_p50"]
    analyzed = ", after ANALYZE" if backend == "scaleout" else ""
    verdict = (
        f"Targets (100,000-event run{analyzed}): ≥ 500,000 events/s — "
        f"{'met' if rate >= 5e5 else 'missed'} ({rate:,.0f}); first event < 30 ms — "
        f"{'met' if first < 30 else 'missed'} (p50 {first:.1f} ms); memory flat in "
        f"run length — peak RSS growth over the warmed-up server: {growths}."
    )
    pg_note = ""
    if backend == "scaleout":
        pg_note = """

On a fresh database (no statistics yet, as after a burst of inserts before
autovacuum's first ANALYZE) PostgreSQL plans the page query
`WHERE run_id = %s AND seq > %s ORDER BY seq LIMIT 2000` as a bitmap scan of
the run's whole journal plus a top-N sort, so every page costs time in
proportion to the run's length. With statistics it is an index range scan. A
bounded range (`AND seq <= after_seq + limit`, valid because a run's seqs are
dense) gives the cheap plan either way: the "what-if bounded-read" rows (NOT
product code: `bench/whatif.py` patches `read_after` in the same kind of server)
read the same fresh database. Fresh-statistics rows use 2 full reads and 5
first-event probes (their pages cost time in proportion to the run's length)."""
    markdown = (
        table
        + f"""

{verdict}{pg_note}

Each row is served by a fresh `daphne hermes_site.asgi:application` process that
first replays a 100-event run (warm-up; "before" is its peak RSS after that):
"first request after start" is the first event of that replay, the server's
first streaming request.
The reader is one raw asyncio socket in the bench process; events/s is events
(including `end`) over the whole request, connect to last byte, {repeats} reads,
median and best. "Server CPU µs per event" is the serving process's CPU time
(user and system, from /proc) over those reads per event: on a shared machine
it moves less than events/s does. "First event" is connect to the first chunk
holding an event frame, over the {repeats} full reads and {probes} more reads
that stop there. "After" is the peak RSS (VmHWM) after all reads."""
    )
    result["growth_kib"] = [r["hwm_after_kib"] - r["hwm_base_kib"] for r in final]
    return markdown, result


if __name__ == "__main__":
    common.bench_main("replay", run, argparse.ArgumentParser(description=__doc__))
