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
    import functools

    import sqlalchemy as sa
    from sqlalchemy.sql import operators, visitors
    from sqlalchemy.sql.elements import BinaryExpression

    from jobqueue.core.db import transaction
    from jobqueue.core.models import Status
    from jobqueue.core.repository import claim
    from jobqueue.core.repository.common import jq

    def ready_queues(conn):
        return list(
            transaction(
                conn,
                lambda c: (
                    c.execute(sa.select(jq.queue).where(jq.status == Status.READY.value).distinct()).scalars().all()
                ),
                what="ready_queues",
            )
        )

    def paused_queues(conn):
        return set()

    with_pause_support = claim.classify_statement

    def drop_paused_filter(element, **kw):
        if (
            isinstance(element, BinaryExpression)
            and element.operator is operators.not_in_op
            and element.left.compare(jq.queue)
        ):
            return sa.true()  # and_() leaves a true() out of the SQL
        return None

    @functools.cache
    def without_paused_filter(queues, flavour_name):
        return visitors.replacement_traverse(with_pause_support(queues, flavour_name), {}, drop_paused_filter)

    def classify_statement(queues, flavour_name=None):
        """The repository's own statement with its paused-queue filter (`queue NOT IN <paused>`) taken
        out. Made once per (queues, flavour): the rewrite costs twice what building the statement
        does, and would be charged to the variant without pause support; cached, that variant
        skips the building instead, so the A/B errs on the side of charging pause support more."""
        return without_paused_filter(None if queues is None else tuple(queues), flavour_name)

    claim.ready_queues = ready_queues
    claim.paused_queues = paused_queues
    claim.classify_statement = classify_statement


if os.environ.get("BENCH_NO_PAUSE") == "1":
    _without_pause_support()
