"""The worker: claim, run after the commit, renew the lease, complete under the fence.

One worker process holds up to `concurrency + prefetch` leases ("lease slots") and runs
`concurrency` handler threads. Its loop reads like this:

    while not stopping:
        maintenance()            # promote due retries/delayed jobs, reap expired leases, enqueue
                                 # due recurring runs, start a retention pass when one is due
        one cycle, one transaction: complete the jobs whose handlers returned since the last
            cycle, and claim a job for every free lease slot (the completed ones included)
        hand each claimed job to a thread (slots.py); a thread whose handler raised schedules
            the retry or fails the job itself
        nothing claimed? the same transaction said why (idle / contended / waiting on leases):
            back off accordingly, reading before claiming while idle

Two writable candidate primaries (a failover that left the old one writable): the engine keeps
every connection on the candidate it chose (db.py), and while a look at all of them finds two
writable the loop claims nothing and does no maintenance; the jobs in hand still renew and
complete on the chosen server. The state says so (`split_brain`) until one is read-only again.

Paused queues: a worker on every queue claims from the queues with ready jobs that are not
paused (read at most every second); a worker with a list of queues leaves out the paused ones
(the paused set read at most every second). The claim transaction itself reads its queues'
state under a shared lock and leaves out paused ones (repository/claim.py), and a job that
waited in hand is confirmed before its handler starts (slots.py): once a pause has answered, no
claim of that queue commits and no handler of it starts; jobs already running finish normally.

The renewer thread (renewer.py) renews every lease in hand every third of the lease, until its
final write has committed, loses leases whose local deadline passed (leases.py), and sends the
process heartbeat. On SIGTERM the loop stops claiming, prefetched jobs that never started go
back to `ready`, running jobs get `grace_seconds` to finish (their completions still written,
their leases still renewed), and whatever still runs is released back to `ready` with its
attempt count kept.
"""

from __future__ import annotations

import collections
import logging
import os
import queue as queue_mod
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar

import pymysql
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import DBAPIError, SQLAlchemyError

from .. import metrics, preflight, repository, retry, wakeup
from ..backoff import IdleBackoff
from ..db import is_mysql, is_not_primary, transient_kind, two_primaries, unwatch_primaries, watch_primaries
from ..errors import JobQueueError, LeaseLostError, NotPrimary, TransientDatabaseError, UnsupportedDatabase
from ..logs import RateLimited, event, events
from ..models import ClaimCycle, ClaimedJob, EmptyClaim, EmptyClaimReport, Outcome
from ..reaper import Reaper
from ..recurring import RecurringRunner
from ..retention import Pruner
from ..tasks import TASKS, JobContext, Registry
from .config import WorkerConfig
from .doorbell import Doorbell
from .leases import Held, LeaseKeeper, LeaseState
from .probe import IdleProbe
from .renewer import Renewer
from .slots import Slots, first_line

log = logging.getLogger("jobqueue.worker")

T = TypeVar("T")
DB_ERRORS = (DBAPIError, SQLAlchemyError, TransientDatabaseError, NotPrimary, pymysql.err.Error)
DOORBELL_AFTER_SECONDS = 0.2   # backoff sleeps this long or longer are spent listening for the doorbell
SWEEP_SECONDS = 60.0   # an idle worker's reaper sweep, besides the ones its reads trigger
NOT_PRIMARY_RETRY_SECONDS = 1.0
NOT_CLAIMING = ("not_primary", "split_brain", "database_unreachable")   # states in which a worker claims nothing
BUSY_RETRY_SECONDS = 0.1
# Automatic prefetch (the default): jobs are claimed ahead of a free thread only while handlers
# take less than this on average, so that a prefetched job waits about one short job for its
# thread, never behind a long one. Its point is that threads do not wait for the claim's round
# trips when jobs take about as long as those.
PREFETCH_WHILE_JOBS_UNDER_SECONDS = 0.1
DURATION_WEIGHT = 0.2   # how much the last handler's time moves the running average

# A job's last write (complete, retry, fail, release, record_result) waits out a restart or a
# failover instead of losing finished work to a blip; its lease is renewed meanwhile.
FINISH = retry.RetryPolicy(first_delay=0.2, max_delay=2.0)
# Before the first claim: wait for the database to answer, however long that takes.
START = retry.RetryPolicy(first_delay=0.5, max_delay=10.0)


