"""Fault injection on a real scale-out deployment (`pytest -m chaos`).

Private PostgreSQL and Redis, two daphne and two worker processes and the
loopback model server (`hermes_testing.chaos`). Each scenario breaks one part of
the platform while runs stream and readers reconnect at random across both web
servers with every cursor form, then checks against the journal: every reader
got every event exactly once and in order, every journal is dense with exactly
one `end`, the kept assistant text equals the journal's; and the scenario's
own bound. docs/operating.md lists what each one proves.
"""

from __future__ import annotations

import os
import secrets
import signal
import threading
import time
from dataclasses import dataclass

import pytest

from hermes_testing.api import new_session, start_run
from hermes_testing.chaos import (
    Stack,
    rss_bytes,
    wait_for,
)
from hermes_testing.chaos_readers import (
    Reader,
    assert_promises,
    join_readers,
    verify,
)
from hermes_testing.fake_llm import FakeLLM, Reply
from hermes_testing.private_servers import PrivatePostgres, PrivateRedis

MISSING = ", ".join(
    name
    for name, found in (
        ("the PostgreSQL server binaries", PrivatePostgres.available()),
        ("redis-server", PrivateRedis.available()),
    )
    if not found
)
pytestmark = [
    pytest.mark.chaos,
    pytest.mark.skipif(
        bool(MISSING) and not os.environ.get("HERMES_REQUIRE_CHAOS"),
        reason=f"fault injection needs {MISSING} (CI installs them)",
    ),
]

LEASE_S = 5.0  # hermes_testing.chaos.DEFAULT_ENV
SETTLE_BOUND_S = LEASE_S + 2  # a dead worker's run is settled within lease + 2 s
MIB = 2**20


@pytest.fixture(scope="module")
def model():
    with FakeLLM(models=["fake-model"]) as fake:
        yield fake


@pytest.fixture(scope="module")
def stack_module(model, tmp_path_factory):
    logdir = tmp_path_factory.mktemp("chaos-logs")
    with Stack(logdir=logdir, model_url=model.base_url) as stack:
        yield stack


@pytest.fixture
def stack(stack_module, model):
    """The deployment with every server and process up, the model unscripted."""
    model.reset()
    stack_module.heal()
    return stack_module


@dataclass
class Case:
    run_id: str
    session_id: int
    headers: dict
    content: str  # the user message, which routes the model's reply
    text: str  # what the model streams


def story(i: int, chars: int) -> str:
    """A distinct answer of `chars` characters, multi-byte text included."""
    words: list[str] = []
    n = 0
    while n < chars:
        word = f"r{i}w{len(words)} naïve café 🙂 "
        words.append(word)
        n += len(word)
    return "".join(words)[:chars]


def start_runs(
    stack: Stack,
    model: FakeLLM,
    count: int,
    *,
    chars: int | list[int] = 1200,
    tokens_per_s: float | None = 40,
    chunk_chars: int = 4,
) -> list[Case]:
    """`count` runs of `count` different users, each with its own scripted reply."""
    users = stack.db.create_users(count)
    web = stack.deployment.live_webs()[0]
    sizes = chars if isinstance(chars, list) else [chars] * count
    cases = []
    for i, headers in enumerate(users):
        content, text = f"chaos {secrets.token_hex(6)}", story(i, sizes[i])
        model.route(
            content,
            Reply(text=text, tokens_per_s=tokens_per_s, chunk_chars=chunk_chars),
        )
        session_id = new_session(web, headers)
        run_id = start_run(web, headers, session_id, content)
        cases.append(Case(run_id, session_id, headers, content, text))
    return cases


def follow(stack: Stack, cases: list[Case], per_run: int = 2, **kw) -> list[Reader]:
    readers = [
        Reader(stack.deployment, c.run_id, c.headers, seed=i * 7919 + n, **kw)
        for i, c in enumerate(cases)
        for n in range(per_run)
    ]
    for reader in readers:
        reader.start()
    return readers


def readers_of(readers: list[Reader], case: Case) -> list[Reader]:
    return [r for r in readers if r.run_id == case.run_id]


def wait_streaming(stack: Stack, cases: list[Case], tokens: int = 3) -> None:
    """Until every run has journaled a few tokens (the model is mid-answer)."""
    ids = [c.run_id for c in cases]

    def streaming() -> bool:
        counts = stack.db.token_counts(ids)
        return counts is not None and all(n >= tokens for n in counts.values())

    wait_for(streaming, timeout=60, what="every run streaming")


