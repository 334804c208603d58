"""Shared by the benchmarks: backends, child processes, raw SSE clients, reports.

Not a benchmark and not a test. Each `bench_*.py` runs in a process of its own
whose environment names the backend (settings are read from the environment at
import time); `prepared()` builds that environment and a fresh database for it,
and removes that database afterwards.

A benchmark touches only what it made. Scale-out runs on the servers
`DATABASE_URL` and `REDIS_URL` name (nothing is assumed about addresses): each
benchmark gets a PostgreSQL database of its own, `hermes_bench_<pid>_<random>`,
created next to the configured one, and a Redis key prefix of the same name for
its channel layer (`HERMES_CHANNEL_PREFIX`). Afterwards that database is dropped
and the keys under that prefix are deleted; `drop_database` and `delete_keys`
refuse any name this process did not create. The configured database itself
and every other key are never written.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import json
import os
import platform
import secrets
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections import deque
from collections.abc import Iterator
from pathlib import Path
from typing import IO
from urllib.parse import urlsplit, urlunsplit

from clients import (  # noqa: F401  (re-exported: benchmarks use common.Reader …)
    FrameReader,
    HTTPError,
    Reader,
    SSEConn,
    http_json,
    start_readers,
)

ROOT = Path(__file__).resolve().parent.parent
BENCH_DIR = ROOT / "bench"
VAR = ROOT / "var" / "bench"
RESULTS = VAR / "results"
DOC = ROOT / "docs" / "benchmarks.md"
PY = sys.executable

# The servers the operator configured; scale-out benchmarks make their own
# database and key prefix on them.
DATABASE_URL = os.environ.get("DATABASE_URL", "")
REDIS_URL = os.environ.get("REDIS_URL", "")
BACKENDS = ("embedded", "scaleout")
BACKEND_LABEL = {
    "embedded": "embedded (SQLite WAL, in-memory channel layer)",
    "scaleout": "scale-out (PostgreSQL + Redis channel layer)",
}
TICK = os.sysconf("SC_CLK_TCK")


# --- backends and environments -------------------------------------------------


def base_env() -> dict:
    """This environment without any Hermes database/broker settings."""
    drop = ("DATABASE_URL", "REDIS_URL", "HERMES_SQLITE_PATH", "OPENAI_BASE_URL")
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in drop and not k.startswith("PYTEST")
    }
    env["DJANGO_SETTINGS_MODULE"] = "hermes_site.settings"
    env["PYTHONPATH"] = str(ROOT)
    env.setdefault("HERMES_LOG_LEVEL", "WARNING")
    # One bench user drives hundreds of runs and streams: lift the per-user
    # limits (chat.limits) that protect a shared server from one account.
    env.update(
        HERMES_USER_MAX_CONCURRENT_RUNS="100000",
        HERMES_USER_RUNS_PER_MINUTE="100000",
        HERMES_USER_MAX_STREAMS="100000",
        HERMES_USER_MAX_SESSIONS="100000",
        HERMES_USER_REQUEST_RATE="1000000/min",
    )
    return env


def child_env(**overrides: str) -> dict:
    """The environment of a server or helper started by a benchmark process."""
    env = dict(os.environ)
    env.update(overrides)
    return env


_created_databases: set[str] = set()  # made by this process, not yet dropped
_created_prefixes: set[str] = set()


def unique_name() -> str:
    """A name no other run uses: `hermes_bench_<pid>_<random>`."""
    return f"hermes_bench_{os.getpid()}_{secrets.token_hex(4)}"


def database_url(name: str) -> str:
    """`DATABASE_URL` with its database replaced by `name` (same server, user)."""
    parts = urlsplit(DATABASE_URL)
    return urlunsplit(parts._replace(path=f"/{name}"))


def create_database(name: str) -> str:
    """Create database `name` on the configured server; returns its URL."""
    import psycopg
    from psycopg import sql

    with psycopg.connect(DATABASE_URL, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    _created_databases.add(name)
    return database_url(name)


def drop_database(name: str) -> None:
    """Drop database `name`, which this process must have created."""
    import psycopg
    from psycopg import sql

    if name not in _created_databases:
        raise RuntimeError(f"refusing to drop database {name!r}: not made by this run")
    with psycopg.connect(DATABASE_URL, autocommit=True) as conn:
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                sql.Identifier(name)
            )
        )
    _created_databases.discard(name)


def claim_prefix(prefix: str) -> str:
    """Reserve a Redis key prefix for this run's channel layer."""
    _created_prefixes.add(prefix)
    return prefix


