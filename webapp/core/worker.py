"""The worker: claim, run after the commit, renew the lease, complete under the fence.

One worker process runs N handler threads ("slots"). Its loop reads like this:

    while not stopping:
        maintenance()            # promote due retries/delayed jobs, reap expired leases
        claim up to <idle slots> jobs in one short transaction
        hand each job to an idle slot; the slot runs the handler, then retries/fails it itself
            or hands it to the completer
        nothing claimed? ask why (idle / contended / waiting on leases) and back off accordingly

The completer thread marks finished jobs done in batches (one fenced UPDATE and one COMMIT for
whatever finished meanwhile) and only then frees their slots. The renewer thread renews the
leases of every job in hand and sends the process heartbeat. On SIGTERM the loop stops claiming,
running jobs get `grace_seconds` to finish, and whatever is still running is released back to
`ready` with its attempt count kept.
"""

from __future__ import annotations

import logging
import os
import queue as queue_mod
import signal
import socket
import threading
import time
import traceback
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone

import pymysql
from sqlalchemy.engine import Engine
from sqlalchemy.exc import DBAPIError, SQLAlchemyError

from . import metrics, preflight, repository, wakeup
from .db import is_mysql
from .backoff import IdleBackoff, retry_delay
from .db import transient_kind
from .errors import PermanentError, TransientDatabaseError, UnsupportedDatabase
from .logs import RateLimited, event
from .models import ClaimedJob, EmptyClaim, EmptyClaimReport, Lease, Outcome
from .reaper import Reaper
from .tasks import TASKS, JobContext, LeaseLostError, Registry

log = logging.getLogger("jobqueue.worker")

DB_ERRORS = (DBAPIError, SQLAlchemyError, TransientDatabaseError, pymysql.err.Error)
COMPLETE_BATCH = 100
SWEEP_SECONDS = 60.0   # an idle worker's reaper sweep, besides the ones its reads trigger


def process_id(name: str | None = None) -> str:
    """host:pid, or host:pid:name, shortened so that a slot's id fits lease_owner (64 chars)."""
    host = socket.gethostname().split(".")[0][:30]
    base = f"{host}:{os.getpid()}"
    return f"{base}:{name[:20]}" if name else base


@dataclass
class WorkerConfig:
    concurrency: int = 4
    queues: Sequence[str] | None = None          # None: every queue
    name: str | None = None
    lease_seconds: float = 60.0
    burst: bool = False
    grace_seconds: float = 30.0
    idle_cap_seconds: float = 2.0
    reap_interval: float | None = None           # default: a quarter of the lease, 1..15 s
    queue_refresh_seconds: float = 1.0
    finish_retry_seconds: float | None = None    # how long to keep retrying a completion write
    reap_in_loop: bool = True                    # off when a scheduler runs the reaper (embedded mode)
    heartbeat_seconds: float = 15.0
    kind: str = "worker"                         # how the dashboard lists this process: worker | embedded

    def __post_init__(self) -> None:
        if self.concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        if self.lease_seconds < 1:
            raise ValueError("lease must be at least 1 second")
        if self.reap_interval is None:
            self.reap_interval = min(15.0, max(1.0, self.lease_seconds / 4))
        if self.finish_retry_seconds is None:
            self.finish_retry_seconds = max(5.0, self.lease_seconds)


@dataclass
class _InHand:
    claimed: ClaimedJob
    slot: int
    ctx: JobContext
    lost: threading.Event = field(default_factory=threading.Event)
    duration: float = 0.0
    finishing: bool = False   # its final write is under way: no more renewals
    slot_freed: bool = False  # its slot took new work before the completion was written


