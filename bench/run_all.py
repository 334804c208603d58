"""Run every Hermes benchmark (what `make bench` runs) and summarise
against the targets of docs/architecture.md §9.

Each benchmark runs in a process of its own on a fresh database made for it
and removed after it: a SQLite file under var/bench/ (embedded), or, on the
PostgreSQL and Redis that `DATABASE_URL` and `REDIS_URL` name, a database and a
key prefix `hermes_bench_<pid>_<random>` (scale-out; see bench/common.py).
Each writes its own sections of docs/benchmarks.md; this script adds the
summary table at the top.

    python bench/run_all.py [--quick] [--backend embedded|scaleout|both]
                            [--only replay,appends,…] [--profile]
"""

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

BENCHES = ["appends", "replay", "fanout", "idle", "worker", "capacity"]
SCALEOUT_ONLY = {"capacity"}  # 2 daphne × 2 workers: a scale-out deployment


def _run(name: str, backend: str, quick: bool, profile: bool) -> tuple[int, float]:
    argv = [common.PY, str(common.BENCH_DIR / f"bench_{name}.py"), "--backend", backend]
    argv += ["--quick"] * quick + ["--profile"] * profile
    print(f"\n=== {name} / {backend}{' (quick)' if quick else ''} ===", flush=True)
    started = time.monotonic()
    with common.prepared(backend) as env:
        code = subprocess.call(argv, cwd=common.ROOT, env=env)
    return code, time.monotonic() - started


_results: dict[tuple[str, str], dict] = {}  # what this run's benchmarks reported


def _collect(name: str, backend: str) -> None:
    path = common.RESULTS / f"{name}-{backend}.json"
    if path.exists():
        _results[name, backend] = json.loads(path.read_text())


def _load(name: str, backend: str) -> dict | None:
    """This run's result, else the last one on disk (`--only` runs some benchmarks)."""
    if (name, backend) not in _results:
        _collect(name, backend)
    return _results.get((name, backend))


def _versus(m: dict) -> str:
    """One latency of the durability comparison: "20 vs 19 ms (+8%)"."""
    return (
        f"{m['journal']:,.0f} vs {m['through']:,.0f} ms "
        f"({common.signed_pct(m['added'])})"
    )


def _rounds(compared: list[dict]) -> str:
    """'medians of 3 rounds up to 100 runs, 1 round above', or as few words."""
    counts = [c["rounds"] for c in compared]
    if len(set(counts)) == 1:
        return f"medians of {counts[0]} rounds" if counts[0] > 1 else "one round"
    most = max(counts)
    upto = max(c["runs"] for c in compared if c["rounds"] == most)
    rest = ", ".join(
        f"{n} round{'s' if n > 1 else ''}" for n in sorted(set(counts) - {most})
    )
    return f"medians of {most} rounds up to {upto} runs, {rest} above"


