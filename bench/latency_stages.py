"""Where a token's latency goes: the worker benchmark's samples split in stages.

    HERMES_WHATIF=stage-probe,gc-probe HERMES_BENCH_MANAGE=bench/whatif.py \\
        python bench/bench_worker.py --quick --samples var/bench/samples
    python bench/latency_stages.py var/bench/samples/worker-200runs-1.json

`bench_worker.py --samples` keeps, for each token a reader read, when the fake
model wrote it and when the reader read it; the `stage-probe` of
`bench/whatif.py` keeps, in the process that ran the turns, when the worker
read each token from the model's stream and when the committer published the
event holding it (one clock: Linux CLOCK_MONOTONIC is system-wide). Joined,
they split each token's latency in three: the model's stream to the worker
(the socket and the worker's event loop), the worker to its publish (the
coalescing interval and the journal's commit), the publish to the reader (the
channel layer, the stream's hub, the SSE write, the reader's socket). Then the
slowest 1 % of tokens: when they were sent and which stage held them; and,
from the probes that ran too, in the window from the first of them sent to
the last read: the event loops' slow callbacks (`loop-probe`), where each
thread of each probed process was (`stack-probe`), and the collector's full
passes (`gc-probe`, over the whole stream).

The probe files are read from var/bench (`--probes`): remove the old ones
before a run, as every `stage-probe-*.json` and `gc-probe-*.json` there is
taken, and `stack-probe-*.jsonl` and `loop-probe-*.json` too.
"""

import argparse
import json
import statistics
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import ROOT, pct  # noqa: E402  (bench_worker's percentiles)

STAGES = (
    "model → worker read",
    "worker read → published",
    "published → reader",
    "model → reader (all)",
)


def load_probe(folder: Path) -> tuple[dict, dict]:
    """Every stage-probe file's `read` and `published`, merged by run."""
    read: dict[str, dict[str, int]] = {}
    published: dict[str, dict[str, int]] = {}
    for path in sorted(folder.glob("stage-probe-*.json")):
        stats = json.loads(path.read_text())
        for run_id, times in stats["read"].items():
            read.setdefault(run_id, {}).update(times)
        for run_id, times in stats["published"].items():
            published.setdefault(run_id, {}).update(times)
    return read, published


def stages(samples: list, read: dict, published: dict, t0: int) -> list[tuple]:
    """(sent s from `t0`, the first send in ns, stage ms ×4) of each token
    seen by the probe."""
    rows = []
    for run_id, index, sent, got in samples:
        r = read.get(run_id, {}).get(str(index))
        p = published.get(run_id, {}).get(str(index))
        if r is None or p is None:
            continue
        rows.append(
            (
                (sent - t0) / 1e9,
                (r - sent) / 1e6,
                (p - r) / 1e6,
                (got - p) / 1e6,
                (got - sent) / 1e6,
            )
        )
    return rows


def full_passes(folder: Path, t0_s: float, t1_s: float) -> list[tuple]:
    """(start s, ms, CPU ms, process and thread) of each full collection
    within the window."""
    passes = []
    for path in sorted(folder.glob("gc-probe-*.json")):
        pid = path.stem.rsplit("-", 1)[1]
        for entry in json.loads(path.read_text())["collections"]:
            generation, seconds, _freed, thread, began, cpu = entry
            if generation == 2 and t0_s <= began <= t1_s:
                where = f"{pid} {thread}"
                passes.append((began - t0_s, seconds * 1000, cpu * 1000, where))
    return sorted(passes)


def slow_callbacks(folder: Path, a_s: float, b_s: float) -> list[str]:
    """The `loop-probe`'s callbacks of 0.5 ms or more that started between
    `a_s` and `b_s`, a line for each probed process: their count, wall and
    CPU ms, and the five that took longest in all, by what they ran."""
    lines = []
    for path in sorted(folder.glob("loop-probe-*.json")):
        took: Counter = Counter()
        cpu: Counter = Counter()
        count = 0
        for began, seconds, cpu_s, what in json.loads(path.read_text())["callbacks"]:
            if a_s <= began <= b_s:
                count += 1
                took[what] += seconds * 1000
                cpu[what] += cpu_s * 1000
        if not count:
            continue
        top = "; ".join(
            f"{what} {ms:.0f} ms ({cpu[what]:.0f} CPU)"
            for what, ms in took.most_common(5)
        )
        lines.append(
            f"The event loop's callbacks of 0.5 ms or more meanwhile "
            f"({_process(path)}): {count}, {took.total():.0f} ms, "
            f"{cpu.total():.0f} ms of their thread's CPU; most: {top}"
        )
    return lines


