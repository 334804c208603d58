"""The turn worker: claims queued runs, holds their leases, settles lost ones (DESIGN §6).

Runs inside `manage.py serve` (embedded) or as `manage.py worker` processes
(scale-out, any number, anywhere that reaches the database and Redis). Wakes on
a channel-layer nudge or a short poll; the database decides who runs what.
"""

import asyncio
import logging
import os
import socket

from channels.layers import get_channel_layer
from django.conf import settings
from ulid import ULID

from journal import dbpool
from journal.heartbeats import worker_beat
from journal.leases import (
    Claim,
    cancel_requested,
    lease_renew,
    reap_lost_runs,
    run_claim_next,
)
from journal.publish import publish

from .providers import registry
from .runner import RunControl, execute_run
from .services import WORKERS_GROUP

log = logging.getLogger(__name__)

POLL_S = 1.0  # claim poll when no nudge arrives (the nudge is only a fast path)
CANCEL_POLL_S = 0.5  # cancel requests read from the database: stop within a second
REAP_EVERY = 5  # heartbeats between two sweeps for runs whose worker died


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
        self._channel: str | None = None

    @property
    def active_provider_requests(self) -> int:
        return registry.active_requests()

    async def start(self) -> None:
        await self._join()
        for loop in (
            self._claim_loop,
            self._lease_loop,
            self._cancel_loop,
            self._listen_loop,
        ):
            self._tasks.append(
                asyncio.create_task(loop(), name=f"worker {loop.__name__}")
            )
        log.info(
            "worker started id=%s concurrency=%d", self.worker_id, self.concurrency
        )

    async def stop(self, grace_s: float = 30.0) -> None:
        """Stop claiming; let held runs finish for `grace_s`, then settle them."""
        self.stopping = True
        self._nudge.set()
        running = [task for _, _, task in self.held.values()]
        if running:
            _, pending = await asyncio.wait(running, timeout=grace_s)
            for _claim, control, _task in list(self.held.values()):
                control.request("shutdown")
            if pending:
                await asyncio.wait(pending, timeout=10)
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._leave()
        log.info("worker stopped id=%s", self.worker_id)

    async def _join(self) -> None:
        layer = get_channel_layer()
        try:
            self._channel = await layer.new_channel()
            await layer.group_add(WORKERS_GROUP, self._channel)
        except Exception:
            log.warning("channel layer unavailable; the worker polls", exc_info=True)
            self._channel = None

    async def _leave(self) -> None:
        if self._channel:
            try:
                await get_channel_layer().group_discard(WORKERS_GROUP, self._channel)
            except Exception:
                log.warning("group_discard failed", exc_info=True)

    async def _listen_loop(self) -> None:
        if not self._channel:
            return
        layer = get_channel_layer()
        while True:
            try:
                message = await layer.receive(self._channel)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.warning("worker channel failed; polling only", exc_info=True)
                return
            if message.get("type") == "run.cancel":
                self._cancel(message.get("run_id", ""))
            else:
                self._nudge.set()

    def _cancel(self, run_id: str) -> None:
        held = self.held.get(run_id)
        if held is not None:
            held[1].request("cancel")

    async def _claim_loop(self) -> None:
        while not self.stopping:
            if len(self.held) < self.concurrency:
                try:
                    claim = await dbpool.writers.run(
                        run_claim_next, worker_id=self.worker_id, lease_s=self.lease_s
                    )
                except Exception:
                    log.exception("claim failed")
                    claim = None
                if claim is not None and not self.stopping:
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
        except Exception:
            # The lease lapses and the reaper settles the run as lost-worker.
            log.exception("run crashed run_id=%s", claim.run_id)
        finally:
            self.held.pop(claim.run_id, None)
            self._nudge.set()

    async def _lease_loop(self) -> None:
        beats = 0
        while True:
            await asyncio.sleep(self.heartbeat_s)
            beats += 1
            claims = [claim for claim, _, _ in self.held.values()]
            try:
                if claims:
                    lost = await dbpool.writers.run(
                        lease_renew, claims=claims, lease_s=self.lease_s
                    )
                    for run_id in lost:  # another process took it over: stop quietly
                        self._cancel(run_id)
                await dbpool.writers.run(
                    worker_beat, worker_id=self.worker_id, active_runs=len(self.held)
                )
                if beats % REAP_EVERY == 0:
                    for run_id, records in await dbpool.writers.run(reap_lost_runs):
                        await publish(run_id, records)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("lease heartbeat failed")

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
            except Exception:
                log.exception("cancel poll failed")
                continue
            for run_id in wanted:
                self._cancel(run_id)
