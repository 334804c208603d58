"""Journal appends, in process: events/s committed through `journal.store.append`.

Each batch is one `append()` call: validate, one fenced UPDATE that takes the
seqs, one SELECT of `last_seq`, one multi-row INSERT, one commit. A second row
per batch size goes through `journal.publish.append_and_publish` (the writer
pool's thread, then the channel-layer doorbell), the path the worker uses.

    python bench/bench_appends.py [--backend embedded|scaleout|both] [--quick]
"""

import argparse
import asyncio
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

TEXT = "tok-" * 5  # ~20 bytes, a typical coalesced token chunk


def _sizes(quick: bool) -> list[tuple[int, int]]:
    """(batch, events) pairs: at least a few seconds of work each."""
    if quick:
        return [(1, 3_000), (10, 20_000), (100, 50_000), (1000, 100_000)]
    return [(1, 5_000), (10, 50_000), (100, 200_000), (1000, 300_000)]


def _sync_appends(owner, batch: int, total: int):
    from journal.store import append

    run = common.running_run(owner)
    events = [("token", {"text": TEXT})] * batch
    per_batch = []
    started = time.perf_counter()
    for _ in range(total // batch):
        t0 = time.perf_counter()
        append(run_id=run.id, token=1, events=events)
        per_batch.append(time.perf_counter() - t0)
    return time.perf_counter() - started, per_batch


async def _pooled_appends(owner, batch: int, total: int) -> tuple[float, list[float]]:
    from journal import dbpool
    from journal.publish import append_and_publish

    run = await dbpool.writers.run(common.running_run, owner)
    events = [("token", {"text": TEXT})] * batch
    per_batch = []
    started = time.perf_counter()
    for _ in range(total // batch):
        t0 = time.perf_counter()
        await append_and_publish(run_id=run.id, token=1, events=events)
        per_batch.append(time.perf_counter() - t0)
    return time.perf_counter() - started, per_batch


def run(args):
    from journal import dbpool

    owner, _ = common.make_user("appender")
    rows, result = [], {"rows": []}
    for batch, total in _sizes(args.quick):
        for path in ("store.append", "append_and_publish"):
            if path == "store.append":
                elapsed, per_batch = _sync_appends(owner, batch, total)
            else:
                if batch == 1:
                    continue  # the worker never appends one event at a time under load
                elapsed, per_batch = asyncio.run(_pooled_appends(owner, batch, total))
            n = len(per_batch) * batch
            row = {
                "path": path,
                "batch": batch,
                "events": n,
                "events_per_s": n / elapsed,
                "batch_p50_ms": common.pct(per_batch, 50) * 1e3,
                "batch_p99_ms": common.pct(per_batch, 99) * 1e3,
            }
            result["rows"].append(row)
            rows.append(
                [
                    path,
                    batch,
                    n,
                    round(row["events_per_s"]),
                    row["batch_p50_ms"],
                    row["batch_p99_ms"],
                    "yes"
                    if batch > 1 and row["events_per_s"] >= 50_000
                    else ("-" if batch == 1 else "no"),
                ]
            )
            print(
                common.md_table(
                    [
                        "path",
                        "batch",
                        "events",
                        "events/s",
                        "batch p50 ms",
                        "batch p99 ms",
                        "≥ 50k/s",
                    ],
                    rows[-1:],
                ).splitlines()[-1],
                flush=True,
            )
    dbpool.shutdown()
    table = common.md_table(
        [
            "path",
            "batch",
            "events",
            "events/s committed",
            "batch p50 ms",
            "batch p99 ms",
            "target ≥ 50,000/s",
        ],
        rows,
    )
    print(table)
    markdown = (
        table
        + """

One process, one writer, one run whose status is `running` with fencing token 1;
each batch of ~20-byte `token` events is one `journal.store.append` call and one
committed transaction. `store.append` calls it directly (sync);
`append_and_publish` is the worker's path: the call runs on the writer pool's
thread and its records are then published to the run's channel-layer group (no
members here: the cost of the doorbell itself). Batch latencies are per call."""
    )
    return markdown, result


if __name__ == "__main__":
    common.bench_main("appends", run, argparse.ArgumentParser(description=__doc__))
