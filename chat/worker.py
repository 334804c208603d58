"""The turn worker: claims queued runs, holds their leases, settles lost ones.
See docs/architecture.md §6.

Runs inside `manage.py serve` (embedded) or as `manage.py worker` processes
(scale-out, any number, anywhere that reaches the database and Redis). Wakes on
a channel-layer nudge or a short poll; the database decides who runs what.

Every worker also reaps: it sleeps until the earliest lease of any running run
lapses (plus `REAP_MARGIN_S`), then settles the runs whose worker is gone, so a
dead worker's run ends within its lease and about a second whether or not
anyone reads it; runs waiting for an approval past their deadline end the same
way (chat.approvals). A worker asked to stop claims nothing more and, while
another worker is alive, hands each run it holds over at once: the run is
queued again at its journal position and the next claim resumes it (`stop`).
A run whose executor raises is settled at once as `failed` / `worker-error` by
its own worker. During a database outage the worker keeps
its runs (chat.writer) and renews their leases every `RENEW_RETRY_S` until the
database answers; reapers give it a lease's grace after an outage
(journal.leases).
"""

import asyncio
import logging
import os
import socket
import time
from datetime import datetime

from channels.layers import get_channel_layer
from django.conf import settings
from django.utils import timezone
from ulid import ULID

from journal import dbpool
from journal.heartbeats import worker_beat
from journal.leases import (
    Claim,
    cancel_requested,
    claims_held_by,
    handed_unclaimed,
    lease_renew,
    next_lease_expiry,
    other_workers_alive,
    reap_lost_runs,
    run_claim_next,
    run_settle,
    worker_leaves,
)
from journal.models import Run
from journal.outages import CHANNEL_LAYER, Backoff, outage
from journal.publish import publish
from journal.waits import next_wait_expiry, reap_expired_waits

from . import approvals, mcp_tools, pending
from .providers import registry
from .runner import HANDOVER, RunControl, execute_run
from .services import WORKERS_GROUP
from .writer import EventsNotStored

log = logging.getLogger(__name__)

POLL_S = 1.0  # claim poll when no nudge arrives (the nudge is only a fast path)
CANCEL_POLL_S = 0.5  # cancel requests read from the database: stop within a second
RENEW_RETRY_S = 0.5  # lease renewals while the database is out of reach
REAP_MARGIN_S = 0.25  # reap this long after the earliest lease lapses
REAP_RECHECK_S = 1.0  # a lapsed lease not reaped yet (outage grace): look again
STOP_CLAIM_WAIT_S = 10.0  # a stop waits this long for a claim in flight
HANDOVER_WAIT_S = 10.0  # past the grace, for hand-overs held up by an outage
UNCLAIMED_WAIT_S = 3.0  # a run handed over is claimed within a poll or two
UNCLAIMED_POLL_S = 0.2


async def close_providers() -> None:
    """Close the model clients' pooled connections on this loop (aiohttp would
    warn of an unclosed session and connector at exit otherwise)."""
    for provider in registry.built().values():
        try:
            await provider.aclose()  # type: ignore[attr-defined]
        except Exception:
            log.warning("closing a model client failed", exc_info=True)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _earliest(*times: datetime | None) -> datetime | None:
    return min((t for t in times if t is not None), default=None)


def reap_delay(first_expiry: datetime | None, lease_s: float) -> float:
    """Seconds until the next reaper pass: just after the earliest lease lapses.

    Never longer than a lease: a run claimed after this look expires no
    earlier than a lease from now, so the next look sees it in time.
    """
    if first_expiry is None:
        return lease_s
    wait = (first_expiry - timezone.now()).total_seconds() + REAP_MARGIN_S
    if wait <= REAP_MARGIN_S:  # lapsed, yet not reaped: a grace or a race
        return min(REAP_RECHECK_S, lease_s)
    return min(wait, lease_s)


