"""The fair claim: the oldest queued run of the least busy owner under the limit."""

import threading
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from hermes_testing.harness import make_user
from journal.leases import run_claim_next
from journal.models import Run


def _queue(owner, *, age_s: float) -> Run:
    run = Run.objects.create(owner=owner)
    created = timezone.now() - timedelta(seconds=age_s)
    Run.objects.filter(id=run.id).update(created_at=created)
    return run


def _claim(limit=None):
    claim = run_claim_next(worker_id="w", lease_s=30, per_owner_limit=limit)
    return claim and Run.objects.get(id=claim.run_id)


@pytest.mark.slow
def test_a_backlog_does_not_delay_another_owners_first_run(
    alice, bob, django_user_model
):
    carol = make_user(django_user_model, "carol")[0]
    backlog = [_queue(alice[0], age_s=100 - i) for i in range(10)]
    bobs = _queue(bob[0], age_s=50)
    carols = _queue(carol, age_s=10)
    # Alice's oldest run goes first (nobody runs anything yet); then every
    # owner with nothing running comes before Alice's second run.
    order = [_claim().id for _ in range(4)]
    assert order == [backlog[0].id, bobs.id, carols.id, backlog[1].id]


@pytest.mark.slow
def test_an_owner_at_the_limit_waits_and_others_go_first(alice, bob):
    backlog = [_queue(alice[0], age_s=100 - i) for i in range(5)]
    assert [_claim(limit=2).id for _ in range(2)] == [r.id for r in backlog[:2]]
    assert _claim(limit=2) is None  # Alice is at the limit; nothing else queued
    later = _queue(bob[0], age_s=0)
    assert _claim(limit=2).id == later.id
    # One of Alice's runs ends: her next oldest run may go.
    Run.objects.filter(id=backlog[0].id).update(status=Run.Status.COMPLETED)
    assert _claim(limit=2).id == backlog[2].id
    assert Run.objects.filter(owner=alice[0], status="queued").count() == 2


def test_fewest_running_first_then_oldest(alice, bob):
    for _ in range(2):
        Run.objects.create(owner=alice[0], status=Run.Status.RUNNING)
    Run.objects.create(owner=bob[0], status=Run.Status.RUNNING)
    alices = _queue(alice[0], age_s=100)
    bobs = _queue(bob[0], age_s=1)
    assert _claim(limit=10).id == bobs.id  # Bob runs 1, Alice 2
    assert _claim(limit=10).id == alices.id


def test_concurrent_claims_do_not_pass_the_limit_together(alice, bob):
    """Eight claims at the same instant, each on its own connection: Alice gets
    no more than her limit, and Bob's run is claimed too."""
    for i in range(20):
        _queue(alice[0], age_s=100 - i)
    bobs = _queue(bob[0], age_s=1)
    start = threading.Barrier(8)
    claimed: list[str] = []

    def claim() -> None:
        try:
            start.wait(30)
            got = run_claim_next(worker_id="w", lease_s=30, per_owner_limit=2)
            if got is not None:
                claimed.append(got.run_id)
        finally:
            connection.close()

    threads = [threading.Thread(target=claim) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    running = Run.objects.filter(status=Run.Status.RUNNING)
    # A claim that finds another claiming for Alice passes her over: she may
    # get fewer than her limit in this round, never more.
    assert 1 <= running.filter(owner=alice[0]).count() <= 2
    assert set(claimed) == set(running.values_list("id", flat=True))
    assert bobs.id in claimed
    # The next claims (the next tick) fill her limit and stop there.
    while _claim(limit=2) is not None:
        pass
    assert running.filter(owner=alice[0]).count() == 2
    assert Run.objects.filter(status="queued", owner=alice[0]).count() == 18
