"""The soak's held-rows fault holds the rows it says it holds. Its locking read sorted the ready
rows of every queue (ORDER BY priority, id: a filesort), and a locking read that sorts locks
every row it reads, not the few it returns: "holding 5 ready rows" held all of them, so workers
found nothing to claim while it lasted and the fault tested something else than it said."""

from __future__ import annotations

import pymysql
import sqlalchemy as sa

from jobqueue.core import service
from jobqueue.core.db import create_engine
from soak import run as soak_run


def test_the_hold_locks_exactly_the_rows_it_reports(mysql_url, tmp_path, monkeypatch):
    engine = create_engine(mysql_url)
    ends: list = []
    url = sa.make_url(mysql_url)
    try:
        with engine.connect() as conn:
            service.enqueue_many(conn, [{"task": "noop", "task_key": f"k{i}"} for i in range(20)])
        soak = soak_run.Soak(soak_run.Plan.quick(), 1, tmp_path)
        monkeypatch.setattr(
            soak,
            "_connect",
            lambda own=True: pymysql.connect(
                host=url.host,
                port=url.port or 3306,
                user=url.username,
                password=url.password or "",
                database=url.database,
                autocommit=True,
            ),
        )
        soak.fault_hold_rows(lambda seconds, release: ends.append(release))
        assert soak.plan.hold_rows == 5 and "holding 5 ready rows" in soak.fault_log[-1]
        with engine.connect() as conn:
            cycle = service.claim_cycle(conn, [f"w:1:{i}" for i in range(20)], ["default"], lease_seconds=30)
        assert len(cycle.claimed) == 15 and cycle.skipped == 5, (len(cycle.claimed), cycle.skipped)
    finally:
        for release in ends:
            release()  # the held rows' transaction ends either way (the teardown drops the database)
        engine.dispose()
    assert soak.held_touched == []