def wait_settled(stack: Stack, cases: list[Case], timeout: float = 180) -> None:
    ids = [c.run_id for c in cases]

    def settled() -> bool:
        statuses = stack.db.statuses(ids)
        return statuses is not None and all(
            s not in ("queued", "running") for s in statuses.values()
        )

    wait_for(settled, timeout=timeout, what="every run settled", interval=0.2)


def check(stack: Stack, cases: list[Case], readers: list[Reader]) -> dict:
    """The shared promises, asserted; returns each run's verdict by id."""
    join_readers(readers)
    verdicts = {
        c.run_id: verify(stack.db, c.run_id, readers_of(readers, c)) for c in cases
    }
    assert_promises(list(verdicts.values()))
    return verdicts


def assert_completed_whole(verdicts: dict, cases: list[Case]) -> None:
    outcomes = {
        c.run_id: (
            verdicts[c.run_id].run["status"],
            verdicts[c.run_id].run["terminal_state"],
            verdicts[c.run_id].text == c.text,
        )
        for c in cases
    }
    assert outcomes == {c.run_id: ("completed", "completed", True) for c in cases}


def http_refusals(readers: list[Reader]) -> list:
    return [r for reader in readers for r in reader.refusals if r.status < 1000]


def assert_refused_only_with_503(readers: list[Reader]) -> None:
    """Requests refused while the database was away: 503 + Retry-After, no 500."""
    refused = [(r.status, r.retry_after) for r in http_refusals(readers)]
    wrong = [r for r in refused if r[0] != 503 or not r[1]]
    assert not wrong, f"{len(wrong)} of {len(refused)} refusals: {wrong[:5]}"


# --- the database -------------------------------------------------------------------


def test_postgres_stopped_10s_mid_stream_interrupts_no_run(stack, model):
    # Half the answers end while the database is away, half after it is back.
    cases = start_runs(stack, model, 8, chars=[1200, 3200] * 4)
    readers = follow(stack, cases)
    wait_streaming(stack, cases)
    stack.pg.stop()
    time.sleep(10)  # the outage itself
    stack.pg.start()
    wait_settled(stack, cases)
    verdicts = check(stack, cases, readers)
    assert_completed_whole(verdicts, cases)
    assert_refused_only_with_503(readers)  # told to come back, never a 500


def test_postgres_stopped_30s_mid_stream_interrupts_no_run(stack, model):
    # 30 s is within HERMES_DB_OUTAGE_MAX_S (90 s by default): runs ride it out.
    cases = start_runs(stack, model, 6, chars=[1200, 7200] * 3)
    readers = follow(stack, cases)
    wait_streaming(stack, cases)
    stack.pg.stop()
    time.sleep(30)  # the outage itself
    stack.pg.start()
    wait_settled(stack, cases)
    verdicts = check(stack, cases, readers)
    assert_completed_whole(verdicts, cases)
    assert_refused_only_with_503(readers)


# --- Redis and the web servers ----------------------------------------------------


def test_redis_killed_10s_loses_nothing(stack, model):
    cases = start_runs(stack, model, 8, chars=[1200, 3200] * 4)
    readers = follow(stack, cases)
    wait_streaming(stack, cases)
    stack.redis.kill()
    time.sleep(10)  # the outage itself
    stack.redis.start()
    wait_settled(stack, cases)
    verdicts = check(stack, cases, readers)
    assert_completed_whole(verdicts, cases)


def test_web_server_killed_readers_move_to_the_other(stack, model):
    cases = start_runs(stack, model, 6, chars=2400)
    readers = follow(stack, cases)
    wait_streaming(stack, cases)
    victim = stack.deployment.webs[1]
    before = {id(r): r.connections for r in readers}
    victim.kill()
    # Every reader has connected again since (to the survivor) before it returns.
    wait_for(
        lambda: all(r.finished or r.connections > before[id(r)] for r in readers),
        timeout=60,
        what="every reader reconnected",
    )
    victim.start()
    wait_settled(stack, cases)
    verdicts = check(stack, cases, readers)
    assert_completed_whole(verdicts, cases)


# --- workers ----------------------------------------------------------------------


def busiest_worker(stack: Stack, cases: list[Case]):
    """The worker process holding the most of these runs, and those runs."""
    owners = {c.run_id: stack.db.run(c.run_id)["lease_owner"] for c in cases}
    by_worker: dict = {}
    for case in cases:
        worker = stack.deployment.worker_holding(owners[case.run_id])
        by_worker.setdefault(worker.name, (worker, []))[1].append(case)
    return max(by_worker.values(), key=lambda item: len(item[1]))