def _cells(backend: str) -> dict[str, str]:
    """One summary cell per measure, from the results this run left behind."""
    out = {}
    if r := _load("replay", backend):
        rows = [x for x in r["rows"] if x.get("stats", "") in ("", "after ANALYZE")]
        big = next(x for x in rows if x["events"] == 100_001)
        growth = " / ".join(
            f"{(x['hwm_after_kib'] - x['hwm_base_kib']) / 1024:+.0f}" for x in rows
        )
        sizes = " / ".join(f"{(x['events'] - 1) // 1000:,}k" for x in rows)
        out["replay"] = (
            f"{big['events_per_s_median']:,.0f} ev/s; first event "
            f"{big['first_event_ms_p50']:.1f} ms; peak RSS growth {growth} MiB "
            f"({sizes} events)"
        )
    if r := _load("appends", backend):

        def rate(path, batch):
            row = next(
                (x for x in r["rows"] if x["path"] == path and x["batch"] == batch),
                None,
            )
            return f"{row['events_per_s']:,.0f}" if row else "n/a"

        out["appends"] = (
            f"batch 10: {rate('store.append', 10)}/s, batch 100: "
            f"{rate('store.append', 100)}/s, batch 1,000: "
            f"{rate('store.append', 1000)}/s"
        )
    if r := _load("fanout", backend):
        w = next(x for x in r["writer"] if x["readers"] == 50)
        bad = sum(x["lost"] + x["duplicated"] for x in r["writer"] + r["worker"])
        out["fanout"] = (
            f"{w['deliveries_per_s']:,.0f} deliveries/s; p99 {w['p99_ms']:.1f} ms; "
            f"lost+duplicated {bad}"
        )
    if r := _load("idle", backend):
        base = r["product"]["base"]
        p = next(x for x in r["product"]["points"] if x["connections"] == 500)
        kib = (p["rss_kib"] - base["rss_kib"]) / 499
        threads = (p["threads"] - base["threads"]) / 499
        out["idle"] = f"{kib:.1f} KiB and {threads:.2f} threads per connection"
    if r := _load("worker", backend):
        p = r["sweep"][-1]
        out["worker"] = (
            f"{p['completed']}/{p['runs']} completed; p99 {p['p99_ms']:,.0f} ms "
            f"(p50 {p['p50_ms']:,.0f})"
        )
        if len(r["sweep"]) > 1:
            out["worker"] += "; p99 at " + ", ".join(
                f"{c['runs']} runs {c['p99_ms']:,.0f} ms" for c in r["sweep"][:-1]
            )
        compared = r.get("durability")
        top = compared[-1] if compared else {}
        rounds = top.get("p99_ms_by_round", {}).get("journal", [])
        if len(rounds) > 1:
            out["worker"] += (
                f"; p99 at {top['runs']} runs in each of the journal's "
                f"{len(rounds)} rounds: "
                + " / ".join(f"{x:,.0f}" for x in rounds)
                + " ms"
            )
        if compared:
            out["durability"] = (
                "; ".join(
                    f"{c['runs']} runs: p50 {_versus(c['p50_ms'])}, "
                    f"p99 {_versus(c['p99_ms'])}"
                    for c in compared
                )
                + f" (journal vs pass-through; {_rounds(compared)})"
            )
    if r := _load("capacity", backend):
        held = common.held(r["sweep"])
        out["capacity"] = (
            (
                f"{held[-1]['runs']} runs, {held[-1]['readers']} live readers held p99 "
                f"< 150 ms"
                if held
                else "no step held p99 < 150 ms"
            )
            + "; p99 at "
            + ", ".join(f"{c['runs']} runs {c['p99_ms']:,.0f} ms" for c in r["sweep"])
        )
        if by_readers := r.get("readers_sweep"):
            held = common.held(by_readers)
            out["capacity"] += (
                f"; {by_readers[0]['runs']} runs: "
                + (
                    f"{held[-1]['readers']} live readers held p99 < 150 ms"
                    if held
                    else "no readers step held p99 < 150 ms"
                )
                + "; p99 at "
                + ", ".join(
                    f"{c['readers']} readers {c['p99_ms']:,.0f} ms" for c in by_readers
                )
            )
    return out


MEASURES = [
    (
        "replay",
        "replay of a 100,000-event run to one SSE reader",
        "≥ 500,000 events/s, first event < 30 ms, memory flat in run length",
    ),
    (
        "appends",
        "journal appends (batched, committed before publish)",
        "≥ 50,000 events/s",
    ),
    (
        "fanout",
        "fan-out: 50 readers, writer as fast as it can",
        "≥ 175,000 deliveries/s, p99 < 30 ms, 0 duplicates",
    ),
    ("idle", "idle SSE connections (500)", "≤ 20 KiB each, no thread each"),
    ("durability", "latency durability adds to a token", "< 10 % over pass-through"),
    (
        "worker",
        "one worker process: 200 runs × 50 tokens/s, 2 readers each",
        "p99 token→reader < 150 ms",
    ),
    (
        "capacity",
        "2 daphne × 2 workers: runs × 50 tokens/s, 2 readers each; "
        "then 50 runs, more readers",
        "the largest step with p99 < 150 ms (measured, not a target)",
    ),
]


