"""`replay_run` and `prune_journal` on real journals, live runs included.

See docs/architecture.md §7.
"""

import io
import json
import time
import tracemalloc
from datetime import timedelta

import pytest
from django.core.management import CommandError, call_command
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from hermes_testing.harness import running_run
from journal import replay, wire
from journal.heartbeats import worker_beat
from journal.models import Event, Run, WorkerHeartbeat
from journal.store import READ_PAGE, append, read_after

END = (
    "end",
    {"status": "completed", "terminal_state": "completed", "message_id": None},
)
SCRIPT = [
    ("start", {"model": "fake-model", "provider": "openai"}),
    ("reasoning", {"text": "Let me "}),
    ("reasoning", {"text": "think."}),
    ("token", {"text": "Hello"}),
    ("token", {"text": ", world"}),
    (
        "tool",
        {"tool_call_id": "c1", "name": "calculator", "args": '{"expression": "6*7"}'},
    ),
    (
        "tool_complete",
        {
            "tool_call_id": "c1",
            "name": "calculator",
            "result": "42",
            "is_error": False,
            "duration_ms": 3,
        },
    ),
    ("token", {"text": "It is 42."}),
    ("status", {"message": "Retry attempt: stream-resume 1/3; body cut"}),
    ("usage", {"input_tokens": 11, "output_tokens": 7, "total_tokens": 18}),
    END,
]
SCRIPT_TEXT = """\
[start model=fake-model provider=openai]
[reasoning]
Let me think.
[/reasoning]
Hello, world
[tool tool_call_id=c1 name=calculator args="{\\"expression\\": \\"6*7\\"}"]
[tool_complete tool_call_id=c1 name=calculator result=42 is_error=false duration_ms=3]
It is 42.
[status message="Retry attempt: stream-resume 1/3; body cut"]
[usage input_tokens=11 output_tokens=7 total_tokens=18]
[end status=completed terminal_state=completed message_id=null]
"""


def scripted_run(user, *, subject: str = "", events=SCRIPT) -> Run:
    run = running_run(user, subject=subject)
    append(run_id=run.id, token=1, events=list(events))
    return run


def replay_out(*args) -> str:
    out = io.StringIO()
    call_command("replay_run", *args, stdout=out)
    return out.getvalue()


def test_replay_run_text_jsonl_and_sse_on_a_real_journal(alice):
    run = scripted_run(alice[0])
    assert replay_out(run.id) == SCRIPT_TEXT

    lines = [
        json.loads(line)
        for line in replay_out(run.id, "--format", "jsonl").splitlines()
    ]
    assert lines == [
        {"id": f"{run.id}:{seq}", "seq": seq, "event": kind, "data": data}
        for seq, (kind, data) in enumerate(SCRIPT, start=1)
    ]

    # The frames of `journal.wire`, which the SSE transports send.
    sse = replay_out(run.id, "--format", "sse")
    assert sse == "".join(
        wire.sse_frame(run.id, record)
        for record in read_after(run_id=run.id, after_seq=0)
    )

    after = [
        json.loads(line)["seq"]
        for line in replay_out(
            run.id, "--format", "jsonl", "--after-seq", "8"
        ).splitlines()
    ]
    assert after == [9, 10, 11]
    assert replay_out(run.id, "--after-seq", "11") == ""


def test_replay_run_refuses_clearly(alice):
    with pytest.raises(CommandError, match="no run run_nope"):
        call_command("replay_run", "run_nope")
    run = scripted_run(alice[0], subject="demo:fox")
    with pytest.raises(CommandError, match="--speed must be a positive number"):
        call_command("replay_run", run.id, "--speed", "0")
    with pytest.raises(CommandError, match="--after-seq must be 0 or more"):
        call_command("replay_run", run.id, "--after-seq", "-1")
    with pytest.raises(CommandError, match="invalid choice"):
        call_command("replay_run", run.id, "--format", "xml")
    Run.objects.filter(id=run.id).update(pruned_at=timezone.now())
    with pytest.raises(
        CommandError, match=r"\(subject demo:fox\) were pruned by retention"
    ):
        call_command("replay_run", run.id)


