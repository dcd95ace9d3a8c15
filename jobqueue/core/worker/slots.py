"""The threads that run handlers. Each takes a leased job from the inbox, runs its handler after
the claim committed (never inside it), and says how the attempt ended:

- before it starts: a job that waited in hand for a thread (prefetched) longer than
  CONFIRM_AFTER_SECONDS is confirmed in the database first (Finisher.confirm_start: one fenced
  write that renews its lease and share-locks its queue's row), because an operator may have
  cancelled, failed or requeued it, or paused its queue, while it waited; the worker would only
  hear of it at the next renewal. Taken back: its handler never starts; its queue paused: it is
  released to `ready` with its attempts kept. Past its local lease deadline it never starts
  either. A job handed to a free thread at once is not confirmed: it waited no longer than the
  claim's own round trip;

- it returned: a value other than None is recorded as the job's result first (as by
  ctx.record_result, unless this attempt recorded one; one that is not JSON fails the attempt as
  a raised error would); then the lease goes to FINISHING and the job to the claim loop, which completes it in
  its next cycle (one COMMIT with the next claim); the thread takes the next job at once;
- it raised: the thread itself schedules the retry (backoff) or fails the job, under the lease;
- its lease was lost meanwhile (reaped, requeued, failed or cancelled by an operator, timed out,
  or the local deadline passed): nothing is written; the lease is forgotten once the handler
  returns.
"""

from __future__ import annotations

import logging
import queue as queue_mod
import threading
import time
import traceback
from typing import TYPE_CHECKING

from .. import metrics
from ..errors import LeaseLostError, PermanentError
from ..logs import event
from ..tasks import Registry
from .leases import Held, LeaseKeeper

if TYPE_CHECKING:
    from .finisher import Finisher

log = logging.getLogger("jobqueue.worker")

# A job that waited in hand longer than this before its thread took it is confirmed in the
# database before its handler starts (one fenced write). Shorter waits are those of a job handed
# to a busy thread that freed up within about a claim's round trip.
CONFIRM_AFTER_SECONDS = 0.05
DURATION_WEIGHT = 0.2  # how much the last handler's time moves the running average