def process_id(name: str | None = None) -> str:
    """host:pid, or host:pid:name, shortened so that a slot's id fits lease_owner (64 chars)."""
    host = socket.gethostname().split(".")[0][:30]
    base = f"{host}:{os.getpid()}"
    return f"{base}:{name[:20]}" if name else base


def reachability(exc: BaseException) -> str | None:
    """A lost connection, a deadlock, a lock-wait timeout, a server that is not (or no longer) the
    primary: worth waiting out. Anything else (a result the database refuses) is not."""
    if isinstance(exc, TransientDatabaseError):
        return "transient"
    if is_not_primary(exc):
        return "not_primary"
    if isinstance(exc, DBAPIError):
        return transient_kind(exc)
    if isinstance(exc, pymysql.err.OperationalError):
        return "disconnect"
    return None


class Worker:
    def __init__(self, engine: Engine, config: WorkerConfig | None = None, *, registry: Registry = TASKS):
        self.engine = engine
        self.config = config or WorkerConfig()
        self.registry = registry
        self.id = process_id(self.config.name)
        self.keeper = LeaseKeeper(self.config.lease_seconds)
        self.reaper = Reaper(engine, name=self.id)
        self.recurring = RecurringRunner(engine, registry=registry, name=self.id)
        self.pruner = Pruner(engine, name=self.id, every_seconds=self.config.prune_every_seconds)
        self.slots = Slots(self, self.config.concurrency)
        self.renewer = Renewer(self)
        self._stop = threading.Event()
        self._wake = wakeup.subscribe()
        self._lock = threading.Lock()
        self._free: set[int] = set(range(1, self.config.capacity + 1))   # lease slots
        self._handler_seconds: float | None = None   # running average of handler durations
        self._finished: queue_mod.SimpleQueue[Held] = queue_mod.SimpleQueue()
        self._backoff = IdleBackoff(cap=self.config.idle_cap_seconds)
        self._idle_log = RateLimited(60.0)
        self._error_log = RateLimited(5.0)
        self._last_reap = self._queues_at = 0.0
        self._probe_first = False   # after an idle empty claim: read first, claim only if worth it
        self._busy = False          # claimed since the last sweep
        self._probe = IdleProbe(engine, self.config.queues) if is_mysql(engine) else None
        # A burst worker exits when idle: nobody needs to ring it.
        self._doorbell = (Doorbell(engine, self.config.queues, self._wake, self._stop, name=self.id)
                          if is_mysql(engine) and self.config.doorbell and not self.config.burst else None)
        self._known_queues: list[str] = list(self.config.queues or [])
        self._rotation = 0
        self._queue_label = ",".join(self.config.queues) if self.config.queues else "*"
        self._started = False
        self.processed = 0
        self.last_empty: EmptyClaimReport | None = None
        self.state = "starting"          # claiming | not_primary | split_brain | database_unreachable | stopping | stopped
        self.state_detail: str | None = None

    def slot_id(self, slot: int) -> str:
        return f"{self.id}:{slot}"

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
            self._set_state("refused", str(exc))
            event(log, logging.ERROR, "worker_refused", worker=self.id, reason=str(exc))
            return 3
        if self._stop.is_set():
            return 0
        self.start_threads()
        event(log, logging.INFO, "worker_started", worker=self.id, concurrency=self.config.concurrency,
              prefetch="auto" if self.config.prefetch is None else self.config.prefetch or None,
              queues=self._queue_label,
              lease_seconds=self.config.lease_seconds, burst=self.config.burst)
        try:
            while not self._stop.is_set():
                delay = self.run_once()
                if delay is None:
                    break
                if delay > BUSY_RETRY_SECONDS and not self._finished.empty():
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
        self.slots.start()
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
            self._set_state("not_primary" if kind == "not_primary" else "database_unreachable", str(exc)[:300])
            self._sql_error("preflight", exc)

        retry.call(check, START, lambda exc: None if isinstance(exc, UnsupportedDatabase) and not
                   isinstance(exc, NotPrimary) else reachability(exc),
                   on_retry=waiting, sleep=self._stop.wait)

    # --- the loop --------------------------------------------------------------------------------

    def run_once(self) -> float | None:
        """One turn of the loop. Returns seconds to sleep before the next turn, or None when a
        burst worker has nothing left to do."""
        if self._stop.is_set():
            return None
        split = two_primaries(self.engine)
        if split is not None:
            self._complete_finished()   # on the chosen server, where these jobs were claimed
            self._split_brain(split)
            return NOT_PRIMARY_RETRY_SECONDS
        self._maintenance()
        finished = self._take_finished()
        free, refill = self._fillable(finished)
        if not free and not finished:
            return 0.05   # every lease slot we may fill is taken; a finishing handler wakes us
        if self._probe_first and not finished:
            # Idle: one plain read says whether a claim could find anything, so an idle worker
            # sends about one statement per turn instead of a claim transaction.
            report = self._probe_read()
            if report is None:
                return self._backoff.next(None) if self.state != "not_primary" else NOT_PRIMARY_RETRY_SECONDS
            if not self._act_on(report):
                return self._settle(report, probe=True)
        try:
            cycle = self._cycle(free, finished, refill=refill)
        except DB_ERRORS as exc:
            self._give_back(finished)
            if is_not_primary(exc):
                self._not_primary("claim", exc)
                return NOT_PRIMARY_RETRY_SECONDS
            self._set_state("database_unreachable", str(exc)[:300])
            self._sql_error("claim", exc)
            return self._backoff.next(None)
        self._set_state("claiming", None)
        if cycle.claimed:
            if self._doorbell is not None:
                self._doorbell.busy()
            self._probe_first = False
            self._busy = True
            self._backoff.reset()
            self._idle_log.reset()
            return 0
        if cycle.asked == 0:
            return 0.05 if not self._fillable([])[0] else 0
        report = cycle.report
        if report is None:
            return self._backoff.next(None)
        if self._act_on(report):
            return 0
        return self._settle(report)

    def _cycle(self, free: Sequence[int], finished: list[Held], *, refill: bool = True) -> ClaimCycle:
        """One transaction: complete `finished`, claim for the free slots and (with `refill`) the
        slots the completions free."""
        owners = [self.slot_id(s) for s in free]
        with self.keeper.writing(finished):
            sent_at = time.monotonic()
            with self.engine.connect() as conn:
                refreshed = self._refresh_queues(conn)
                cycle = repository.claim_cycle(conn, owners, self._rotated(), lease_seconds=self.config.lease_seconds,
                                               completions=[h.lease for h in finished],
                                               classify_queues=self.config.queues, refill=refill)
                if refill and not cycle.claimed and cycle.asked and not refreshed and self.config.queues is None \
                        and self._refresh_queues(conn, force=True):
                    # The cached list of queues with ready jobs was stale: try the fresh one
                    # before calling this an empty claim.
                    slots = self._slots_after(cycle, finished, free)
                    if slots:
                        again = repository.claim_cycle(conn, [self.slot_id(s) for s in slots], self._rotated(),
                                                       lease_seconds=self.config.lease_seconds,
                                                       classify_queues=self.config.queues)
                        cycle = ClaimCycle(again.claimed, cycle.completed, cycle.losses, again.skipped,
                                           cycle.queues + again.queues, again.asked, again.report)
        metrics.CLAIM_SECONDS.observe(time.monotonic() - sent_at)
        self._settle_completions(cycle, finished, free)
        for item in cycle.claimed:
            self._dispatch(item, sent_at)
        return cycle

    def _slots_after(self, cycle: ClaimCycle, finished: list[Held], free: Sequence[int]) -> list[int]:
        done = [h.slot for h in finished if cycle.completed.get(h.key) is not Outcome.BUSY]
        return sorted(set(free) | set(done))

    def _settle_completions(self, cycle: ClaimCycle, finished: list[Held], free: Sequence[int]) -> None:
        """Account for the finished jobs the cycle completed, and the slots the claim took."""
        taken = {int(item.lease.owner.rsplit(":", 1)[1]) for item in cycle.claimed}
        freed = []
        completed: collections.Counter[str] = collections.Counter()
        lines: list[dict[str, Any]] = []
        for held in finished:
            outcome = cycle.completed.get(held.key)
            job, lease = held.claimed.job, held.lease
            if outcome is Outcome.BUSY or outcome is None:
                self._finished.put(held)   # held elsewhere this instant: next cycle; still renewed
                continue
            freed.append(held.slot)
            if outcome is Outcome.OK:
                completed[job.queue] += 1
                metrics.labelled("ATTEMPT_SECONDS", job.task_name, "done").observe(held.duration)
                lines.append({"job_id": job.id, "task_key": job.task_key, "attempt": lease.attempt,
                              "worker": lease.owner, "seconds": f"{held.duration:.3f}"})
            else:
                metrics.labelled("ATTEMPT_SECONDS", job.task_name, "lease_lost").observe(held.duration)
            if not self.keeper.drop(held):
                freed.pop()
                continue
            self.processed += 1
        for queue, n in completed.items():
            metrics.labelled("COMPLETED", queue).inc(n)
        events(log, logging.INFO, "complete", lines)
        with self._lock:
            self._free = (self._free | set(freed)) - taken
        if freed and cycle.asked == 0:
            self._wake.set()

    def _dispatch(self, claimed: ClaimedJob, sent_at: float) -> None:
        slot = int(claimed.lease.owner.rsplit(":", 1)[1])
        job, lease = claimed.job, claimed.lease
        spec = self.registry.get(job.task_name)
        ctx = JobContext(job_id=job.id, task_key=job.task_key, task_name=job.task_name, queue=job.queue,
                         attempt=lease.attempt, max_attempts=job.max_attempts, worker_id=lease.owner,
                         _record_result=lambda result: self._record_result(held, result),
                         _transaction=lambda: self._handler_transaction(held))
        held = self.keeper.hold(claimed, slot, ctx, sent_at=sent_at,
                                timeout=getattr(spec, "timeout_seconds", None) if spec else None)
        with self._lock:
            self._free.discard(slot)
        if claimed.start_delay is not None:
            metrics.labelled("START_DELAY_SECONDS", job.queue).observe(claimed.start_delay)
        event(log, logging.DEBUG, "claim", job_id=job.id, task_key=job.task_key, task=job.task_name,
              queue=job.queue, attempt=lease.attempt, worker=lease.owner)
        self.slots.give(held)

    def _probe_read(self) -> EmptyClaimReport | None:
        try:
            if self._probe is not None:
                report = self._probe.read()   # it reads the read-only flags too
            else:
                with self.engine.connect() as conn:
                    report = repository.classify_empty(conn, self.config.queues)
            self._set_state("claiming", None)
            return report
        except DB_ERRORS as exc:
            if is_not_primary(exc):
                self._not_primary("probe", exc)
            else:
                self._set_state("database_unreachable", str(exc)[:300])
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

    def _settle(self, report: EmptyClaimReport, probe: bool = False) -> float | None:
        """Log an empty turn (and count it, when it was a claim, not a probe), then say how long
        to sleep (None: a burst worker is done)."""
        self.last_empty = report
        self._probe_first = report.kind is not EmptyClaim.CONTENDED
        # A probe is not a claim: counted apart, so that empty claims count real claims only.
        (metrics.PROBES if probe else metrics.EMPTY_CLAIMS).labels(kind=report.kind.value, queues=self._queue_label).inc()
        suppressed = self._idle_log.allow(report.kind)
        if suppressed is not None:
            event(log, logging.INFO, report.kind.value, worker=self.id, skipped=report.skipped or None,
                  next_lease_expiry=report.next_lease_expiry, next_scheduled=report.next_scheduled,
                  repeats=suppressed or None)
        if self.config.burst and report.kind not in (EmptyClaim.CONTENDED, EmptyClaim.LIMITED):
            if not len(self.keeper):
                return None
            return 0.05
        return self._backoff.next(report)

    def _refresh_queues(self, conn, force: bool = False) -> bool:
        """The queues to claim from, read at most every second: for a worker on every queue, the
        queues with ready jobs that are not paused (a loose index scan); for a worker with a list
        of queues, that list without the paused ones. True when the list was read now (with
        `force`: and changed)."""
        if not force and time.monotonic() - self._queues_at <= self.config.queue_refresh_seconds:
            return False
        before = self._known_queues
        if self.config.queues is None:
            self._known_queues = repository.ready_queues(conn)
        else:
            paused = repository.paused_queues(conn)
            self._known_queues = [q for q in self.config.queues if q not in paused]
        self._queues_at = time.monotonic()
        return not force or self._known_queues != before

    def _rotated(self) -> list[str]:
        """The queues to claim from, rotated each turn so that no queue starves the others."""
        queues = self._known_queues
        if len(queues) > 1:
            self._rotation = (self._rotation + 1) % len(queues)
            queues = queues[self._rotation:] + queues[:self._rotation]
        return queues

    def _maintenance(self) -> None:
        """The reaper's sweep (expired leases back to ready, due retries promoted): every
        reap_interval while this worker has been busy, at least every SWEEP_SECONDS when idle.
        An idle worker's read also triggers it as soon as it sees an expiry or a due job."""
        if not self.config.reap_in_loop:
            return
        self._schedules()
        since = time.monotonic() - self._last_reap
        if (self._busy and since >= self.config.reap_interval) or since >= SWEEP_SECONDS:
            self._busy = False
            if self._reap() + self._promote():
                self._queues_at = 0.0

    def _schedules(self) -> None:
        """Recurring runs that are due (cheap unless one is), and a retention pass in the
        background when no process has started one lately."""
        try:
            if self.recurring.tick():
                self._queues_at = 0.0
        except DB_ERRORS as exc:
            self._sql_error("recurring", exc)
        self.pruner.maybe_start()

    def _reap(self) -> int:
        self._last_reap = time.monotonic()
        # A job whose handler returned here and whose final write waits (its row held by a stray
        # transaction kept it from renewing too) is not re-run by our own reaper: the write lands
        # once the row is free. (tests/integration/test_leases.py, the held-row test.)
        pending = [(h.lease.job_id, h.lease.attempt) for h in self.keeper.held() if h.handler_done]
        try:
            result = self.reaper.reap(keep=pending)
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
        """Sleep up to `seconds`, less if a job is enqueued in this process or a handler
        finishes, or another process rings the doorbell. True when woken early."""
        if self._doorbell is not None and seconds >= DOORBELL_AFTER_SECONDS:
            self._doorbell.idle()
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

    # --- what the threads hand back --------------------------------------------------------------

    def _take_finished(self) -> list[Held]:
        out = []
        while True:
            try:
                out.append(self._finished.get_nowait())
            except queue_mod.Empty:
                return out

    def _give_back(self, finished: list[Held]) -> None:
        for held in finished:
            self._finished.put(held)

    def _free_slots(self) -> list[int]:
        with self._lock:
            return sorted(self._free)

    def _fillable(self, finished: list[Held]) -> tuple[list[int], bool]:
        """The free lease slots this cycle may fill, and whether the slots of `finished` take
        new work too: every thread's slot, plus prefetched ones up to the prefetch allowed now."""
        free = self._free_slots()
        allowed = self.config.concurrency + self.prefetch_now()
        room = allowed - (len(self.keeper) - len(finished))   # leases in hand once `finished` are done
        if room >= len(finished):
            return free[:room - len(finished)], True
        return free[:max(0, room)], False

    def prefetch_now(self) -> int:
        """Jobs to hold beyond one per thread: the configured number, or (automatic) up to one per
        thread while handlers are short on average, none while they are long or not yet seen."""
        if self.config.prefetch is not None:
            return self.config.prefetch
        average = self._handler_seconds
        return self.config.concurrency if average is not None and average < PREFETCH_WHILE_JOBS_UNDER_SECONDS else 0

    def handler_took(self, seconds: float) -> None:
        """A slot thread was busy `seconds` with one job (its handler and any write of its own)."""
        average = self._handler_seconds
        self._handler_seconds = seconds if average is None else average + DURATION_WEIGHT * (seconds - average)

    def handler_succeeded(self, held: Held) -> None:
        """A slot's handler returned: the next cycle completes the job (its lease still renewed)."""
        self._finished.put(held)
        self._wake.set()

    def forget(self, held: Held) -> None:
        """A lease that needs no more writes (lost, or its final write made) and whose handler
        is not running: free its slot. Idempotent."""
        if not self.keeper.drop(held):
            return
        with self._lock:
            self._free.add(held.slot)
        self.processed += 1
        self._wake.set()

    def confirm_start(self, held: Held) -> bool:
        """Before the handler of a job that waited in hand starts: one fenced write that renews its
        lease and reads its queue's state under a shared lock (repository.start_lease). False
        when the handler must not start: taken back by an operator or reaped (the lease is lost),
        its queue paused (the job is released to `ready`, its attempts kept), or its lease lost
        here meanwhile (the deadline passed while the database could not be reached, a shutdown)."""
        lease, queue = held.lease, held.claimed.job.queue
        while not held.lost:
            sent_at = time.monotonic()
            try:
                with self.keeper.writing([held]):
                    with self.engine.connect() as conn:
                        outcome = repository.start_lease(conn, lease, queue, self.config.lease_seconds)
            except DB_ERRORS as exc:
                if reachability(exc) is None:
                    raise
                self._sql_error("start", exc)
                time.sleep(FINISH.first_delay)   # the lease's deadline (the renewer's clock) says when to give up
                continue
            if outcome is Outcome.OK:
                self.keeper.end_renewal([held], sent_at, {lease: outcome})
                return True
            if outcome is Outcome.PAUSED:
                if self.keeper.lose(held, "paused", "its queue was paused before its handler started",
                                    only_if=(LeaseState.WAITING,)):
                    self._release(held, "its queue was paused before its handler started")
                return False
            if outcome is Outcome.LEASE_LOST:
                self.keeper.lose(held, "start", "taken back before its handler started")
                return False
            time.sleep(BUSY_RETRY_SECONDS)   # BUSY: its row is held by another transaction this instant
        return False

    def finish_attempt(self, held: Held, operation: str, error: str | None, delay: float = 0.0,
                       outcome: str | None = None) -> None:
        """retry or fail one job under its lease (from the slot thread whose handler raised, or
        the renewer for a timed-out attempt), renewing it while the write is retried. `outcome`
        names the attempt in its history when it is not the operation's (say, `timeout`)."""
        job, lease = held.claimed.job, held.lease
        label = outcome or operation
        if operation == "retry":
            result = self._final_write(label, [held], lambda conn: repository.retry(conn, lease, error or "", delay,
                                                                                    outcome=label))
        else:
            result = self._final_write(label, [held], lambda conn: repository.fail(conn, lease, error or "",
                                                                                   outcome=label))
        metrics.ATTEMPT_SECONDS.labels(task=job.task_name, outcome=label).observe(held.duration)
        if result is Outcome.OK:
            if operation == "retry":
                metrics.RETRIED.labels(queue=job.queue).inc()
                event(log, logging.WARNING, "retry", job_id=job.id, task_key=job.task_key, attempt=lease.attempt,
                      max_attempts=job.max_attempts, worker=lease.owner, delay=f"{delay:.2f}",
                      seconds=f"{held.duration:.3f}", outcome=outcome, error=first_line(error))
            else:
                metrics.FAILED.labels(queue=job.queue).inc()
                event(log, logging.ERROR, "fail", job_id=job.id, task_key=job.task_key, attempt=lease.attempt,
                      max_attempts=job.max_attempts, worker=lease.owner, seconds=f"{held.duration:.3f}",
                      outcome=outcome, error=first_line(error))
        if held.handler_done:
            self.forget(held)   # a handler still running (timed out) is forgotten when it returns

    def _final_write(self, operation: str, items: list[Held], write: Callable[[Any], T]) -> T | None:
        """A job's last write, retried while the database is away (FINISH policy) and given up
        when every lease in `items` is lost; renewals go on between the tries."""
        def once() -> T:
            with self.keeper.writing(items):
                with self.engine.connect() as conn:
                    return write(conn)

        def on_retry(kind: str, attempt: int, delay: float, exc: BaseException) -> None:
            self._sql_error(operation, exc)

        policy = retry.RetryPolicy(seconds=self.config.finish_retry_seconds, first_delay=FINISH.first_delay,
                                   max_delay=FINISH.max_delay)
        try:
            # A lease given up by its local deadline or its task's timeout may still be valid in the
            # database: its last write is worth retrying. One the fence refused is gone.
            return retry.call(once, policy, reachability, on_retry=on_retry,
                              give_up=lambda: all(h.lost and h.lost_reason not in ("deadline", "timeout")
                                                  for h in items))
        except (retry.RetriesExhausted, *DB_ERRORS) as exc:
            self._sql_error(operation, getattr(exc, "last", exc))
            for held in items:
                event(log, logging.ERROR, "finish_abandoned", job_id=held.lease.job_id,
                      task_key=held.claimed.job.task_key, attempt=held.lease.attempt, worker=held.lease.owner,
                      operation=operation)
            return None

    @contextmanager
    def _handler_transaction(self, held: Held) -> Iterator[Connection]:
        """ctx.transaction(): the handler's writes and this attempt's fenced completion in one
        transaction. A lost lease rolls everything back (LeaseLostError); so does an error in
        the block (the attempt is then retried as usual)."""
        lease = held.lease
        with self.engine.connect() as conn:
            tx = conn.begin()
            try:
                yield conn
            except BaseException:
                tx.rollback()
                raise
            with self.keeper.writing([held]):
                try:
                    outcome = repository.complete_with(conn, lease)
                    if outcome is not Outcome.OK:
                        tx.rollback()
                        self.keeper.lose(held, "complete", "the fence refused the completion: nothing committed")
                        raise LeaseLostError(f"job {lease.job_id} attempt {lease.attempt}: lease lost; the "
                                             "transaction was rolled back")
                    tx.commit()
                except DBAPIError:
                    if not self._done_under(lease):   # a lost COMMIT reply: did it land?
                        raise
        held.completed_in_transaction = True

    def _done_under(self, lease) -> bool:
        try:
            with self.engine.connect() as conn:
                job = repository.get_job(conn, lease.job_id)
        except DB_ERRORS:
            return False
        return job is not None and job.status.value == "done" and (job.lease_owner, job.attempts) == (
            lease.owner, lease.attempt)

    def completed_in_transaction(self, held: Held) -> None:
        """The handler's ctx.transaction() committed the completion: nothing left to write."""
        job, lease = held.claimed.job, held.lease
        metrics.COMPLETED.labels(queue=job.queue).inc()
        metrics.ATTEMPT_SECONDS.labels(task=job.task_name, outcome="done").observe(held.duration)
        event(log, logging.INFO, "complete", job_id=job.id, task_key=job.task_key, attempt=lease.attempt,
              worker=lease.owner, seconds=f"{held.duration:.3f}", transaction=True)
        self.forget(held)

    def _record_result(self, held: Held, result: object) -> bool:
        """ctx.record_result(): the handler's work is done, so a lost connection or a database
        restart is waited out (as for a completion) rather than failing the attempt. Retrying is
        safe: the write is fenced by the lease and keyed by task_key. Errors that are not about
        reaching the database (a result it refuses) reach the handler at once."""
        lease, task_key = held.lease, held.claimed.job.task_key

        def once() -> bool:
            with self.engine.connect() as conn:
                return repository.record_result(conn, lease, task_key, result)

        policy = retry.RetryPolicy(seconds=self.config.finish_retry_seconds, first_delay=FINISH.first_delay,
                                   max_delay=FINISH.max_delay)
        try:
            return retry.call(once, policy, reachability,
                              on_retry=lambda kind, n, delay, exc: self._sql_error("record_result", exc))
        except retry.RetriesExhausted as exc:
            raise exc.last from None

    # --- shutdown ------------------------------------------------------------------------------

    def shutdown(self) -> None:
        """Stop claiming; release prefetched jobs; give running jobs the grace period (their
        completions written, their leases renewed); release what still runs; then stop."""
        self._stop.set()
        self._set_state("stopping", None)
        if not self._started:
            return
        for held in self.keeper.held(LeaseState.WAITING):
            if self.keeper.lose(held, "shutdown", "released before it started", only_if=(LeaseState.WAITING,)):
                self._release(held)
        deadline = time.monotonic() + self.config.grace_seconds
        while time.monotonic() < deadline and self.keeper.held(LeaseState.RUNNING, LeaseState.FINISHING):
            self._complete_finished()
            self._wake.wait(0.05)
            self._wake.clear()
        released = 0
        for held in self.keeper.held(LeaseState.RUNNING):
            if self.keeper.lose(held, "shutdown", "released on shutdown", only_if=(LeaseState.RUNNING,)):
                released += self._release(held)
        # Completions still pending (a handler returned at the last moment, or the database is
        # away): keep trying while their leases last.
        last_call = time.monotonic() + self.config.finish_retry_seconds
        while self.keeper.held(LeaseState.FINISHING) and time.monotonic() < last_call:
            self._complete_finished()
            if self.keeper.held(LeaseState.FINISHING):
                self._wake.wait(0.2)
                self._wake.clear()
        self.slots.stop()
        self.renewer.stop()
        self.pruner.stop()
        if self._doorbell is not None:
            self._doorbell.hang_up()
        if self._probe is not None:
            self._probe.close()
        unwatch_primaries(self.engine)
        try:
            self.heartbeat()
            with self.engine.connect() as conn:
                repository.mark_stopped(conn, self.id)
        except DB_ERRORS as exc:
            self._sql_error("heartbeat", exc)
        self._set_state("stopped", None)
        event(log, logging.INFO, "worker_stopped", worker=self.id, processed=self.processed, released=released)

    def _complete_finished(self) -> None:
        finished = self._take_finished()
        if not finished:
            return
        try:
            self._cycle([], finished, refill=False)
        except DB_ERRORS as exc:
            self._give_back(finished)
            self._sql_error("complete", exc)

    def _release(self, held: Held, reason: str = "worker shutting down") -> int:
        """running -> ready under the lease (attempts kept), renewed until it commits."""
        lease = held.lease
        outcome = self._final_write("release", [held], lambda conn: repository.release(conn, lease, reason))
        if outcome is not None:
            metrics.RELEASED.inc()
            event(log, logging.WARNING, "released", job_id=lease.job_id, task_key=held.claimed.job.task_key,
                  attempt=lease.attempt, worker=lease.owner, outcome=outcome.value)
        if held.handler_done or held.started_at is None:
            self.forget(held)   # a handler still running is forgotten when it returns
        return 1 if outcome is Outcome.OK else 0

    # --- reporting -----------------------------------------------------------------------------

    def _set_state(self, state: str, detail: str | None) -> None:
        if state == self.state and detail == self.state_detail:
            return
        before, self.state, self.state_detail = self.state, state, detail
        if state == "claiming" and before in NOT_CLAIMING:
            event(log, logging.WARNING, "claiming_resumed", worker=self.id, after=before)
        if state != before and (state in NOT_CLAIMING or before in NOT_CLAIMING):
            self.renewer.beat_soon()   # the dashboard and /api/health show it now, not at the next beat

    def _split_brain(self, detail: str) -> None:
        first = self.state != "split_brain"
        self._set_state("split_brain", detail)
        allowed = self._error_log.allow(("split_brain", "claim")) is not None
        if first or allowed:
            event(log, logging.ERROR, "split_brain", worker=self.id, detail=detail)

    def _not_primary(self, operation: str, exc: BaseException) -> None:
        metrics.NOT_PRIMARY.labels(operation=operation).inc()
        first = self.state != "not_primary"
        self._set_state("not_primary", str(exc)[:300])
        if first or self._error_log.allow(("not_primary", operation)) is not None:
            event(log, logging.ERROR, "not_primary", worker=self.id, operation=operation,
                  detail="claiming paused: the server is not a writable primary; resuming when one answers",
                  error=str(getattr(exc, "orig", None) or exc)[:300])

    def _sql_error(self, operation: str, exc: BaseException) -> None:
        metrics.SQL_ERRORS.labels(operation=operation).inc()
        # Every error is counted; during an outage the log gets one line per operation every
        # few seconds, with how many were held back.
        suppressed = self._error_log.allow(operation)
        if suppressed is not None:
            event(log, logging.ERROR, "sql_error", worker=self.id, operation=operation,
                  error=f"{type(exc).__name__}: {str(getattr(exc, 'orig', None) or exc)[:300]}",
                  repeats=suppressed or None)

    def _register(self) -> None:
        self._stats_sent = metrics.stat_totals()
        try:
            with self.engine.connect() as conn:
                repository.register_process(
                    conn, process_id=self.id, host=socket.gethostname(), pid=os.getpid(), kind=self.config.kind,
                    concurrency=self.config.concurrency, queues=self._queue_label, tasks=self.registry.specs())
        except DB_ERRORS as exc:
            self._sql_error("heartbeat", exc)

    def status(self) -> dict[str, Any]:
        """What this process is doing, for its heartbeat, the workers page and /api/health."""
        return {"state": self.state, "detail": self.state_detail, "slots": self.keeper.snapshot()}

    def heartbeat(self) -> None:
        """Tell the dashboard this process is alive and what it holds, and flush its activity
        counts."""
        totals = metrics.stat_totals()
        sent = getattr(self, "_stats_sent", {})
        deltas = {k: v - sent.get(k, 0) for k, v in totals.items()}
        with self.engine.connect() as conn:
            known = repository.heartbeat(conn, self.id, jobs_in_hand=len(self.keeper), processed=self.processed,
                                         stats=deltas, state=self.status())
        self._stats_sent = totals
        if not known:
            self._register()
            self.renewer.beat_soon()

    def renew_now(self) -> None:
        self.renewer.renew()

    def in_hand(self) -> list[ClaimedJob]:
        return [h.claimed for h in self.keeper.held()]


__all__ = ["DB_ERRORS", "JobQueueError", "Worker", "WorkerConfig", "process_id"]
