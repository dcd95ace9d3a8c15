"""Row locks held on purpose: the source document's "deliberately paused transaction"."""

from __future__ import annotations

import time

import sqlalchemy as sa

from jobqueue.core.repository.locks import PROBE_POLL


def hold_rows(engine, ids):
    """A second transaction holding FOR UPDATE on `ids`, not committing (the paused transaction).
    Returns its connection once the server's lock tables show it (InnoDB refreshes INNODB_TRX at
    most every 0.1 s; the Locks page is that picture); roll it back (or close it) to let go."""
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
