"""The worker: claim, run after the commit, renew the lease, complete under the fence.

One worker process holds up to `concurrency + prefetch` leases ("lease slots") and runs
`concurrency` handlers at once: plain ones on threads, `async def` ones on one event loop. Its loop reads like this:

    while not stopping:
        maintenance              # promote due retries/delayed jobs, reap expired leases, enqueue
                                 # due recurring runs, start a retention pass when one is due
                                 # (maintenance.py)
        one cycle, one transaction: complete the jobs whose handlers returned since the last
            cycle, and claim a job for every free lease slot (the completed ones included)
            (claimer.py)
        hand each claimed job to a thread (slots.py); a thread whose handler raised schedules
            the retry or fails the job itself (finisher.py)
        nothing claimed? the same transaction said why (idle / contended / waiting on leases):
            back off accordingly, reading before claiming while idle

This module owns the lifecycle of those parts: start (preflight, the threads), the loop, the
stop and its grace period, the heartbeat.

Two writable candidate primaries (a failover that left the old one writable): the engine keeps
every connection on the candidate it chose (db.py), and while a look at all of them finds two
writable the loop claims nothing and does no maintenance; the jobs in hand still renew and
complete on the chosen server. The state says so (`split_brain`) until one is read-only again.

The renewer thread (renewer.py) renews every lease in hand every third of the lease, until its
final write has committed, loses leases whose local deadline passed (leases.py), and sends the
process heartbeat. On SIGTERM the loop stops claiming, prefetched jobs that never started go
back to `ready`, running jobs get `grace_seconds` to finish (their completions still written,
their leases still renewed), and whatever still runs is released back to `ready` with its
attempt count kept.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time
from typing import Any

from sqlalchemy.engine import Engine

from .. import metrics, preflight, repository, retry, wakeup
from ..db import is_mysql, two_primaries, unwatch_primaries, watch_primaries
from ..errors import JobQueueError, NotPrimary, UnsupportedDatabase
from ..logs import event
from ..models import ClaimedJob, EmptyClaimReport
from ..retention import Pruner
from ..tasks import TASKS, Registry
from .claimer import NOT_PRIMARY_RETRY_SECONDS, Claimer
from .config import WorkerConfig
from .doorbell import Doorbell
from .finisher import BUSY_RETRY_SECONDS, Finisher
from .leases import LeaseKeeper, LeaseState
from .maintenance import Maintenance
from .renewer import Renewer
from .slots import Slots
from .state import DB_ERRORS, WorkerState, reachability

log = logging.getLogger("jobqueue.worker")

DOORBELL_AFTER_SECONDS = 0.2  # backoff sleeps this long or longer are spent listening for the doorbell
# Before the first claim: wait for the database to answer, however long that takes.
START = retry.RetryPolicy(first_delay=0.5, max_delay=10.0)


def process_id(name: str | None = None) -> str:
    """host:pid, or host:pid:name, shortened so that a slot's id fits lease_owner (64 chars)."""
    host = socket.gethostname().split(".")[0][:30]
    base = f"{host}:{os.getpid()}"
    return f"{base}:{name[:20]}" if name else base


