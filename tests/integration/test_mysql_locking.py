"""What only a server with row locks can show: SKIP LOCKED, NOWAIT, the claim's plan, deadlock
and lost-connection retries, and refusing servers that cannot keep the guarantees."""

from __future__ import annotations

import re
import threading
import time

import pytest
import sqlalchemy as sa

from jobqueue.core import db, migrate, preflight, repository, service
from jobqueue.core.errors import JobBusy, UnsupportedDatabase
from jobqueue.core.models import EmptyClaim, Status
from jobqueue.core.repository.claim import pick_statement
from jobqueue.core.schema import job_queue
from testkit.locks import hold_rows
from testkit.sql import seq_rows

jq = job_queue.c


def test_claim_skips_rows_held_by_a_paused_transaction_without_waiting(mysql_engine):
    with mysql_engine.connect() as conn:
        ids = [r.id for r in service.enqueue_many(conn, [{"task": "noop", "task_key": f"k{i}"} for i in range(10)])]
        lock_wait = conn.exec_driver_sql("SELECT @@innodb_lock_wait_timeout").scalar()
    holder = hold_rows(mysql_engine, ids[:3])
    try:
        with mysql_engine.connect() as conn:
            started = time.monotonic()
            got = service.claim(conn, "w", 4, ["default"], lease_seconds=30)
            elapsed = time.monotonic() - started
            assert [c.job.id for c in got] == ids[3:7]
            assert elapsed < 0.5 < lock_wait
            service.claim(conn, "w", 10, ["default"], lease_seconds=30)
            assert service.claim(conn, "w", 10, ["default"], lease_seconds=30) == []
            report = repository.claim.classify_empty(conn, ["default"])
            # A plain read still sees the held rows: ready-but-locked, not an empty queue.
            assert report.kind is EmptyClaim.CONTENDED and report.skipped == 3
    finally:
        holder.rollback()
        holder.close()
    with mysql_engine.connect() as conn:
        assert sorted(c.job.id for c in service.claim(conn, "w", 10, ["default"], lease_seconds=30)) == ids[:3]


