"""Tasks and switches for bench/mature.py, loaded by `jobqueue worker --tasks bench.mature_tasks`
(before bench.gate_tasks):

- `keyed_noop`: a no-op with a concurrency limit of 1 per payload["k"];
- with BENCH_NO_PAUSE=1, the worker runs without pause support, as before it existed: the ready
  queues and the empty-claim read without the paused-queue filter, and a worker with a list of
  queues never reads the paused set. The A/B measures what pause support costs the claim path.
"""

from __future__ import annotations

import os

from jobqueue.core.tasks import task


@task("keyed_noop", concurrency_key="k", concurrency_limit=1)
def keyed_noop(payload, ctx):
    """A no-op, at most one per payload["k"] at once."""


def _without_pause_support() -> None:
    import importlib

    import sqlalchemy as sa

    from jobqueue.core import repository
    from jobqueue.core.db import db_now, transaction
    from jobqueue.core.models import Status
    claim = importlib.import_module("jobqueue.core.repository.claim")   # the package's `claim` is the verb
    from jobqueue.core.repository.common import jq

    def ready_queues(conn):
        return list(transaction(conn, lambda c: c.execute(
            sa.select(jq.queue).where(jq.status == Status.READY.value).distinct()).scalars().all(), what="ready_queues"))

    def paused_queues(conn):
        return set()

    def classify_statement(queues, flavour_name=None):
        in_queues = (lambda q: q) if queues is None else (lambda q: q.where(jq.queue.in_(list(queues))))
        ready = in_queues(sa.select(sa.literal(1)).where(jq.status == Status.READY.value)).limit(1000).subquery()
        columns = [
            sa.select(sa.func.count()).select_from(ready).scalar_subquery().label("ready"),
            in_queues(sa.select(sa.func.min(jq.lease_until)).where(jq.status == Status.RUNNING.value))
            .scalar_subquery().label("next_lease_expiry"),
            in_queues(sa.select(sa.func.min(jq.run_at)).where(jq.status == Status.SCHEDULED.value))
            .scalar_subquery().label("next_scheduled"),
            db_now().label("now"),
        ]
        if flavour_name in ("mariadb", "mysql"):
            columns += [sa.literal_column(f"@@global.{flag}") for flag in claim.READ_ONLY_FLAGS[flavour_name]]
        return sa.select(*columns)

    for module in (repository, claim):
        module.ready_queues = ready_queues
        module.paused_queues = paused_queues
        module.classify_statement = classify_statement


if os.environ.get("BENCH_NO_PAUSE") == "1":
    _without_pause_support()
