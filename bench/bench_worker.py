"""One worker process, many concurrent runs: 200 runs × 50 tokens/s, 2 readers each.

The model is the project's loopback fake (`bench/run_fake_llm.py`, a process of
its own) streaming ~150 one-token chunks per run at 50 tokens/s. Embedded: one
`manage.py serve` process (daphne + the in-process worker, concurrency 200).
Scale-out: `daphne` for the readers + one `manage.py worker --concurrency 200`.

Every run is started through the API (a session each, then a run), both of its
SSE readers are attached and have received `start`, and every model request is
waiting at the fake's gate before the gate opens: all runs stream at once.

Token → reader latency: each token's text carries its index (" w0042"); the fake
records the CLOCK_MONOTONIC time it wrote each token's frame, the reader the
time it read the event carrying it (same clock: Linux CLOCK_MONOTONIC is
system-wide). It includes the worker's coalescing (30 ms, 50 ms once a tick
carries 160 runs), by design.

    python bench/bench_worker.py [--backend embedded|scaleout|both] [--quick]
                                 [--runs 25,50] [--durability] [--rounds N]

`--runs` chooses the sweep's steps (an A/B of a change at the loads it is
about takes a few minutes); the pass-through build runs with every sweep but
`--quick`'s, which takes it with `--durability`. `--rounds` is how many
sweeps of each build durability compares (3; `--quick` 1). A what-if of
`bench/whatif.py` named in `HERMES_WHATIF`, with `HERMES_BENCH_MANAGE` set to
that file, goes to both builds: a change's effect on what durability costs.
"""

import argparse
import asyncio
import json
import re
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402
from run_fake_llm import token_text  # noqa: E402

TOKENS, RATE, READERS_PER_RUN = 150, 50, 2
TOKEN_INDEX = re.compile(r"w(\d+)")


async def _start_runs(port: int, token: str, count: int, prefix: str) -> dict[str, str]:
    """label -> run id; a session per run, created and started through the API."""
    sem = asyncio.Semaphore(10)

    async def one(i: int) -> tuple[str, str]:
        label = f"{prefix}-run-{i}"
        async with sem:
            status, session = await common.http_json(
                port, "POST", "/api/sessions/", token, {"title": label}
            )
            assert status == 201, (status, session)
            status, run = await common.http_json(
                port,
                "POST",
                f"/api/sessions/{session['id']}/runs/",
                token,
                {"content": label},
            )
            assert status == 201, (status, run)
        return label, run["run_id"]

    return dict(await asyncio.gather(*(one(i) for i in range(count))))


def _journal(run_ids: list[str]) -> dict:
    from django.db.models import Count, Max, Min

    from chat.models import Turn
    from journal.models import Event, Run

    statuses: dict[str, int] = {}
    for status in Run.objects.filter(id__in=run_ids).values_list("status", flat=True):
        statuses[status] = statuses.get(status, 0) + 1
    rows = (
        Event.objects.filter(run_id__in=run_ids)
        .exclude(type="start")
        .aggregate(n=Count("seq"), first=Min("created_at"), last=Max("created_at"))
    )
    diag = list(
        Turn.objects.filter(run_id__in=run_ids).values_list("diagnostics", flat=True)
    )
    return {
        "statuses": statuses,
        "rows": rows["n"],
        "rows_span_s": (rows["last"] - rows["first"]).total_seconds()
        if rows["n"]
        else 0,
        "first_token_ms_median": statistics.median(
            d.get("first_token_ms") or 0 for d in diag
        )
        if diag
        else None,
    }


TICKS = "hermes_journal_tick_seconds"


async def _ticks(metric_ports: list[int]) -> dict[float, float]:
    """The journal tick histogram summed over the processes running turns."""
    summed: dict[float, float] = {}
    for port in metric_ports:
        for bound, count in (
            await asyncio.to_thread(common.histogram, port, TICKS)
        ).items():
            summed[bound] = summed.get(bound, 0) + count
    return summed


