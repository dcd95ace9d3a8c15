"""Where handlers run: a plain one on a thread that takes its leased job from the inbox, an
`async def` one on the worker's event loop (coroutines.py), at most `concurrency` of either kind
at once (Places). Each runs after the claim committed (never inside it), and says how the
attempt ended, the same way for both:

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

import asyncio
import collections
import logging
import threading
import time
import traceback
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from .. import metrics, tracing
from ..errors import LeaseLostError, PermanentError
from ..logs import event
from ..tasks import Registry
from .coroutines import EventLoop
from .leases import Held, LeaseKeeper

if TYPE_CHECKING:
    from .finisher import Finisher

log = logging.getLogger("jobqueue.worker")

# A job that waited in hand longer than this before its thread took it is confirmed in the
# database before its handler starts (one fenced write). Shorter waits are those of a job handed
# to a busy thread that freed up within about a claim's round trip.
CONFIRM_AFTER_SECONDS = 0.05
DURATION_WEIGHT = 0.2  # how much the last handler's time moves the lane's running average
# The lane: while handlers take less than LANE_WHILE_HANDLERS_UNDER_SECONDS on average (their own
# time, call to return) or none has run yet, the jobs in hand run one after another on one thread
# (the lane), and another thread takes a job only once it waited LATE_START_SECONDS for the lane
# (the lane's job turned slow, or the lane cannot keep up). Why: a handler that lets go of the GIL
# around its system calls (appending a line to a file: eight of them) hands it to whichever other
# slot thread has a job to run, and waits to get it back; four threads running such jobs at once
# cost the worker more CPU a job than one (docs/benchmarks.md, "A small handler's cost").
LANE_WHILE_HANDLERS_UNDER_SECONDS = 0.001
LATE_START_SECONDS = 0.001


class Places:
    """Handlers running at once, threads and coroutines alike: at most `concurrency`. A job held
    beyond that (prefetched) waits for a place, first come first served, whichever kind it is."""

    def __init__(self, places: int):
        self._free = places
        self._lock = threading.Lock()
        self._waiting: collections.deque[threading.Event | asyncio.Future[None]] = collections.deque()

    def take(self) -> None:
        with self._lock:
            if self._free and not self._waiting:
                self._free -= 1
                return
            turn = threading.Event()
            self._waiting.append(turn)
        turn.wait()

    async def take_async(self) -> None:
        with self._lock:
            if self._free and not self._waiting:
                self._free -= 1
                return
            turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._waiting.append(turn)
        try:
            await turn
        except asyncio.CancelledError:
            with self._lock:
                handed = turn not in self._waiting
                if not handed:
                    self._waiting.remove(turn)
            if handed:  # the place came as it was cancelled: pass it on
                self.give_back()
            raise

    def give_back(self) -> None:
        with self._lock:
            if not self._waiting:
                self._free += 1
                return
            turn = self._waiting.popleft()
        if isinstance(turn, threading.Event):
            turn.set()
        else:
            turn.get_loop().call_soon_threadsafe(_hand_over, turn)


def _hand_over(turn: asyncio.Future[None]) -> None:
    if not turn.done():  # a cancelled waiter gives the place back itself
        turn.set_result(None)


class Slots:
    """`concurrency` places to run a job. A plain handler runs on a thread of its own (threads are
    started as jobs need them, up to `concurrency`; while handlers are short, on the lane first:
    LANE_WHILE_HANDLERS_UNDER_SECONDS); an `async def` handler runs on the worker's event loop and
    takes no thread: the loop starts with the first one."""

    def __init__(self, finisher: Finisher, keeper: LeaseKeeper, registry: Registry, worker_id: str, threads: int):
        self.finisher = finisher
        self.keeper = keeper
        self.registry = registry
        self.worker_id = worker_id
        self.concurrency = threads
        self._recent: collections.deque[float] = collections.deque(maxlen=2 * threads + 1)  # places' times
        self.handler_seconds: float | None = None  # running average of a plain handler's own time
        self.places = Places(threads)
        self.threads: list[threading.Thread] = []
        self._inbox: collections.deque[tuple[float, Held]] = collections.deque()  # (when given, job)
        self._idle = 0  # threads waiting for a job
        self._lock = threading.Lock()
        self._lane_wake = threading.Condition(self._lock)  # the lane (the first thread) waits here
        self._lane_called = False  # woken for a job it has not taken yet
        # When the lane took the job it runs; None while it waits for one (or has not started).
        self._lane_since: float | None = None
        self._others_wake = threading.Condition(self._lock)  # every other thread waits here
        self._watching = 0  # other threads waiting for the inbox's first job to be late
        self._resting = 0  # other threads waiting for a job (not watching)
        # A thread woken to watch that has not run yet: the lane does not wake another meanwhile
        # (a no-op handler is done before the woken thread runs, and each job woke one more).
        self._watcher_called = False
        self._stopping = False
        self._loop = EventLoop()

    def stop(self, wait: float = 2.0) -> None:
        """The threads take what is left in the inbox (lost leases: each is forgotten), then end."""
        with self._lock:
            self._stopping = True
            self._lane_wake.notify_all()
            self._others_wake.notify_all()
        self._loop.stop(wait)

    @property
    def queued(self) -> int:
        """Jobs handed to the threads that no thread has taken yet."""
        return len(self._inbox)

    def give(self, held: Held) -> None:
        spec = self.registry.get(held.claimed.job.task_name)
        if spec is not None and spec.is_coroutine:
            held.coroutine = self._loop.submit(self._run_coroutine(held, spec.handler))
            return
        with self._lock:
            self._inbox.append((time.monotonic(), held))
            thread = None
            if len(self._inbox) > self._idle and len(self.threads) < self.concurrency:
                lane = not self.threads
                thread = threading.Thread(
                    target=self._run, args=(lane,), name=f"jobqueue-slot-{len(self.threads) + 1}", daemon=True
                )
                self.threads.append(thread)
            if self._lane_since is None and not self._lane_called:
                self._lane_called = True
                self._lane_wake.notify()
            elif not self._on_lane():
                self._others_wake.notify()  # to run it now
            elif self._lane_since is not None:
                self._call_watcher()  # to watch for the lane's job turning slow
        if thread is not None:
            thread.start()

    def _on_lane(self) -> bool:
        """Whether jobs wait for the lane now (the lock held)."""
        average = self.handler_seconds
        return not self._stopping and (average is None or average < LANE_WHILE_HANDLERS_UNDER_SECONDS)

    def _next(self, lane: bool) -> Held | None:
        """The next job for this thread; None once the slots stop and the inbox is empty."""
        with self._lock:
            self._idle += 1
            try:
                return self._lane_next() if lane else self._other_next()
            finally:
                self._idle -= 1

    def _lane_next(self) -> Held | None:
        self._lane_since = None
        while not self._inbox:
            if self._stopping:
                return None
            # Woken for a job another thread took first: no longer "called", or the next job given
            # would wait for a lane that nobody wakes.
            self._lane_called = False
            self._lane_wake.wait()
        self._lane_called = False
        self._lane_since = time.monotonic()
        if len(self._inbox) > 1:
            self._call_watcher()  # the jobs behind this one: watch for it turning slow
        return self._inbox.popleft()[1]

    def _call_watcher(self) -> None:
        """Wake another thread to watch the lane's job (the lock held), unless one watches or
        was woken to and has not run yet."""
        if self._resting and not self._watching and not self._watcher_called:
            self._watcher_called = True
            self._others_wake.notify()

    def _other_next(self) -> Held | None:
        while True:
            if self._inbox:
                late_at = self._inbox[0][0]
                if self._lane_since is not None:
                    late_at = max(late_at, self._lane_since)
                late_in = late_at + LATE_START_SECONDS - time.monotonic()
                if late_in <= 0 or not self._on_lane():
                    held = self._inbox.popleft()[1]
                    if self._inbox:
                        self._others_wake.notify()  # the next one needs a taker or a watcher
                    return held
                self._watching += 1
                self._others_wake.wait(late_in)
                self._watching -= 1
            elif self._stopping:
                return None
            else:
                self._resting += 1
                self._others_wake.wait()
                self._resting -= 1
            self._watcher_called = False  # a thread woke (by the call or not): it watches or takes

    def _run(self, lane: bool) -> None:
        while (held := self._next(lane)) is not None:
            self.places.take()
            try:
                self.run_attempt(held)
            except Exception as exc:  # never lose a thread to a bug of ours
                self._slot_error(held, exc)
            finally:
                self._took(held)
                if held.duration:  # it ran and ended (returned or raised)
                    self.handler_seconds = moved(self.handler_seconds, held.duration)
                self.places.give_back()

    async def _run_coroutine(self, held: Held, handler: Callable[..., Awaitable[Any]]) -> None:
        """run_attempt for an `async def` handler, on the event loop: the database writes go to a
        thread (asyncio.to_thread), so that the loop never waits for the database. Cancelled
        (timeout, shutdown): its lease is already lost, so the attempt only forgets it."""
        try:
            await self.places.take_async()
        except asyncio.CancelledError:
            self.finisher.forget(held)
            return
        started = time.monotonic()
        try:
            if (
                self._needs_confirm(held)
                and not await asyncio.to_thread(self.finisher.confirm_start, held)
                or not self.keeper.start(held)
            ):
                self.finisher.forget(held)
                return
            started = time.monotonic()
            run = held.run = tracing.start_run(held.claimed.job, held.lease, held.trace_context)
            try:
                with tracing.active(run):
                    returned = await handler(held.claimed.job.payload, held.ctx)
                    if self._keeps(held, returned):
                        await asyncio.to_thread(self.finisher.record_result, held, returned)
            except (Exception, asyncio.CancelledError) as exc:
                if run is not None:
                    run.raised(exc)
                await asyncio.to_thread(self._raised, held, exc, started)
                return
            self._returned(held, started)
        except asyncio.CancelledError:
            self.finisher.forget(held)
        except Exception as exc:
            self._slot_error(held, exc)
        finally:
            self._took(held)
            self.places.give_back()

    def _slot_error(self, held: Held, exc: Exception) -> None:
        event(
            log,
            logging.ERROR,
            "slot_error",
            job_id=held.lease.job_id,
            attempt=held.lease.attempt,
            error=f"{type(exc).__name__}: {exc}",
        )
        self.finisher.forget(held)

    @property
    def typical_seconds(self) -> float | None:
        """A job's time as jobs run now: the lower median of the last 2 x concurrency + 1 times a
        place was busy with one. A moment when every thread was slow at once (the process paused
        on a busy machine, a slow write: one slowed job a thread) moves it not at all; jobs that
        turned long move it within about two of them a thread."""
        with self._lock:
            recent = sorted(self._recent)
        return recent[(len(recent) - 1) // 2] if recent else None

    def _took(self, held: Held) -> None:
        """A place was busy with one job from its handler's start to its attempt's end (its own
        writes included). A job that never started (taken back, handed back, past its deadline)
        says nothing of how long jobs take, nor does the write that confirmed a job that had
        waited in hand: a cost of the wait, counted it made every job look long after a slow
        moment, and the jobs in hand went back to `ready` though their jobs had stayed short."""
        if held.started_at is not None:
            with self._lock:
                self._recent.append(self.keeper.clock() - held.started_at)

    def run_attempt(self, held: Held) -> None:
        job = held.claimed.job
        if not self._may_start(held):
            # Lost while it waited for a thread (an operator took it, its queue was paused, it was
            # reaped, its local deadline passed): the handler never starts.
            self.finisher.forget(held)
            return
        spec = self.registry.get(job.task_name)
        started = time.monotonic()
        run = held.run = tracing.start_run(job, held.lease, held.trace_context)
        try:
            if spec is None:
                raise LookupError(f"no handler for task {job.task_name!r} in worker {self.worker_id}")
            with tracing.active(run):
                returned = spec.handler(job.payload, held.ctx)
                if self._keeps(held, returned):
                    self.finisher.record_result(held, returned)  # as ctx.record_result(returned) would
        except Exception as exc:
            if run is not None:
                run.raised(exc)
            self._raised(held, exc, started)
            return
        self._returned(held, started)

    @staticmethod
    def _keeps(held: Held, returned: object) -> bool:
        """Whether a handler's return value is recorded as its result."""
        return returned is not None and not held.result_recorded and not held.completed_in_transaction

    def _raised(self, held: Held, exc: BaseException, started: float) -> None:
        if held.completed_in_transaction:
            # Its ctx.transaction() committed: the job is done, whatever came after.
            job, lease = held.claimed.job, held.lease
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
            self.keeper.finishing(held)
            self.finisher.completed_in_transaction(held)
            return
        self._failed(held, exc, started)

    def _returned(self, held: Held, started: float) -> None:
        finisher, keeper = self.finisher, self.keeper
        job, lease = held.claimed.job, held.lease
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

    def _needs_confirm(self, held: Held) -> bool:
        return self.keeper.clock() - held.claimed_at >= CONFIRM_AFTER_SECONDS

    def _may_start(self, held: Held) -> bool:
        if self._needs_confirm(held) and not self.finisher.confirm_start(held):
            return False
        return self.keeper.start(held)

    def _failed(self, held: Held, exc: BaseException, started: float) -> None:
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


def moved(average: float | None, seconds: float) -> float:
    """A running average after one more job of `seconds`."""
    return seconds if average is None else average + DURATION_WEIGHT * (seconds - average)


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