def delete_keys(prefix: str) -> int:
    """Delete the keys under `prefix`, which this process must have claimed."""
    import redis

    if prefix not in _created_prefixes:
        raise RuntimeError(f"refusing to delete keys {prefix!r}*: not made by this run")
    client = redis.Redis.from_url(REDIS_URL)
    deleted = 0
    batch = []
    for key in client.scan_iter(match=f"{prefix}*", count=1000):
        batch.append(key)
        if len(batch) == 1000:
            deleted += int(client.delete(*batch))  # type: ignore[arg-type]
            batch = []
    if batch:
        deleted += int(client.delete(*batch))  # type: ignore[arg-type]
    _created_prefixes.discard(prefix)
    return deleted


@contextlib.contextmanager
def prepared(backend: str) -> Iterator[dict]:
    """A fresh, migrated database for one benchmark; yields the child env.

    Embedded: a SQLite file of its own under var/bench/. Scale-out: a database
    and a Redis key prefix of its own on the configured servers. Whatever was
    made here is removed on the way out, and nothing else.
    """
    env = base_env()
    env["HERMES_BENCH_BACKEND"] = backend
    name = unique_name()
    if backend == "embedded":
        VAR.mkdir(parents=True, exist_ok=True)
        path = VAR / f"{name}.sqlite3"
        env["HERMES_SQLITE_PATH"] = str(path)
    elif backend == "scaleout":
        env["DATABASE_URL"] = create_database(name)
        env["REDIS_URL"] = REDIS_URL
        env["HERMES_CHANNEL_PREFIX"] = claim_prefix(f"{name}:")
    else:
        raise ValueError(f"unknown backend {backend!r}")
    try:
        subprocess.run(
            [PY, "manage.py", "migrate", "--noinput", "-v", "0"],
            cwd=ROOT,
            env=env,
            check=True,
        )
        yield env
    finally:
        if backend == "embedded":
            for suffix in ("", "-wal", "-shm"):
                Path(f"{path}{suffix}").unlink(missing_ok=True)
        else:
            drop_database(name)
            delete_keys(env["HERMES_CHANNEL_PREFIX"])


def scaleout_available() -> str | None:
    """None if the configured PostgreSQL and Redis answer, else why not."""
    if not DATABASE_URL.startswith(("postgres://", "postgresql://")) or not REDIS_URL:
        return "set DATABASE_URL (PostgreSQL) and REDIS_URL to the servers to use"
    try:
        import psycopg
        import redis

        psycopg.connect(DATABASE_URL, connect_timeout=3).close()
        redis.Redis.from_url(REDIS_URL, socket_connect_timeout=3).ping()
    except Exception as exc:  # noqa: BLE001  (any failure means: skip scale-out)
        return f"{type(exc).__name__}: {exc}"
    return None


