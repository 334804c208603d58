"""Proposed product fixes, patched in at start-up, so the benchmarks can measure them.

NOT product code. `HERMES_WHATIF` is a comma list of:

- `bounded-read`: `journal.store.read_after` with an upper bound on the seq range
  (`seq <= after_seq + limit`; a run's seqs are dense), so PostgreSQL never
  plans a scan of the run's whole journal.
- `writer-threads:N`: N threads in the journal's writer pool (PostgreSQL only).
- `switch-interval:S`: `sys.setswitchinterval(S)` (CPython's default is 0.005 s):
  how long a thread that waited on I/O (the writer, after each database round
  trip) may wait for the event loop's thread to hand the GIL back.

Used two ways: `python bench/whatif.py <manage.py arguments>` (a stand-in for
`manage.py`, see `HERMES_BENCH_MANAGE` in common.py) and
`daphne bench.whatif:application`.
"""

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "hermes_site.settings")


def wanted() -> set[str]:
    return {
        w.strip() for w in os.environ.get("HERMES_WHATIF", "").split(",") if w.strip()
    }


def bounded_read_after(*, run_id: str, after_seq: int, limit: int = 2000):
    from django.db import connection

    from journal.store import Record

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT seq, type, payload FROM journal_event"
            " WHERE run_id = %s AND seq > %s AND seq <= %s ORDER BY seq LIMIT %s",
            [run_id, after_seq, after_seq + limit, limit],
        )
        return [Record(*row) for row in cursor.fetchall()]


def apply() -> set[str]:
    """Patch the wanted changes into the loaded product modules (Django set up)."""
    names = wanted()
    if "bounded-read" in names:
        import chat.api
        import chat.snapshot
        import journal.admin
        import journal.replay
        import journal.store
        import journal.subscribe

        for module in (
            journal.store,
            journal.subscribe,
            journal.replay,
            journal.admin,
            chat.api,
            chat.snapshot,
        ):
            vars(module)["read_after"] = bounded_read_after
    for name in names:
        if name.startswith("switch-interval:"):
            sys.setswitchinterval(float(name.split(":")[1]))
        if name.startswith("writer-threads:"):
            from journal import dbpool

            dbpool.writers = dbpool.DBPool("write", int(name.split(":")[1]))
    return names


def main() -> None:
    import django

    django.setup()
    apply()
    from django.core.management import execute_from_command_line

    execute_from_command_line(["manage.py", *sys.argv[1:]])


if __name__ == "__main__":
    main()
else:  # imported as an ASGI module by daphne
    import hermes_site.asgi

    apply()
    application = hermes_site.asgi.application
