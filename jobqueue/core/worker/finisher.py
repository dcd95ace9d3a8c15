"""How an attempt ends: every write that finishes a job under its lease, and the lease slots those
writes free.

- returned: the slot thread hands the job over (`handler_succeeded`) and the claim loop completes
  it in its next cycle, one COMMIT with the next claim (`take_finished`, then `completed`);
- raised or timed out: `attempt_failed` schedules the retry (backoff) or fails the job;
- the handler's `ctx.transaction()`: its writes and the fenced completion commit together
  (`handler_transaction`); `ctx.record_result()`, or a return value other than None, writes
  its result under the lease, before the completion;
- never started, or on shutdown: `release` puts the job back to `ready`, its attempts kept;
- waited in hand: `confirm_start` checks in the database that it may still start.

A job's last write waits out a restart or a failover (FINISH) instead of losing finished work to
a blip; its lease is renewed meanwhile. Once a lease needs no more writes and its handler is not
running, `forget` frees its slot for the next claim.
"""

from __future__ import annotations

import collections
import json
import logging
import queue as queue_mod
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import DBAPIError

from .. import metrics, repository, retry, service, tracing, wakeup
from ..backoff import retry_delay
from ..errors import LeaseLostError
from ..logs import event, events
from ..models import Outcome
from ..tasks import Registry
from .config import WorkerConfig
from .leases import Held, Key, LeaseKeeper, LeaseState
from .slots import first_line
from .state import DB_ERRORS, WorkerState, reachability

log = logging.getLogger("jobqueue.worker")

T = TypeVar("T")
FINISH = retry.RetryPolicy(first_delay=0.2, max_delay=2.0)
BUSY_RETRY_SECONDS = 0.1