def _process(path: Path) -> str:
    """The process a probe's file is of: "worker 1234" from
    `loop-probe-worker-1234.json` (`bench/whatif.py`'s `_probe_file`)."""
    role, pid = path.stem.rsplit("-", 2)[-2:]
    return f"{role} {pid}"


def where_threads_were(folder: Path, a_s: float, b_s: float) -> list[str]:
    """From the `stack-probe`: each thread's share of samples between `a_s`
    and `b_s` by its three innermost frames (the three most common)."""
    leaves: dict[str, Counter] = {}
    for path in sorted(folder.glob("stack-probe-*.jsonl")):
        stacks: dict[int, list[str]] = {}  # a process's own ids
        for line in path.read_text().splitlines():
            entry = json.loads(line)
            if entry[0] == "stack":
                stacks[entry[1]] = entry[2]
            elif a_s <= entry[0] / 1e9 <= b_s:
                frames = stacks[entry[2]][-3:]
                thread = f"{_process(path)}: {entry[1]}"
                leaves.setdefault(thread, Counter())[" ← ".join(frames[::-1])] += 1
    lines = []
    for thread, counts in sorted(leaves.items(), key=lambda kv: -kv[1].total()):
        if len(counts) == 1:
            continue  # a thread that waited the whole time
        top = "; ".join(
            f"{100 * n / counts.total():.0f} % {leaf}"
            for leaf, n in counts.most_common(3)
        )
        lines.append(f"- {thread} ({counts.total()} samples): {top}")
    return ["Where the threads were meanwhile (stack-probe):", *lines] if lines else []


def report(samples: list, folder: Path) -> str:
    read, published = load_probe(folder)
    t0 = min(sent for _r, _i, sent, _t in samples)
    rows = stages(samples, read, published, t0)
    if not rows:
        return "no token of the samples is in the stage probe's files"
    lines = [
        f"{len(rows)} of {len(samples)} token reads joined with the probe",
        "",
        "| stage | p50 ms | p90 ms | p99 ms | max ms |",
        "|---|---|---|---|---|",
    ]
    for k, name in enumerate(STAGES, start=1):
        values = [row[k] for row in rows]
        lines.append(
            f"| {name} | {pct(values, 50):.1f} | {pct(values, 90):.1f}"
            f" | {pct(values, 99):.1f} | {max(values):.1f} |"
        )
    p99 = pct([row[4] for row in rows], 99)
    slow = [row for row in rows if row[4] >= p99]
    when = Counter(round(row[0], 1) for row in slow)
    means = [statistics.mean(row[k] for row in slow) for k in (1, 2, 3)]
    lines += [
        "",
        f"The slowest 1 % ({len(slow)} reads, ≥ {p99:.1f} ms): on average "
        f"{means[0]:.1f} ms to the worker, {means[1]:.1f} ms to the publish, "
        f"{means[2]:.1f} ms to the reader; sent at (s after the first send: "
        "reads) " + ", ".join(f"{t:.1f}: {n}" for t, n in sorted(when.items())),
    ]
    t0_s = t0 / 1e9
    # From the first slow token's send to the last one's read.
    a_s = t0_s + min(row[0] for row in slow)
    b_s = t0_s + max(row[0] + row[4] / 1000 for row in slow)
    lines += slow_callbacks(folder, a_s, b_s)
    lines += where_threads_were(folder, a_s, b_s)
    t1_s = max(got for _r, _i, _s, got in samples) / 1e9
    passes = full_passes(folder, t0_s, t1_s)
    if passes:
        listed = (f"{t:.2f}: {ms:.0f}, {cpu:.0f}, {at}" for t, ms, cpu, at in passes)
        lines.append(
            "Full collections meanwhile (s: ms, CPU ms, process thread): "
            + "; ".join(listed)
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("samples", type=Path, help="a file of bench_worker --samples")
    parser.add_argument(
        "--probes",
        type=Path,
        default=ROOT / "var" / "bench",
        help="the folder of the probes' files (var/bench)",
    )
    args = parser.parse_args()
    print(report(json.loads(args.samples.read_text()), args.probes))


if __name__ == "__main__":
    main()
