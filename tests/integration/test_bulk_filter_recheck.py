"""A filter bulk action re-checks the whole filter under its lock (issue 25, defect 8): a job that
left the filtered status between the page read and its batch is left alone."""

from __future__ import annotations

import pytest
import sqlalchemy as sa
from sqlalchemy import event

from jobqueue.core import service
from jobqueue.core.models import Status
from jobqueue.core.repository.operator import JobFilter
from jobqueue.core.schema import job_queue
from testkit.procs import jobqueue as jobqueue_cli

jq = job_queue.c


@pytest.fixture
def engine(mysql_url):
    from jobqueue.core.db import create_engine

    eng = create_engine(mysql_url, pool_size=4)
    yield eng
    eng.dispose()


def statuses(engine) -> dict[str, str]:
    with engine.connect() as conn:
        return dict(conn.execute(sa.select(jq.task_key, jq.status)).all())


@pytest.mark.parametrize("job_filter", [JobFilter(status=Status.FAILED), JobFilter(status=Status.FAILED, queue="mail")])
def test_a_job_that_left_the_filter_after_the_page_read_is_left_alone(engine, mysql_url, job_filter):
    with engine.connect() as conn:
        ids = {key: service.enqueue(conn, "noop", key, queue="mail").id for key in ("f-1", "f-2", "f-3")}
    with engine.begin() as conn:
        conn.execute(sa.update(job_queue).values(status="failed", finished_at=sa.func.utc_timestamp(6)))
    moved = []

    def after_the_page_read(conn, cursor, statement, parameters, context, executemany):
        # The batch's page was just read (the filter's ids, newest first): another process
        # requeues one of them (failed -> ready, still eligible for cancel, no longer failed).
        if not moved and "ORDER BY job_queue.id DESC" in statement:
            moved.append(jobqueue_cli(mysql_url, "requeue", str(ids["f-2"])))

    event.listen(engine, "after_cursor_execute", after_the_page_read)
    try:
        with engine.connect() as conn:
            result = service.bulk_action(conn, "cancel", actor="tester", job_filter=job_filter)
    finally:
        event.remove(engine, "after_cursor_execute", after_the_page_read)
    assert moved and moved[0].returncode == 0, moved and moved[0].stderr
    assert statuses(engine) == {"f-1": "cancelled", "f-2": "ready", "f-3": "cancelled"}
    assert (result.changed, result.skipped, result.busy) == (2, 1, 0)