async def _measure(
    args,
    fake,
    ports: list[int],
    token: str,
    procs: dict,
    runs: int,
    per_run: int,
    metric_ports: list[int],
) -> dict:
    """One step of the sweep: `runs` runs, `per_run` readers each; a run's
    readers go to `ports` in turn; `metric_ports` serve the metrics of the
    processes that run the turns."""
    t_setup = time.monotonic()
    posts0 = fake.command("wait", 0, 0)["posts"]
    labels = await _start_runs(ports[0], token, runs, f"c{runs}")
    readers: dict[str, list] = {}
    tasks = []
    for i, (label, run_id) in enumerate(labels.items()):
        port = ports[i % len(ports)]
        rs, ts = await common.start_readers(port, token, run_id, per_run)
        readers[label] = rs
        tasks += ts
    flat = [r for rs in readers.values() for r in rs]
    deadline = time.monotonic() + 60
    while not all(r.seqs for r in flat) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    posts = fake.command("wait", posts0 + runs, 60)["posts"] - posts0
    setup_s = time.monotonic() - t_setup
    print(
        f"{runs} runs started, {len(flat)} readers attached, {posts} model requests "
        f"waiting ({setup_s:.1f} s)",
        flush=True,
    )
    profilers = [
        common.Profiler(p.pid, f"worker-{args.backend}-{name}")
        for name, p in procs.items()
    ]
    cpu0 = {name: p.cpu_s() for name, p in procs.items()} | {
        "fake": fake.cpu_s(),
        "client": common.self_cpu_s(),
    }
    ticks0 = await _ticks(metric_ports)
    t0 = time.monotonic_ns()
    fake.command("gate", "open")
    try:
        await asyncio.wait_for(asyncio.gather(*(r.done.wait() for r in flat)), 180)
        finished = True
    except TimeoutError:
        finished = False
    t1 = time.monotonic_ns()
    cpu1 = {name: p.cpu_s() for name, p in procs.items()} | {
        "fake": fake.cpu_s(),
        "client": common.self_cpu_s(),
    }
    for p in profilers:
        p.stop()
    ticks1 = await _ticks(metric_ports)
    ticks = {b: ticks1[b] - ticks0.get(b, 0) for b in ticks1}
    fake.command("gate", "close")
    for task in tasks:  # readers still waiting after the bound are given up on
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    sent = {
        r["marker"]: {int(k): v for k, v in r["sent"].items()}
        for r in fake.command("dump")["requests"]
        if r["marker"] in labels
    }
    journal = await asyncio.to_thread(_journal, list(labels.values()))
    folder = getattr(args, "samples", None)  # bench_capacity has no --samples
    samples: list | None = [] if folder else None
    result = _analyse(
        labels, readers, sent, journal, (cpu0, cpu1), (t0, t1), finished, samples
    )
    result["setup_s"] = setup_s
    if folder and samples is not None:
        _write_samples(folder, runs, samples)
    # From gate open to the last `end`, the runs' starts not included.
    result["tick_ms"] = {"count": int(ticks.get(float("inf"), 0))}
    for pc in (50, 90, 99):
        seconds = common.histogram_quantile(pc / 100, ticks)
        result["tick_ms"][f"p{pc}"] = (
            None if seconds is None else round(seconds * 1000, 1)
        )
    return result


def _write_samples(folder: str, runs: int, samples: list) -> None:
    """Every token's `[run id, index, sent ns, read ns]` of one step, for
    `bench/latency_stages.py`, in `<folder>/worker-<runs>runs-<n>.json`."""
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    n = 1 + len(list(out.glob(f"worker-{runs}runs-*.json")))
    path = out / f"worker-{runs}runs-{n}.json"
    path.write_text(json.dumps(samples))
    print(f"token samples written: {path}", flush=True)