def test_worker_killed_its_runs_settle_within_lease_plus_2s(stack, model):
    cases = start_runs(stack, model, 6, chars=3000)
    wait_streaming(stack, cases)
    worker, lost = busiest_worker(stack, cases)
    others = [c for c in cases if c not in lost]
    readers = follow(stack, others)  # nobody reads the lost runs while they settle
    pending = {c.run_id for c in lost}
    settled_after: dict[str, float] = {}
    worker.kill()
    killed = time.monotonic()

    def all_settled() -> bool:
        statuses = stack.db.statuses(sorted(pending)) or {}
        for run_id, status in statuses.items():
            if status not in ("queued", "running"):
                settled_after[run_id] = time.monotonic() - killed
                pending.discard(run_id)
        return not pending

    wait_for(all_settled, timeout=60, what="the dead worker's runs settled")
    readers += follow(stack, lost, per_run=1)
    wait_settled(stack, cases)
    verdicts = check(stack, cases, readers)
    assert max(settled_after.values()) <= SETTLE_BOUND_S, settled_after
    for case in lost:
        end = verdicts[case.run_id].end
        assert (end["status"], end["terminal_state"]) == ("interrupted", "lost-worker")
        assert case.text.startswith(verdicts[case.run_id].text)
    assert_completed_whole(verdicts, others)


def test_worker_paused_past_its_lease_is_fenced_and_writes_nothing(stack, model):
    cases = start_runs(stack, model, 4, chars=6000)
    readers = follow(stack, cases)
    wait_streaming(stack, cases)
    worker, paused = busiest_worker(stack, cases)
    worker.send(signal.SIGSTOP)
    wait_settled(stack, paused, timeout=60)  # another process settles them
    frozen = {
        c.run_id: (
            stack.db.run(c.run_id)["last_seq"],
            stack.db.message_count(c.session_id),
        )
        for c in paused
    }
    worker.send(signal.SIGCONT)
    # The woken worker finds itself fenced out and hangs up on the model.
    by_content = {r.messages[-1]["content"]: r.index for r in model.requests}
    for case in paused:
        model.wait_closed(by_content[case.content], timeout=60)
    wait_settled(stack, cases)
    verdicts = check(stack, cases, readers)
    after = {
        c.run_id: (
            stack.db.run(c.run_id)["last_seq"],
            stack.db.message_count(c.session_id),
        )
        for c in paused
    }
    assert after == frozen
    for case in paused:
        end = verdicts[case.run_id].end
        assert (end["status"], end["terminal_state"]) == ("interrupted", "lost-worker")
    assert_completed_whole(verdicts, [c for c in cases if c not in paused])
    assert "run crashed" not in worker.log()  # fencing is not a crash


HOLD_CHUNKS = 41  # the role frame, then 40 chunks of 4 characters: 160 shown


def start_held_runs(stack: Stack, model: FakeLLM, count: int, chars: int):
    """Runs whose model streams 160 characters and then holds (until its event
    is set or the worker hangs up), scripted to go on with the rest of the
    answer when asked again with those 160 characters as the assistant's:
    a worker stopped at the hold leaves an exact, known position."""
    users = stack.db.create_users(count)
    web = stack.deployment.live_webs()[0]
    cases, holds = [], []
    for i, headers in enumerate(users):
        content, text = f"held {secrets.token_hex(6)}", story(i, chars)
        hold = threading.Event()
        shown = 4 * (HOLD_CHUNKS - 1)
        model.route(
            content,
            Reply(text=text, chunk_chars=4, hold_after_chunks=HOLD_CHUNKS, hold=hold),
            Reply(text=text[shown:], chunk_chars=4, tokens_per_s=400),
        )
        session_id = new_session(web, headers)
        run_id = start_run(web, headers, session_id, content)
        cases.append(Case(run_id, session_id, headers, content, text))
        holds.append(hold)
    return cases, holds


