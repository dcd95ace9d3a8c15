"""The replicas of JOBQUEUE_REPLICA_URLS, watched: each one's lag and replication threads for the
health panel, `/api/health` and `jobqueue doctor`, and the pause a bulk action takes between
batches while one of them is too far behind.

Why bulk actions pace themselves instead of being capped (Mission Control caps them at 3,000 jobs
"to avoid replication lag in MySQL"): the primary commits a 500-row batch in milliseconds, but a
replica applies what it receives on one SQL thread, behind its own readers; a bulk over 100,000
jobs can leave it minutes behind, and every page and report that reads from it shows the past.
So before each batch (the first too: the dashboard runs a long bulk as a chain of requests, and a
new request must not write while the lag is still high) the bulk reads every watched replica's
lag and, while one is above JOBQUEUE_REPLICA_LAG_LIMIT, waits and reads again (every second:
Seconds_Behind_Master counts whole seconds) until it is back under the bound or the caller's
deadline passes; then the caller stops there and says "paused for replica lag".

What is never waited for: a replica whose lag cannot be read. That is one that does not answer,
one whose replication threads are stopped (MariaDB and MySQL report Seconds_Behind_Master as NULL
then, whatever the real age of its data), or one whose account may not read the status. Waiting
cannot make it readable, and only an operator can restart replication, so waiting would turn a
replica outage into a bulk-action outage. The bulk goes on, its progress names the replica it
could not read, and the health checks call that replica a problem. A replica that did not answer
is not tried again for RETRY_SECONDS, so a host that is cut off costs one connect timeout, not one
per batch.

With no replica configured nothing here runs: no engine is made and bulk actions read nothing.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

from sqlalchemy.exc import SQLAlchemyError

from . import logs, repository
from .db import create_engine
from .errors import TransientDatabaseError
from .repository.replicas import Pause, ReplicaReport
from .settings import Settings

log = logging.getLogger("jobqueue.replicas")

CHECK_INTERVAL_SECONDS = 1.0  # re-reading while paused: the lag is counted in whole seconds
FRESH_SECONDS = 0.5  # between batches a reading this young is reused (same whole second)
RETRY_SECONDS = 10.0  # a replica that did not answer is skipped this long
STATEMENT_SECONDS = 3.0  # SHOW SLAVE STATUS answers in a millisecond; a stuck server must not hold a bulk


class ReplicaWatch:
    """The watched replicas of one process: an engine each (one pooled connection, READ ONLY
    sessions, statements bounded), read on demand."""

    def __init__(
        self,
        urls: Sequence[str],
        lag_limit: int,
        *,
        settings: Settings | None = None,
        check_interval: float = CHECK_INTERVAL_SECONDS,
        retry_seconds: float = RETRY_SECONDS,
    ):
        self.lag_limit = lag_limit
        self.check_interval = check_interval
        self.retry_seconds = retry_seconds
        self.engines = [
            create_engine(
                url, pool_size=1, settings=settings, read_only=True, statement_timeout_seconds=STATEMENT_SECONDS
            )
            for url in urls
        ]
        self.addresses = [engine.candidates.address(0) for engine in self.engines]
        self._down_until = [0.0] * len(self.engines)
        self._last_error: list[str | None] = [None] * len(self.engines)
        self._last_reading: tuple[float, list[ReplicaReport]] = (float("-inf"), [])

    @classmethod
    def from_settings(cls, settings: Settings) -> ReplicaWatch | None:
        """None when no replica is configured: callers then skip every replica step."""
        if not settings.replica_urls:
            return None
        return cls(settings.replica_urls, settings.replica_lag_limit, settings=settings)

    def read(self, max_age: float = 0.0) -> list[ReplicaReport]:
        """Every watched replica, in the configured order; a failure is a report, never raised.
        `max_age`: the last reading, if it is that young."""
        read_at, reports = self._last_reading
        if time.monotonic() - read_at < max_age:
            return reports
        reports = [self._read_one(i) for i in range(len(self.engines))]
        self._last_reading = (time.monotonic(), reports)
        return reports

    def _read_one(self, i: int) -> ReplicaReport:
        address = self.addresses[i]
        if time.monotonic() < self._down_until[i]:
            return ReplicaReport(address, None, self._last_error[i])
        try:
            with self.engines[i].connect() as conn:
                return ReplicaReport(address, repository.replicas.replica_lag(conn))
        except (SQLAlchemyError, TransientDatabaseError) as exc:
            error = str(getattr(exc, "orig", None) or exc).splitlines()[0][:200]
            self._down_until[i] = time.monotonic() + self.retry_seconds
            self._last_error[i] = error
            self.engines[i].dispose()  # its pooled connection is dead too
            logs.event(log, logging.WARNING, "replica_unreachable", address=address, error=error)
            return ReplicaReport(address, None, error)

    def wait(self, deadline: float | None) -> Pause:
        """Before a bulk action's next batch: at once when every replica that can be read is
        within the bound; else wait, reading again every check_interval, until they are or
        `deadline` (time.monotonic()) would pass. None: wait as long as it takes."""
        started = time.monotonic()
        waited_for: tuple[ReplicaReport, ...] | None = None
        while True:
            # A batch takes tens of milliseconds: reading before each would cost a round trip per
            # replica each time to learn the same whole second again.
            reports = self.read(FRESH_SECONDS if waited_for is None else 0.0)
            lagging = tuple(r for r in reports if r.over(self.lag_limit))
            unread = tuple(r for r in reports if r.unread)
            if waited_for is None:
                waited_for = lagging
            now = time.monotonic()
            if not lagging or (deadline is not None and now + self.check_interval > deadline):
                # Reading the lag is not waiting: only a wait that found a replica behind counts.
                return Pause(now - started if waited_for else 0.0, self.lag_limit, lagging, unread, waited_for)
            time.sleep(self.check_interval)

    def dispose(self) -> None:
        for engine in self.engines:
            engine.dispose()