def _analyse(labels, readers, sent, journal, cpu, span, finished, samples):
    """A step's results; with `samples` a list, each token read is appended
    to it as `[run id, index, sent ns, read ns]`."""
    (cpu0, cpu1), (t0, t1) = cpu, span
    expected, _ = token_text(TOKENS)
    latencies, lost = [], 0
    by_decile: list[list[float]] = [[] for _ in range(10)]
    wrong_text = dup = failed = 0
    last_rx = t0
    for label, rs in readers.items():
        times = sent.get(label, {})
        for r in rs:
            if r.error is not None or not r.types or r.types[-1] != b"end":
                failed += 1
            lo, du, _ = r.check()
            lost, dup = lost + lo, dup + du
            text = []
            for kind, data, t in zip(r.types, r.datas, r.times, strict=True):
                if kind != b"token":
                    continue
                chunk = json.loads(data)["text"]
                text.append(chunk)
                for idx in map(int, TOKEN_INDEX.findall(chunk)):
                    if idx in times:
                        latencies.append((t - times[idx]) / 1e6)
                        by_decile[idx * 10 // TOKENS].append(latencies[-1])
                        if samples is not None:
                            samples.append([labels[label], idx, times[idx], t])
            wrong_text += "".join(text) != expected
            if r.times:
                last_rx = max(last_rx, r.times[-1])
    paces = []
    for times in sent.values():
        if len(times) > 1:
            span = (max(times.values()) - min(times.values())) / 1e9
            paces.append((len(times) - 1) / span if span else float("nan"))
    tokens = sum(len(t) for t in sent.values())
    wall = (t1 - t0) / 1e9
    cpu = {k: cpu1[k] - cpu0[k] for k in cpu0}
    return {
        "runs": len(labels),
        "completed": journal["statuses"].get("completed", 0),
        "statuses": journal["statuses"],
        "readers": sum(len(rs) for rs in readers.values()),
        "readers_failed": failed + (not finished),
        "lost": lost,
        "duplicated": dup,
        "wrong_text": wrong_text,
        "tokens": tokens,
        "p50_ms": common.pct(latencies, 50),
        "p90_ms": common.pct(latencies, 90),
        "p99_ms": common.pct(latencies, 99),
        "max_ms": max(latencies, default=float("nan")),
        "samples": len(latencies),
        "p50_ms_by_token_decile": [round(common.pct(d, 50), 1) for d in by_decile],
        "p99_ms_by_token_decile": [round(common.pct(d, 99), 1) for d in by_decile],
        "fake_pace_median": statistics.median(paces) if paces else float("nan"),
        "fake_pace_min": min(paces, default=float("nan")),
        "rows": journal["rows"],
        "rows_per_s": journal["rows"] / journal["rows_span_s"]
        if journal["rows_span_s"]
        else 0,
        "rows_span_s": journal["rows_span_s"],
        "wall_s": wall,
        "last_read_s": (last_rx - t0) / 1e9,
        "cpu_s": cpu,
        "cpu_ms_per_1k_tokens": {k: v / tokens * 1e6 for k, v in cpu.items()}
        if tokens
        else {},
    }


# The build durability is measured against: the same worker and readers, the
# streamed events published without being stored (bench/whatif.py, NOT product
# code).
PASS_THROUGH = "pass-through"


async def _main(
    args,
    env,
    token,
    sweep: list[int],
    patch: str = "",
    per_run: int | list[int] = READERS_PER_RUN,
) -> list[dict]:
    """One server (and worker) for every concurrency of `sweep`, in order;
    `per_run` readers for each run, or one count per step."""
    readers = [per_run] * len(sweep) if isinstance(per_run, int) else per_run
    fake = common.FakeModel(env)
    text, chunk = token_text(TOKENS)
    fake.command(
        "default",
        json.dumps({"text": text, "chunk_chars": chunk, "tokens_per_s": RATE}),
    )
    fake.command("gate", "close")
    port = common.free_port()
    server_env = common.child_env(
        OPENAI_BASE_URL=fake.base_url,
        HERMES_DEFAULT_MODEL="fake-model",
        HERMES_WORKER_CONCURRENCY=str(max(sweep)),
        # Each chat's first answer queues a title run (a model request of its
        # own): off, so the sweep measures the runs it names and no others.
        HERMES_TITLES="false",
    )
    procs = {}
    # The process that runs the worker gets the patch; daphne stores nothing.
    # A what-if of the environment's own (`HERMES_WHATIF`, an A/B of a change)
    # goes to both builds.
    patched = server_env | (
        {
            "HERMES_WHATIF": ",".join(
                w for w in (server_env.get("HERMES_WHATIF", ""), patch) if w
            ),
            "HERMES_BENCH_MANAGE": str(common.BENCH_DIR / "whatif.py"),
        }
        if patch
        else {}
    )

    ports = [port]
    metric_ports = [port]  # the embedded process serves them with its pages
    try:
        if args.backend == "embedded":
            procs["serve"] = common.serve(patched, port)
        else:
            # Scale-out: `daphnes` web processes and `workers` worker processes,
            # each worker taking at most its share of the largest step.
            ports += [common.free_port() for _ in range(args.daphnes - 1)]
            for i, web_port in enumerate(ports):
                procs[_name("daphne", i)] = common.daphne(
                    server_env,
                    web_port,
                    # An A/B's what-ifs and probes reach daphne too.
                    "bench.whatif:application"
                    if "HERMES_BENCH_MANAGE" in server_env
                    else "hermes_site.asgi:application",
                )
            share = -(-max(sweep) // args.workers)
            metric_ports = [common.free_port() for _ in range(args.workers)]
            for i, metrics_port in enumerate(metric_ports):
                procs[_name("worker", i)] = common.worker(patched, share, metrics_port)
        out = []
        for runs, per_run in zip(sweep, readers, strict=True):
            result = await _measure(
                args, fake, ports, token, procs, runs, per_run, metric_ports
            )
            result["rss_mib"] = {
                name: round(p.hwm_kib() / 1024, 1) for name, p in procs.items()
            }
            print(json.dumps(result, indent=1), flush=True)
            out.append(result)
            await asyncio.sleep(1)
        return out
    finally:
        for p in procs.values():
            p.stop()
        fake.stop()


def _name(role: str, i: int) -> str:
    return role if i == 0 else f"{role}{i + 1}"


def _table(results: list[dict], served_by: str) -> str:
    return common.md_table(
        [
            "runs at once",
            "completed",
            "readers",
            "tokens",
            "token→reader p50 ms",
            "p90 ms",
            "p99 ms",
            "max ms",
            "lost",
            "duplicated",
            "wrong text",
            "journal rows/s",
            f"{served_by} CPU (of one core)",
            f"{served_by} CPU ms per 1,000 tokens",
        ],
        [
            [
                c["runs"],
                c["completed"],
                c["readers"],
                c["tokens"],
                c["p50_ms"],
                c["p90_ms"],
                c["p99_ms"],
                c["max_ms"],
                c["lost"],
                c["duplicated"],
                c["wrong_text"],
                round(c["rows_per_s"]),
                f"{c['cpu_s'][served_by] / c['wall_s']:.0%}",
                c["cpu_ms_per_1k_tokens"].get(served_by),
            ]
            for c in results
        ],
    )


def _held(results: list[dict]) -> str:
    held = [c["runs"] for c in common.held(results)]
    return (
        f"largest concurrency measured with p99 < 150 ms: {max(held)} runs"
        if held
        else "no concurrency measured had p99 < 150 ms"
    )


def add_topology(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--daphnes", type=int, default=1, help="scale-out: web processes"
    )
    parser.add_argument(
        "--workers", type=int, default=1, help="scale-out: worker processes"
    )


def _durability_rounds(args, env, token, sweep: list[int], stored: list[dict]):
    """The pass-through build's sweeps, alternating with more of the journal's.

    One sweep of each build is one round (the journal's first is the sweep
    above). Two servers measured one after the other differ by more than
    durability costs on a busy two-core machine (one round's "added" at 100
    runs ranged from +1 % to +22 % over three runs of this bench, and at 200
    from 0 % to +28 % over the four rounds of one), so every step takes
    `--rounds` rounds, and each build's latency is the median of its rounds.
    Which build goes first turns round each round (journal and pass-through,
    then pass-through and journal, …): whatever drifts over a sweep (the
    machine's load, the database's size) weighs on both builds alike.
    """
    rounds_of: dict[int, tuple[list[dict], list[dict]]] = {
        c["runs"]: ([c], []) for c in stored
    }
    for i in range(args.rounds):
        pair = [(0, ""), (1, PASS_THROUGH)]  # (side, patch): journal, pass-through
        if i == 0:
            pair = pair[1:]  # the journal's first round is the sweep above
        elif i % 2:
            pair.reverse()
        for side, patch in pair:
            for c in asyncio.run(_main(args, env, token, sweep, patch=patch)):
                rounds_of[c["runs"]][side].append(c)
    return [_compare(n, *rounds_of[n]) for n in sweep]


def _compare(runs: int, stored: list[dict], through: list[dict]) -> dict:
    def median(rows: list[dict], key: str) -> float:
        return statistics.median(c[key] for c in rows)

    def added(a: float, b: float) -> float | None:
        return (a - b) / b if b else None

    out: dict[str, Any] = {"runs": runs, "rounds": len(through)}
    for q in ("p50_ms", "p99_ms"):
        out[q] = {"journal": median(stored, q), "through": median(through, q)}
        out[q]["added"] = added(out[q]["journal"], out[q]["through"])
    out["p99_ms_by_round"] = {
        "journal": [c["p99_ms"] for c in stored],
        "through": [c["p99_ms"] for c in through],
    }
    out["p50_added_by_round"] = [
        added(s["p50_ms"], t["p50_ms"]) for s, t in zip(stored, through, strict=False)
    ]
    out["lost_or_duplicated"] = sum(
        c["lost"] + c["duplicated"] for c in [*stored, *through]
    )
    return out


def _durability(compared: list[dict]) -> str:
    pct = common.signed_pct
    rows = [
        [
            c["runs"],
            c["rounds"],
            c["p50_ms"]["journal"],
            c["p50_ms"]["through"],
            pct(c["p50_ms"]["added"]),
            c["p99_ms"]["journal"],
            c["p99_ms"]["through"],
            pct(c["p99_ms"]["added"]),
            " / ".join(pct(x) for x in c["p50_added_by_round"]),
            " / ".join(f"{x:,.0f}" for x in c["p99_ms_by_round"]["journal"]),
            c["lost_or_duplicated"],
        ]
        for c in compared
    ]
    return common.md_table(
        [
            "runs at once",
            "rounds",
            "p50 ms, journal",
            "p50 ms, pass-through",
            "added",
            "p99 ms, journal",
            "p99 ms, pass-through",
            "added",
            "p50 added, round by round",
            "p99 ms of the journal's rounds",
            "lost + duplicated",
        ],
        rows,
    )


def run(args):
    env = common.child_env()
    _, token = common.make_user("worker-bench")
    common.close_db()
    sweep = args.runs or ([200] if args.quick else [25, 50, 100, 150, 200])
    if args.rounds is None:
        args.rounds = 1 if args.quick else 3
    results = asyncio.run(_main(args, env, token, sweep))
    compared = None
    if not args.quick or args.durability:
        compared = _durability_rounds(args, env, token, sweep, results)
    r = results[-1]
    served_by = "serve" if args.backend == "embedded" else "worker"
    ok = bool(common.held([r]))
    durability = (
        ""
        if compared is None
        else f"""

What durability costs: the same sweep on a pass-through build, each on a
server of its own: the same worker and readers, but the committer's
appends store nothing after a run's first batch (`bench/whatif.py`,
`{PASS_THROUGH}`: seqs counted in memory, the records published as committed
ones are, after the same hand-off to the writer thread; NOT product code).
Each step takes {args.rounds} round{"s" if args.rounds > 1 else ""}, which build
goes first turning round each round (journal and pass-through, then
pass-through and journal, …); each build's figure is the median of its
rounds, and "added" is the journal's latency over the pass-through's. The
round-by-round column shows how far one pair of servers can be from the
next on this machine.

{_durability(compared)}"""
    )
    markdown = f"""{_table(results, served_by)}

Target: {r["runs"]} concurrent runs × {RATE} tokens/s on one worker process, p99
token→reader < 150 ms — {"met" if ok else "missed"} ({r["completed"]}/{r["runs"]}
runs completed, p99 {r["p99_ms"]:,.0f} ms over {r["samples"]:,} token deliveries);
{_held(results)}.

{_details(r)}

Each row: that many runs started together on the same server, {TOKENS} one-token
chunks each at {RATE} tokens/s, {READERS_PER_RUN} SSE readers per run, every reader
attached and every model request waiting before the fake's gate opens. "CPU
(of one core)" is the serving process's CPU time over the wall time from gate
open to the last reader's `end`; a Python process cannot use more than one core
for this work (one event loop plus the journal's writer thread, under one GIL).
This machine is shared with other work: the 1-minute load average before and
after is in the line above; CPU per 1,000 tokens is the steadier figure.
Title runs are off (`HERMES_TITLES=false`): each new chat's first answer would
queue one more model request of its own.{durability}"""
    return markdown, {"sweep": results, "durability": compared}


def _details(r: dict) -> str:
    cpu = ", ".join(
        f"{k} {v:.1f} s ({v / r['wall_s']:.0%} of one core)"
        for k, v in r["cpu_s"].items()
    )
    per_k = ", ".join(f"{k} {v:.0f} ms" for k, v in r["cpu_ms_per_1k_tokens"].items())
    deciles = " / ".join(f"{x:.0f}" for x in r["p50_ms_by_token_decile"])
    deciles99 = " / ".join(f"{x:.0f}" for x in r.get("p99_ms_by_token_decile", []))
    rss = ", ".join(f"{k} {v} MiB" for k, v in r["rss_mib"].items())
    tick = r.get("tick_ms") or {}
    ticks = (
        f"""
Journal ticks (`hermes_journal_tick_seconds`, interpolated within its
buckets): {tick["count"]:,}, p50 {tick["p50"]} ms, p90 {tick["p90"]} ms,
p99 {tick["p99"]} ms."""
        if tick.get("count")
        else ""
    )
    return f"""At {r["runs"]} runs: the fake model kept a median pace of
{r["fake_pace_median"]:.1f} tokens/s per run (slowest {r["fake_pace_min"]:.1f});
{r["wall_s"]:.1f} s from gate open to the last reader's `end` (the replies last
{TOKENS / RATE:.0f} s). Journal: {r["rows"]:,} rows (token chunks, usage, end) in
{r["rows_span_s"]:.1f} s. CPU in that window: {cpu}; per 1,000 tokens: {per_k}
("client" is this bench process with its {r["readers"]} readers, "fake" the model).
Token latency by tenth of the reply (ms), p50: {deciles}; p99: {deciles99}.{ticks}
Peak RSS: {rss}. Setup (sessions, runs, readers attached) took
{r["setup_s"]:.1f} s and is not measured."""


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    add_topology(parser)
    parser.add_argument(
        "--durability",
        action="store_true",
        help="with --quick: also the pass-through build (the full sweep always does)",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=None,
        help="rounds of each build for durability (default 3; --quick 1)",
    )
    parser.add_argument(
        "--runs",
        type=lambda text: [int(n) for n in text.split(",")],
        help="the sweep's steps, e.g. 25,50 (default 25,50,100,150,200; --quick 200)",
    )
    parser.add_argument(
        "--samples",
        metavar="DIR",
        help="write every token's send and read times of each step to DIR, "
        "for bench/latency_stages.py",
    )
    common.bench_main("worker", run, parser)