def test_worker_sigterm_hands_its_runs_to_the_other_which_finishes_them(stack, model):
    """A deploy's SIGTERM to one worker: its runs in flight continue on the
    other worker from their journal position, each answer whole and once."""
    cases, holds = start_held_runs(stack, model, 6, chars=8000)
    readers = follow(stack, cases)
    shown = 4 * (HOLD_CHUNKS - 1)

    def all_held() -> bool:
        rows = stack.db.try_query(
            "SELECT run_id, string_agg(payload::json->>'text', '' ORDER BY seq)"
            " FROM journal_event WHERE run_id = ANY(%s) AND type = 'token'"
            " GROUP BY run_id",
            ([c.run_id for c in cases],),
        )
        texts = dict(rows or [])
        return all(texts.get(c.run_id) == c.text[:shown] for c in cases)

    wait_for(all_held, timeout=90, what="every run streamed up to its hold")
    worker, handed = busiest_worker(stack, cases)
    # What it prints from its stop on (the stack's processes lived through
    # the other scenarios, an outage's tracebacks included).
    before_stop = len(worker.log())
    worker.send(signal.SIGTERM)
    signalled = time.monotonic()
    assert worker.proc is not None and worker.proc.wait(60) == 0
    stopped_after = time.monotonic() - signalled
    for hold in holds:  # the other worker's own runs go on to their end
        hold.set()
    wait_settled(stack, cases)
    verdicts = check(stack, cases, readers)
    assert_completed_whole(verdicts, cases)
    assert stopped_after < 20, stopped_after  # at once, not after its 30 s grace
    for case in handed:
        kinds = [kind for _, kind, _ in verdicts[case.run_id].journal]
        assert kinds.count("start") == 1
        assert kinds.count("status") == 1  # the hand-over, said once
    log = worker.log()[before_stop:]
    assert f"handing {len(handed)} run(s) over" in log
    assert "Unclosed" not in log and "Traceback" not in log


def journal_texts(stack: Stack, cases: list[Case]) -> dict[str, str]:
    rows = stack.db.try_query(
        "SELECT run_id, string_agg(payload::json->>'text', '' ORDER BY seq)"
        " FROM journal_event WHERE run_id = ANY(%s) AND type = 'token'"
        " GROUP BY run_id",
        ([c.run_id for c in cases],),
    )
    return dict(rows or [])


def test_rolling_restart_of_every_process_interrupts_no_run(stack, model):
    """The runbook (docs/operating.md, "Rolling restart") under load: each
    worker SIGTERMed and started again in turn, then each daphne, while six
    long answers stream; every run completes whole and once, and runs go
    from worker to worker at known points (the model's script holds there)."""
    users = stack.db.create_users(6)
    web = stack.deployment.live_webs()[0]
    first, second = 41, 31  # chunks (the role frame included) before each hold
    cut1, cut2 = 4 * (first - 1), 4 * (first - 1) + 4 * (second - 1)
    cases, later = [], []
    for i, headers in enumerate(users):
        content, text = f"rolling {secrets.token_hex(6)}", story(i, 6000)
        at_cut1, at_cut2 = threading.Event(), threading.Event()
        model.route(
            content,
            Reply(text=text, chunk_chars=4, hold_after_chunks=first, hold=at_cut1),
            Reply(
                text=text[cut1:],
                chunk_chars=4,
                tokens_per_s=400,
                hold_after_chunks=second,
                hold=at_cut2,
            ),
            Reply(text=text[cut2:], chunk_chars=4, tokens_per_s=400),
        )
        session_id = new_session(web, headers)
        run_id = start_run(web, headers, session_id, content)
        cases.append(Case(run_id, session_id, headers, content, text))
        later.append(at_cut2)
    readers = follow(stack, cases)

    def at(cut: int, which: list[Case]) -> bool:
        texts = journal_texts(stack, which)
        return all(texts.get(c.run_id) == c.text[:cut] for c in which)

    wait_for(lambda: at(cut1, cases), timeout=90, what="every run at its hold")
    first_worker, moved = busiest_worker(stack, cases)
    second_worker = next(w for w in stack.deployment.workers if w is not first_worker)
    for worker in (first_worker, second_worker):
        worker.send(signal.SIGTERM)
        assert worker.proc is not None and worker.proc.wait(60) == 0
        if worker is first_worker:  # its runs stream on, up to the next hold
            wait_for(lambda: at(cut2, moved), timeout=90, what="moved runs held")
            worker.start()
    for hold in later:  # the second hop's runs go on to their end
        hold.set()
    for daphne in stack.deployment.webs:  # then the web servers, one at a time
        daphne.stop()
        daphne.start()
    wait_settled(stack, cases)
    verdicts = check(stack, cases, readers)
    assert_completed_whole(verdicts, cases)
    for case in cases:
        hops = [
            data["message"]
            for _, kind, data in verdicts[case.run_id].journal
            if kind == "status"
        ]
        assert len(hops) == (2 if case in moved else 1), hops


# --- readers -------------------------------------------------------------------------


