"""Tasks the acceptance tests run inside real worker processes (--tasks testkit.tasks)."""

from __future__ import annotations

import os
import time

from jobqueue.core.builtin_tasks import export_orders
from jobqueue.core.tasks import task


@task("slow_noop")
def slow_noop(payload, ctx):
    """Long enough that jobs spread over all workers."""
    time.sleep(payload.get("seconds", 0.05))


@task("hold_first_attempt", max_attempts=3)
def hold_first_attempt(payload, ctx):
    """The first attempt blocks (to be killed while holding its lease); later ones finish at once."""
    if ctx.attempt == 1:
        time.sleep(payload.get("seconds", 60))


@task("export_then_hang", max_attempts=3)
def export_then_hang(payload, ctx):
    """export_orders, then on the first attempt stall until the lease is lost: a worker that did
    the work but never got to report it."""
    export_orders(payload, ctx)
    if ctx.attempt == 1:
        ctx.lease_lost.wait(payload.get("seconds", 60))


@task("fail_first_attempt", max_attempts=1)
def fail_first_attempt(payload, ctx):
    """Fails on attempt 1 (and, with max_attempts=1, for good); an operator's requeue succeeds."""
    if ctx.attempt == 1:
        raise RuntimeError("first attempt fails <b>on purpose</b>")


@task("record_runs", max_attempts=5)
def record_runs(payload, ctx):
    """Appends `start <attempt>` and `end <attempt>` lines to the file `payload["log"]` around a
    sleep of `payload["sleeps"][str(attempt)]` seconds (default `payload["seconds"]`), ignoring
    `ctx.lease_lost` on purpose: a handler that does not cooperate, so that only the worker's
    lease bookkeeping can keep two attempts from overlapping."""
    import os

    seconds = payload.get("sleeps", {}).get(str(ctx.attempt), payload.get("seconds", 0))
    with open(payload["log"], "a") as f:
        f.write(f"start {ctx.attempt} {os.getpid()} {time.time():.3f}\n")
    time.sleep(seconds)
    with open(payload["log"], "a") as f:
        f.write(f"end {ctx.attempt} {os.getpid()} {time.time():.3f}\n")


@task("echo_payload", max_attempts=1)
def echo_payload(payload, ctx):
    """Writes the payload as the handler got it (json.dumps keeps its key order, its integers
    and its floats as they are) to the file `payload["out"]`, and records it as the result."""
    import json

    with open(payload["out"], "w") as f:
        f.write(json.dumps(payload))
    ctx.record_result(payload)


def runs(path) -> list[tuple[str, int]]:
    """The (start|end, attempt) lines record_runs wrote, in order."""
    try:
        with open(path) as f:
            lines = f.read().split("\n")
    except FileNotFoundError:
        return []
    return [(parts[0], int(parts[1])) for parts in (line.split() for line in lines) if parts]


def _append(path: str, line: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


@task("keyed_sleep", concurrency_key="key", concurrency_limit=1, max_attempts=5)
def keyed_sleep(payload, ctx):
    """At most one per payload["key"] at once. Sleeps, then appends `key job_id attempt start end`
    (time.time()) to payload["log"], so a test can check from the jobs' own times that no two of
    one key overlapped."""
    started = time.time()
    # "later_seconds": how long attempts after the first sleep (a first attempt killed mid-run).
    later = payload.get("later_seconds")
    time.sleep(later if later is not None and ctx.attempt > 1 else payload.get("seconds", 0.05))
    if payload.get("log"):
        _append(payload["log"], f"{payload['key']} {ctx.job_id} {ctx.attempt} {started:.6f} {time.time():.6f}\n")


@task("keyed_pair", concurrency_key="key", concurrency_limit=2)
def keyed_pair(payload, ctx):
    """At most two per payload["key"] at once."""
    time.sleep(payload.get("seconds", 0))


@task("record_start", max_attempts=1)
def record_start(payload, ctx):
    """Appends `task_key job_id time.time()` to payload["log"] when it starts (which process ran
    what, and when)."""
    _append(payload["log"], f"{ctx.task_key} {ctx.job_id} {time.time():.6f} {os.getpid()}\n")
    time.sleep(payload.get("seconds", 0))


@task("until_lease_lost", max_attempts=2)
def until_lease_lost(payload, ctx):
    """Waits (up to payload["seconds"]) for ctx.lease_lost, logs `lease_lost_seen=<bool>`, then
    returns normally: its worker then tries to complete it, which the fence must refuse."""
    import logging

    told = ctx.lease_lost.wait(payload.get("seconds", 30))
    logging.getLogger("jobqueue.testkit").warning("event=handler_saw lease_lost_seen=%s job_id=%s", told, ctx.job_id)


@task("rate_five", rate_limit="5/s", max_attempts=1)
def rate_five(payload, ctx):
    """At most 5 starts per second of the database clock, across every worker."""
    time.sleep(payload.get("seconds", 0))


@task("rate_one", rate_limit="1/s", max_attempts=1)
def rate_one(payload, ctx):
    """At most 1 start per second of the database clock."""


@task("rate_per_customer", rate_limit="2/h", rate_key="customer", max_attempts=1)
def rate_per_customer(payload, ctx):
    """At most 2 starts per hour for each payload["customer"]."""
