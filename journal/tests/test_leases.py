"""Leases after an outage, settling that always succeeds, and the reaper's timing."""

from datetime import timedelta

import pytest
from django.utils import timezone

from hermes_testing.harness import running_run
from journal import dbpool, leases
from journal.leases import Claim, lease_renew, reap_lost_runs, run_settle, runs_lost
from journal.models import Run
from journal.signals import run_settling
from journal.store import append


@pytest.fixture(autouse=True)
def _no_trouble_seen():
    dbpool.forget_trouble()
    yield
    dbpool.forget_trouble()


def test_no_run_is_taken_over_within_a_lease_of_an_outage(alice):
    run = running_run(alice[0], lease_s=-1)  # lapsed while the database was away
    dbpool.note_trouble()
    assert runs_lost() == []
    assert reap_lost_runs() == []
    settle = {"status": "cancelled", "terminal_state": "cancelled-by-user", "by": "t"}
    assert run_settle(run_id=run.id, **settle) == []
    assert Run.objects.get(id=run.id).status == "running"
    dbpool.forget_trouble()  # a lease later
    assert runs_lost() == [run.id]
    assert [r for r, _ in reap_lost_runs()] == [run.id]


def test_a_failing_receiver_does_not_keep_a_run_from_being_settled(alice):
    run = running_run(alice[0], lease_s=-1)

    def broken(**kwargs):
        raise RuntimeError("receiver bug")

    run_settling.connect(broken, dispatch_uid="test-broken")
    try:
        [(run_id, records)] = reap_lost_runs()
    finally:
        run_settling.disconnect(dispatch_uid="test-broken")
    assert run_id == run.id and records[-1].type == "end"
    assert Run.objects.get(id=run.id).terminal_state == "lost-worker"


def test_its_own_worker_settles_a_run_with_an_error_event_only_under_its_token(alice):
    run = running_run(alice[0])
    append(run_id=run.id, token=1, events=[("token", {"text": "part"})])
    failed = {
        "run_id": run.id,
        "status": "failed",
        "terminal_state": "worker-error",
        "by": "w",
        "only_if_lost": False,
        "error": {"category": "worker-error", "message": "boom"},
    }
    assert run_settle(**failed, token=7) == []  # not the holder's token
    records = run_settle(**failed, token=1)
    assert [r.type for r in records] == ["error", "end"]
    assert Run.objects.get(id=run.id).error_category == "worker-error"


def test_lease_renew_extends_held_leases_in_batches_and_names_the_lost(
    alice, monkeypatch
):
    monkeypatch.setattr(leases, "RENEW_BATCH", 2)  # three batches for five claims
    held = [running_run(alice[0], lease_s=1) for _ in range(3)]
    taken_over = running_run(alice[0], lease_s=1)
    Run.objects.filter(id=taken_over.id).update(fencing_token=2)
    ended = running_run(alice[0], lease_s=1)
    Run.objects.filter(id=ended.id).update(status=Run.Status.COMPLETED)
    claims = [Claim(r.id, 1) for r in [held[0], taken_over, held[1], ended, held[2]]]
    before = timezone.now()
    assert lease_renew(claims=claims, lease_s=600) == {taken_over.id, ended.id}
    leases_now = dict(Run.objects.values_list("id", "lease_expires_at"))
    for run in held:
        assert leases_now[run.id] > before + timedelta(seconds=500)
    for run in (taken_over, ended):
        assert leases_now[run.id] < before + timedelta(seconds=60)
    assert lease_renew(claims=[Claim(r.id, 1) for r in held], lease_s=600) == set()