class Worker:
    def __init__(self, engine: Engine, config: WorkerConfig | None = None, *, registry: Registry = TASKS):
        self.engine = engine
        self.config = config = config or WorkerConfig()
        self.registry = registry
        self.id = process_id(config.name)
        self.keeper = LeaseKeeper(config.lease_seconds)
        self._stop = threading.Event()
        self._wake = wakeup.subscribe()
        self._state = WorkerState(self.id, on_change=lambda: self.renewer.beat_soon())
        # A job whose handler returned here and whose final write waits (its row held by a stray
        # transaction kept it from renewing too) is not re-run by our own reaper: the write lands
        # once the row is free. (tests/integration/test_leases.py, the held-row test.)
        self.maintenance = Maintenance(
            engine,
            name=self.id,
            registry=registry,
            on_error=self._state.sql_error,
            reap_every=config.reap_interval,
            prune_every_seconds=config.prune_every_seconds,
            in_loop=config.reap_in_loop,
            keep=lambda: [(h.lease.job_id, h.lease.attempt) for h in self.keeper.held() if h.handler_done],
        )
        self.finisher = Finisher(engine, config, self.keeper, registry, self._state, self._wake)
        self.slots = Slots(self.finisher, self.keeper, registry, self.id, config.concurrency)
        self.renewer = Renewer(engine, config, self.keeper, self.finisher, self._state, self.heartbeat)
        # A burst worker exits when idle: nobody needs to ring it.
        self._doorbell = (
            Doorbell(engine, config.queues, self._wake, self._stop, name=self.id)
            if is_mysql(engine) and config.doorbell and not config.burst
            else None
        )
        self.claimer = Claimer(
            engine,
            config,
            self.id,
            keeper=self.keeper,
            finisher=self.finisher,
            slots=self.slots,
            maintenance=self.maintenance,
            state=self._state,
            registry=registry,
            doorbell=self._doorbell,
        )
        self._started = False
        self._stats_sent: dict[str, int] = {}

    def slot_id(self, slot: int) -> str:
        return self.claimer.owners[slot]

    @property
    def state(self) -> str:  # claiming | not_primary | split_brain | database_unreachable | stopping | stopped
        return self._state.name

    @property
    def state_detail(self) -> str | None:
        return self._state.detail

    @property
    def processed(self) -> int:
        return self.finisher.processed

    @property
    def last_empty(self) -> EmptyClaimReport | None:
        return self.claimer.last_empty

    @property
    def pruner(self) -> Pruner:
        return self.maintenance.pruner

    def prefetch_now(self) -> int:
        return self.claimer.prefetch_now()

    # --- lifecycle -----------------------------------------------------------------------------

    def run(self) -> int:
        """Run until stopped (SIGTERM/SIGINT) or, in burst mode, until there is nothing to do.
        Exit code: 0, or 3 when the server cannot run the queue safely."""
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, lambda *_: self.stop("SIGTERM"))
            signal.signal(signal.SIGINT, lambda *_: self.stop("SIGINT"))
        try:
            self._wait_for_database()
        except UnsupportedDatabase as exc:
            self._state.set("refused", str(exc))
            event(log, logging.ERROR, "worker_refused", worker=self.id, reason=str(exc))
            return 3
        if self._stop.is_set():
            return 0
        self.start_threads()
        event(
            log,
            logging.INFO,
            "worker_started",
            worker=self.id,
            concurrency=self.config.concurrency,
            prefetch="auto" if self.config.prefetch is None else self.config.prefetch or None,
            queues=self.claimer.queue_label,
            lease_seconds=self.config.lease_seconds,
            burst=self.config.burst,
        )
        try:
            while not self._stop.is_set():
                delay = self.run_once()
                if delay is None:
                    break
                if delay > BUSY_RETRY_SECONDS and self.finisher.pending:
                    # A completion found its row held by another transaction: try again soon,
                    # before the lease the held row cannot renew runs out.
                    delay = BUSY_RETRY_SECONDS
                if delay > 0:
                    self.wait_for_wake(delay)
        finally:
            self.shutdown()
        return 0

    def stop(self, reason: str = "stop requested") -> None:
        if not self._stop.is_set():
            event(log, logging.INFO, "worker_stopping", worker=self.id, reason=reason)
        self._stop.set()
        self._wake.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def start_threads(self) -> None:
        if self._started:
            return
        self._started = True
        watch_primaries(self.engine)
        self._register()
        self.renewer.start()
        if self._doorbell is not None:
            self._doorbell.start()

    def _wait_for_database(self) -> None:
        """Preflight before the first claim, waiting for the database to answer. A read-only
        server refuses a standalone worker at once (exit 3) unless configured to wait for it to
        become the primary (embedded workers, several candidate URLs)."""

        def check() -> None:
            if self._stop.is_set():
                return
            try:
                preflight.require_supported(self.engine)
            except NotPrimary:
                raise
            except UnsupportedDatabase as exc:
                if "read-only" in str(exc) and not self.config.refuse_read_only_at_start:
                    raise NotPrimary(str(exc)) from exc
                raise

        def waiting(kind: str, attempt: int, delay: float, exc: BaseException) -> None:
            self._state.set("not_primary" if kind == "not_primary" else "database_unreachable", str(exc)[:300])
            self._state.sql_error("preflight", exc)

        retry.call(
            check,
            START,
            lambda exc: (
                None if isinstance(exc, UnsupportedDatabase) and not isinstance(exc, NotPrimary) else reachability(exc)
            ),
            on_retry=waiting,
            sleep=self._stop.wait,
        )

    # --- the loop --------------------------------------------------------------------------------

    def run_once(self) -> float | None:
        """One turn of the loop. Returns seconds to sleep before the next turn, or None when a
        burst worker has nothing left to do."""
        if self._stop.is_set():
            return None
        split = two_primaries(self.engine)
        if split is not None:
            self.claimer.complete_finished()  # on the chosen server, where these jobs were claimed
            self._state.split_brain(split)
            return NOT_PRIMARY_RETRY_SECONDS
        if self.maintenance.turn():
            self.claimer.queues_changed()
        return self.claimer.turn()

    def wait_for_wake(self, seconds: float) -> bool:
        """Sleep up to `seconds`, less if a job is enqueued in this process or a handler
        finishes, or another process rings the doorbell. True when woken early."""
        if self._doorbell is not None and seconds >= DOORBELL_AFTER_SECONDS:
            self._doorbell.idle()
        if not self._wake.wait(seconds):
            return False
        self._wake.clear()
        if self._wake.new_work:
            self._wake.new_work = False
            self.claimer.new_work()
        return True

    # --- shutdown ------------------------------------------------------------------------------

    def shutdown(self) -> None:
        """Stop claiming; release prefetched jobs; give running jobs the grace period (their
        completions written, their leases renewed); release what still runs; then stop."""
        self._stop.set()
        self._state.set("stopping", None)
        if not self._started:
            return
        finisher = self.finisher
        finisher.gathering = False  # each handler that returns from now on wakes the loop below
        for held in self.keeper.held(LeaseState.WAITING):
            finisher.release_unstarted(held, "shutdown", "released before it started", "worker shutting down")
        deadline = time.monotonic() + self.config.grace_seconds
        while time.monotonic() < deadline and self.keeper.held(LeaseState.RUNNING, LeaseState.FINISHING):
            self.claimer.complete_finished()
            self._wake.wait(0.05)
            self._wake.clear()
        released = 0
        for held in self.keeper.held(LeaseState.RUNNING):
            if self.keeper.lose(held, "shutdown", "released on shutdown", only_if=(LeaseState.RUNNING,)):
                if held.coroutine is not None:  # a thread cannot be stopped; a coroutine can
                    held.coroutine.cancel()
                released += finisher.release(held)
        # Completions still pending (a handler returned at the last moment, or the database is
        # away): keep trying while their leases last.
        last_call = time.monotonic() + self.config.finish_retry_seconds
        while self.keeper.held(LeaseState.FINISHING) and time.monotonic() < last_call:
            self.claimer.complete_finished()
            if self.keeper.held(LeaseState.FINISHING):
                self._wake.wait(0.2)
                self._wake.clear()
        self.slots.stop()
        self.renewer.stop()
        self.maintenance.stop()
        if self._doorbell is not None:
            self._doorbell.hang_up()
        self.claimer.close()
        unwatch_primaries(self.engine)
        try:
            self.heartbeat()
            with self.engine.connect() as conn:
                repository.processes.mark_stopped(conn, self.id)
        except DB_ERRORS as exc:
            self._state.sql_error("heartbeat", exc)
        self._state.set("stopped", None)
        event(log, logging.INFO, "worker_stopped", worker=self.id, processed=self.processed, released=released)

    # --- reporting -----------------------------------------------------------------------------

    def _register(self) -> None:
        self._stats_sent = metrics.stat_totals()
        try:
            with self.engine.connect() as conn:
                repository.processes.register_process(
                    conn,
                    process_id=self.id,
                    host=socket.gethostname(),
                    pid=os.getpid(),
                    kind=self.config.kind,
                    concurrency=self.config.concurrency,
                    queues=self.claimer.queue_label,
                    tasks=self.registry.specs(),
                )
        except DB_ERRORS as exc:
            self._state.sql_error("heartbeat", exc)

    def status(self) -> dict[str, Any]:
        """What this process is doing, for its heartbeat, the workers page and /api/health."""
        return {"state": self.state, "detail": self.state_detail, "slots": self.keeper.snapshot()}

    def heartbeat(self) -> None:
        """Tell the dashboard this process is alive and what it holds, and flush its activity
        counts."""
        totals = metrics.stat_totals()
        sent = self._stats_sent
        deltas = {k: v - sent.get(k, 0) for k, v in totals.items()}
        with self.engine.connect() as conn:
            known = repository.processes.heartbeat(
                conn,
                self.id,
                jobs_in_hand=len(self.keeper),
                processed=self.processed,
                stats=deltas,
                state=self.status(),
            )
        self._stats_sent = totals
        if not known:
            self._register()
            self.renewer.beat_soon()

    def renew_now(self) -> None:
        self.renewer.renew()

    def in_hand(self) -> list[ClaimedJob]:
        return [h.claimed for h in self.keeper.held()]


__all__ = ["DB_ERRORS", "JobQueueError", "Worker", "WorkerConfig", "process_id"]