def test_replay_run_speed_keeps_the_recorded_gaps(alice):
    run = scripted_run(alice[0])
    base = timezone.now() - timedelta(hours=1)
    for seq in range(1, len(SCRIPT) + 1):  # one event every 100 ms: 1 s in all
        Event.objects.filter(run_id=run.id, seq=seq).update(
            created_at=base + timedelta(milliseconds=100 * (seq - 1))
        )
    delays = []
    written = []
    replay.replay_paced(
        run_id=run.id, after_seq=0, speed=4, write=written.extend, sleep=delays.append
    )
    assert [r.seq for r in written] == list(range(1, len(SCRIPT) + 1))
    # Nothing slept for real: event k is due k × 25 ms after the first, from the start.
    assert delays == pytest.approx([0.025 * k for k in range(1, len(SCRIPT))], abs=0.02)
    began = time.monotonic()
    assert replay_out(run.id, "--speed", "10") == SCRIPT_TEXT
    assert time.monotonic() - began >= 0.1  # 1 s of recorded time at 10x


class _Sink:
    """A stdout that keeps nothing: memory measured is the replay's own."""

    def __init__(self):
        self.chars = 0

    def write(self, text):
        self.chars += len(text)

    def flush(self):
        pass


def _long_run(user, events: int) -> Run:
    run = running_run(user)
    for start in range(0, events, READ_PAGE):
        n = min(READ_PAGE, events - start)
        append(run_id=run.id, token=1, events=[("token", {"text": "x" * 40})] * n)
    append(run_id=run.id, token=1, events=[END])
    return run


def _peak_replay_bytes(run: Run) -> tuple[int, int]:
    sink = _Sink()
    tracemalloc.start()
    try:
        call_command("replay_run", run.id, "--format", "jsonl", stdout=sink)
        return tracemalloc.get_traced_memory()[1], sink.chars
    finally:
        tracemalloc.stop()


@pytest.mark.slow
def test_replay_run_pages_through_the_journal_in_constant_memory(alice):
    small, large = (
        _long_run(alice[0], 2 * READ_PAGE),
        _long_run(alice[0], 10 * READ_PAGE),
    )
    with CaptureQueriesContext(connection) as queries:
        call_command("replay_run", large.id, "--format", "jsonl", stdout=_Sink())
    reads = [q["sql"] for q in queries if "journal_event" in q["sql"]]
    assert len(reads) == 11 and all(
        "LIMIT" in sql for sql in reads
    )  # 10 full pages + 1
    small_peak, small_chars = _peak_replay_bytes(small)
    large_peak, large_chars = _peak_replay_bytes(large)
    assert large_chars > 4.5 * small_chars
    # Five times the journal, about the same memory: pages, not the run, are held.
    assert large_peak < 1.5 * small_peak, (small_peak, large_peak)


# --- prune_journal ---------------------------------------------------------------


def _ended(run: Run, days_ago: float) -> Run:
    Run.objects.filter(id=run.id).update(
        ended_at=timezone.now() - timedelta(days=days_ago)
    )
    return Run.objects.get(id=run.id)


@pytest.fixture
def aged_journal(alice):
    """Two runs ended 40 days ago, one 1 day ago, one still running since long ago."""
    owner, subject = alice[0], "demo:old"
    tokens = [("token", {"text": f"w{i} "}) for i in range(23)]
    old = [
        _ended(scripted_run(owner, subject=subject, events=[*tokens, END]), 40)
        for _ in range(2)
    ]
    recent = _ended(scripted_run(owner, subject=subject, events=[*tokens, END]), 1)
    active = running_run(owner, subject=subject)
    append(run_id=active.id, token=1, events=tokens)
    Run.objects.filter(id=active.id).update(
        created_at=timezone.now() - timedelta(days=60)
    )
    return {"old": old, "recent": recent, "active": active}


