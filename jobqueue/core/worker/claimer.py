"""The claim cycle: one transaction completes the jobs whose handlers returned since the last
cycle and claims a job for every lease slot it may fill; each claimed job goes to a thread.

Which slots it may fill: one per thread, plus prefetched ones. By default (automatic prefetch)
jobs are claimed ahead of a free thread only while jobs are typically short: one per thread
while they take milliseconds, more while they take microseconds (auto_prefetch), so that the last
job in hand waits a few milliseconds at most. When the jobs turn long, the jobs in hand that would
wait behind them go back to `ready` (_hand_back_when_long).

Nothing claimed? The same transaction said why (idle / contended / waiting on leases), and the
claimer backs off accordingly; while idle it reads first (probe.py) and claims only when the read
finds work, and that read also triggers the reaper and promotes due jobs (maintenance.py).

Paused queues: a worker on every queue claims from the queues with ready jobs that are not
paused (read at most every second); a worker with a list of queues leaves out the paused ones
(the paused set read at most every second). The claim transaction itself reads its queues'
state under a shared lock and leaves out paused ones (repository/claim.py).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

from sqlalchemy.engine import Engine

from .. import metrics, repository, service, tracing
from ..backoff import IdleBackoff
from ..db import is_mysql, is_not_primary
from ..logs import RateLimited, event
from ..models import ClaimCycle, ClaimedJob, EmptyClaim, EmptyClaimReport, Outcome
from ..tasks import JobContext, Registry
from .config import WorkerConfig
from .doorbell import Doorbell
from .finisher import Finisher
from .leases import Held, LeaseKeeper, LeaseState
from .maintenance import Maintenance
from .probe import IdleProbe
from .slots import CONFIRM_AFTER_SECONDS, Slots
from .state import DB_ERRORS, WorkerState

log = logging.getLogger("jobqueue.worker")

NOT_PRIMARY_RETRY_SECONDS = 1.0
# Automatic prefetch: claim ahead of a free thread only while jobs typically take less than
# this; its point is that threads do not wait for the claim's round trips when jobs take
# about as long as those.
PREFETCH_WHILE_JOBS_UNDER_SECONDS = 0.1
# ... and while they are much shorter, take so many ahead that the last of them would wait about
# this long in hand were the jobs before it run one after another (auto_prefetch).
HAND_WAIT_SECONDS = 0.005
# While every thread still has a prefetched job to start, a cycle may wait this long for more
# handlers to return, so that one COMMIT completes several jobs rather than one or two.
GATHER_SECONDS = 0.002


def auto_prefetch(concurrency: int, most: int, typical: float | None) -> int:
    """Jobs to claim ahead of a free thread, by a job's typical time (Slots.typical_seconds):
    none before one has finished or while they are long; one per thread while they take
    milliseconds; more, up to `most`, while they take less, so that a cycle's round trips are
    shared by more jobs (each cycle takes about what finished since the last), yet the last job
    in hand waits about HAND_WAIT_SECONDS at most for the jobs before it."""
    if typical is None or typical >= PREFETCH_WHILE_JOBS_UNDER_SECONDS:
        return 0
    deep = int(HAND_WAIT_SECONDS / typical) if typical > 0 else most
    return min(most, max(concurrency, deep))


class Claimer:
    def __init__(
        self,
        engine: Engine,
        config: WorkerConfig,
        worker_id: str,
        *,
        keeper: LeaseKeeper,
        finisher: Finisher,
        slots: Slots,
        maintenance: Maintenance,
        state: WorkerState,
        registry: Registry,
        doorbell: Doorbell | None,
    ):
        self.engine = engine
        self.config = config
        self.worker_id = worker_id
        self.keeper = keeper
        self.finisher = finisher
        self.slots = slots
        self.maintenance = maintenance
        self.state = state
        self.registry = registry
        self.doorbell = doorbell
        self.owners = {s: f"{worker_id}:{s}" for s in range(1, config.capacity + 1)}  # lease slot -> lease_owner
        self._slot_of = {owner: s for s, owner in self.owners.items()}
        self.queue_label = ",".join(config.queues) if config.queues else "*"
        self.last_empty: EmptyClaimReport | None = None
        self._backoff = IdleBackoff(cap=config.idle_cap_seconds)
        self._idle_log = RateLimited(60.0)
        self._probe = IdleProbe(engine, config.queues) if is_mysql(engine) else None
        self._probe_first = False  # after an idle empty claim: read first, claim only if worth it
        self._known_queues: list[str] = list(config.queues or [])
        self._queues_at = 0.0
        self._rotation = 0
        self._gather_since: float | None = None

    def turn(self) -> float | None:
        """Complete what finished and claim what fits. Returns seconds to sleep before the next
        turn, or None when a burst worker has nothing left to do."""
        gather = self._gather_for()
        if gather:
            return gather
        self._hand_back_when_long()
        finished = self.finisher.take_finished()
        free, refill = self.fillable(finished)
        if not free and not finished:
            return 0.05  # every lease slot we may fill is taken; a finishing handler wakes us
        if self._probe_first and not finished:
            # Idle: one plain read says whether a claim could find anything, so an idle worker
            # sends about one statement per turn instead of a claim transaction.
            report = self._probe_read()
            if report is None:
                return self._backoff.next(None) if self.state.name != "not_primary" else NOT_PRIMARY_RETRY_SECONDS
            if not self._act_on(report):
                return self._back_off(report, probe=True)
        try:
            cycle = self.cycle(free, finished, refill=refill)
        except DB_ERRORS as exc:
            self.finisher.give_back(finished)
            if is_not_primary(exc):
                self.state.not_primary("claim", exc)
                return NOT_PRIMARY_RETRY_SECONDS
            self.state.set("database_unreachable", str(exc)[:300])
            self.state.sql_error("claim", exc)
            return self._backoff.next(None)
        self.state.set("claiming", None)
        if cycle.claimed:
            if self.doorbell is not None:
                self.doorbell.busy()
            self._probe_first = False
            self.maintenance.claimed()
            self._backoff.reset()
            self._idle_log.reset()
            return 0
        if cycle.asked == 0:
            return 0.05 if not self.fillable([])[0] else 0
        report = cycle.report
        if report is None:
            return self._backoff.next(None)
        if self._act_on(report):
            return 0
        return self._back_off(report)

    def _gather_for(self) -> float:
        """Seconds to wait for more handlers to return before this cycle (0: go now).

        A cycle runs as soon as one handler returns. A handler that never lets go of the GIL
        (a no-op) returns with all the others before this thread runs again, and one COMMIT
        completes them all; one that does any I/O (appends a line to a file) lets this thread run
        in between, and cycles completed one or two jobs each: twice the COMMITs a job, 0.6x the
        throughput. So while other jobs in hand are still running, wait for them, at most
        GATHER_SECONDS, and only when nobody waits on this cycle: every thread still has a job
        queued behind it, or handlers are so short that the wait is about one of them."""
        pending = self.finisher.pending_count
        left = 0.0
        if pending and pending < len(self.keeper) and (self.slots.queued or self._typically_under(GATHER_SECONDS)):
            now = time.monotonic()
            if self._gather_since is None:
                self._gather_since = now
            left = max(0.0, self._gather_since + GATHER_SECONDS - now)
        if not left:
            self._gather_since = None
        # While it waits, only the handler returning last wakes it (else the wait's end): a
        # wake-up for each one was a switch of threads a job for any handler that lets go of the GIL.
        self.finisher.gathering = bool(left)
        return left

    def complete_finished(self) -> None:
        """Complete what finished, claim nothing (split brain, shutdown)."""
        finished = self.finisher.take_finished()
        if not finished:
            return
        try:
            self.cycle([], finished, refill=False)
        except DB_ERRORS as exc:
            self.finisher.give_back(finished)
            self.state.sql_error("complete", exc)

    def cycle(self, free: Sequence[int], finished: list[Held], *, refill: bool = True) -> ClaimCycle:
        """One transaction: complete `finished`, claim for the free slots and (with `refill`) the
        slots the completions free."""
        with self.keeper.writing(finished):
            sent_at = time.monotonic()
            with self.engine.connect() as conn:
                refreshed = self._refresh_queues(conn)
                cycle = service.claim_cycle(
                    conn,
                    [self.owners[s] for s in free],
                    self._rotated(),
                    lease_seconds=self.config.lease_seconds,
                    completions=[h.lease for h in finished],
                    classify_queues=self.config.queues,
                    refill=refill,
                )
                if (
                    refill
                    and not cycle.claimed
                    and cycle.asked
                    and not refreshed
                    and self.config.queues is None
                    and self._refresh_queues(conn, force=True)
                ):
                    # The cached list of queues with ready jobs was stale: try the fresh one
                    # before calling this an empty claim.
                    slots = self._slots_after(cycle, finished, free)
                    if slots:
                        again = service.claim_cycle(
                            conn,
                            [self.owners[s] for s in slots],
                            self._rotated(),
                            lease_seconds=self.config.lease_seconds,
                            classify_queues=self.config.queues,
                        )
                        cycle = ClaimCycle(
                            again.claimed,
                            cycle.completed,
                            cycle.losses,
                            again.skipped,
                            cycle.queues + again.queues,
                            again.asked,
                            again.report,
                        )
        claim_seconds = time.monotonic() - sent_at
        metrics.CLAIM_SECONDS.observe(claim_seconds)
        tracing.claimed(claim_seconds, self.queue_label)
        self.finisher.completed(cycle.completed, finished, wake=cycle.asked == 0)
        contexts = self._trace_contexts(cycle.claimed)
        for item in cycle.claimed:
            self._dispatch(item, self._slot_of[item.lease.owner], sent_at, contexts.get(item.job.id))
        return cycle

    def _trace_contexts(self, claimed: list[ClaimedJob]) -> dict[int, str]:
        """While tracing is on, the claimed jobs' stored trace contexts: one read by primary key
        after the claim committed, so that the claim is the same statement with tracing off. A
        failed read costs the jobs their parent span, never their run."""
        if not claimed or not tracing.enabled():
            return {}
        try:
            with self.engine.connect() as conn:
                return repository.reads.trace_contexts(conn, [item.job.id for item in claimed])
        except DB_ERRORS as exc:
            self.state.sql_error("trace_contexts", exc)
            return {}

    @staticmethod
    def _slots_after(cycle: ClaimCycle, finished: list[Held], free: Sequence[int]) -> list[int]:
        done = [h.slot for h in finished if cycle.completed.get(h.key) is not Outcome.BUSY]
        return sorted(set(free) | set(done))

    def _dispatch(self, claimed: ClaimedJob, slot: int, sent_at: float, trace_context: str | None = None) -> None:
        job, lease = claimed.job, claimed.lease
        spec = self.registry.get(job.task_name)
        finisher = self.finisher
        ctx = JobContext(
            job_id=job.id,
            task_key=job.task_key,
            task_name=job.task_name,
            queue=job.queue,
            attempt=lease.attempt,
            max_attempts=job.max_attempts,
            worker_id=lease.owner,
            _record_result=lambda result: finisher.record_result(held, result),
            _transaction=lambda: finisher.handler_transaction(held),
        )
        held = self.keeper.hold(
            claimed, slot, ctx, sent_at=sent_at, timeout=getattr(spec, "timeout_seconds", None) if spec else None
        )
        held.trace_context = trace_context
        finisher.take_slot(slot)
        if claimed.start_delay is not None:
            metrics.labelled("START_DELAY_SECONDS", job.queue).observe(claimed.start_delay)
        event(
            log,
            logging.DEBUG,
            "claim",
            job_id=job.id,
            task_key=job.task_key,
            task=job.task_name,
            queue=job.queue,
            attempt=lease.attempt,
            worker=lease.owner,
        )
        self.slots.give(held)

    def fillable(self, finished: list[Held]) -> tuple[list[int], bool]:
        """The free lease slots this cycle may fill, and whether the slots of `finished` take
        new work too: every thread's slot, plus prefetched ones up to the prefetch allowed now."""
        free = self.finisher.free_slots()
        allowed = self.config.concurrency + self.prefetch_now()
        room = allowed - (len(self.keeper) - len(finished))  # leases in hand once `finished` are done
        if room >= len(finished):
            return free[: room - len(finished)], True
        return free[: max(0, room)], False

    def _typically_under(self, seconds: float) -> bool:
        typical = self.slots.typical_seconds
        return typical is not None and typical < seconds

    def prefetch_now(self) -> int:
        """Jobs to hold beyond one per thread: the configured number, or automatic
        (auto_prefetch)."""
        if self.config.prefetch is not None:
            return self.config.prefetch
        return auto_prefetch(self.config.concurrency, self.config.max_prefetch, self.slots.typical_seconds)

    def _hand_back_when_long(self) -> None:
        """Jobs turned long after a deep claim: a job in hand that has waited CONFIRM_AFTER_SECONDS
        (ten times the wait deep prefetch allows for) and lies beyond one per free thread and
        `keep` more goes back to `ready`, attempts kept, for any worker with a free thread. `keep`:
        as many as one thread runs in CONFIRM_AFTER_SECONDS at the typical time now, one per
        thread at least (what was held ahead before deep prefetch). While jobs stay about as short
        as when they were claimed, none waits that long; after a moment when every thread was
        slow, all have, yet they go back only if those ahead of them would hold them that long
        again: jobs a little slower than before (a busy machine) are not long."""
        threads = self.config.concurrency
        if self.config.prefetch is not None or len(self.keeper) <= 2 * threads:
            return  # nothing in hand beyond one per thread and `keep` (one per thread at least)
        typical = self.slots.typical_seconds  # a sort under a lock: read only when it may matter
        keep = threads if typical is None else max(threads, int(CONFIRM_AFTER_SECONDS / max(typical, 1e-9)))
        if len(self.keeper) - threads <= keep:
            return
        places = threads - len(self.keeper.held(LeaseState.RUNNING))
        now = self.keeper.clock()
        for held in self.keeper.held(LeaseState.WAITING)[max(0, places) + keep :]:
            if now - held.claimed_at < CONFIRM_AFTER_SECONDS:
                continue
            self.finisher.release_unstarted(
                held,
                "handed_back",
                "its jobs turned long",
                "handed back before it started: its worker's jobs turned long",
            )

    # --- empty claims ----------------------------------------------------------------------------

    def _probe_read(self) -> EmptyClaimReport | None:
        try:
            if self._probe is not None:
                report = self._probe.read()  # it reads the read-only flags too
            else:
                with self.engine.connect() as conn:
                    report = repository.claim.classify_empty(conn, self.config.queues)
            self.state.set("claiming", None)
            return report
        except DB_ERRORS as exc:
            if is_not_primary(exc):
                self.state.not_primary("probe", exc)
            else:
                self.state.set("database_unreachable", str(exc)[:300])
                self.state.sql_error("classify", exc)
            return None

    def _act_on(self, report: EmptyClaimReport) -> bool:
        """Promote due retries and reap expired leases the read revealed. True when a claim is
        worth trying now."""
        acted = self.maintenance.after_read(report)
        if acted:
            self.queues_changed()
        return acted or (self._probe_first and report.kind is EmptyClaim.CONTENDED)

    def _back_off(self, report: EmptyClaimReport, probe: bool = False) -> float | None:
        """Log an empty turn (and count it, when it was a claim, not a probe), then say how long
        to sleep (None: a burst worker is done)."""
        self.last_empty = report
        self._probe_first = report.kind is not EmptyClaim.CONTENDED
        # A probe is not a claim: counted apart, so that empty claims count real claims only.
        (metrics.PROBES if probe else metrics.EMPTY_CLAIMS).labels(
            kind=report.kind.value, queues=self.queue_label
        ).inc()
        suppressed = self._idle_log.allow(report.kind)
        if suppressed is not None:
            event(
                log,
                logging.INFO,
                report.kind.value,
                worker=self.worker_id,
                skipped=report.skipped or None,
                next_lease_expiry=report.next_lease_expiry,
                next_scheduled=report.next_scheduled,
                repeats=suppressed or None,
            )
        if self.config.burst and report.kind not in (EmptyClaim.CONTENDED, EmptyClaim.LIMITED):
            if not len(self.keeper):
                return None
            return 0.05
        return self._backoff.next(report)

    def new_work(self) -> None:
        """Something was enqueued in this process, maybe into a queue we have not seen: claim now."""
        self.queues_changed()
        self._probe_first = False
        self._backoff.reset()

    # --- which queues ----------------------------------------------------------------------------

    def queues_changed(self) -> None:
        """Read the queues to claim from again at the next cycle."""
        self._queues_at = 0.0

    def _refresh_queues(self, conn, force: bool = False) -> bool:
        """The queues to claim from, read at most every second: for a worker on every queue, the
        queues with ready jobs that are not paused (a loose index scan); for a worker with a list
        of queues, that list without the paused ones. True when the list was read now (with
        `force`: and changed)."""
        if not force and time.monotonic() - self._queues_at <= self.config.queue_refresh_seconds:
            return False
        before = self._known_queues
        if self.config.queues is None:
            self._known_queues = repository.claim.ready_queues(conn)
        else:
            paused = repository.claim.paused_queues(conn)
            self._known_queues = [q for q in self.config.queues if q not in paused]
        self._queues_at = time.monotonic()
        return not force or self._known_queues != before

    def _rotated(self) -> list[str]:
        """The queues to claim from, rotated each turn so that no queue starves the others."""
        queues = self._known_queues
        if len(queues) > 1:
            self._rotation = (self._rotation + 1) % len(queues)
            queues = queues[self._rotation :] + queues[: self._rotation]
        return queues

    def close(self) -> None:
        if self._probe is not None:
            self._probe.close()