class Finisher:
    def __init__(
        self,
        engine: Engine,
        config: WorkerConfig,
        keeper: LeaseKeeper,
        registry: Registry,
        state: WorkerState,
        wake: wakeup.Wake,
    ):
        self.engine = engine
        self.config = config
        self.keeper = keeper
        self.registry = registry
        self.state = state
        self.processed = 0
        self._wake = wake
        self._lock = threading.Lock()
        self._free: set[int] = set(range(1, config.capacity + 1))  # lease slots
        self._finished: queue_mod.SimpleQueue[Held] = queue_mod.SimpleQueue()
        # The claim loop waits for the other jobs in hand to return (Claimer._gather_for): a
        # returning handler wakes it only when it was the last.
        self.gathering = False
        self._policy = retry.RetryPolicy(
            seconds=config.finish_retry_seconds, first_delay=FINISH.first_delay, max_delay=FINISH.max_delay
        )

    # --- lease slots -----------------------------------------------------------------------------

    def free_slots(self) -> list[int]:
        with self._lock:
            return sorted(self._free)

    def take_slot(self, slot: int) -> None:
        with self._lock:
            self._free.discard(slot)

    def forget(self, held: Held) -> None:
        """A lease that needs no more writes (lost, or its final write made) and whose handler
        is not running: free its slot. Idempotent."""
        if held.run is not None and held.lost_reason != "timeout":  # a timeout's write ends it (finish_attempt)
            held.run.end("lease_lost")  # unless its outcome ended it already
        if not self.keeper.drop(held):
            return
        with self._lock:
            self._free.add(held.slot)
        if held.started_at is not None:  # a job that never ran is not processed: it runs elsewhere, or later
            self.processed += 1
        self._wake.set()

    # --- returned handlers, completed by the claim loop ------------------------------------------

    def _outcome(self, held: Held, outcome: str) -> None:
        """The attempt's outcome was written: its span ends, its completion is timed (tracing.py)."""
        if held.run is not None:
            held.run.end(outcome)
        if held.returned_at is not None:
            tracing.completed(self.keeper.clock() - held.returned_at, held.claimed.job.queue, outcome)

    def handler_succeeded(self, held: Held) -> None:
        """A slot's handler returned: the next cycle completes the job (its lease still renewed)."""
        self._finished.put(held)
        if not self.gathering or self._finished.qsize() >= len(self.keeper):
            self._wake.set()

    @property
    def pending(self) -> bool:
        """Handlers returned whose completion is not written yet."""
        return not self._finished.empty()

    @property
    def pending_count(self) -> int:
        return self._finished.qsize()

    def take_finished(self) -> list[Held]:
        out = []
        while True:
            try:
                out.append(self._finished.get_nowait())
            except queue_mod.Empty:
                return out

    def give_back(self, finished: list[Held]) -> None:
        for held in finished:
            self._finished.put(held)

    def completed(self, outcomes: dict[Key, Outcome], finished: list[Held], *, wake: bool) -> None:
        """Account for the finished jobs a claim cycle completed (`outcomes`: how each write went),
        free their slots, and give back the ones it could not write yet. `wake`: wake the loop
        when a slot was freed."""
        freed = []
        done: collections.Counter[str] = collections.Counter()
        lines: list[dict[str, Any]] = []
        for held in finished:
            outcome = outcomes.get(held.key)
            job, lease = held.claimed.job, held.lease
            if outcome is Outcome.BUSY or outcome is None:
                self._finished.put(held)  # held elsewhere this instant: next cycle; still renewed
                continue
            self._outcome(held, "done" if outcome is Outcome.OK else "lease_lost")
            if outcome is Outcome.OK:
                done[job.queue] += 1
                metrics.labelled("ATTEMPT_SECONDS", job.task_name, "done").observe(held.duration)
                lines.append(
                    {
                        "job_id": job.id,
                        "task_key": job.task_key,
                        "attempt": lease.attempt,
                        "worker": lease.owner,
                        "seconds": f"{held.duration:.3f}",
                    }
                )
            else:
                metrics.labelled("ATTEMPT_SECONDS", job.task_name, "lease_lost").observe(held.duration)
            if self.keeper.drop(held):
                freed.append(held.slot)
                self.processed += 1
        for queue, n in done.items():
            metrics.labelled("COMPLETED", queue).inc(n)
        if wakeup.results_awaited():
            wakeup.finished([h.claimed.job.task_key for h in finished if outcomes.get(h.key) is Outcome.OK])
        events(log, logging.INFO, "complete", lines)
        with self._lock:
            self._free |= set(freed)
        if freed and wake:
            self._wake.set()

    # --- the slot threads' writes ----------------------------------------------------------------

    def confirm_start(self, held: Held) -> bool:
        """Before the handler of a job that waited in hand starts: one fenced write that renews its
        lease and reads its queue's state under a shared lock (service.start_lease). False
        when the handler must not start: taken back by an operator or reaped (the lease is lost),
        its queue paused (the job is released to `ready`, its attempts kept), or its lease lost
        here meanwhile (the deadline passed while the database could not be reached, a shutdown)."""
        lease, queue = held.lease, held.claimed.job.queue
        while not held.lost:
            sent_at = time.monotonic()
            try:
                with self.keeper.writing([held]):
                    with self.engine.connect() as conn:
                        outcome = service.start_lease(conn, lease, queue, self.config.lease_seconds)
            except DB_ERRORS as exc:
                if reachability(exc) is None:
                    raise
                self.state.sql_error("start", exc)
                time.sleep(FINISH.first_delay)  # the lease's deadline (the renewer's clock) says when to give up
                continue
            if outcome is Outcome.OK:
                self.keeper.end_renewal([held], sent_at, {lease: outcome})
                return True
            if outcome is Outcome.PAUSED:
                why = "its queue was paused before its handler started"
                self.release_unstarted(held, "paused", why, why)
                return False
            if outcome is Outcome.LEASE_LOST:
                self.keeper.lose(held, "start", "taken back before its handler started")
                return False
            time.sleep(BUSY_RETRY_SECONDS)  # BUSY: its row is held by another transaction this instant
        return False

    def attempt_failed(self, held: Held, error: str, *, permanent: bool = False, outcome: str | None = None) -> None:
        """The handler raised (or, `outcome="timeout"`, ran past its task's timeout): retry after
        the task's backoff, or fail the job on its last attempt or a permanent error."""
        job, lease = held.claimed.job, held.lease
        if permanent or lease.attempt >= job.max_attempts:
            self.finish_attempt(held, "fail", error, outcome=outcome)
            return
        spec = self.registry.get(job.task_name)
        delay = retry_delay(
            lease.attempt, spec.retry_base_seconds if spec else 1.0, spec.retry_cap_seconds if spec else 3600.0
        )
        self.finish_attempt(held, "retry", error, delay, outcome=outcome)

    def finish_attempt(
        self, held: Held, operation: str, error: str | None, delay: float = 0.0, outcome: str | None = None
    ) -> None:
        """retry or fail one job under its lease (from the slot thread whose handler raised, or
        the renewer for a timed-out attempt), renewing it while the write is retried. `outcome`
        names the attempt in its history when it is not the operation's (say, `timeout`)."""
        job, lease = held.claimed.job, held.lease
        label = outcome or operation
        if operation == "retry":
            result = self._final_write(
                label, [held], lambda conn: service.retry(conn, lease, error or "", delay, outcome=label)
            )
        else:
            result = self._final_write(
                label, [held], lambda conn: service.fail(conn, lease, error or "", outcome=label)
            )
        metrics.ATTEMPT_SECONDS.labels(task=job.task_name, outcome=label).observe(held.duration)
        self._outcome(
            held,
            "lease_lost" if result is not Outcome.OK else outcome or ("retry" if operation == "retry" else "failed"),
        )
        if result is Outcome.OK:
            if operation == "retry":
                metrics.RETRIED.labels(queue=job.queue).inc()
                event(
                    log,
                    logging.WARNING,
                    "retry",
                    job_id=job.id,
                    task_key=job.task_key,
                    attempt=lease.attempt,
                    max_attempts=job.max_attempts,
                    worker=lease.owner,
                    delay=f"{delay:.2f}",
                    seconds=f"{held.duration:.3f}",
                    outcome=outcome,
                    error=first_line(error),
                )
            else:
                metrics.FAILED.labels(queue=job.queue).inc()
                if wakeup.results_awaited():
                    wakeup.finished([job.task_key])
                event(
                    log,
                    logging.ERROR,
                    "fail",
                    job_id=job.id,
                    task_key=job.task_key,
                    attempt=lease.attempt,
                    max_attempts=job.max_attempts,
                    worker=lease.owner,
                    seconds=f"{held.duration:.3f}",
                    outcome=outcome,
                    error=first_line(error),
                )
        if held.handler_done:
            self.forget(held)  # a handler still running (timed out) is forgotten when it returns

    def release_unstarted(self, held: Held, lost_reason: str, detail: str, reason: str) -> None:
        """A job in hand whose handler has not started goes back to `ready` (release), unless a
        thread started it this instant (then it runs)."""
        if self.keeper.lose(held, lost_reason, detail, only_if=(LeaseState.WAITING,)):
            self.release(held, reason)

    def release(self, held: Held, reason: str = "worker shutting down") -> int:
        """running -> ready under the lease (attempts kept), renewed until it commits."""
        lease = held.lease
        outcome = self._final_write("release", [held], lambda conn: service.release(conn, lease, reason))
        if held.run is not None:
            held.run.end("released")
        if outcome is not None:
            metrics.RELEASED.inc()
            event(
                log,
                logging.WARNING,
                "released",
                job_id=lease.job_id,
                task_key=held.claimed.job.task_key,
                attempt=lease.attempt,
                worker=lease.owner,
                outcome=outcome.value,
            )
        if held.handler_done or held.started_at is None:
            self.forget(held)  # a handler still running is forgotten when it returns
        return 1 if outcome is Outcome.OK else 0

    def _final_write(self, operation: str, items: list[Held], write: Callable[[Any], T]) -> T | None:
        """A job's last write, retried while the database is away (FINISH policy) and given up
        when every lease in `items` is lost; renewals go on between the tries."""

        def once() -> T:
            while True:
                with self.keeper.writing(items):
                    with self.engine.connect() as conn:
                        result = write(conn)
                # BUSY: a row held by another transaction this instant (an operator's action, a
                # sweep): tried again, the lease renewed meanwhile, while it may still be ours.
                if result is not Outcome.BUSY or self.keeper.clock() >= max(h.deadline for h in items):
                    return result
                time.sleep(BUSY_RETRY_SECONDS)

        def on_retry(kind: str, attempt: int, delay: float, exc: BaseException) -> None:
            self.state.sql_error(operation, exc)

        try:
            # A lease given up by its local deadline or its task's timeout may still be valid in the
            # database: its last write is worth retrying. One the fence refused is gone.
            return retry.call(
                once,
                self._policy,
                reachability,
                on_retry=on_retry,
                give_up=lambda: all(h.lost and h.lost_reason not in ("deadline", "timeout") for h in items),
            )
        except (retry.RetriesExhausted, *DB_ERRORS) as exc:
            self.state.sql_error(operation, getattr(exc, "last", exc))
            for held in items:
                event(
                    log,
                    logging.ERROR,
                    "finish_abandoned",
                    job_id=held.lease.job_id,
                    task_key=held.claimed.job.task_key,
                    attempt=held.lease.attempt,
                    worker=held.lease.owner,
                    operation=operation,
                )
            return None

    # --- the handler's own writes (its JobContext) -----------------------------------------------

    @contextmanager
    def handler_transaction(self, held: Held) -> Iterator[Connection]:
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
                    outcome = service.complete_with(conn, lease)
                    if outcome is not Outcome.OK:
                        tx.rollback()
                        self.keeper.lose(held, "complete", "the fence refused the completion: nothing committed")
                        raise LeaseLostError(
                            f"job {lease.job_id} attempt {lease.attempt}: lease lost; the transaction was rolled back"
                        )
                    tx.commit()
                except DBAPIError:
                    if not self._done_under(lease):  # a lost COMMIT reply: did it land?
                        raise
        held.completed_in_transaction = True

    def _done_under(self, lease) -> bool:
        try:
            with self.engine.connect() as conn:
                job = repository.reads.get_job(conn, lease.job_id)
        except DB_ERRORS:
            return False
        return (
            job is not None
            and job.status.value == "done"
            and (job.lease_owner, job.attempts) == (lease.owner, lease.attempt)
        )

    def completed_in_transaction(self, held: Held) -> None:
        """The handler's ctx.transaction() committed the completion: nothing left to write."""
        job, lease = held.claimed.job, held.lease
        metrics.COMPLETED.labels(queue=job.queue).inc()
        metrics.ATTEMPT_SECONDS.labels(task=job.task_name, outcome="done").observe(held.duration)
        self._outcome(held, "done")
        event(
            log,
            logging.INFO,
            "complete",
            job_id=job.id,
            task_key=job.task_key,
            attempt=lease.attempt,
            worker=lease.owner,
            seconds=f"{held.duration:.3f}",
            transaction=True,
        )
        if wakeup.results_awaited():
            wakeup.finished([job.task_key])
        self.forget(held)

    def record_result(self, held: Held, result: object) -> bool:
        """ctx.record_result(), and a handler's return value other than None: the handler's work
        is done, so a lost connection or a database restart is waited out (as for a completion)
        rather than failing the attempt. Retrying is safe: the write is fenced by the lease and
        keyed by task_key. Errors that are not about reaching the database (a result it refuses,
        one that is not JSON) reach the handler at once."""
        lease, task_key = held.lease, held.claimed.job.task_key
        try:
            json.dumps(result)
        except (TypeError, ValueError) as exc:
            raise TypeError(f"the result of {task_key!r} is not JSON-serialisable: {exc}") from None
        held.result_recorded = True

        def once() -> bool:
            with self.engine.connect() as conn:
                return service.record_result(conn, lease, task_key, result)

        try:
            return retry.call(
                once,
                self._policy,
                reachability,
                on_retry=lambda kind, n, delay, exc: self.state.sql_error("record_result", exc),
            )
        except retry.RetriesExhausted as exc:
            raise exc.last from None
