"""The soak's one task, `soak`, loaded by workers and gunicorn with `--tasks soak.tasks`.

The payload says what kind of job it is:

    {"kind": "noop"}                     succeeds at once
    {"kind": "sleep", "seconds": 0.2}    sleeps, then succeeds
    {"kind": "flaky", "fail_times": 2}   raises on attempts 1..fail_times, then succeeds
    {"kind": "doomed"}                   always raises (enqueued with a small max_attempts)

On success the handler appends one line `task_key attempt worker_id pid` to the execution log
(SOAK_EXEC_LOG; O_APPEND and a single write per line, so lines from many processes never mix)
and records its result. The line is written before the result: it stands for the work itself
(the side effect a real handler would have), so a handler that did the work and then lost its
lease still shows up as an execution. Counting lines per task_key gives duplicate executions;
counting job_result rows per task_key gives duplicate results.

`soak_callback` is the callback of every soak batch (on_success, on_failure, on_complete): its
job's task_key is `batch:<KEY>:<kind>`, and it logs and records the same way, so its executions
are counted like any job's.
"""

from __future__ import annotations

import os
from typing import Any

from jobqueue.core.errors import LeaseLostError
from jobqueue.core.tasks import JobContext, task

ENV_EXEC_LOG = "SOAK_EXEC_LOG"
KINDS = ("noop", "sleep", "flaky", "doomed")


class SoakFailure(RuntimeError):
    """A soak job failing on purpose."""


def _log_execution(ctx: JobContext) -> None:
    path = os.environ.get(ENV_EXEC_LOG)
    if not path:
        return
    line = f"{ctx.task_key} {ctx.attempt} {ctx.worker_id} {os.getpid()}\n".encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


@task("soak", max_attempts=4, retry_base_seconds=0.2, retry_cap_seconds=2)
def soak(payload: dict[str, Any], ctx: JobContext) -> None:
    kind = payload.get("kind")
    if kind == "sleep":
        # Cooperative: a handler told its lease is gone (an operator took the job, its worker is
        # cut off or shutting down past its grace) stops without doing the work.
        if ctx.lease_lost.wait(float(payload.get("seconds", 0.1))):
            raise LeaseLostError(f"{ctx.task_key} attempt {ctx.attempt}: lease lost while sleeping")
    elif kind == "flaky":
        if ctx.attempt <= int(payload.get("fail_times", 1)):
            raise SoakFailure(f"flaky job fails attempt {ctx.attempt} of {payload.get('fail_times')} on purpose")
    elif kind == "doomed":
        raise SoakFailure(f"doomed job fails attempt {ctx.attempt} on purpose")
    elif kind != "noop":
        raise SoakFailure(f"unknown soak kind {kind!r}")
    _log_execution(ctx)
    ctx.record_result({"kind": kind, "attempt": ctx.attempt, "worker": ctx.worker_id})


@task("soak_callback", max_attempts=4, retry_base_seconds=0.2, retry_cap_seconds=2)
def soak_callback(payload: dict[str, Any], ctx: JobContext) -> None:
    """A batch's callback: what the batch counted when it fired, logged and recorded once."""
    _log_execution(ctx)
    ctx.record_result({k: payload.get(k) for k in ("batch", "kind", "total", "done", "failed", "cancelled")})
