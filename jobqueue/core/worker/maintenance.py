"""What maintenance runs, and when: the one schedule used by every worker's loop and by the web
process's scheduler.

Maintenance is four steps, each safe to run in any number of processes at once:

    reap       expired leases back to `ready` (reaper.py)
    promote    due retries and delayed jobs from `scheduled` to `ready`
    recurring  enqueue the runs of recurring schedules that are due (recurring.py; cheap unless one is)
    prune      a retention pass when no process started one lately (retention.py)

A worker's loop calls `turn()` every turn: recurring runs and the retention check each turn, and a
sweep (reap, then promote) every `reap_interval` while the worker has been claiming, at least every
SWEEP_SECONDS when idle; an idle worker's read also calls `after_read()`, which sweeps as soon as
the read sees an expired lease or a due job. A process whose maintenance a scheduler runs instead
(the web process: APScheduler, jobqueue/web/runtime.py) builds the same object and runs `timed()`:
the same steps on the same intervals.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from sqlalchemy.engine import Engine

from ..models import EmptyClaimReport
from ..reaper import Reaper
from ..recurring import RecurringRunner
from ..retention import PRUNE_EVERY_SECONDS, Pruner
from ..settings import Settings
from .state import DB_ERRORS

SWEEP_SECONDS = 60.0  # an idle worker's sweep, besides the ones its reads trigger
RECURRING_CHECK_SECONDS = 1.0  # a scheduler's recurring check (the loop checks every turn)
PRUNE_CHECK_SECONDS = 60.0  # a scheduler's retention check


def reap_interval(lease_seconds: float) -> float:
    """How often a busy process reaps: a quarter of the lease, 1..15 s, so that a job whose worker
    died waits at most about a quarter of a lease past its expiry."""
    return min(15.0, max(1.0, lease_seconds / 4))


@dataclass(frozen=True)
class Timed:
    """One step for a scheduler: run `run` every `every` seconds (first at once with `at_start`).
    `preflight`: check the server before each run (never reap on a replica); the recurring check
    runs every second, so it checks the server only while the last check refused it."""

    name: str
    every: float
    run: Callable[[], object]
    at_start: bool
    preflight: bool = True


class Maintenance:
    """`on_error(operation, exc)` hears of every database error of a step (the step itself is
    skipped until its next turn); `keep()` names the leases of this process whose final write is
    pending, never reaped by it (see Reaper.reap)."""

    def __init__(
        self,
        engine: Engine,
        *,
        name: str,
        on_error: Callable[[str, BaseException], None],
        reap_every: float,
        registry=None,
        prune_every_seconds: float = PRUNE_EVERY_SECONDS,
        settings: Settings | None = None,
        keep: Callable[[], Sequence[tuple[int, int]]] = tuple,
        in_loop: bool = True,
    ):
        self.reaper = Reaper(engine, name=name)
        self.recurring = RecurringRunner(engine, registry=registry, name=name)
        self.pruner = Pruner(engine, name=name, every_seconds=prune_every_seconds, settings=settings)
        self.reap_every = reap_every
        self.in_loop = in_loop  # False: a scheduler runs reap, recurring and prune; the loop only promotes
        self._on_error = on_error
        self._keep = keep
        self._last_sweep = 0.0
        self._busy = False  # claimed since the last sweep

    # --- in a worker's loop ----------------------------------------------------------------------

    def claimed(self) -> None:
        """The loop claimed work: sweep every reap_every, not every SWEEP_SECONDS."""
        self._busy = True

    def turn(self) -> bool:
        """One loop turn's maintenance. True when it may have made jobs ready."""
        if not self.in_loop:
            return False
        made_ready = self.tick_recurring() > 0
        self.pruner.maybe_start()
        since = time.monotonic() - self._last_sweep
        if (self._busy and since >= self.reap_every) or since >= SWEEP_SECONDS:
            self._busy = False
            made_ready = self.sweep() > 0 or made_ready
        return made_ready

    def after_read(self, report: EmptyClaimReport) -> bool:
        """Reap the expired leases and promote the due jobs an idle read revealed. True when it
        made jobs ready."""
        now = report.db_now
        if now is None:
            return False
        acted = False
        if self.in_loop and report.next_lease_expiry is not None and report.next_lease_expiry <= now:
            acted = self.reap() > 0
        if report.next_scheduled is not None and report.next_scheduled <= now:
            acted = self.promote() > 0 or acted
        return acted

    # --- the steps -------------------------------------------------------------------------------

    def sweep(self) -> int:
        return self.reap() + self.promote()

    def reap(self) -> int:
        self._last_sweep = time.monotonic()
        try:
            result = self.reaper.reap(keep=self._keep())
            return result.reclaimed + result.failed
        except DB_ERRORS as exc:
            self._on_error("reap", exc)
            return 0

    def promote(self) -> int:
        try:
            return self.reaper.promote()
        except DB_ERRORS as exc:
            self._on_error("promote", exc)
            return 0

    def tick_recurring(self) -> int:
        try:
            return self.recurring.tick()
        except DB_ERRORS as exc:
            self._on_error("recurring", exc)
            return 0

    def prune_if_due(self) -> None:
        """A retention pass in the caller's thread when no process started one lately."""
        try:
            self.pruner.run_if_due()
        except DB_ERRORS as exc:
            self._on_error("prune", exc)

    # --- for a scheduler -------------------------------------------------------------------------

    def timed(self) -> list[Timed]:
        return [
            Timed("reaper", self.reap_every, self.sweep, at_start=True),
            Timed("recurring", RECURRING_CHECK_SECONDS, self.tick_recurring, at_start=True, preflight=False),
            Timed("prune", PRUNE_CHECK_SECONDS, self.prune_if_due, at_start=False),
        ]

    def stop(self, timeout: float = 10.0) -> None:
        """Stop a retention pass in progress after its current batch."""
        self.pruner.stop(timeout=timeout)