def _journal_sizes():
    return {
        run_id: (Event.objects.filter(run_id=run_id).count(), pruned_at)
        for run_id, pruned_at in Run.objects.values_list("id", "pruned_at")
    }


def test_prune_journal_dry_run_changes_nothing(aged_journal):
    before = _journal_sizes()
    out = io.StringIO()
    call_command("prune_journal", "--older-than", "30d", stdout=out)
    text = out.getvalue()
    assert text.startswith(
        "dry run: would prune 2 run(s), 48 event(s) of runs ended before "
    )
    for run in aged_journal["old"]:
        assert f"  {run.id}  ended " in text and "24 event(s)" in text
    assert (
        aged_journal["recent"].id not in text and aged_journal["active"].id not in text
    )
    assert text.endswith("nothing was changed; run again with --for-real to prune\n")
    assert _journal_sizes() == before
    assert not Run.objects.filter(pruned_at__isnull=False).exists()


def test_prune_journal_for_real_prunes_old_runs_and_keeps_their_rows(aged_journal):
    old, recent, active = (
        aged_journal["old"],
        aged_journal["recent"],
        aged_journal["active"],
    )
    worker_beat(worker_id="long-gone:1:w", active_runs=0)
    WorkerHeartbeat.objects.update(seen_at=timezone.now() - timedelta(days=40))
    worker_beat(worker_id="alive:2:w", active_runs=1)
    out = io.StringIO()
    call_command(
        "prune_journal",
        "--older-than",
        "30d",
        "--for-real",
        "--batch-size",
        "5",
        "-v",
        "2",
        stdout=out,
    )
    lines = out.getvalue().splitlines()
    assert sorted(lines[:2]) == sorted(f"pruned {run.id}: 24 event(s)" for run in old)
    assert lines[2].startswith("pruned 2 run(s), 48 event(s) of runs ended before ")
    assert lines[2].endswith("; forgot 1 old worker heartbeat(s)")
    assert list(WorkerHeartbeat.objects.values_list("worker_id", flat=True)) == [
        "alive:2:w"
    ]
    for run in old:
        run.refresh_from_db()
        assert run.pruned_at is not None and run.last_seq == 24  # the row stays
        assert not Event.objects.filter(run_id=run.id).exists()
        with pytest.raises(CommandError, match="pruned by retention"):
            call_command("replay_run", run.id)
    assert Event.objects.filter(run_id=recent.id).count() == 24
    assert Event.objects.filter(run_id=active.id).count() == 23  # never cut a live run
    # A second prune finds nothing left to do.
    out = io.StringIO()
    call_command("prune_journal", "--older-than", "30d", "--for-real", stdout=out)
    assert out.getvalue().startswith("pruned 0 run(s), 0 event(s)")


def test_prune_journal_deletes_in_batches_without_counting_the_journal(aged_journal):
    with CaptureQueriesContext(connection) as queries:
        call_command(
            "prune_journal",
            "--older-than",
            "30d",
            "--for-real",
            "--batch-size",
            "10",
            stdout=io.StringIO(),
        )
    sql = [q["sql"] for q in queries]
    deletes = [s for s in sql if s.startswith("DELETE") and "journal_event" in s]
    assert len(deletes) == 2 * 3  # 24 events each: 10 + 10 + 4
    assert not [s for s in sql if "COUNT(" in s.upper() and "journal_event" in s]
    assert not [
        s for s in sql if s.startswith("SELECT") and '"journal_event"."id"' in s
    ]


@pytest.mark.slow
def test_prune_journal_refuses_bad_input(db):
    for bad in ("30", "thirty days", "-1d", "0d", ""):
        with pytest.raises(CommandError):
            call_command("prune_journal", "--older-than", bad)
    with pytest.raises(CommandError, match="--batch-size must be at least 1"):
        call_command("prune_journal", "--older-than", "1d", "--batch-size", "0")
    with pytest.raises(
        CommandError, match="the following arguments are required: --older-than"
    ):
        call_command("prune_journal")