def summary(backends: list[str], timings: list[str], quick: bool) -> str:
    cells = {b: _cells(b) for b in backends}
    rows = []
    for key, what, target in MEASURES:
        row = [what, target]
        for b in backends:
            if key == "durability":
                row.append(cells[b].get(key, "not run (the worker sweep measures it)"))
            elif key in SCALEOUT_ONLY and b != "scaleout":
                row.append("n/a (scale-out only)")
            else:
                result = _load(key, b)
                scaled = " (`--quick`)" if result and result.get("quick") else ""
                row.append(cells[b].get(key, "not run") + scaled)
        rows.append(row)
    headers = ["measure (docs/architecture.md §9)", "target"] + [
        common.BACKEND_LABEL[b] for b in backends
    ]
    machine = common.machine_line(common.machine_info(backends[0]))
    return (
        f"## Summary\n\nMachine: {machine}.\n\n"
        + common.md_table(headers, rows)
        + "\n\nRun times of the last `run_all.py`"
        + (" (`--quick`)" if quick else "")
        + ": "
        + "; ".join(timings)
        + "."
    )


def write_summary(text: str) -> None:
    with common.doc_lock():
        _write_summary(text)


def _write_summary(text: str) -> None:
    doc = common.DOC.read_text() if common.DOC.exists() else common.DOC_HEAD
    begin, end = "<!-- summary -->", "<!-- /summary -->"
    block = f"{begin}\n{text}\n{end}"
    if begin in doc and end in doc:
        head, rest = doc.split(begin, 1)
        doc = head + block + rest.split(end, 1)[1]
    else:
        cut = doc.find("\n<!-- bench:") + 1
        doc = (
            (doc.rstrip() + "\n\n" + block + "\n")
            if cut <= 0
            else (doc[:cut] + block + "\n\n" + doc[cut:])
        )
    common.DOC.write_text(doc)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--quick", action="store_true", help="scaled down (a few minutes)"
    )
    parser.add_argument(
        "--backend", choices=["embedded", "scaleout", "both"], default="both"
    )
    parser.add_argument("--only", default="", help="comma list of " + ",".join(BENCHES))
    parser.add_argument(
        "--profile",
        action="store_true",
        help="py-spy profiles of the servers into var/bench/profiles",
    )
    args = parser.parse_args()
    backends = ["embedded", "scaleout"] if args.backend == "both" else [args.backend]
    if "scaleout" in backends and (why := common.scaleout_available()):
        if args.backend == "scaleout":
            sys.exit(f"scale-out needs PostgreSQL and Redis: {why}")
        print(f"skipping scale-out: {why}")
        backends.remove("scaleout")
    names = [n for n in BENCHES if not args.only or n in args.only.split(",")]
    started, failed, timings = time.monotonic(), [], []
    for backend in backends:
        for name in names:
            if name in SCALEOUT_ONLY and backend != "scaleout":
                continue
            (common.RESULTS / f"{name}-{backend}.json").unlink(missing_ok=True)
            code, seconds = _run(name, backend, args.quick, args.profile)
            _collect(name, backend)
            timings.append(f"{name}/{backend} {seconds:.0f} s")
            if code:
                failed.append(f"{name}/{backend}")
    shown = [b for b in common.BACKENDS if any(_load(n, b) for n in BENCHES)]
    text = summary(shown, timings, args.quick)
    write_summary(text)
    print("\n" + text)
    doc = common.DOC.relative_to(common.ROOT)
    print(
        f"\nall done in {time.monotonic() - started:.0f} s; {doc}"
        + (f"; FAILED: {', '.join(failed)}" if failed else "")
    )
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
