"""The jobs list's `batch` filter: a batch's members, with every other filter, keyset pages both
ways, counts and bulk actions, on each server (read through ix_batch_member) and on SQLite."""

from __future__ import annotations

import pytest

from jobqueue import JobQueue
from jobqueue.core import repository, service
from jobqueue.core.models import Status
from jobqueue.core.repository.operator import JobFilter
from jobqueue.core.validation import job_query
from testkit.sql import explain, seq_rows, statements_sent


def members_and_others(engine) -> tuple[list[int], list[int]]:
    """Batch "b" has m0..m6 (m0..m2 on queue "mail"), with outsiders enqueued between them."""
    q = JobQueue(engine)
    inside, outside = [], []
    with q.batch("b") as b:
        for i in range(7):
            inside.append(b.enqueue("noop", f"m{i}", queue="mail" if i < 3 else None).id)
            outside.append(q.enqueue("noop", f"o{i}").id)
    with q.batch("other") as b:
        outside.append(b.enqueue("noop", "x0").id)
    return inside, outside


def ids(page) -> list[int]:
    return [j.id for j in page.jobs]


def test_batch_filter_pages_through_the_members_only(engine):
    inside, _ = members_and_others(engine)
    newest_first = sorted(inside, reverse=True)
    with engine.connect() as conn:
        f = JobFilter(batch="b")
        first = repository.reads.page_jobs(conn, f, limit=3)
        assert ids(first) == newest_first[:3] and (first.matches, first.capped) == (7, False)
        second = repository.reads.page_jobs(conn, f, before=first.older, limit=3)
        assert ids(second) == newest_first[3:6]
        last = repository.reads.page_jobs(conn, f, before=second.older, limit=3)
        assert ids(last) == newest_first[6:] and last.older is None
        back = repository.reads.page_jobs(conn, f, after=second.newer, limit=3)
        assert ids(back) == newest_first[:3]
        assert repository.reads.count_matching(conn, f) == (7, False)


def test_batch_filter_with_the_other_filters(engine):
    inside, _ = members_and_others(engine)
    with engine.connect() as conn:
        mail = repository.reads.page_jobs(conn, JobFilter(batch="b", queue="mail"))
        assert ids(mail) == sorted(inside[:3], reverse=True)
        assert ids(repository.reads.page_jobs(conn, JobFilter(batch="b", key_prefix="m6"))) == [inside[6]]
        assert ids(repository.reads.page_jobs(conn, JobFilter(batch="b", status=Status.DONE))) == []
        assert ids(repository.reads.page_jobs(conn, JobFilter(batch="b", task="noop"), limit=2)) == inside[:-3:-1]
        found = repository.reads.page_jobs(conn, JobFilter(batch="b", search="m4"))
        assert ids(found) == [inside[4]]
        assert repository.reads.count_matching(conn, JobFilter(batch="b"), statuses=["ready"], below=inside[3]) == (
            3,
            False,
        )
        assert ids(repository.reads.page_jobs(conn, JobFilter(batch="nosuchbatch"))) == []
        assert repository.reads.count_matching(conn, JobFilter(batch="nosuchbatch")) == (0, False)


def test_bulk_cancel_over_a_batch_leaves_the_rest(engine):
    inside, outside = members_and_others(engine)
    with engine.connect() as conn:
        result = service.bulk_action(conn, "cancel", actor="t", job_filter=JobFilter(batch="b"), batch_size=2)
        assert (result.changed, result.finished) == (7, True)
        statuses = {j.id: j.status for j in repository.reads.jobs_by_id(conn, inside + outside)}
        shown = repository.batches.show(conn, "b")
    assert {statuses[i] for i in inside} == {Status.CANCELLED}
    assert {statuses[i] for i in outside} == {Status.READY}
    assert (shown["cancelled"], shown["state"]) == (7, "finished")


def test_batch_is_a_query_argument_and_describes_itself():
    query = job_query({"batch": "nightly", "status": "failed"})
    assert query.job_filter.batch == "nightly"
    assert query.job_filter.args() == {"status": "failed", "batch": "nightly"}
    assert query.job_filter.terms() == "status=failed batch=nightly"


def test_unknown_batch_key_matches_nothing_without_error(engine):
    with engine.connect() as conn:
        assert repository.reads.page_jobs(conn, JobFilter(batch="x" * 64)).jobs == []


@pytest.mark.servers_only
def test_a_batch_page_reads_the_batch_entries_not_the_table(mysql_engine):
    """An old batch under 20,000 newer jobs: its page and counts read the batch's
    entries of ix_batch_member and each member's row by primary key (EXPLAIN of the statements
    sent), in job_id order with no sort."""
    with mysql_engine.connect() as conn:
        conn.exec_driver_sql(
            "INSERT INTO job_batch (batch_key, state, total, done, failed, cancelled, created_at) "
            "VALUES ('old', 'open', 0, 0, 0, 0, UTC_TIMESTAMP(6))"
        )
        for prefix, n in (("m:", 500), ("x:", 20_000)):
            conn.exec_driver_sql(
                "INSERT INTO job_queue (task_key, task_name, queue, priority, payload, status, run_at, attempts, "
                f"max_attempts, created_at, updated_at) SELECT CONCAT('{prefix}', seq), 'noop', 'default', 0, '{{}}', "
                f"'ready', UTC_TIMESTAMP(6), 0, 3, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6) FROM {seq_rows(n)}"
            )
        conn.exec_driver_sql(
            "INSERT INTO job_batch_member (job_id, batch_id) SELECT id, (SELECT id FROM job_batch) "
            "FROM job_queue WHERE task_key LIKE 'm:%%'"
        )
        conn.exec_driver_sql("ANALYZE TABLE job_queue, job_batch_member")
        conn.commit()
        f = JobFilter(batch="old", status=Status.READY)

        def run():
            page = repository.reads.page_jobs(conn, f)
            assert len(page.jobs) == 50 and page.matches == 500 and page.jobs[0].task_key == "m:500"
            assert repository.reads.count_matching(conn, f, statuses=["ready"]) == (500, False)

        sent = statements_sent(mysql_engine, run, lambda s: "ix_batch_member" in s)
        assert len(sent) == 3  # the page, its count, the count of a bulk confirmation
        for stmt in sent:
            plan = explain(conn, stmt.replace("%", "%%"))
            tables = [(r["table"], r["key"]) for r in plan if r["table"] in ("job_batch_member", "job_queue")]
            assert tables == [("job_batch_member", "ix_batch_member"), ("job_queue", "PRIMARY")], plan
            assert not any("filesort" in (r["Extra"] or "") for r in plan), plan
