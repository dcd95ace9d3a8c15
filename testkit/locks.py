"""Row locks held on purpose: the source document's "deliberately paused transaction"."""

from __future__ import annotations

import time

import sqlalchemy as sa

from jobqueue.core.repository.locks import PROBE_POLL
from testkit.procs import wait_until


def hold_rows(engine, ids):
    """A second transaction holding FOR UPDATE on `ids`, not committing (the paused transaction).
    Returns its connection once the server's lock tables show it (InnoDB refreshes INNODB_TRX when it
    was last read over 0.1 s ago; the Locks page is that picture); roll it back (or close it) to let go."""
    conn = engine.connect()
    conn.begin()
    # FORCE INDEX: on a table this small the optimizer would rather scan the whole table, and a
    # locking scan locks every row it reads, not only the matching ones.
    got = (
        conn.execute(
            sa.text("SELECT id FROM job_queue FORCE INDEX (PRIMARY) WHERE id IN :ids FOR UPDATE").bindparams(
                sa.bindparam("ids", expanding=True)
            ),
            {"ids": list(ids)},
        )
        .scalars()
        .all()
    )
    assert sorted(got) == sorted(ids)
    time.sleep(PROBE_POLL)
    return conn


def wait_for_lock_tables(predicate, message: str, timeout: float = 15.0):
    """wait_until for a predicate that reads the server's lock tables (the inspector, row_lock):
    InnoDB refreshes INNODB_TRX only when it was last read more than 0.1 s ago, so a faster poll
    reads the picture from before the wait began for as long as it polls."""
    return wait_until(predicate, timeout=timeout, interval=PROBE_POLL, message=message)
