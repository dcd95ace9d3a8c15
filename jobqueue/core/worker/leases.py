"""The lease keeper: every lease this process holds, and what stage each is at.

A lease is named by the job id *and* the attempt (the claim set `attempts` to it), never by the
job id alone: the same process may hold attempt 2 of a job while its attempt 1 is still running
here after an operator's forced requeue, and each is renewed, finished and released on its own.

    claimed ──> WAITING ──start──> RUNNING ──handler returns──> FINISHING ──final write commits──> (gone)
                  │                  │                             │
                  └──────────────────┴──────────────┬──────────────┘
                                                    v
                                                  LOST ──handler returns──> (gone)

WAITING, RUNNING and FINISHING leases are renewed every third of the lease until their final
write (complete, retry, fail, release) has committed: through a shutdown's grace period and
through a completion retried while the database restarts.

Each lease has a local deadline on the monotonic clock: the send time of its last successful
renewal (or of its claim) plus the lease, minus a margin. The database cannot expire the lease
before then (it counts from when the statement ran, which is later), so past the deadline the
attempt is treated as lost although nobody told us: renewals kept failing (a partition, a
restart) and another worker may be running the job by now. A lease is also LOST when a renewal
is refused by the fence (reaped, requeued, failed or cancelled by an operator) or when the
attempt ran past its task's timeout. Either way `ctx.lease_lost` is set, and the handler may
stop early; its writes stay fenced.

Renewals and final writes never overlap on one lease (`writing`): a renewal racing the
completion would find the row done and cry "lost".

`start` refuses a lease that is not WAITING any more or is past its local deadline: the handler
of a job taken back, or whose lease may have expired, never starts. A job that waited in hand is
also confirmed in the database before that (slots.py): the keeper alone learns of an operator's
action only at the next renewal.
"""

from __future__ import annotations

import concurrent.futures
import enum
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from .. import tracing
from ..models import ClaimedJob, Lease, Outcome
from ..tasks import JobContext


class LeaseState(str, enum.Enum):
    WAITING = "waiting"  # claimed ahead of a free thread (prefetch)
    RUNNING = "running"  # its handler runs
    FINISHING = "finishing"  # the handler returned; its final write is pending
    LOST = "lost"  # gone: refused by the fence, past its deadline, or timed out


Key = tuple[int, int]  # (job id, attempt)


def key_of(lease: Lease) -> Key:
    return (lease.job_id, lease.attempt)


@dataclass(eq=False)
class Held:
    claimed: ClaimedJob
    slot: int
    ctx: JobContext
    state: LeaseState
    deadline: float  # monotonic: past it, the lease may have expired in the database
    claimed_at: float  # monotonic
    started_at: float | None = None  # monotonic, when the handler started
    lost_at: float | None = None
    lost_reason: str | None = None
    timeout: float | None = None  # seconds the task allows an attempt
    duration: float = 0.0  # the handler's run time, once it returned
    writing: bool = False  # a final write is in flight: no renewal now
    renewing: bool = False  # a renewal is in flight: no final write now
    handler_done: bool = False
    completed_in_transaction: bool = False  # the handler's ctx.transaction() committed the completion
    result_recorded: bool = False  # this attempt called record_result: a return value is not recorded again
    coroutine: concurrent.futures.Future[None] | None = None  # an async handler's run on the event loop
    trace_context: str | None = None  # the enqueuer's span, read only while tracing is on
    run: tracing.Run | None = None  # the attempt's span, from its handler's start to its outcome written
    returned_at: float | None = None  # monotonic, when the handler returned or raised

    @property
    def key(self) -> Key:
        return key_of(self.claimed.lease)

    @property
    def lease(self) -> Lease:
        return self.claimed.lease

    @property
    def lost(self) -> bool:
        return self.state is LeaseState.LOST


@dataclass
class Lost:
    """A lease that the keeper has just given up on, and why (for the caller to report)."""

    held: Held
    reason: str  # renew | deadline | timeout | ...
    detail: str