class Slots:
    def __init__(self, finisher: Finisher, keeper: LeaseKeeper, registry: Registry, worker_id: str, threads: int):
        self.finisher = finisher
        self.keeper = keeper
        self.registry = registry
        self.worker_id = worker_id
        self.average_seconds: float | None = None  # running average of a thread's time per job
        self.inbox: queue_mod.SimpleQueue[Held | None] = queue_mod.SimpleQueue()
        self.threads = [
            threading.Thread(target=self._run, name=f"jobqueue-slot-{i + 1}", daemon=True) for i in range(threads)
        ]
        self._idle = threads
        self._lock = threading.Lock()

    def start(self) -> None:
        for t in self.threads:
            t.start()

    def stop(self) -> None:
        for _ in self.threads:
            self.inbox.put(None)

    def give(self, held: Held) -> None:
        self.inbox.put(held)

    @property
    def idle(self) -> int:
        """Threads waiting for a job (an estimate: it changes as you read it)."""
        with self._lock:
            return self._idle

    def _run(self) -> None:
        while True:
            held = self.inbox.get()
            if held is None:
                return
            with self._lock:
                self._idle -= 1
            started = time.monotonic()
            try:
                self.run_attempt(held)
            except Exception as exc:  # never lose a thread to a bug of ours
                event(
                    log,
                    logging.ERROR,
                    "slot_error",
                    job_id=held.lease.job_id,
                    attempt=held.lease.attempt,
                    error=f"{type(exc).__name__}: {exc}",
                )
                self.finisher.forget(held)
            finally:
                self._took(time.monotonic() - started)
                with self._lock:
                    self._idle += 1

    def _took(self, seconds: float) -> None:
        """A thread was busy `seconds` with one job (its handler and any write of its own)."""
        average = self.average_seconds
        self.average_seconds = seconds if average is None else average + DURATION_WEIGHT * (seconds - average)

    def run_attempt(self, held: Held) -> None:
        finisher, keeper = self.finisher, self.keeper
        job, lease = held.claimed.job, held.claimed.lease
        if not self._may_start(held):
            # Lost while it waited for a thread (an operator took it, its queue was paused, it was
            # reaped, its local deadline passed): the handler never starts.
            finisher.forget(held)
            return
        spec = self.registry.get(job.task_name)
        started = time.monotonic()
        try:
            if spec is None:
                raise LookupError(f"no handler for task {job.task_name!r} in worker {self.worker_id}")
            returned = spec.handler(job.payload, held.ctx)
            if returned is not None and not held.result_recorded and not held.completed_in_transaction:
                finisher.record_result(held, returned)  # as ctx.record_result(returned) would
        except Exception as exc:
            if held.completed_in_transaction:
                # Its ctx.transaction() committed: the job is done, whatever came after.
                event(
                    log,
                    logging.WARNING,
                    "handler_error_after_completion",
                    job_id=job.id,
                    task_key=job.task_key,
                    attempt=lease.attempt,
                    worker=lease.owner,
                    error=first_line(describe(exc)),
                )
                held.duration = time.monotonic() - started
                keeper.finishing(held)
                finisher.completed_in_transaction(held)
                return
            self._failed(held, exc, started)
            return
        held.duration = time.monotonic() - started
        if held.completed_in_transaction:
            keeper.finishing(held)
            finisher.completed_in_transaction(held)
            return
        # A lease lost only by its local deadline (renewals failed; nobody said it is gone) may
        # still be completed: the write is fenced, and lands only if nobody took the job.
        if keeper.finishing(held) or held.lost_reason == "deadline":
            finisher.handler_succeeded(held)
        else:
            self._ended(held, "lease_lost", started)
            event(
                log,
                logging.WARNING,
                "handler_finished_after_lease_lost",
                job_id=job.id,
                task_key=job.task_key,
                attempt=lease.attempt,
                worker=lease.owner,
                reason=held.lost_reason,
                seconds=f"{held.duration:.3f}",
            )
            finisher.forget(held)

    def _may_start(self, held: Held) -> bool:
        if self.keeper.clock() - held.claimed_at >= CONFIRM_AFTER_SECONDS and not self.finisher.confirm_start(held):
            return False
        return self.keeper.start(held)

    def _failed(self, held: Held, exc: Exception, started: float) -> None:
        """The handler raised: how the attempt ends."""
        job, lease = held.claimed.job, held.lease
        if isinstance(exc, LeaseLostError):
            self._ended(held, "lease_lost", started)
            event(
                log,
                logging.WARNING,
                "handler_lease_lost",
                job_id=job.id,
                task_key=job.task_key,
                attempt=lease.attempt,
                worker=lease.owner,
                seconds=f"{time.monotonic() - started:.3f}",
            )
            self.finisher.forget(held)
        elif self._still_held(held, started):  # a handler's failure is the job's failure, never the worker's
            self.finisher.attempt_failed(held, describe(exc), permanent=isinstance(exc, PermanentError))

    def _still_held(self, held: Held, started: float) -> bool:
        held.duration = time.monotonic() - started
        if self.keeper.finishing(held) or held.lost_reason == "deadline":
            return True
        self._ended(held, "lease_lost", started)
        self.finisher.forget(held)
        return False

    @staticmethod
    def _ended(held: Held, outcome: str, started: float) -> None:
        metrics.ATTEMPT_SECONDS.labels(task=held.claimed.job.task_name, outcome=outcome).observe(
            time.monotonic() - started
        )


def describe(exc: BaseException) -> str:
    """The attempt's error: its first line names the exception's class as the traceback's last
    line does (module-qualified unless a builtin), since only the head survives truncation and a
    Django TaskError needs the class path."""
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__, limit=8))
    return f"{class_path(type(exc))}: {exc}\n{tb}"


def class_path(cls: type) -> str:
    module = cls.__module__
    return cls.__qualname__ if module in ("builtins", "__main__") else f"{module}.{cls.__qualname__}"


def first_line(text: str | None) -> str | None:
    return text.splitlines()[0][:300] if text else None
