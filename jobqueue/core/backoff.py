"""How long to wait: before a failed job's next attempt, and between empty claims."""

from __future__ import annotations

import random
from datetime import datetime

from .models import EmptyClaim, EmptyClaimReport


def retry_delay(attempt: int, base: float = 1.0, cap: float = 3600.0, rng: random.Random | None = None) -> float:
    """Exponential backoff with jitter: base * 2^(attempt-1), capped, then scaled by 0.5..1.5 so
    that jobs that failed together do not come back together."""
    rng = rng or random
    raw = min(cap, base * (2 ** min(max(attempt, 1) - 1, 32)))
    return min(cap, raw * rng.uniform(0.5, 1.5))


class IdleBackoff:
    """Sleep lengths for a worker whose claims come back empty, by the reason they were empty.

    - contended: others hold the ready rows for a moment; come back soon (20 ms), and less
      eagerly (doubling up to `contended_cap`) while the same rows stay held.
    - idle: nothing to do; double the wait each time (with jitter) up to `cap`.
    - waiting on leases: nothing ready until a lease expires; sleep until about then (capped).
    A delayed job or retry that comes due earlier shortens any of these.
    """

    def __init__(
        self,
        minimum: float = 0.05,
        cap: float = 2.0,
        contended: float = 0.02,
        contended_cap: float = 0.5,
        rng: random.Random | None = None,
    ):
        self.minimum = minimum
        self.cap = cap
        self.contended = contended
        self.contended_cap = min(contended_cap, cap)
        self.rng = rng or random.Random()
        self._idle = 0.0
        self._contended = 0.0

    def reset(self) -> None:
        self._idle = 0.0
        self._contended = 0.0

    def next(self, report: EmptyClaimReport | None) -> float:
        """Seconds to sleep after this empty claim (None: an error, treated like idle)."""
        if report is not None and report.kind is EmptyClaim.CONTENDED:
            self._contended = self.contended if self._contended == 0 else min(self.contended_cap, self._contended * 2)
            return self._contended * self.rng.uniform(0.5, 1.5)
        self._contended = 0.0
        self._idle = self.minimum if self._idle == 0 else min(self.cap, self._idle * 2)
        delay = self._idle * self.rng.uniform(0.75, 1.0)
        if report is None or report.db_now is None:
            return delay
        if report.kind is EmptyClaim.WAITING and report.next_lease_expiry is not None:
            delay = max(delay, _seconds_until(report.next_lease_expiry, report.db_now))
        if report.next_allowed is not None:
            # A spent rate window: no claim of those jobs can succeed before it ends.
            delay = max(delay, _seconds_until(report.next_allowed, report.db_now))
        if report.next_scheduled is not None:
            delay = min(delay, _seconds_until(report.next_scheduled, report.db_now))
        return max(self.minimum / 2, min(delay, self.cap))


def _seconds_until(when: datetime, now: datetime) -> float:
    return max(0.0, (when - now).total_seconds())