class Worker:
    def __init__(self, *, concurrency: int | None = None, worker_id: str | None = None):
        hermes = settings.HERMES
        self.concurrency = concurrency or hermes["WORKER_CONCURRENCY"]
        self.worker_id = worker_id or f"{socket.gethostname()}:{os.getpid()}:{ULID()}"
        self.lease_s = hermes["LEASE_S"]
        self.heartbeat_s = hermes["HEARTBEAT_S"]
        self.held: dict[str, tuple[Claim, RunControl, asyncio.Task]] = {}
        self.stopping = False
        self._nudge = asyncio.Event()
        self._tasks: list[asyncio.Task] = []
        self._claim_task: asyncio.Task | None = None
        self._channel: str | None = None
        self._troubled: dict[str, float] = {}  # failing loops, since when
        # A claim met a connection error: it may have committed unanswered.
        self.claim_unsure = False

    @property
    def active_provider_requests(self) -> int:
        return registry.active_requests()

    async def start(self) -> None:
        await self._join()
        await self._announce()
        for loop in (
            self._claim_loop,
            self._lease_loop,
            self._reap_loop,
            self._cancel_loop,
            self._listen_loop,
        ):
            self._tasks.append(
                asyncio.create_task(loop(), name=f"worker {loop.__name__}")
            )
        self._claim_task = self._tasks[0]
        log.info(
            "worker started id=%s concurrency=%d", self.worker_id, self.concurrency
        )

    async def stop(self, grace_s: float = 30.0) -> None:
        """Stop claiming at once; hand the runs held over, or finish them.

        While another worker is alive each run is handed over now
        (`HANDOVER`: its text so far journaled, the run queued again, resumed
        from the journal by the next claim; docs/operating.md, "Rolling
        restart"). With no other worker the runs may finish for `grace_s`,
        and what outlives it ends `interrupted` / `worker-shutdown`, its text
        kept once (Retry asks again).
        """
        self.stopping = True
        self._nudge.set()
        if self._claim_task is not None:  # a claim in flight lands in `held`
            await asyncio.wait([self._claim_task], timeout=STOP_CLAIM_WAIT_S)
        others = await self._leave_heartbeats()
        if self.held and others:
            log.info(
                "worker stopping: handing %d run(s) over to %d other worker(s)",
                len(self.held),
                others,
            )
            handed = [claim for claim, _, _ in self.held.values()]
            await self._stop_runs(HANDOVER, timeout=grace_s + HANDOVER_WAIT_S)
            await self._nudge_others()
            await self._settle_unclaimed(handed)
        elif self.held:
            running = [task for _, _, task in self.held.values()]
            await asyncio.wait(running, timeout=grace_s)
            await self._stop_runs("shutdown", timeout=10)
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._leave()
        await mcp_tools.close_sessions()
        await close_providers()
        log.info("worker stopped id=%s", self.worker_id)

    async def _stop_runs(self, reason: str, *, timeout: float) -> None:
        held = list(self.held.values())
        for _claim, control, _task in held:
            control.request(reason)
        if held:
            await asyncio.wait([task for _, _, task in held], timeout=timeout)

    async def _settle_unclaimed(self, handed: list[Claim]) -> None:
        """Wait for the runs handed over to be claimed; if they are not and no
        worker is alive any more (the others were stopping too, as a
        supervisor's children do), end them here as the last worker would:
        `interrupted` / `worker-shutdown`, their text kept once."""
        deadline = time.monotonic() + UNCLAIMED_WAIT_S
        while True:
            try:
                waiting = await dbpool.readers.run(handed_unclaimed, claims=handed)
                if not waiting:
                    return
                alive = await dbpool.readers.run(
                    other_workers_alive,
                    worker_id=self.worker_id,
                    max_age_s=self.lease_s,
                )
            except Exception as exc:  # the runs stay queued for the next worker
                log.warning("worker stopping: hand-over unconfirmed (%s)", exc)
                return
            if not alive:
                break
            if time.monotonic() > deadline:
                return  # others are alive: they claim the runs when they can
            await asyncio.sleep(UNCLAIMED_POLL_S)
        for claim in waiting:
            await self._settle_shutdown(claim)

    async def _settle_shutdown(self, claim: Claim) -> None:
        records = await self._settle(
            claim,
            Run.Status.INTERRUPTED,
            "worker-shutdown",
            failed="run left queued for the next worker",
        )
        if records:
            log.info("run ended: no worker left to hand it to run_id=%s", claim.run_id)
            await publish(claim.run_id, records)

    async def _leave_heartbeats(self) -> int:
        """Drop this worker's heartbeat; how many other workers are alive.

        0 when the database cannot say: the runs then end here, as before.
        """
        try:
            await dbpool.writers.run(worker_leaves, worker_id=self.worker_id)
            return await dbpool.readers.run(
                other_workers_alive, worker_id=self.worker_id, max_age_s=self.lease_s
            )
        except Exception as exc:
            log.warning(
                "worker stopping: other workers unknown (%s); ending its runs here",
                _first_line(exc),
            )
            return 0

    async def _nudge_others(self) -> None:
        """Tell the other workers that runs are queued (they also poll)."""
        try:
            layer = get_channel_layer()
            await layer.group_send(WORKERS_GROUP, {"type": "worker.nudge"})
        except Exception as exc:
            outage(CHANNEL_LAYER).failed("worker nudge", exc)

    async def _join(self) -> None:
        """Join the workers' group on a fresh channel; polling covers a failure."""
        layer = get_channel_layer()
        try:
            self._channel = await layer.new_channel()
            await layer.group_add(WORKERS_GROUP, self._channel)
        except Exception as exc:
            outage(CHANNEL_LAYER).failed("worker join", exc)
            self._channel = None
        else:
            outage(CHANNEL_LAYER).recovered()

    async def _announce(self) -> None:
        """Beat once at start, not a heartbeat later: `/healthz` counts it now."""
        try:
            await dbpool.writers.run(
                worker_beat, worker_id=self.worker_id, active_runs=0
            )
        except Exception as exc:  # the lease loop beats again once the database is back
            self._trouble("lease renewal", exc)

    async def _leave(self) -> None:
        if self._channel:
            try:
                await get_channel_layer().group_discard(WORKERS_GROUP, self._channel)
            except Exception:
                log.warning("group_discard failed", exc_info=True)

    async def _listen_loop(self) -> None:
        """Nudges and cancels; rejoins with backoff after a channel-layer outage."""
        layer = get_channel_layer()
        backoff = Backoff(first=0.2, cap=5.0)
        while True:
            if not self._channel:
                await asyncio.sleep(backoff.next_delay())
                await self._join()
                if not self._channel:
                    continue
                self._nudge.set()  # nudges may have been missed meanwhile
            try:
                message = await layer.receive(self._channel)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the claim and cancel polls cover the gap
                outage(CHANNEL_LAYER).failed("worker receive", exc)
                self._channel = None
                continue
            backoff.reset()
            if message.get("type") == "run.cancel":
                self._cancel(message.get("run_id", ""))
            else:
                self._nudge.set()

    def _trouble(self, what: str, exc: Exception) -> None:
        """Log a failing database loop once per outage, not on every pass."""
        if what in self._troubled:
            return
        self._troubled[what] = time.monotonic()
        if dbpool.is_connection_error(exc):
            log.warning("worker %s failed; retrying (%s)", what, _first_line(exc))
        else:
            log.error("worker %s failed; retrying", what, exc_info=exc)

    def _untroubled(self, what: str) -> None:
        began = self._troubled.pop(what, None)
        if began is not None:
            log.warning(
                "worker %s works again after %.1f s", what, time.monotonic() - began
            )

    def _cancel(self, run_id: str, reason: str = "cancel") -> None:
        held = self.held.get(run_id)
        if held is not None:
            held[1].request(reason)

    async def _adopt_unknown_claims(self) -> None:
        """After a claim whose commit was unknown: run what this worker holds."""
        claims = await dbpool.writers.run(claims_held_by, worker_id=self.worker_id)
        self.claim_unsure = False
        for claim in claims:
            if claim.run_id not in self.held and not self.stopping:
                log.warning(
                    "run adopted after an unanswered claim run_id=%s", claim.run_id
                )
                self._launch(claim)

    async def _claim_loop(self) -> None:
        while not self.stopping:
            if len(self.held) < self.concurrency:
                try:
                    if self.claim_unsure:
                        await self._adopt_unknown_claims()
                    claim = await dbpool.writers.run(
                        run_claim_next,
                        worker_id=self.worker_id,
                        lease_s=self.lease_s,
                        per_owner_limit=settings.HERMES["USER_MAX_CONCURRENT_RUNS"],
                    )
                except Exception as exc:
                    self._trouble("claim", exc)
                    self.claim_unsure |= dbpool.is_connection_error(exc)
                    claim = None
                else:
                    self._untroubled("claim")
                if claim is not None:  # even while stopping: stop() hands it over
                    self._launch(claim)
                    continue
            self._nudge.clear()
            try:
                await asyncio.wait_for(self._nudge.wait(), POLL_S)
            except TimeoutError:
                pass

    def _launch(self, claim: Claim) -> None:
        control = RunControl()
        task = asyncio.create_task(
            self._execute(claim, control), name=f"run {claim.run_id}"
        )
        self.held[claim.run_id] = (claim, control, task)

    async def _execute(self, claim: Claim, control: RunControl) -> None:
        log.info("run claimed run_id=%s worker=%s", claim.run_id, self.worker_id)
        try:
            await execute_run(claim, control)
        except EventsNotStored as exc:
            log.error("run failed run_id=%s: %s", claim.run_id, exc)
            await self._settle_failed(claim, str(exc))
        except Exception as exc:
            log.exception("run crashed run_id=%s", claim.run_id)
            await self._settle_failed(
                claim, f"the worker failed running this run ({type(exc).__name__})"
            )
        finally:
            self.held.pop(claim.run_id, None)
            self._nudge.set()

    async def _settle_failed(self, claim: Claim, message: str) -> None:
        """Settle a run whose executor gave up: `failed` / `worker-error`, now."""
        records = await self._settle(
            claim,
            Run.Status.FAILED,
            "worker-error",
            failed="run could not be settled; its lease will lapse",
            error={"category": "worker-error", "message": message},
        )
        if records is not None:
            await publish(claim.run_id, records)

    async def _settle(
        self, claim: Claim, status: str, state: str, *, failed: str, **extra
    ) -> list | None:
        """Settle a run this worker holds (its token, lease or not); the
        records journaled, or None when the database refused (logged as
        `failed`, one line)."""
        try:
            return await dbpool.writers.run(
                run_settle,
                run_id=claim.run_id,
                status=status,
                terminal_state=state,
                by=self.worker_id,
                only_if_lost=False,
                token=claim.token,
                **extra,
            )
        except Exception as exc:
            log.warning("%s run_id=%s (%s)", failed, claim.run_id, _first_line(exc))
            return None

    async def _lease_loop(self) -> None:
        delay = self.heartbeat_s
        while True:
            await asyncio.sleep(delay)
            claims = [claim for claim, _, _ in self.held.values()]
            try:
                if claims:
                    lost = await dbpool.writers.run(
                        lease_renew, claims=claims, lease_s=self.lease_s
                    )
                    for run_id in lost:  # another process took it over: stop quietly
                        self._cancel(run_id, "fenced")
                if not self.stopping:  # a stopping worker takes no runs over
                    await dbpool.writers.run(
                        worker_beat,
                        worker_id=self.worker_id,
                        active_runs=len(self.held),
                    )
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self._trouble("lease renewal", exc)
                delay = RENEW_RETRY_S  # renew first, as soon as the database is back
                continue
            self._untroubled("lease renewal")
            delay = self.heartbeat_s

    async def _reap_loop(self) -> None:
        while True:
            try:
                for run_id, records in await dbpool.writers.run(reap_lost_runs):
                    await publish(run_id, records)
                for run_id, records in await dbpool.writers.run(
                    reap_expired_waits,
                    terminal_state=approvals.TIMEOUT_STATE,
                    error=approvals.timeout_error(),
                ):
                    await publish(run_id, records)
                await dbpool.writers.run(pending.deliver_stranded)
                first = _earliest(
                    await dbpool.readers.run(next_lease_expiry),
                    await dbpool.readers.run(next_wait_expiry),
                )
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self._trouble("reaper", exc)
                delay = self.heartbeat_s
            else:
                self._untroubled("reaper")
                delay = reap_delay(first, self.lease_s)
            await asyncio.sleep(delay)

    async def _cancel_loop(self) -> None:
        while True:
            await asyncio.sleep(CANCEL_POLL_S)
            if not self.held:
                continue
            try:
                wanted = await dbpool.readers.run(
                    cancel_requested, run_ids=list(self.held)
                )
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self._trouble("cancel poll", exc)
                continue
            self._untroubled("cancel poll")
            for run_id in wanted:
                self._cancel(run_id)
