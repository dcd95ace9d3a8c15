"""Tasks the acceptance tests run inside real worker processes (--tasks testkit.tasks)."""

from __future__ import annotations

import time

from webapp.core.builtin_tasks import export_orders
from webapp.core.tasks import task


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


def runs(path) -> list[tuple[str, int]]:
    """The (start|end, attempt) lines record_runs wrote, in order."""
    try:
        with open(path) as f:
            lines = f.read().split("\n")
    except FileNotFoundError:
        return []
    return [(parts[0], int(parts[1])) for parts in (line.split() for line in lines) if parts]
