"""What finishing a job sets off, run in the transaction that finished it: its blocked children
(dependencies.py) and its batch's counters and callbacks (batches.py).

Only for jobs whose row said has_dependents when the finishing transaction locked it: the flag
that every finishing path reads with the lock it takes anyway, so a job with no children and no
batch pays nothing.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from . import batches, dependencies
from .common import jq


def settle(c: Connection, ids: Iterable[int]) -> None:
    """For jobs (with has_dependents) this transaction finished, or moved out of a finished state."""
    ids = sorted(set(ids))
    if ids:
        cancelled = dependencies.settle(c, ids)
        batches.settle(c, [*ids, *cancelled])


def flagged(c: Connection, ids: Sequence[int]) -> list[int]:
    """Of `ids`, those with has_dependents (for the finishing paths that did not read the flag
    with their lock: operator actions and the reaper, none of them on the hot path)."""
    if not ids:
        return []
    return list(c.execute(sa.select(jq.id).where(jq.id.in_(list(ids)), jq.has_dependents.is_(True))).scalars())


def settle_finished(c: Connection, ids: Sequence[int]) -> None:
    settle(c, flagged(c, ids))
