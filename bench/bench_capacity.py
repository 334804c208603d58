"""Scale-out capacity: 2 daphne × 2 workers on PostgreSQL + Redis, measured.

The worker benchmark's sweep (`bench/bench_worker.py`: runs × 50 tokens/s, 2
SSE readers per run, the loopback fake model) on the scale-out deployment
with two web processes and two worker processes: a run's readers go to the
web processes in turn, each worker takes at most half of the largest step.
Two sweeps: runs (2 readers each), then readers (50 runs, more readers each).
Each table gives, for each step, the token → reader latency and every
process's CPU; the text the largest step that kept p99 < 150 ms, in runs and
in live readers, and what limited the next one.

    python bench/bench_capacity.py --backend scaleout [--quick]
"""

import argparse
import asyncio
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_worker  # noqa: E402
import common  # noqa: E402

SWEEP = [100, 200, 300, 400]
READERS_RUNS, READERS_PER_RUN = 50, [4, 10, 20, 40]  # 200 … 2,000 live readers


def _cpu_table(results: list[dict]) -> str:
    names = list(results[0]["cpu_s"])
    return common.md_table(
        ["runs at once", "live readers", "p50 ms", "p99 ms", "lost + duplicated"]
        + [f"{n} CPU (of one core)" for n in names],
        [
            [
                c["runs"],
                c["readers"],
                c["p50_ms"],
                c["p99_ms"],
                c["lost"] + c["duplicated"],
            ]
            + [f"{c['cpu_s'][n] / c['wall_s']:.0%}" for n in names]
            for c in results
        ],
    )


def _limit(results: list[dict]) -> str:
    held = common.held(results)
    first_missed = next((c for c in results if c not in held), None)
    head = (
        f"largest step with p99 < 150 ms: {held[-1]['runs']} runs, "
        f"{held[-1]['readers']} live readers"
        if held
        else "no step measured kept p99 < 150 ms"
    )
    if first_missed is None:
        return head + "; every step held."
    busiest = max(first_missed["cpu_s"].items(), key=lambda kv: kv[1])
    share = busiest[1] / first_missed["wall_s"]
    total = sum(first_missed["cpu_s"].values()) / first_missed["wall_s"]
    return (
        f"{head}. At {first_missed['runs']} runs (p99 "
        f"{first_missed['p99_ms']:,.0f} ms) the busiest process was {busiest[0]} at "
        f"{share:.0%} of one core, and the measured processes together used "
        f"{total:.0%} of one core out of this machine's 2 (PostgreSQL and Redis "
        "not counted)."
    )


def run(args):
    if args.backend != "scaleout":
        sys.exit("capacity is measured on the scale-out deployment: --backend scaleout")
    args.daphnes, args.workers = 2, 2
    env = common.child_env()
    _, token = common.make_user("capacity-bench")
    common.close_db()
    sweep = [200] if args.quick else SWEEP
    results = asyncio.run(bench_worker._main(args, env, token, sweep))
    per_run = READERS_PER_RUN[1:2] if args.quick else READERS_PER_RUN
    runs = [READERS_RUNS] * len(per_run)
    by_readers = asyncio.run(bench_worker._main(args, env, token, runs, "", per_run))
    markdown = f"""Runs, 2 live readers each:

{_cpu_table(results)}

Two daphne processes and two `manage.py worker` processes on PostgreSQL and
the Redis channel layer, the fake model and this bench's readers on the same
2-core machine; {_limit(results)}

Live readers, {READERS_RUNS} runs:

{_cpu_table(by_readers)}

The same deployment; {_limit(by_readers)}

{bench_worker._details(results[-1])}"""
    return markdown, {"sweep": results, "readers_sweep": by_readers}


if __name__ == "__main__":
    common.bench_main("capacity", run, argparse.ArgumentParser(description=__doc__))
