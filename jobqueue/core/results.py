"""Waiting for a job's result (JobQueue.result, `jobqueue result --wait`, GET /api/jobs/<id>/result
?wait=): the job's row is read at most once a second, and a completion this process makes
itself (an embedded or in-process worker) wakes the waiter at once (wakeup.awaiting). Another
process's completion is seen at the next read, within a second."""

from __future__ import annotations

import time

from sqlalchemy.engine import Engine

from . import repository, wakeup
from .errors import JobNotFound
from .models import JobResult

POLL_SECONDS = 1.0


def wait_for(
    engine: Engine, *, task_key: str | None = None, job_id: int | None = None, timeout: float | None = 0.0
) -> JobResult:
    """The job's outcome once it finished, or where it stands when `timeout` seconds passed
    (0: at once; None: no limit). JobNotFound for an unknown key or id. A connection is taken
    from the pool for each read only, so long waits do not hold one."""
    deadline = None if timeout is None else time.monotonic() + max(timeout, 0.0)
    outcome = _read(engine, task_key, job_id)
    if outcome.finished:
        return outcome
    with wakeup.awaiting(outcome.task_key) as done:
        while not outcome.finished:
            left = POLL_SECONDS if deadline is None else deadline - time.monotonic()
            if left <= 0:
                break
            done.wait(min(POLL_SECONDS, left))
            done.clear()  # set again only by another completion: never a busy loop
            outcome = _read(engine, outcome.task_key, None)
    return outcome


def _read(engine: Engine, task_key: str | None, job_id: int | None) -> JobResult:
    with engine.connect() as conn:
        outcome = repository.reads.job_outcome(conn, task_key=task_key, job_id=job_id)
    if outcome is None:
        raise JobNotFound(f"no job with key {task_key!r}" if task_key is not None else f"job {job_id} not found")
    return outcome
