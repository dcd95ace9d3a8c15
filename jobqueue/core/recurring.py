"""Recurring jobs: cron schedules stored in `recurring_job`, enqueued by whichever worker process
sees a tick due.

Every tick of a schedule is one job whose task_key is `recurring:<name>:<tick in UTC as
YYYY-MM-DDTHH:MM>`. Any number of processes (standalone workers, web processes with embedded
workers, on any number of hosts) may see the same tick due at the same moment: each enqueues it,
and the existing idempotency by task_key makes that one job. The schedule row then moves on to the
next tick (a guarded UPDATE, so only one process's write lands).

After downtime, a schedule whose tick passed while nobody was running gets one catch-up run, for
the latest tick missed, not one per missed tick: the run enqueued is always the latest tick at or
before now.

Cron expressions are the usual five fields (minute hour day-of-month month day-of-week, Sunday is
0 or 7) or an alias such as `@hourly`, evaluated in UTC by croniter (whose `R` and `H` are refused:
every process must compute the same tick); the clock is the database's,
so hosts with skewed clocks agree on when a tick is due.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from datetime import UTC, datetime, timedelta

from .errors import ValidationError
from .logs import RateLimited, event

log = logging.getLogger("jobqueue.recurring")

NAME = re.compile(r"[A-Za-z0-9_.\-]{1,50}")  # fullmatch: "$" would let a final newline through
ALIASES = ("@yearly", "@annually", "@monthly", "@weekly", "@daily", "@midnight", "@hourly")
KEY_PREFIX = "recurring:"
REREAD_SECONDS = 30.0  # how stale a process's idea of the next due tick may get (one small read)


def check_name(name: object) -> str:
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise ValidationError(
            "a recurring job's name must be 1-50 characters of letters, digits, '_', '.' or '-'", "name"
        )
    return name


def parse_cron(expr: object) -> str:
    """The expression, normalised (single spaces), or ValidationError (field `cron`) saying what
    is wrong: five fields or an alias, each in range, and a tick that can happen at all."""
    if not isinstance(expr, str) or not expr.strip():
        raise ValidationError("cron must be an expression such as '*/5 * * * *'", "cron")
    text = " ".join(expr.split())
    if len(text) > 100:
        raise ValidationError("cron is longer than 100 characters", "cron")
    if text.startswith("@"):
        if text.lower() not in ALIASES:
            raise ValidationError(f"unknown cron alias {text!r}; use one of {', '.join(ALIASES)}", "cron")
    elif len(text.split(" ")) != 5:
        raise ValidationError(
            f"cron {text!r} must have 5 fields (minute hour day-of-month month day-of-week), "
            f"it has {len(text.split(' '))}",
            "cron",
        )
    else:
        chance = _CHANCE.search(text)
        if chance is not None:
            letter = chance.group(1).upper()
            raise ValidationError(
                f"cron {text!r}: {letter!r} ({'random' if letter == 'R' else 'hashed'}) picks a tick that differs "
                "from process to process, so each process would enqueue a run of its own; write the minute or "
                "hour out (e.g. '17 * * * *')",
                "cron",
            )
    from croniter import croniter  # here, not at import: 40 ms a one-shot command need not pay
    from croniter.croniter import CroniterError

    try:
        croniter(text, datetime(2026, 1, 1, tzinfo=UTC)).get_next(datetime)
    except (CroniterError, ValueError, KeyError) as exc:
        raise ValidationError(f"cron {text!r} is not valid: {exc}", "cron") from None
    return text


# croniter's R (random) and H (hashed) as a field's value, a list item or a range's start: no month
# or weekday name starts with either letter (MAR, THU and FRI are fine).
_CHANCE = re.compile(r"(?:^|[ ,/-])([HhRr])")


def _aware(when: datetime) -> datetime:
    return when if when.tzinfo is not None else when.replace(tzinfo=UTC)


def latest_tick(expr: str, now: datetime) -> datetime:
    """The latest tick at or before `now` (naive UTC in, naive UTC out)."""
    from croniter import croniter

    # croniter's get_prev is strictly before its base: a microsecond later counts `now` itself.
    tick = croniter(expr, _aware(now) + timedelta(microseconds=1)).get_prev(datetime)
    return tick.astimezone(UTC).replace(tzinfo=None)


def next_tick(expr: str, after: datetime) -> datetime:
    """The first tick strictly after `after` (naive UTC)."""
    from croniter import croniter

    tick = croniter(expr, _aware(after)).get_next(datetime)
    return tick.astimezone(UTC).replace(tzinfo=None)


def run_key(name: str, tick: datetime) -> str:
    """The task_key of the run of `name` for `tick`: recurring:<name>:<YYYY-MM-DDTHH:MM UTC>."""
    return f"{KEY_PREFIX}{name}:{tick.strftime('%Y-%m-%dT%H:%M')}"


class RecurringRunner:
    """A process's part in enqueueing due runs: cheap to call every loop turn. It reads the
    earliest next tick of the enabled schedules at most every REREAD_SECONDS, and enqueues when
    that tick has come (judged by the database clock, offset onto this host's monotonic clock)."""

    def __init__(
        self,
        engine,
        *,
        registry=None,
        name: str = "recurring",
        reread_seconds: float = REREAD_SECONDS,
        clock=time.monotonic,
    ):
        from .tasks import TASKS

        self.engine = engine
        self.registry = registry or TASKS
        self.name = name
        self.reread_seconds = reread_seconds
        self.clock = clock
        self._read_at = float("-inf")
        self._due_at = float("inf")  # monotonic time of the earliest next tick
        self._synced = False
        self._lock = threading.Lock()
        self._error_log = RateLimited(60.0)

    def tick(self) -> int:
        """Enqueue the runs that are due, if any. Returns how many jobs were written."""
        from . import service

        now = self.clock()
        if now < self._due_at and now - self._read_at < self.reread_seconds:
            return 0
        if not self._lock.acquire(blocking=False):
            return 0
        try:
            try:
                with self.engine.connect() as conn:
                    if not self._synced:
                        service.sync_code_schedules(conn, registry=self.registry, actor=self.name)
                        self._synced = True
                    result = service.enqueue_due_recurring(conn, registry=self.registry)
            except Exception:
                # The caller counts and logs it; try again in a second, not on every loop turn.
                self._read_at, self._due_at = self.clock(), self.clock() + 1.0
                raise
            self._read_at = self.clock()
            if result.next_due is None:
                self._due_at = float("inf")
            else:
                self._due_at = self._read_at + max(0.0, (result.next_due - result.now).total_seconds())
            for skipped in result.skipped:
                if self._error_log.allow(skipped) is not None:
                    event(log, logging.WARNING, "recurring_skipped", by=self.name, detail=skipped)
            return result.enqueued
        finally:
            self._lock.release()

    def forget(self) -> None:
        """Read the schedules again at the next tick() (one was added or changed here)."""
        self._read_at = float("-inf")