class Worker:
    def __init__(self, engine: Engine, config: WorkerConfig | None = None, *, registry: Registry = TASKS):
        self.engine = engine
        self.config = config or WorkerConfig()
        self.registry = registry
        self.id = process_id(self.config.name)
        self.reaper = Reaper(engine, name=self.id)
        self._stop = threading.Event()
        self._wake = wakeup.subscribe()
        self._slots = threading.Condition()
        self._free: list[int] = list(range(1, self.config.concurrency + 1))
        self._in_hand: dict[int, _InHand] = {}
        self._inbox: queue_mod.Queue[_InHand | None] = queue_mod.Queue()
        self._completions: queue_mod.Queue[_InHand | None] = queue_mod.Queue()
        self._renew_lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._backoff = IdleBackoff(cap=self.config.idle_cap_seconds)
        self._idle_log = RateLimited(60.0)
        self._error_log = RateLimited(5.0)
        self._last_reap = self._queues_at = 0.0
        self._probe_first = False   # after an idle empty claim: read first, claim only if worth it
        self._busy = False          # claimed since the last sweep
        self._probe = _IdleProbe(engine, self.config.queues) if is_mysql(engine) else None
        self._known_queues: list[str] = list(self.config.queues or [])
        self._rr = 0
        self._queue_label = ",".join(self.config.queues) if self.config.queues else "*"
        self.processed = 0
        self.last_empty: EmptyClaimReport | None = None

    def slot_id(self, slot: int) -> str:
        return f"{self.id}:{slot}"

    # --- lifecycle -----------------------------------------------------------------------------

    def run(self) -> int:
        """Run until stopped (SIGTERM/SIGINT) or, in burst mode, until there is nothing to do."""
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, lambda *_: self.stop("SIGTERM"))
            signal.signal(signal.SIGINT, lambda *_: self.stop("SIGINT"))
        try:
            self._wait_for_database()
        except UnsupportedDatabase as exc:
            event(log, logging.ERROR, "worker_refused", worker=self.id, reason=str(exc))
            return 3
        if self._stop.is_set():
            return 0
        self.start_threads()
        event(log, logging.INFO, "worker_started", worker=self.id, concurrency=self.config.concurrency,
              queues=",".join(self.config.queues) if self.config.queues else "*",
              lease_seconds=self.config.lease_seconds, burst=self.config.burst)
        try:
            while not self._stop.is_set():
                delay = self.run_once()
                if delay is None:
                    break
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
        with self._slots:
            self._slots.notify_all()

    def start_threads(self) -> None:
        self._register()
        for slot in range(1, self.config.concurrency + 1):
            t = threading.Thread(target=self._slot_loop, name=f"jobqueue-slot-{slot}", daemon=True)
            t.start()
            self._threads.append(t)
        for target, name in ((self._renew_loop, "jobqueue-renewer"), (self._complete_loop, "jobqueue-completer")):
            t = threading.Thread(target=target, name=name, daemon=True)
            t.start()
            self._threads.append(t)

    def shutdown(self) -> None:
        """Stop claiming, give running jobs the grace period, release what is left."""
        self._stop.set()
        deadline = time.monotonic() + self.config.grace_seconds
        with self._slots:
            while self._in_hand and time.monotonic() < deadline:
                self._slots.wait(min(0.2, max(0.0, deadline - time.monotonic())))
            left = list(self._in_hand.values())
        for item in left:
            item.lost.set()
            try:
                with self.engine.connect() as conn:
                    outcome = repository.release(conn, item.claimed.lease)
                metrics.RELEASED.inc()
                event(log, logging.WARNING, "released", job_id=item.claimed.job.id, task_key=item.claimed.job.task_key,
                      attempt=item.claimed.lease.attempt, worker=item.claimed.lease.owner, outcome=outcome.value)
            except DB_ERRORS as exc:
                # The lease will expire and the reaper will return the job instead.
                self._sql_error("release", exc)
        for _ in range(self.config.concurrency):
            self._inbox.put(None)
        self._completions.put(None)
        if self._probe is not None:
            self._probe.close()
        try:
            self.heartbeat()
            with self.engine.connect() as conn:
                repository.mark_stopped(conn, self.id)
        except DB_ERRORS as exc:
            self._sql_error("heartbeat", exc)
        event(log, logging.INFO, "worker_stopped", worker=self.id, processed=self.processed,
              released=len(left))

    def _wait_for_database(self) -> None:
        delay = 0.5
        while not self._stop.is_set():
            try:
                preflight.require_supported(self.engine)
                return
            except UnsupportedDatabase:
                raise
            except DB_ERRORS as exc:
                self._sql_error("preflight", exc)
                self._stop.wait(delay)
                delay = min(delay * 2, 10.0)

    # --- the loop --------------------------------------------------------------------------------

    def run_once(self) -> float | None:
        """One turn of the loop. Returns seconds to sleep before the next turn, or None when a
        burst worker has nothing left to do."""
        if self._stop.is_set():
            return None
        self._maintenance()
        free = self._free_slots()
        if not free:
            return 0.05  # all slots busy; a finishing slot wakes us
        if self._probe_first:
            # Idle: one plain read says whether a claim could find anything, so an idle worker
            # sends about one statement per turn instead of a claim transaction and a read.
            report = self._classify(probe=True)
            if report is None:
                return self._backoff.next(None)
            if not self._act_on(report):
                return self._settle(report)
        try:
            claimed = self._claim(free)
        except DB_ERRORS as exc:
            self._sql_error("claim", exc)
            return self._backoff.next(None)
        if claimed:
            self._probe_first = False
            self._busy = True
            self._backoff.reset()
            self._idle_log.reset()
            for item in claimed:
                self._dispatch(item)
            return 0
        report = self._classify(probe=False)
        if report is None:
            return self._backoff.next(None)
        if self._act_on(report):
            return 0
        return self._settle(report)

    def _classify(self, probe: bool) -> EmptyClaimReport | None:
        try:
            if probe and self._probe is not None:
                return self._probe.read()
            with self.engine.connect() as conn:
                return repository.classify_empty(conn, self.config.queues)
        except DB_ERRORS as exc:
            self._sql_error("classify", exc)
            return None

    def _act_on(self, report: EmptyClaimReport) -> bool:
        """Promote due retries and reap expired leases the read revealed. True when a claim is
        worth trying now."""
        now = report.db_now
        acted = False
        if now is not None and report.next_lease_expiry is not None and report.next_lease_expiry <= now \
                and self.config.reap_in_loop:
            acted = self._reap() > 0
        if now is not None and report.next_scheduled is not None and report.next_scheduled <= now:
            acted = self._promote() > 0 or acted
        if acted:
            self._queues_at = 0.0
        return acted or (self._probe_first and report.kind is EmptyClaim.CONTENDED)

    def _settle(self, report: EmptyClaimReport) -> float | None:
        """Count and log an empty claim, then say how long to sleep (None: a burst worker is done)."""
        self.last_empty = report
        self._probe_first = report.kind is not EmptyClaim.CONTENDED
        metrics.EMPTY_CLAIMS.labels(kind=report.kind.value, queues=self._queue_label).inc()
        if report.kind is EmptyClaim.CONTENDED:
            metrics.SKIPPED.inc(report.skipped)
        suppressed = self._idle_log.allow(report.kind)
        if suppressed is not None:
            event(log, logging.INFO, report.kind.value, worker=self.id, skipped=report.skipped or None,
                  next_lease_expiry=report.next_lease_expiry, next_scheduled=report.next_scheduled,
                  repeats=suppressed or None)
        if self.config.burst and report.kind is not EmptyClaim.CONTENDED:
            with self._slots:
                if not self._in_hand:
                    return None
            return 0.05
        return self._backoff.next(report)

    def _claim(self, free: list[int]) -> list[ClaimedJob]:
        with self.engine.connect() as conn:
            refreshed = self._refresh_queues(conn)
            owners = [self.slot_id(s) for s in free]
            claimed = repository.claim(conn, owners, len(free), self._rotated(), lease_seconds=self.config.lease_seconds)
            if not claimed and not refreshed and self._refresh_queues(conn, force=True):
                # The cached list of queues with ready jobs was stale: try the fresh one before
                # calling this an empty claim.
                claimed = repository.claim(conn, owners, len(free), self._rotated(),
                                           lease_seconds=self.config.lease_seconds)
            return claimed

    def _refresh_queues(self, conn, force: bool = False) -> bool:
        """For a worker on every queue: which queues have ready jobs (cached for a second, a loose
        index scan). True when the list was read now."""
        if self.config.queues is not None:
            return False
        if not force and time.monotonic() - self._queues_at <= self.config.queue_refresh_seconds:
            return False
        self._known_queues = repository.ready_queues(conn)
        self._queues_at = time.monotonic()
        return True

    def _rotated(self) -> list[str]:
        """The queues to claim from, rotated each turn so that no queue starves the others."""
        queues = self._known_queues
        if len(queues) > 1:
            self._rr = (self._rr + 1) % len(queues)
            queues = queues[self._rr:] + queues[:self._rr]
        return queues

    def _maintenance(self) -> None:
        """The reaper's sweep (expired leases back to ready, due retries promoted): every
        reap_interval while this worker has been busy, at least every SWEEP_SECONDS when idle.
        An idle worker's read also triggers it as soon as it sees an expiry or a due job."""
        if not self.config.reap_in_loop:
            return
        since = time.monotonic() - self._last_reap
        if (self._busy and since >= self.config.reap_interval) or since >= SWEEP_SECONDS:
            self._busy = False
            if self._reap() + self._promote():
                self._queues_at = 0.0

    def _reap(self) -> int:
        self._last_reap = time.monotonic()
        try:
            result = self.reaper.reap()
            return result.reclaimed + result.failed
        except DB_ERRORS as exc:
            self._sql_error("reap", exc)
            return 0

    def _promote(self) -> int:
        try:
            return self.reaper.promote()
        except DB_ERRORS as exc:
            self._sql_error("promote", exc)
            return 0

    def wait_for_wake(self, seconds: float) -> bool:
        """Sleep up to `seconds`, less if a job is enqueued in this process or a slot frees up.
        True when woken early."""
        if not self._wake.wait(seconds):
            return False
        self._wake.clear()
        if self._wake.new_work:
            # Something was enqueued in this process: maybe into a queue we have not seen.
            self._wake.new_work = False
            self._queues_at = 0.0
            self._probe_first = False
            self._backoff.reset()
        return True

    def _sql_error(self, operation: str, exc: BaseException) -> None:
        metrics.SQL_ERRORS.labels(operation=operation).inc()
        # Every error is counted; during an outage the log gets one line per operation every
        # few seconds, with how many were held back.
        suppressed = self._error_log.allow(operation)
        if suppressed is not None:
            event(log, logging.ERROR, "sql_error", worker=self.id, operation=operation,
                  error=f"{type(exc).__name__}: {str(getattr(exc, 'orig', None) or exc)[:300]}",
                  repeats=suppressed or None)

    # --- slots ---------------------------------------------------------------------------------

    def _free_slots(self) -> list[int]:
        with self._slots:
            return sorted(self._free)

    def _dispatch(self, claimed: ClaimedJob) -> None:
        slot = int(claimed.lease.owner.rsplit(":", 1)[1])
        job, lease = claimed.job, claimed.lease
        ctx = JobContext(job_id=job.id, task_key=job.task_key, task_name=job.task_name, queue=job.queue,
                         attempt=lease.attempt, max_attempts=job.max_attempts, worker_id=lease.owner,
                         _record_result=lambda result: self._record_result(lease, job.task_key, result))
        item = _InHand(claimed, slot, ctx, ctx.lease_lost)
        with self._slots:
            self._free.remove(slot)
            self._in_hand[job.id] = item
        event(log, logging.INFO, "claim", job_id=job.id, task_key=job.task_key, task=job.task_name,
              queue=job.queue, attempt=lease.attempt, worker=lease.owner)
        self._inbox.put(item)

    def _slot_loop(self) -> None:
        while True:
            item = self._inbox.get()
            if item is None:
                return
            handed_over = False
            try:
                handed_over = self._execute(item)
            finally:
                if not handed_over:
                    self._release_slots([item])

    def _release_slots(self, items: list[_InHand]) -> None:
        """These jobs are finished: out of our hands, and their slots (if still taken) free."""
        with self._slots:
            for item in items:
                self._in_hand.pop(item.claimed.job.id, None)
                if not item.slot_freed:
                    item.slot_freed = True
                    self._free.append(item.slot)
            self._slots.notify_all()
        self.processed += len(items)
        self._wake.set()

    def _free_slot_early(self, item: _InHand) -> None:
        """The handler is done and the job waits for the completer: let the slot take new work
        while the completion is written, so the next claim overlaps the last COMMIT. Only while
        the completer keeps up (at most `concurrency` jobs waiting), so a slow database slows
        claiming down instead of piling up finished jobs."""
        if self._completions.qsize() > self.config.concurrency:
            return
        with self._slots:
            item.slot_freed = True
            self._free.append(item.slot)
        self._wake.set()

    def _execute(self, item: _InHand) -> bool:
        """Run the handler. True when the job went to the completer (which frees its slot)."""
        job, lease = item.claimed.job, item.claimed.lease
        spec = self.registry.get(job.task_name)
        started = time.monotonic()
        try:
            try:
                if spec is None:
                    raise LookupError(f"no handler for task {job.task_name!r} in worker {self.id}")
                spec.handler(job.payload, item.ctx)
            finally:
                # A renewal racing the final write would find the job finished and cry "lost".
                with self._renew_lock:
                    item.finishing = True
        except PermanentError as exc:
            self._finish(item, "fail", _describe(exc))
        except LeaseLostError:
            event(log, logging.WARNING, "handler_lease_lost", job_id=job.id, task_key=job.task_key,
                  attempt=lease.attempt, worker=lease.owner)
        except Exception as exc:  # a handler's failure is the job's failure, never the worker's
            if lease.attempt >= job.max_attempts:
                self._finish(item, "fail", _describe(exc))
            else:
                base = spec.retry_base_seconds if spec else 1.0
                cap = spec.retry_cap_seconds if spec else 3600.0
                self._finish(item, "retry", _describe(exc), retry_delay(lease.attempt, base, cap))
        else:
            item.duration = time.monotonic() - started
            self._completions.put(item)
            self._free_slot_early(item)
            return True
        return False

    def _complete_loop(self) -> None:
        """Completes finished jobs in batches: whatever finished while the previous batch was
        being written goes in the next one, so under load one COMMIT serves many jobs and when
        idle a job is completed at once."""
        while True:
            item = self._completions.get()
            if item is None:
                return
            batch = [item]
            while len(batch) < COMPLETE_BATCH:
                try:
                    more = self._completions.get_nowait()
                except queue_mod.Empty:
                    break
                if more is None:
                    self._completions.put(None)
                    break
                batch.append(more)
            try:
                self._complete(batch)
            finally:
                self._release_slots(batch)

    def _complete(self, batch: list[_InHand]) -> None:
        outcomes = self._write_with_retries("complete", batch, lambda conn: repository.complete_many(
            conn, [i.claimed.lease for i in batch]))
        if outcomes is None:
            return
        for item in batch:
            job, lease = item.claimed.job, item.claimed.lease
            if outcomes[job.id] is Outcome.OK:
                metrics.COMPLETED.labels(queue=job.queue).inc()
                event(log, logging.INFO, "complete", job_id=job.id, task_key=job.task_key, attempt=lease.attempt,
                      worker=lease.owner, seconds=f"{item.duration:.3f}")

    def _retrying(self, operation: str, write, *, retry_if=lambda exc: True, give_up=lambda: False):
        """`write(conn)`, with database errors that `retry_if` accepts retried (doubling pauses,
        0.2 s to 2 s) for up to finish_retry_seconds or until `give_up()`; then the last error is
        raised. A job's last writes wait out a restart instead of losing work to a blip."""
        deadline = time.monotonic() + self.config.finish_retry_seconds
        pause = 0.2
        while True:
            try:
                with self.engine.connect() as conn:
                    return write(conn)
            except DB_ERRORS as exc:
                if not retry_if(exc) or time.monotonic() > deadline or give_up():
                    raise
                self._sql_error(operation, exc)
                time.sleep(pause)
                pause = min(pause * 2, 2.0)

    def _write_with_retries(self, operation: str, items: list[_InHand], write):
        """A finishing write; if the database stays away, the jobs are given up and their leases
        left to expire (the reaper hands them on)."""
        try:
            return self._retrying(operation, write, give_up=lambda: all(i.lost.is_set() for i in items))
        except DB_ERRORS as exc:
            self._sql_error(operation, exc)
            for item in items:
                event(log, logging.ERROR, "finish_abandoned", job_id=item.claimed.job.id,
                      task_key=item.claimed.job.task_key, attempt=item.claimed.lease.attempt,
                      worker=item.claimed.lease.owner, operation=operation)
            return None

    def _finish(self, item: _InHand, operation: str, error: str | None, delay: float = 0.0) -> None:
        """retry or fail one job under its lease."""
        job, lease = item.claimed.job, item.claimed.lease
        if operation == "retry":
            outcome = self._write_with_retries(operation, [item], lambda conn: repository.retry(
                conn, lease, error or "", delay))
        else:
            outcome = self._write_with_retries(operation, [item], lambda conn: repository.fail(conn, lease, error or ""))
        if outcome is None or outcome is Outcome.LEASE_LOST:
            return  # abandoned, or lost (logged and counted by the repository)
        if operation == "retry":
            metrics.RETRIED.labels(queue=job.queue).inc()
            event(log, logging.WARNING, "retry", job_id=job.id, task_key=job.task_key, attempt=lease.attempt,
                  max_attempts=job.max_attempts, worker=lease.owner, delay=f"{delay:.2f}", error=_first_line(error))
        else:
            metrics.FAILED.labels(queue=job.queue).inc()
            event(log, logging.ERROR, "fail", job_id=job.id, task_key=job.task_key, attempt=lease.attempt,
                  max_attempts=job.max_attempts, worker=lease.owner, error=_first_line(error))

    def _record_result(self, lease: Lease, task_key: str, result: object) -> bool:
        """ctx.record_result(): the handler's work is done, so a lost connection or a database
        restart is waited out (as for a completion) rather than failing the attempt. Retrying is
        safe: the write is fenced by the lease and keyed by task_key. Errors that are not about
        reaching the database (a result it refuses) reach the handler at once."""
        return self._retrying("record_result", lambda conn: repository.record_result(conn, lease, task_key, result),
                              retry_if=_reachability)

    # --- leases ----------------------------------------------------------------------------------

    def _renew_loop(self) -> None:
        renew_every = self.config.lease_seconds / 3
        beat_every = self.config.heartbeat_seconds
        next_renew = next_beat = time.monotonic()
        while not self._stop.wait(max(0.05, min(next_renew, next_beat) - time.monotonic())):
            now = time.monotonic()
            if now >= next_renew:
                next_renew = now + renew_every
                self.renew_now()
            if now >= next_beat:
                next_beat = now + beat_every
                try:
                    self.heartbeat()
                except DB_ERRORS as exc:
                    self._sql_error("heartbeat", exc)

    def _register(self) -> None:
        self._stats_sent = metrics.stat_totals()
        try:
            with self.engine.connect() as conn:
                repository.register_process(
                    conn, process_id=self.id, host=socket.gethostname(), pid=os.getpid(), kind=self.config.kind,
                    concurrency=self.config.concurrency,
                    queues=",".join(self.config.queues) if self.config.queues else "*")
        except DB_ERRORS as exc:
            self._sql_error("heartbeat", exc)

    def heartbeat(self) -> None:
        """Tell the dashboard this process is alive, and flush its activity counts."""
        totals = metrics.stat_totals()
        sent = getattr(self, "_stats_sent", {})
        deltas = {k: v - sent.get(k, 0) for k, v in totals.items()}
        minute = datetime.now(timezone.utc).replace(tzinfo=None, second=0, microsecond=0)
        with self._slots:
            in_hand = len(self._in_hand)
        with self.engine.connect() as conn:
            repository.heartbeat(conn, self.id, jobs_in_hand=in_hand, processed=self.processed, minute=minute,
                                 stats=deltas)
        self._stats_sent = totals

    def renew_now(self) -> None:
        with self._renew_lock:
            with self._slots:
                items = [i for i in self._in_hand.values() if not i.lost.is_set() and not i.finishing]
            if not items:
                return
            try:
                with self.engine.connect() as conn:
                    outcomes = repository.renew_leases(conn, [i.claimed.lease for i in items],
                                                       self.config.lease_seconds)
            except DB_ERRORS as exc:
                self._sql_error("renew", exc)
                return
        for item in items:
            if outcomes.get(item.claimed.job.id) is Outcome.LEASE_LOST:
                item.lost.set()

    def in_hand(self) -> list[ClaimedJob]:
        with self._slots:
            return [i.claimed for i in self._in_hand.values()]


