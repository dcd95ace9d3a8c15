"""What happens when a worker dies.

A worker that is SIGKILLed, OOM-killed, frozen or cut off from the database stops renewing the
leases of the jobs it holds. Once a lease has expired, the reaper returns the job to `ready`
(attempts kept, so a job that kills every worker that touches it ends `failed` after
`max_attempts`), and another worker picks it up. If the old worker wakes up later, its writes
are fenced by (lease_owner, attempts) and change nothing.

The reaper also promotes delayed jobs and retries whose time has come from `scheduled` to
`ready`. It runs inside every worker's loop and, in the web process, on an APScheduler
interval; any number of reapers may run at once (they lock with SKIP LOCKED and re-check the
expiry in the UPDATE).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy.engine import Engine

from . import repository, service
from .logs import event

log = logging.getLogger("jobqueue.reaper")


@dataclass(frozen=True)
class ReaperPass:
    reclaimed: int
    failed: int
    promoted: int


class Reaper:
    def __init__(self, engine: Engine, name: str = "reaper"):
        self.engine = engine
        self.name = name

    def reap(self, keep: Sequence[tuple[int, int]] = ()) -> repository.maintenance.ReapResult:
        """`keep`: this process's leases whose handler finished and whose final write is
        pending: not reaped by this process (see repository.maintenance.reap)."""
        with self.engine.connect() as conn:
            result = service.reap(conn, keep=keep)
        if result.reclaimed or result.failed:
            event(log, logging.WARNING, "reaped", by=self.name, reclaimed=result.reclaimed, failed=result.failed)
        return result

    def promote(self) -> int:
        with self.engine.connect() as conn:
            return service.promote_due(conn)

    def run_once(self) -> ReaperPass:
        result = self.reap()
        return ReaperPass(result.reclaimed, result.failed, self.promote())