def bench_main(name: str, run, parser) -> None:
    """Entry point of a benchmark script.

    Without a prepared environment (run by hand), prepare one and re-run this
    script in a child process; with one, set Django up and call `run(args)`,
    which returns (markdown, result dict).
    """
    parser.add_argument("--backend", choices=[*BACKENDS, "both"], default="embedded")
    parser.add_argument("--quick", action="store_true", help="scaled-down sizes")
    parser.add_argument(
        "--profile",
        action="store_true",
        help="record py-spy profiles of the servers under var/bench/profiles",
    )
    args = parser.parse_args()
    if args.profile:
        os.environ["HERMES_BENCH_PROFILE"] = "1"
    if os.environ.get("HERMES_BENCH_BACKEND") != args.backend:
        backends = BACKENDS if args.backend == "both" else (args.backend,)
        failed = 0
        for backend in backends:
            if backend == "scaleout" and (why := scaleout_available()):
                sys.exit(f"scale-out needs PostgreSQL and Redis: {why}")
            with prepared(backend) as env:
                # argparse keeps the last --backend given
                argv = [sys.argv[0], *sys.argv[1:], "--backend", backend]
                failed += subprocess.call([PY, *argv], env=env) != 0
        sys.exit(1 if failed else 0)
    setup_django()
    started, load_before = time.monotonic(), os.getloadavg()[0]
    markdown, result = run(args)
    machine = machine_info(args.backend)
    machine["load"] = f"{load_before:.2f} before / {os.getloadavg()[0]:.2f} after"
    result.update(
        bench=name,
        backend=args.backend,
        quick=args.quick,
        seconds=round(time.monotonic() - started, 1),
        machine=machine,
    )
    write_section(name, args.backend, markdown, machine, args.quick)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{name}-{args.backend}.json").write_text(json.dumps(result, indent=1))


def setup_django() -> None:
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "hermes_site.settings")
    import django

    django.setup()


# --- Django-side fixtures (the bench process, after setup_django) -------------


def make_user(name: str):
    """A user and its API token key."""
    from django.contrib.auth import get_user_model
    from rest_framework.authtoken.models import Token

    user = get_user_model().objects.create_user(
        username=name, password=f"pw-{name}-bench"
    )
    return user, Token.objects.create(user=user).key


def running_run(owner, *, lease_s: float = 3600):
    """A run as a worker holds it right after claiming: running, fencing token 1."""
    from datetime import timedelta

    from django.utils import timezone

    from journal.models import Run

    now = timezone.now()
    return Run.objects.create(
        owner=owner,
        status=Run.Status.RUNNING,
        fencing_token=1,
        lease_owner="bench-writer",
        lease_expires_at=now + timedelta(seconds=lease_s),
        started_at=now,
    )


def close_db() -> None:
    from django.db import connections

    connections.close_all()


