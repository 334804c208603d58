"""`manage.py worker --processes N`: N worker processes under one supervisor.

One Python process streams on one core (one event loop under one GIL), so an
operator who wants more cores for model turns runs more worker processes; this
runs them without a process manager (docs/operating.md):

- each child is `manage.py worker` with the same options, minus `--processes`
  (and a metrics port of its own);
- a child that dies (a crash, the kernel's OOM killer, a stray `kill`) is
  started again, after a pause that doubles while children die young
  (`RESTART_MIN_S` to `RESTART_MAX_S`); its runs are settled by the reapers as
  for any lost worker;
- SIGTERM and SIGINT are passed to every child, which stops claiming and
  hands its runs over to a worker still alive elsewhere, or else lets them
  finish for `--grace` seconds and settles the rest (chat.worker); the
  supervisor waits for them all and exits, 0 if every child did. Children
  still running `STOP_MARGIN_S` after their grace are killed (their runs are
  then settled by the reapers). The children stop together: a rolling
  restart restarts worker processes one at a time instead (docs/operating.md).

The supervisor itself touches neither the database nor the channel layer.
"""

import signal
import subprocess
import sys
import time
from collections.abc import Callable
from typing import TextIO

RESTART_MIN_S = 1.0
RESTART_MAX_S = 30.0
YOUNG_S = 10.0  # a child that dies sooner than this doubles the next pause
POLL_S = 0.2
STOP_MARGIN_S = 20.0  # past the grace: settling, closing connections


class Supervisor:
    def __init__(
        self,
        argvs: list[list[str]],
        *,
        grace_s: float,
        out: TextIO = sys.stdout,
        spawn: Callable[[list[str]], subprocess.Popen] | None = None,
    ):
        self.argvs = argvs  # each child's command line
        processes = self.processes = len(argvs)
        self.grace_s = grace_s
        self.out = out
        self._spawn = spawn or (lambda args: subprocess.Popen(args))
        self.children: list[subprocess.Popen | None] = [None] * processes
        self._started_at = [0.0] * processes
        self._restart_at = [0.0] * processes
        self._pause = [RESTART_MIN_S] * processes
        self.stop_signal: int | None = None

    def say(self, text: str) -> None:
        self.out.write(f"{text}\n")
        self.out.flush()

    def _on_signal(self, signum, _frame) -> None:
        if self.stop_signal is None:
            self.stop_signal = signum
        for child in self.children:  # every stop signal, passed on at once
            if child is not None and child.poll() is None:
                child.send_signal(signum)

    def run(self) -> int:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._on_signal)
        for i in range(self.processes):
            self._start(i)
        self.say(
            f"supervising {self.processes} worker processes "
            f"(pids {' '.join(str(c.pid) for c in self.children if c)})"
        )
        while self.stop_signal is None:
            self._watch()
            time.sleep(POLL_S)
        return self._stop()

    def _start(self, i: int) -> None:
        self.children[i] = self._spawn(self.argvs[i])
        self._started_at[i] = time.monotonic()

    def _pid(self, i: int) -> int | None:
        child = self.children[i]
        return child.pid if child is not None else None

    def _watch(self) -> None:
        now = time.monotonic()
        for i, child in enumerate(self.children):
            if child is None:
                if now >= self._restart_at[i] and self.stop_signal is None:
                    self._start(i)
                    self.say(f"worker process {i} restarted (pid {self._pid(i)})")
                continue
            code = child.poll()
            if code is None:
                continue
            lived = now - self._started_at[i]
            pause = self._pause[i] if lived < YOUNG_S else RESTART_MIN_S
            self._pause[i] = min(pause * 2, RESTART_MAX_S)
            self._restart_at[i] = now + pause
            self.children[i] = None
            self.say(
                f"worker process {i} (pid {child.pid}) exited with {code} after "
                f"{lived:.1f} s; restarting in {pause:.1f} s"
            )

    def _stop(self) -> int:
        self.say("stopping: signal passed to every worker process")
        deadline = time.monotonic() + self.grace_s + STOP_MARGIN_S
        codes = []
        for child in self.children:
            if child is None:
                continue
            try:
                codes.append(child.wait(max(0.1, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                self.say(f"worker process {child.pid} did not stop; killing it")
                child.kill()
                codes.append(child.wait())
        return 0 if all(code == 0 for code in codes) else 1