def test_concurrent_claims_never_take_the_same_job(mysql_engine):
    with mysql_engine.connect() as conn:
        service.enqueue_many(conn, [{"task": "noop", "task_key": f"k{i}"} for i in range(300)])
    taken: list[int] = []
    lock = threading.Lock()

    def claimer(n):
        with mysql_engine.connect() as conn:
            while True:
                got = service.claim(conn, f"w{n}", 7, ["default"], lease_seconds=30)
                if not got:
                    return
                with lock:
                    taken.extend(c.job.id for c in got)

    threads = [threading.Thread(target=claimer, args=(n,)) for n in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(taken) == 300 and len(set(taken)) == 300


def test_claim_plan_uses_the_pick_index_without_filesort(mysql_engine, db_server):
    with mysql_engine.connect() as conn:
        # Plenty of finished rows around the ready ones, as in a table that has run for a while.
        conn.exec_driver_sql(
            "INSERT INTO job_queue (task_key, task_name, queue, priority, payload, status, run_at, attempts, "
            "max_attempts, created_at, updated_at, finished_at) "
            "SELECT CONCAT('done-', seq), 'noop', 'default', 0, '{}', 'done', UTC_TIMESTAMP(6), 1, 5, "
            f"UTC_TIMESTAMP(6), UTC_TIMESTAMP(6), UTC_TIMESTAMP(6) FROM {seq_rows(20000)}"
        )
        conn.commit()
        service.enqueue_many(conn, [{"task": "noop", "task_key": f"r{i}", "priority": i % 3} for i in range(200)])
        conn.exec_driver_sql("ANALYZE TABLE job_queue").all()
        for limit in (1, 10, 50):
            plan = repository.claim.explain_claim(conn, "default", limit)
            assert len(plan) == 1, plan
            row = plan[0]
            assert row["key"] == "ix_ready_pick", plan
            assert "filesort" not in (row["Extra"] or "").lower(), plan
            if db_server == "mysql":
                # MySQL estimates a `ref` range from index statistics (half the table: two
                # statuses), not by diving into it: what it reads is the measure.
                sql = str(
                    pick_statement("mysql", True)
                    .params(queue="default", limit=limit)
                    .compile(dialect=conn.dialect, compile_kwargs={"literal_binds": True})
                )
                analyzed = conn.exec_driver_sql("EXPLAIN ANALYZE " + sql).scalar()
                assert re.search(
                    rf"Index lookup on job_queue using ix_ready_pick .*actual time=\S+ rows={limit} ", analyzed
                ), analyzed
            else:
                assert int(row["rows"]) < 1000, plan  # narrowed to the ready range, not the table


def test_nowait_operator_action_answers_busy_at_once(mysql_engine):
    with mysql_engine.connect() as conn:
        (res,) = service.enqueue_many(conn, [{"task": "noop", "task_key": "busy"}])
    holder = hold_rows(mysql_engine, [res.id])
    try:
        with mysql_engine.connect() as conn:
            for action in (lambda: service.requeue_job(conn, res.id), lambda: service.fail_job(conn, res.id, "x")):
                started = time.monotonic()
                with pytest.raises(JobBusy):
                    action()
                assert time.monotonic() - started < 0.5
    finally:
        holder.rollback()
        holder.close()
    with mysql_engine.connect() as conn:
        assert service.fail_job(conn, res.id, "now").after is Status.FAILED


def test_lost_connection_is_retried(mysql_engine):
    with mysql_engine.connect() as conn:
        service.enqueue(conn, "noop", "a")
        conn_id = conn.exec_driver_sql("SELECT CONNECTION_ID()").scalar()
        conn.commit()
        with mysql_engine.connect() as killer:
            killer.exec_driver_sql(f"KILL CONNECTION {conn_id}")
        # The same Connection object: the first statement finds the socket dead, the retry
        # reconnects and the claim goes through.
        got = service.claim(conn, "w", 1, ["default"], lease_seconds=30)
        assert [c.job.task_key for c in got] == ["a"]
        assert conn.exec_driver_sql("SELECT CONNECTION_ID()").scalar() != conn_id


def test_deadlock_is_retried():
    calls = []

    class FakeOrig(Exception):
        pass

    def flaky(conn):
        calls.append(1)
        if len(calls) < 3:
            raise sa.exc.OperationalError("UPDATE", {}, FakeOrig(db.ER_LOCK_DEADLOCK, "Deadlock found"))
        return "ok"

    engine = db.create_engine("sqlite://")
    with engine.connect() as conn:
        assert db.transaction(conn, flaky, what="test") == "ok"
    assert len(calls) == 3


def test_init_db_twice_and_concurrently(mysql_url):
    engine = db.create_engine(mysql_url)
    results = []
    threads = [threading.Thread(target=lambda: results.append(migrate.init_db(engine))) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [after for _, after in results] == [migrate.head_revision()] * 3
    engine.dispose()


def test_myisam_queue_table_is_refused(mysql_url):
    engine = db.create_engine(mysql_url)
    with engine.connect() as conn:
        conn.exec_driver_sql("ALTER TABLE job_queue ENGINE=MyISAM")
    with pytest.raises(UnsupportedDatabase, match="InnoDB"):
        preflight.require_supported(engine)
    with pytest.raises(UnsupportedDatabase, match="job_queue is MyISAM"):
        migrate.init_db(engine)
    engine.dispose()


def test_server_version_is_read(mysql_engine, db_server):
    info = preflight.require_supported(mysql_engine)
    assert info.flavour == ("mysql" if db_server == "mysql" else "mariadb") and info.supports_skip_locked


def test_the_preflight_is_three_statements(mysql_engine):
    # The first thing a worker sends: one round trip per fact made it eleven.
    with mysql_engine.connect() as conn:  # the connection's own set-up is not the preflight's
        conn.rollback()
    sent = []
    sa.event.listen(
        mysql_engine, "before_cursor_execute", lambda conn, cursor, statement, *rest: sent.append(statement)
    )
    preflight.require_supported(mysql_engine)
    assert len(sent) == 3, sent


@pytest.mark.parametrize("step", ["promote", "reap"])
def test_the_reapers_statements_hold_no_row_but_the_ones_they_change(mysql_url, step):
    """While the promoter or the reaper is inside its transaction, every running job they have
    no business with can still be completed (its row is not locked): a locking range scan that
    finds nothing still locks the first row past its range, and a worker's completion of that
    running job came back BUSY (CI: a running job the dashboard kept showing as running)."""
    due_engine = sa.create_engine(mysql_url)
    probe_engine = sa.create_engine(mysql_url)
    try:
        with due_engine.connect() as conn:
            service.enqueue_many(conn, [{"task": "noop", "task_key": f"run-{i}"} for i in range(40)])
            running = [c.lease.job_id for c in service.claim(conn, "w", 40, ["default"], lease_seconds=300)]
            # Work for the step, so that its statements run through: one job due for promotion, one
            # lease run out.
            due = service.enqueue(conn, "noop", "due", delay=0.001).id
            expired = service.enqueue(conn, "noop", "expired").id
            service.claim(conn, "w2", 1, ["default"], lease_seconds=0.001)
        time.sleep(0.05)
        held_back: dict[str, list[int]] = {}

        def probe(conn, cursor, statement, parameters, context, executemany):
            # After each statement of the step, inside its transaction: which running jobs of
            # other workers could not be locked right now?
            if not conn.in_transaction():
                return
            with probe_engine.connect() as other:
                mine = repository.leases.lock_leased(other, running)
                other.rollback()
            missing = sorted(set(running) - set(mine))
            if missing:
                held_back[statement.split(" FROM ")[0][:60]] = missing

        sa.event.listen(due_engine, "after_cursor_execute", probe)
        try:
            with due_engine.connect() as conn:
                changed = (
                    repository.maintenance.promote_due(conn) if step == "promote" else repository.maintenance.reap(conn)
                )
        finally:
            sa.event.remove(due_engine, "after_cursor_execute", probe)
        assert held_back == {}
        with due_engine.connect() as conn:
            status = dict(conn.execute(sa.select(jq.id, jq.status).where(jq.id.in_([due, expired]))).all())
        if step == "promote":
            assert changed == 1 and status[due] == "ready"
        else:
            assert changed.reclaimed == 1 and status[expired] == "ready"
    finally:
        due_engine.dispose()
        probe_engine.dispose()