# --- child processes ------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Child:
    """A child process (server, worker, helper) with /proc readings."""

    def __init__(
        self,
        args: list[str],
        env: dict,
        *,
        ready: str | None = None,
        port: int | None = None,
        timeout: float = 60,
        name: str = "",
    ):
        self.name = name or args[0]
        self.log: deque[str] = deque(maxlen=200)
        self.proc = subprocess.Popen(
            [PY, *args],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self._ready = threading.Event()
        self._ready_text = ready
        threading.Thread(target=self._drain, daemon=True).start()
        deadline = time.monotonic() + timeout
        if ready is not None and not self._ready.wait(timeout):
            self.stop()
            raise RuntimeError(f"{self.name} not ready: {self.tail()}")
        if port is not None:
            while not _accepts(port):
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"{self.name} does not listen: {self.tail()}")
                time.sleep(0.05)

    def _drain(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.log.append(line)
            if self._ready_text and self._ready_text in line:
                self._ready.set()

    def tail(self, n: int = 40) -> str:
        return "".join(list(self.log)[-n:])

    @property
    def pid(self) -> int:
        return self.proc.pid

    def status(self) -> dict[str, str]:
        out = {}
        with open(f"/proc/{self.pid}/status") as f:
            for line in f:
                key, _, value = line.partition(":")
                out[key] = value.strip()
        return out

    def rss_kib(self) -> int:
        return int(self.status()["VmRSS"].split()[0])

    def hwm_kib(self) -> int:
        return int(self.status()["VmHWM"].split()[0])

    def threads(self) -> int:
        return int(self.status()["Threads"])

    def cpu_s(self) -> float:
        with open(f"/proc/{self.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / TICK  # utime + stime

    def fds(self) -> int:
        return len(os.listdir(f"/proc/{self.pid}/fd"))

    def stop(self, timeout: float = 20) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


def _accepts(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
        return True
    except OSError:
        return False


def daphne(
    env: dict,
    port: int,
    app: str = "hermes_site.asgi:application",
    timeout: float = 60,
) -> Child:
    return Child(
        ["-m", "daphne", "-b", "127.0.0.1", "-p", str(port), app],
        env,
        port=port,
        name="daphne",
        timeout=timeout,
    )


def manage_py(env: dict) -> str:
    """`manage.py`, or a stand-in for what-if experiments (HERMES_BENCH_MANAGE)."""
    return env.get("HERMES_BENCH_MANAGE", "manage.py")


def serve(env: dict, port: int) -> Child:
    """`manage.py serve`: daphne and the in-process worker."""
    return Child(
        [manage_py(env), "serve", "--port", str(port)],
        env,
        ready="Hermes at",
        port=port,
        name="serve",
    )


def worker(env: dict, concurrency: int, metrics_port: int | None = None) -> Child:
    """`manage.py worker`: a turn-worker process (scale-out), serving its
    metrics on `metrics_port` if given."""
    metrics = ["--metrics-port", str(metrics_port)] if metrics_port else []
    return Child(
        [manage_py(env), "worker", "--concurrency", str(concurrency), *metrics],
        env,
        ready="running",
        name="worker",
    )


def histogram(port: int, name: str) -> dict[float, float]:
    """A Prometheus histogram of the process serving `/metrics` on `port`:
    `{upper bound: cumulative count}`."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as r:
        text = r.read().decode()
    return {
        float(sample.labels["le"]): sample.value
        for family in text_string_to_metric_families(text)
        if family.name == name
        for sample in family.samples
        if sample.name == f"{name}_bucket"
    }


def histogram_quantile(q: float, buckets: dict[float, float]) -> float | None:
    """The `q` quantile of cumulative `buckets`, interpolated within its
    bucket as Prometheus's `histogram_quantile` does; None without samples."""
    bounds = sorted(buckets)
    total = buckets[bounds[-1]] if bounds else 0
    if not total:
        return None
    rank, lower, below = q * total, 0.0, 0.0
    for bound in bounds:
        if buckets[bound] >= rank:
            if bound == float("inf"):
                return lower  # beyond the last finite bound: its value
            inside = buckets[bound] - below
            return lower + (bound - lower) * ((rank - below) / inside if inside else 1)
        lower, below = bound, buckets[bound]
    return lower


class Helper:
    """A helper process that answers one JSON line per command line on stdin."""

    def __init__(self, args: list[str], env: dict, ready: str):
        self.proc = subprocess.Popen(
            [PY, *args],
            cwd=ROOT,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self._in: IO[str] = self.proc.stdin
        self._out: IO[str] = self.proc.stdout
        line = self._out.readline()
        if not line.startswith(ready):
            self.proc.kill()
            raise RuntimeError(f"{args[0]} did not start: {line!r}")
        self.ready_line = line.strip()
        self.pid = self.proc.pid

    def command(self, *words) -> dict:
        self._in.write(" ".join(str(w) for w in words) + "\n")
        self._in.flush()
        return json.loads(self._out.readline())

    def cpu_s(self) -> float:
        with open(f"/proc/{self.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / TICK

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                self._in.write("quit\n")
                self._in.flush()
                self.proc.wait(10)
            except (BrokenPipeError, ValueError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait(5)


class FakeModel(Helper):
    """The loopback model server in a process of its own (`bench/run_fake_llm.py`).

    Its own process, so its send times are not skewed by the readers' GIL; the
    times are CLOCK_MONOTONIC nanoseconds, which every process on the machine shares.
    """

    def __init__(self, env: dict):
        super().__init__([str(BENCH_DIR / "run_fake_llm.py")], env, "FAKE ")
        self.base_url = self.ready_line.split()[1]


# --- statistics and reports -------------------------------------------------------


def pct(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    k = min(len(ordered) - 1, max(0, round(p / 100 * (len(ordered) - 1))))
    return ordered[k]


def signed_pct(x: float | None) -> str:
    """A relative change as "+8%" ("n/a" when there was nothing to compare)."""
    return "n/a" if x is None else f"{x:+.0%}"


def fmt(x, digits: int = 1) -> str:
    if isinstance(x, float):
        if x != x:
            return "n/a"
        return f"{x:,.{digits}f}"
    if isinstance(x, int):
        return f"{x:,}"
    return str(x)


def md_table(headers: list[str], rows: list[list]) -> str:
    cells = [[fmt(c) for c in row] for row in rows]
    out = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    out += ["| " + " | ".join(row) + " |" for row in cells]
    return "\n".join(out)


def machine_info(backend: str) -> dict:
    info = {
        "nproc": os.cpu_count(),
        "cpu": _cpu_model(),
        "python": platform.python_version(),
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "kernel": platform.release(),
    }
    import sqlite3

    if backend == "embedded":
        info["database"] = f"SQLite {sqlite3.sqlite_version} (WAL, synchronous=NORMAL)"
        info["layer"] = "channels InMemoryChannelLayer"
    else:
        info["database"] = _pg_version()
        info["layer"] = f"channels_redis, {_redis_version()}"
    return info


def _cpu_model() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def _pg_version() -> str:
    try:
        import psycopg

        with psycopg.connect(DATABASE_URL) as conn:
            row = conn.execute("SHOW server_version").fetchone()
            return "PostgreSQL " + (row[0] if row else "(version unknown)")
    except Exception:  # noqa: BLE001
        return "PostgreSQL (version unknown)"


def _redis_version() -> str:
    try:
        import redis

        info = redis.Redis.from_url(REDIS_URL).info()
        # redis-py types its sync and asyncio clients' answers as one union
        return "Redis " + info["redis_version"]  # type: ignore[index]
    except Exception:  # noqa: BLE001
        return "Redis (version unknown)"


def machine_line(m: dict) -> str:
    load = f", 1-min load average {m['load']}" if m.get("load") else ""
    return (
        f"nproc {m['nproc']} ({m['cpu']}), Python {m['python']}, {m['database']}, "
        f"{m['layer']}, Linux {m['kernel']}, {m['date']}{load}"
    )


DOC_HEAD = """# Hermes benchmarks

Generated by `bench/run_all.py` (`make bench`); each `bench/bench_*.py` rewrites
its own sections (between HTML comment markers named after it) and leaves the
rest of this file alone. Targets are those of docs/architecture.md §9. How each
number is measured is said under each table. Scale-out runs on the PostgreSQL and
Redis that `DATABASE_URL` and `REDIS_URL` name, in a database and key prefix made
for each benchmark and removed after it.
"""


@contextlib.contextmanager
def doc_lock():
    """Serialise read-modify-write of the doc between benchmark processes."""
    VAR.mkdir(parents=True, exist_ok=True)
    with open(VAR / "doc.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def write_section(
    name: str, backend: str, markdown: str, machine: dict, quick: bool
) -> None:
    """Replace (or add) this benchmark's section for this backend in the doc."""
    DOC.parent.mkdir(parents=True, exist_ok=True)
    with doc_lock():
        _write_section(name, backend, markdown, machine, quick)
    print(f"\n[{name}/{backend}] {DOC.relative_to(ROOT)} updated", flush=True)


def _write_section(
    name: str, backend: str, markdown: str, machine: dict, quick: bool
) -> None:
    text = DOC.read_text() if DOC.exists() else DOC_HEAD
    begin, end = f"<!-- bench:{name}:{backend} -->", f"<!-- /bench:{name}:{backend} -->"
    scale = " — `--quick` (scaled down)" if quick else ""
    body = (
        f"{begin}\n### {name} — {BACKEND_LABEL[backend]}{scale}\n\n"
        f"Machine: {machine_line(machine)}.\n\n{markdown.strip()}\n{end}"
    )
    if begin in text and end in text:
        head, rest = text.split(begin, 1)
        _, tail = rest.split(end, 1)
        text = head + body + tail
    else:
        text = text.rstrip() + "\n\n" + body + "\n"
    DOC.write_text(text)


def which(cmd: str) -> str | None:
    return shutil.which(cmd)


# --- bench-only routes of the ASGI wrappers (writer_asgi, traced_asgi) --------


async def send_json(send, payload: dict) -> None:
    """Answer an ASGI HTTP request with `payload` as JSON."""
    body = json.dumps(payload).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
    ]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": body})


# --- the fan-out writer (inside a server process or in a helper process) ------


async def write_batches(run_id: str, n: int, batch: int, *, end: bool = False) -> list:
    """Append `n` token events in batches, each published after its commit.

    A worker's path: each batch is one tick of its committer for this run
    (`journal.store.append_many` with the run's last seq known), the `end`
    goes through `journal.store.append` as a runner's does; each is published
    after it returns, with the CLOCK_MONOTONIC time taken between the two: the
    moment the batch is committed. Returns [[last seq, commit ns], …].
    """
    from journal import dbpool
    from journal.models import Run
    from journal.publish import publish
    from journal.store import Record, append, append_many

    events = [("token", {"text": "tok-" * 5})] * batch
    last = await dbpool.writers.run(
        lambda: Run.objects.values_list("last_seq", flat=True).get(pk=run_id)
    )
    commits = []

    def tick(events: list) -> list[Record]:
        (records,) = append_many([(run_id, 1, events)], last_seqs={run_id: last})
        if not isinstance(records, list):
            raise records
        return records

    for done in range(0, n, batch):
        records = await dbpool.writers.run(tick, events[: min(batch, n - done)])
        last = records[-1].seq
        commits.append([last, time.monotonic_ns()])
        await publish(run_id, records)
    if end:
        records = await dbpool.writers.run(
            append,
            run_id=run_id,
            token=1,
            events=[("end", {"status": "completed", "terminal_state": "completed"})],
        )
        commits.append([records[-1].seq, time.monotonic_ns()])
        await publish(run_id, records)
    return commits


# --- profiling (optional: `--profile`, needs py-spy in the venv) ----------------


class Profiler:
    """`py-spy record` attached to a process until `stop()`; raw collapsed stacks."""

    def __init__(self, pid: int, label: str):
        self.proc = None
        spy = shutil.which("py-spy", path=str(Path(PY).parent)) or shutil.which(
            "py-spy"
        )
        if not os.environ.get("HERMES_BENCH_PROFILE") or spy is None:
            return
        out = VAR / "profiles"
        out.mkdir(parents=True, exist_ok=True)
        self.path = out / f"{label}.txt"
        self.proc = subprocess.Popen(
            [
                spy,
                "record",
                "--pid",
                str(pid),
                "-f",
                "raw",
                "-o",
                str(self.path),
                # GIL holders only: where the CPU of the process goes
                *os.environ.get(
                    "HERMES_BENCH_PYSPY_ARGS", "-r 200 --gil --nonblocking"
                ).split(),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        time.sleep(0.3)

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.send_signal(2)  # SIGINT: py-spy writes its file and exits
            self.proc.wait(30)
            print(f"profile written: {self.path}", flush=True)


def self_cpu_s() -> float:
    """CPU seconds of this process so far (user + system)."""
    t = os.times()
    return t.user + t.system


# --- sweeps of runs (bench_worker, bench_capacity, run_all's summary) --------

P99_TARGET_MS = 150  # token → reader, docs/architecture.md §9


def held(steps: list[dict]) -> list[dict]:
    """The steps of a sweep that completed every run within the p99 target."""
    return [
        c for c in steps if c["p99_ms"] < P99_TARGET_MS and c["completed"] == c["runs"]
    ]
