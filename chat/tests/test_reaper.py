"""Chat's side of lost runs: the reaper keeps what the journal holds, on time."""

from datetime import timedelta

import pytest
from django.utils import timezone

from chat.models import ChatSession, Message
from chat.worker import REAP_MARGIN_S, REAP_RECHECK_S, reap_delay
from hermes_testing.harness import running_run
from hermes_testing.turns import running_turn
from journal.leases import next_lease_expiry, reap_lost_runs
from journal.models import Event, Run
from journal.store import append


def test_the_reaper_keeps_text_postgres_could_not_hold_and_goes_on(alice):
    session = ChatSession.objects.create(owner=alice[0])
    poisoned, healthy = (
        running_turn(alice[0], lease_s=-1, session=session) for _ in "ab"
    )
    # A journal written before text was cleaned: NUL is stored escaped in JSON,
    # but no PostgreSQL text column can hold it once decoded.
    append(run_id=poisoned.id, token=1, events=[("token", {"text": "a\x00b"})])
    append(run_id=healthy.id, token=1, events=[("token", {"text": "fine"})])
    settled = dict(reap_lost_runs())
    assert set(settled) == {poisoned.id, healthy.id}
    kept = dict(
        Message.objects.filter(role="assistant").values_list("run_id", "content")
    )
    assert kept == {poisoned.id: "a\ufffdb", healthy.id: "fine"}
    for run in (poisoned, healthy):
        assert Event.objects.filter(run=run, type="end").count() == 1


def test_reaper_sleeps_until_just_after_the_earliest_lease(alice):
    now = timezone.now()
    assert reap_delay(None, 15) == 15
    assert reap_delay(now + timedelta(seconds=4), 15) == pytest.approx(
        4 + REAP_MARGIN_S, abs=0.1
    )
    assert reap_delay(now + timedelta(seconds=60), 15) == 15
    assert reap_delay(now - timedelta(seconds=1), 15) == REAP_RECHECK_S
    assert next_lease_expiry() is None
    soon = running_run(alice[0], lease_s=5)
    running_run(alice[0], lease_s=9)
    assert next_lease_expiry() == Run.objects.get(id=soon.id).lease_expires_at
