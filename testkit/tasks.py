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
