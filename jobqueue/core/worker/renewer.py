"""The renewer thread: keeps every lease in hand alive until its final write, gives up on leases
that are past their local deadline or their task's timeout, and sends the process heartbeat.

It renews every third of the lease, and after a failed renewal again within a second, so that a
blip does not eat two thirds of a lease. It runs until the worker's shutdown has written the
last of its jobs, not until the stop signal: a job in its grace period is still renewed.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from sqlalchemy.engine import Engine

from .. import metrics, service
from ..logs import event
from .config import WorkerConfig
from .finisher import Finisher
from .leases import LeaseKeeper, LeaseState, Lost
from .state import WorkerState

log = logging.getLogger("jobqueue.worker")

TICK_SECONDS = 0.25
RETRY_AFTER_FAILURE_SECONDS = 1.0


class Renewer:
    """Two threads: one renews and heartbeats (it may hang on a dead network for a while), the
    other only watches the clock, so that a lease past its local deadline is given up on time
    even while a renewal is stuck in flight."""

    def __init__(
        self,
        engine: Engine,
        config: WorkerConfig,
        keeper: LeaseKeeper,
        finisher: Finisher,
        state: WorkerState,
        heartbeat: Callable[[], None],
    ):
        self.engine = engine
        self.config = config
        self.keeper = keeper
        self.finisher = finisher
        self.state = state
        self.heartbeat = heartbeat
        self._done = threading.Event()
        self._beat_now = threading.Event()
        self._threads = [
            threading.Thread(target=self._run, name="jobqueue-renewer", daemon=True),
            threading.Thread(target=self._watch, name="jobqueue-lease-clock", daemon=True),
        ]

    def start(self) -> None:
        for t in self._threads:
            t.start()

    def stop(self) -> None:
        self._done.set()
        for t in self._threads:
            if t.is_alive() and t is not threading.current_thread():
                t.join(10)

    def _watch(self) -> None:
        while not self._done.wait(min(TICK_SECONDS, self.config.renew_seconds / 4)):
            self.give_up_overdue()

    def _run(self) -> None:
        renew_every = self.config.renew_seconds
        next_renew = time.monotonic() + renew_every
        next_beat = time.monotonic()
        while not self._done.wait(min(TICK_SECONDS, renew_every / 4)):
            now = time.monotonic()
            if now >= next_renew:
                ok = self.renew()
                next_renew = now + (renew_every if ok else min(renew_every, RETRY_AFTER_FAILURE_SECONDS))
            if now >= next_beat or self._beat_now.is_set():
                self._beat_now.clear()
                next_beat = now + self.config.heartbeat_seconds
                try:
                    self.heartbeat()
                except Exception as exc:
                    self.state.sql_error("heartbeat", exc)

    def beat_soon(self) -> None:
        """Send the heartbeat at the next tick (the worker's state changed)."""
        self._beat_now.set()

    def renew(self) -> bool:
        """Renew every lease in hand now. False when the renewal failed (it is tried again soon)."""
        items, sent_at = self.keeper.begin_renewal()
        if not items:
            return True
        outcomes = None
        try:
            with self.engine.connect() as conn:
                outcomes = service.renew(conn, [h.lease for h in items], self.config.lease_seconds)
        except Exception as exc:  # every error: the deadline keeps running and says when to give up
            self.state.sql_error("renew", exc)
        finally:
            lost = self.keeper.end_renewal(items, sent_at, outcomes)
        for gone in lost:
            self._lost(gone, counted=True)
        return outcomes is not None

    def give_up_overdue(self) -> None:
        for gone in self.keeper.overdue():
            self._lost(gone)
            if gone.reason == "timeout":
                # The attempt counts as failed: retried by the usual backoff, or failed for good
                # on its last attempt. A plain handler may go on running (nothing it writes
                # lands); a coroutine is cancelled.
                if gone.held.coroutine is not None:
                    gone.held.coroutine.cancel()
                # Written from a thread of its own: the clock must keep watching meanwhile.
                threading.Thread(target=self._time_out, args=(gone,), name="jobqueue-timeout", daemon=True).start()

    def _lost(self, gone: Lost, counted: bool = False) -> None:
        held = gone.held
        if not counted:  # the repository already counted and logged a renewal the fence refused
            metrics.LEASES_LOST.labels(operation=gone.reason).inc()
            event(
                log,
                logging.WARNING,
                "lease_lost",
                operation=gone.reason,
                job_id=held.lease.job_id,
                task_key=held.claimed.job.task_key,
                attempt=held.lease.attempt,
                worker=held.lease.owner,
                detail=gone.detail,
            )

    def _time_out(self, gone: Lost) -> None:
        held = gone.held
        held.duration = time.monotonic() - (held.started_at or held.claimed_at)
        self.finisher.attempt_failed(held, f"timed out after {held.timeout:g} s", outcome="timeout")


__all__ = ["Renewer", "LeaseState"]
