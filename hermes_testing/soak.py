"""Run the whole suite several times on a loaded machine and print a table.

`make soak` (`python -m hermes_testing.soak`): a busy process spins on one
core for the whole time, as another job on a shared CI machine would, and the
README's test command runs `--runs` times in a row (5 by default). Each run's
wall time, counts and result go into a table; the exit status is non-zero if
any run failed. A test that passes only on an idle machine fails here.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import re
import subprocess
import sys
import time

SUMMARY = re.compile(r"^=+ (?P<counts>.*\d+ (passed|failed|error).*) in [\d.]+s")


def _spin() -> None:
    """Keep one core busy until killed."""
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {0})
    while True:
        pass


def _one(command: list[str]) -> tuple[float, int, str]:
    began = time.monotonic()
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    counts = "no summary line"
    for line in done.stdout.splitlines():
        match = SUMMARY.match(line)
        if match:
            counts = match["counts"]
    return time.monotonic() - began, done.returncode, counts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument(
        "command",
        nargs="*",
        default=["make", "--no-print-directory", "test"],
        help="the test command (default: make test)",
    )
    args = parser.parse_args(argv)
    busy = multiprocessing.Process(target=_spin, daemon=True)
    busy.start()
    rows = []
    try:
        for number in range(1, args.runs + 1):
            seconds, code, counts = _one(args.command)
            rows.append((number, seconds, "pass" if code == 0 else "FAIL", counts))
            print(f"run {number}: {seconds / 60:.1f} min, {counts}", flush=True)
    finally:
        busy.kill()
    print("\n| run | minutes | result | tests |\n|---|---|---|---|")
    for number, seconds, result, counts in rows:
        print(f"| {number} | {seconds / 60:.1f} | {result} | {counts} |")
    return 0 if all(row[2] == "pass" for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
