"""The operations dashboard: overview, jobs, job detail, batches, workers, recurring jobs, audit log, and
the actions (requeue, fail, cancel; pause and resume a queue; add, enable, disable and remove a
recurring job). Every read and write goes through jobqueue.core.repository.

The pages that only read use `read_db()` (a replica when JOBQUEUE_READ_URL is set, its lag in the
page header); the actions, and the row or panel an action answers with, use `db()`, the primary."""

from __future__ import annotations

from . import actions, batches, jobs, locks, overview, recurring, workers  # noqa: F401 - each adds its views to `bp`
from .common import bp
from .overview import LOCK_MINUTES, LockCounterMinutes

__all__ = ["LOCK_MINUTES", "LockCounterMinutes", "bp"]