def _reachability(exc: BaseException) -> bool:
    """A lost connection, a deadlock or a lock-wait timeout: worth waiting out."""
    return isinstance(exc, TransientDatabaseError) or (isinstance(exc, DBAPIError) and transient_kind(exc) is not None)


def _describe(exc: BaseException) -> str:
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__, limit=8))
    return f"{type(exc).__name__}: {exc}\n{tb}"


def _first_line(text: str | None) -> str | None:
    return text.splitlines()[0][:300] if text else None


class _IdleProbe:
    """The idle worker's read (repository.classify_statement) on a connection of its own in
    autocommit mode: one statement per idle turn, no COMMIT, no ROLLBACK. The SQL is compiled once
    with this worker's queues inlined. The connection is never returned to the pool (it would
    carry autocommit to the next user); it is dropped on any error and made anew next time."""

    def __init__(self, engine: Engine, queues: Sequence[str] | None):
        self.engine = engine
        self.sql = str(repository.classify_statement(queues).compile(
            dialect=engine.dialect, compile_kwargs={"literal_binds": True}))
        self._conn = None

    def read(self) -> EmptyClaimReport:
        if self._conn is None:
            self._conn = self.engine.raw_connection()
            self._conn.dbapi_connection.autocommit(True)
        try:
            cursor = self._conn.dbapi_connection.cursor()
            try:
                cursor.execute(self.sql)
                return repository.classify_row(cursor.fetchone())
            finally:
                cursor.close()
        except Exception:
            self.close()
            raise

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.invalidate()