class LeaseKeeper:
    def __init__(
        self, lease_seconds: float, *, clock: Callable[[], float] = time.monotonic, margin: float | None = None
    ):
        self.lease_seconds = lease_seconds
        # The database's lease counts from when the statement ran, which is after we sent it; the
        # margin covers the rest (clock rates, the time to learn of a failure).
        self.margin = min(2.0, lease_seconds / 10) if margin is None else margin
        self.clock = clock
        self._held: dict[Key, Held] = {}
        self._cond = threading.Condition()

    # --- taking and giving up ----------------------------------------------------------------

    def hold(
        self, claimed: ClaimedJob, slot: int, ctx: JobContext, *, sent_at: float, timeout: float | None = None
    ) -> Held:
        """A lease the claim sent at `sent_at` (monotonic) took."""
        held = Held(claimed, slot, ctx, LeaseState.WAITING, self._deadline(sent_at), self.clock(), timeout=timeout)
        with self._cond:
            self._held[held.key] = held
        return held

    def start(self, held: Held) -> bool:
        """WAITING -> RUNNING: a thread runs the handler now. False when the lease was lost while
        the job waited, or its local deadline passed (the handler must not run)."""
        with self._cond:
            if held.state is not LeaseState.WAITING or self.clock() >= held.deadline:
                return False
            held.state = LeaseState.RUNNING
            held.started_at = self.clock()
            return True

    def finishing(self, held: Held) -> bool:
        """RUNNING -> FINISHING: the handler returned and its final write is pending. False when
        the lease was lost meanwhile."""
        with self._cond:
            held.handler_done = True
            if held.returned_at is None:
                held.returned_at = self.clock()
            if held.state is LeaseState.LOST:
                return False
            held.state = LeaseState.FINISHING
            return True

    def lose(
        self, held: Held, reason: str, detail: str = "", *, only_if: tuple[LeaseState, ...] | None = None
    ) -> Lost | None:
        """Give up on a lease: set `ctx.lease_lost`. None when it was already lost or gone (or,
        with `only_if`, not in one of those states at this instant)."""
        with self._cond:
            if held.state is LeaseState.LOST or self._held.get(held.key) is not held:
                return None
            if only_if is not None and held.state not in only_if:
                return None
            held.state = LeaseState.LOST
            held.lost_at = self.clock()
            held.lost_reason = reason
            self._cond.notify_all()
        held.ctx.lease_lost.set()
        return Lost(held, reason, detail)

    def drop(self, held: Held) -> bool:
        """The lease's final write committed (or the lease is gone and its handler has returned):
        forget it. False when it was already forgotten."""
        with self._cond:
            if self._held.get(held.key) is not held:
                return False
            del self._held[held.key]
            self._cond.notify_all()
            return True

    # --- final writes and renewals never overlap on one lease -----------------------------------

    @contextmanager
    def writing(self, items: Sequence[Held]) -> Iterator[None]:
        """Around a final write: waits for a renewal of these leases in flight (milliseconds),
        and keeps the next one off them until the write is done."""
        with self._cond:
            while any(h.renewing for h in items):
                self._cond.wait(0.05)
            for h in items:
                h.writing = True
        try:
            yield
        finally:
            with self._cond:
                for h in items:
                    h.writing = False
                self._cond.notify_all()

    def begin_renewal(self) -> tuple[list[Held], float]:
        """The leases to renew now (all not lost, not being written), marked as renewing, and the
        send time that their new deadline will count from."""
        with self._cond:
            items = [h for h in self._held.values() if not h.lost and not h.writing]
            for h in items:
                h.renewing = True
        return items, self.clock()

    def end_renewal(self, items: Sequence[Held], sent_at: float, outcomes: dict[Lease, Outcome] | None) -> list[Lost]:
        """Apply a renewal's answer: OK moves the deadline, LEASE_LOST loses the lease, BUSY (the
        row was held elsewhere this instant) and a failed renewal (None) change nothing: the
        deadline keeps running."""
        lost: list[Lost] = []
        with self._cond:
            for h in items:
                h.renewing = False
                outcome = outcomes.get(h.lease) if outcomes is not None else None
                if outcome is Outcome.OK and not h.lost:
                    h.deadline = self._deadline(sent_at)
            self._cond.notify_all()
        if outcomes is not None:
            for h in items:
                if outcomes.get(h.lease) is Outcome.LEASE_LOST:
                    gone = self.lose(h, "renew", "the fence refused the renewal: reaped, requeued, failed or cancelled")
                    if gone is not None:
                        lost.append(gone)
        return lost

    def overdue(self) -> list[Lost]:
        """Leases past their local deadline, or running past their task's timeout: lost now."""
        now = self.clock()
        with self._cond:
            late = [h for h in self._held.values() if not h.lost and now >= h.deadline]
            slow = [
                h
                for h in self._held.values()
                if not h.lost
                and h not in late
                and h.timeout is not None
                and h.started_at is not None
                and not h.handler_done
                and now - h.started_at >= h.timeout
            ]
        out = []
        for h in late:
            gone = self.lose(h, "deadline", f"no successful renewal for {self.lease_seconds - self.margin:.1f} s")
            if gone is not None:
                out.append(gone)
        for h in slow:
            gone = self.lose(h, "timeout", f"timed out after {h.timeout:g} s")
            if gone is not None:
                out.append(gone)
        return out

    def _deadline(self, sent_at: float) -> float:
        return sent_at + self.lease_seconds - self.margin

    # --- looking -------------------------------------------------------------------------------

    def held(self, *states: LeaseState) -> list[Held]:
        with self._cond:
            return [h for h in self._held.values() if not states or h.state in states]

    def get(self, key: Key) -> Held | None:
        with self._cond:
            return self._held.get(key)

    def __len__(self) -> int:
        with self._cond:
            return len(self._held)

    def wait_until_empty(self, deadline: float, *states: LeaseState) -> bool:
        """Wait until no lease in `states` (all, when none given) is held, or `deadline`
        (monotonic). True when none is left."""
        with self._cond:
            while True:
                left = [h for h in self._held.values() if not states or h.state in states]
                if not left:
                    return True
                wait = deadline - self.clock()
                if wait <= 0:
                    return False
                self._cond.wait(min(wait, 0.1))

    def snapshot(self) -> list[dict[str, Any]]:
        """What each lease slot holds, for the workers page and /api/health."""
        now = self.clock()
        with self._cond:
            items = sorted(self._held.values(), key=lambda h: h.slot)
            return [
                {
                    "slot": h.slot,
                    "job_id": h.lease.job_id,
                    "attempt": h.lease.attempt,
                    "task": h.claimed.job.task_name,
                    "queue": h.claimed.job.queue,
                    "state": h.state.value,
                    "running_seconds": round(now - h.started_at, 1) if h.started_at is not None else None,
                    "held_seconds": round(now - h.claimed_at, 1),
                    "lease_left_seconds": round(h.deadline - now, 1),
                    "lost_reason": h.lost_reason,
                    "lost_seconds_ago": round(now - h.lost_at, 1) if h.lost_at is not None else None,
                    "handler_running": h.started_at is not None and not h.handler_done,
                }
                for h in items
            ]
