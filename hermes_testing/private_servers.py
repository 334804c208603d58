"""Private PostgreSQL and Redis servers that fault tests may stop, kill and restart.

Fault tests must never touch the machine's shared services, so they start their
own: a PostgreSQL cluster made with `initdb` in a temporary directory, or a
`redis-server`, each on a free loopback port. Both have the same small API::

    with PrivatePostgres() as pg:          # start() … stop() and cleanup
        pg.url                            # postgres://postgres@127.0.0.1:<port>/postgres
        pg.stop()                         # a clean shutdown (fast mode)
        pg.kill()                         # SIGKILL: connections die mid-statement
        pg.start()                        # the same data, the same port

`PrivatePostgres.available()` / `PrivateRedis.available()` say whether the
binaries are installed. PostgreSQL refuses to run as root; as root the cluster
is owned by and run as the `postgres` system user.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import IO

from hermes_site.database_url import postgres_url


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _port_open(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.2)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def _wait(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} within {timeout} s")
        time.sleep(0.05)


def _pg_bin_dir() -> Path | None:
    """The directory holding initdb, postgres and pg_isready (Debian's layout first)."""
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin/postgres"), reverse=True)
    found = shutil.which("postgres")
    if found:
        candidates.append(found)
    for postgres in map(Path, candidates):
        if (postgres.parent / "initdb").exists():
            return postgres.parent
    return None


def _children(pid: int) -> list[int]:
    """The processes whose parent is `pid`, from /proc."""
    found = []
    for status in Path("/proc").glob("[0-9]*/status"):
        with contextlib.suppress(OSError):
            if f"\nPPid:\t{pid}\n" in status.read_text():
                found.append(int(status.parent.name))
    return found


class PrivatePostgres:
    """A throwaway PostgreSQL cluster on a free port; data survives stop/start."""

    def __init__(self, *, port: int | None = None, user: str = "postgres"):
        self.port = port or free_port()
        self.user = user
        self.bin = _pg_bin_dir()
        self._tmp: str | None = None
        self._proc: subprocess.Popen | None = None
        self._as: pwd.struct_passwd | None = None
        self._log: IO[bytes] | None = None

    @staticmethod
    def available() -> bool:
        return _pg_bin_dir() is not None

    @property
    def running(self) -> bool:
        """Whether the server process is up (stopped and killed ones are not)."""
        return self._proc is not None and self._proc.poll() is None

    @property
    def url(self) -> str:
        return postgres_url(self.user, "127.0.0.1", self.port, "postgres")

    @property
    def socket_dir(self) -> str:
        """The directory of the server's Unix socket (`.s.PGSQL.<port>`)."""
        assert self._tmp is not None
        return self._tmp

    @property
    def socket_url(self) -> str:
        """`url` over the server's Unix socket, in libpq's form."""
        return postgres_url(self.user, self.socket_dir, self.port, "postgres")

    @property
    def datadir(self) -> Path:
        assert self._tmp is not None
        return Path(self._tmp) / "data"

    def _demote(self):
        if self._as is None:
            return None
        uid, gid = self._as.pw_uid, self._as.pw_gid

        def demote() -> None:
            os.setgid(gid)
            os.setuid(uid)

        return demote

    def _run(self, *args: str) -> None:
        subprocess.run(
            args,
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            preexec_fn=self._demote(),
        )

    def _init(self) -> None:
        if self.bin is None:
            raise RuntimeError("PostgreSQL server binaries (initdb) are not installed")
        self._tmp = tempfile.mkdtemp(prefix="hermes-pg-")
        if os.geteuid() == 0:
            self._as = pwd.getpwnam("postgres")
            os.chown(self._tmp, self._as.pw_uid, self._as.pw_gid)
        self._run(
            str(self.bin / "initdb"),
            "-D",
            str(self.datadir),
            "-U",
            self.user,
            "--auth=trust",
            "--no-sync",
            "-E",
            "UTF8",
        )

    def start(self) -> PrivatePostgres:
        """Start the server (initialising the cluster the first time)."""
        if self._tmp is None:
            self._init()
        assert self._tmp is not None and self.bin is not None
        if self._proc is not None and self._proc.poll() is None:
            return self
        if self._log is None:
            self._log = open(Path(self._tmp) / "server.log", "ab")  # noqa: SIM115
        self._proc = subprocess.Popen(
            [
                str(self.bin / "postgres"),
                "-D",
                str(self.datadir),
                "-p",
                str(self.port),
                "-c",
                "listen_addresses=127.0.0.1",
                "-c",
                f"unix_socket_directories={self._tmp}",
                "-c",
                "fsync=off",
                "-c",
                "max_connections=200",
            ],
            stdout=subprocess.DEVNULL,
            stderr=self._log,
            preexec_fn=self._demote(),
        )
        _wait(self._accepting, 30, f"PostgreSQL did not accept on {self.port}")
        return self

    def _accepting(self) -> bool:
        if self._proc is not None and self._proc.poll() is not None:
            raise RuntimeError(f"PostgreSQL exited: {self.log_tail()}")
        assert self.bin is not None
        result = subprocess.run(
            [
                str(self.bin / "pg_isready"),
                "-h",
                "127.0.0.1",
                "-p",
                str(self.port),
                "-q",
            ],
            check=False,
        )
        return result.returncode == 0

    def stop(self) -> None:
        """A fast shutdown: sessions are ended, the server exits cleanly."""
        self._signal(signal.SIGINT)

    def kill(self) -> None:
        """SIGKILL the postmaster; its backends die too (crash recovery on start)."""
        if self._proc is None or self._proc.poll() is not None:
            return
        # The backends too, at once: orphaned ones only exit when they next
        # notice the postmaster is gone, and may answer a query meanwhile.
        backends = _children(self._proc.pid)
        self._proc.kill()
        for pid in backends:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self._proc.wait(30)
        _wait(lambda: not _port_open(self.port), 30, "PostgreSQL port did not close")
        pid_file = self.datadir / "postmaster.pid"
        with contextlib.suppress(FileNotFoundError):
            pid_file.unlink()

    def _signal(self, sig: int) -> None:
        if self._proc is None or self._proc.poll() is not None:
            return
        self._proc.send_signal(sig)
        self._proc.wait(60)

    def log_tail(self, chars: int = 2000) -> str:
        if self._tmp is None:
            return ""
        path = Path(self._tmp) / "server.log"
        return path.read_text(errors="replace")[-chars:] if path.exists() else ""

    def cleanup(self) -> None:
        self._signal(signal.SIGINT)
        if self._log is not None:
            self._log.close()
            self._log = None
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None

    def __enter__(self) -> PrivatePostgres:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.cleanup()


class PrivateRedis:
    """A throwaway redis-server on a free port, without persistence."""

    def __init__(self, *, port: int | None = None):
        self.port = port or free_port()
        self._proc: subprocess.Popen | None = None

    @staticmethod
    def available() -> bool:
        return shutil.which("redis-server") is not None

    @property
    def running(self) -> bool:
        """Whether the server process is up (stopped and killed ones are not)."""
        return self._proc is not None and self._proc.poll() is None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> PrivateRedis:
        if self._proc is not None and self._proc.poll() is None:
            return self
        self._proc = subprocess.Popen(
            [
                "redis-server",
                "--bind",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--save",
                "",
                "--appendonly",
                "no",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        _wait(lambda: _port_open(self.port), 30, f"Redis did not accept on {self.port}")
        return self

    def stop(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            self._proc.wait(30)

    def kill(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait(30)

    def cleanup(self) -> None:
        self.stop()

    def __enter__(self) -> PrivateRedis:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.cleanup()