def slow_reader_cost(stack: Stack, model: FakeLLM, forms: tuple[str, ...]) -> float:
    """What one more slow reader of a long live run costs a daphne process, in bytes.

    Rounds of 2 and then 20 readers of a new 4 MiB run on one daphne, reading
    at 512 KiB/s through 16 KiB socket buffers: the growth of the process's
    peak RSS from the first round to the second, per added reader. What does
    not depend on the number of readers (the allocator's arenas, the journal
    pool, one run's shared window) is in both peaks, but comes in steps of a
    few MiB: 18 added readers, not 8, make such a step weigh half as much.
    """
    web = stack.deployment.webs[0]
    few, many = 2, 20

    def slow_round(readers: int) -> int:
        (case,) = start_runs(
            stack, model, 1, chars=4 * MIB, tokens_per_s=None, chunk_chars=512
        )
        slow = follow(
            stack,
            [case],
            per_run=readers,
            urls=[web.url],
            hangup_after=None,
            pace_bps=512 * 1024,
            forms=forms,
        )
        peak, deadline = 0, time.monotonic() + 300
        while any(r.is_alive() for r in slow) and time.monotonic() < deadline:
            peak = max(peak, rss_bytes(web.pid))  # sampled until they are done
            time.sleep(0.1)
        wait_settled(stack, [case])
        check(stack, [case], slow)
        return peak

    # Resident memory is seldom given back, so the rounds go in this order.
    slow_round(few)  # warm-up
    few_peak = slow_round(few)
    many_peak = slow_round(many)
    per_reader = (many_peak - few_peak) / (many - few)
    print(f"{forms}: {per_reader / MIB:.2f} MiB per reader")
    return per_reader


def test_slow_sse_readers_cost_the_web_process_at_most_1_mib_each(stack, model):
    per_reader = slow_reader_cost(stack, model, ("after_seq", "last_event_id"))
    assert per_reader <= 1 * MIB, f"{per_reader / MIB:.2f} MiB per slow SSE reader"


def test_slow_websocket_readers_cost_the_web_process_at_most_1_mib_each(stack, model):
    per_reader = slow_reader_cost(stack, model, ("ws",))
    assert per_reader <= 1 * MIB, f"{per_reader / MIB:.2f} MiB per slow WS reader"


# --- the provider ------------------------------------------------------------------


BAD_REPLIES = {
    "nul": Reply(text="before \x00 after " * 20, tokens_per_s=40),
    "surrogate text": Reply(text="lone \ud800 half " * 20, tokens_per_s=40),
    "surrogate tool name": Reply(
        text="calling",
        tool_calls=[{"id": "call_x", "name": "calc\udc00", "arguments": "{}"}],
    ),
    "tool id not a string": Reply(
        text="calling",
        tool_calls=[
            {"id": 12345, "name": "calculator", "arguments": '{"expression": "1+1"}'}
        ],
    ),
}


def test_bad_provider_output_fails_only_its_own_run(stack, model):
    good = start_runs(stack, model, 4, chars=2400)
    users = stack.db.create_users(len(BAD_REPLIES))
    web = stack.deployment.live_webs()[0]
    bad = []
    for headers, (name, reply) in zip(users, BAD_REPLIES.items(), strict=True):
        content = f"bad {name} {secrets.token_hex(4)}"
        model.route(content, reply)
        session_id = new_session(web, headers)
        run_id = start_run(web, headers, session_id, content)
        bad.append(Case(run_id, session_id, headers, content, reply.text))
    readers = follow(stack, good + bad)
    wait_settled(stack, good + bad, timeout=90)
    verdicts = check(stack, good + bad, readers)
    assert_completed_whole(verdicts, good)
    for case in bad:
        journal = verdicts[case.run_id].journal
        if verdicts[case.run_id].end["status"] != "completed":
            assert any(kind == "error" for _, kind, _ in journal), case.content
    # Each bad session takes its next message as usual.
    follow_ups = []
    for case in bad:
        content = f"again {secrets.token_hex(4)}"
        model.route(content, Reply(text="fine now"))
        run_id = start_run(web, case.headers, case.session_id, content)
        follow_ups.append(
            Case(run_id, case.session_id, case.headers, content, "fine now")
        )
    wait_settled(stack, follow_ups, timeout=60)
    assert_completed_whole(check(stack, follow_ups, []), follow_ups)


def test_random_reconnects_lose_nothing_with_everything_up(stack, model):
    """The control: the same readers and checks with no fault injected."""
    cases = start_runs(stack, model, 6, chars=1600)
    readers = follow(stack, cases, per_run=3)
    wait_settled(stack, cases)
    verdicts = check(stack, cases, readers)
    assert_completed_whole(verdicts, cases)
    assert not http_refusals(readers)
    assert sum(r.connections for r in readers) > len(readers)
