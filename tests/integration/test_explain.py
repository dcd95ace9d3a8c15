"""`jobqueue explain`: why a job is (not) running, each reason made to happen for real.

The row lock is held by a second real connection (SELECT ... FOR UPDATE, left open); the expired
lease belongs to a real worker process that was SIGKILLed while running the job."""

from __future__ import annotations

import json
import signal
import time

import pytest
import sqlalchemy as sa

from jobqueue.core import repository, service
from jobqueue.core.errors import InvalidState, JobNotFound
from jobqueue.core.models import Status
from jobqueue.core.schema import job_queue
from testkit.locks import hold_rows, wait_for_lock_tables
from testkit.procs import WorkerProcess, jobqueue, wait_until


def explain(engine, job_id):
    with engine.connect() as conn:
        return repository.explain.explain(conn, job_id)


def reason(explanation, code):
    found = [r for r in explanation.reasons if r.code == code]
    assert found, f"no {code} in {explanation.as_dict()}"
    return found[0].as_dict()


def row(engine, job_id):
    with engine.connect() as conn:
        return dict(conn.execute(sa.select(job_queue).where(job_queue.c.id == job_id)).one()._mapping)


def enqueue(engine, key, task="slow_noop", payload=None, **kw):
    with engine.connect() as conn:
        return service.enqueue(conn, task, key, payload or {}, **kw).id


def serve(engine, process_id, queues="*"):
    """A worker process row with a fresh heartbeat, as a live worker keeps it."""
    with engine.connect() as conn:
        repository.processes.register_process(
            conn, process_id=process_id, host="h", pid=1, kind="worker", concurrency=1, queues=queues
        )


# --- a row held by another transaction (the job that "vanishes") ------------------------------------


def test_a_held_row_names_exactly_the_connection_that_holds_it(mysql_url, mysql_engine):
    first = enqueue(mysql_engine, "a")
    held = enqueue(mysql_engine, "b")
    serve(mysql_engine, "h:1")
    holder = hold_rows(mysql_engine, [held])
    try:
        holder_id = holder.exec_driver_sql("SELECT CONNECTION_ID()").scalar()
        before = row(mysql_engine, held)
        started = time.monotonic()
        out = jobqueue(mysql_url, "explain", str(held), "--json")
        took = time.monotonic() - started
        assert out.returncode == 0, out.stderr
        data = json.loads(out.stdout)
        assert data["job_id"] == held and data["status"] == "ready"
        assert data["reasons"][0]["code"] == "locked_by_transaction"
        locked = data["reasons"][0]
        assert locked["connection_id"] == holder_id
        assert locked["account"].startswith("root@") and locked["transaction_state"] == "RUNNING"
        assert locked["transaction_age_seconds"] is not None and "runnable" not in [r["code"] for r in data["reasons"]]
        # The holder sits idle in its transaction: said so on every server (MySQL keeps the last
        # statement of an idle connection, which read as "running SELECT ..." there).
        assert "it is idle in its transaction" in locked["detail"] and "it is running" not in locked["detail"], locked[
            "detail"
        ]
        # A whole command (interpreter start included): far below the server's 50 s or the
        # engine's 5 s lock wait, so the probe did not wait on the lock.
        print(f"explain of a held row: {took:.2f} s as a command")
        assert took < 5
        assert row(mysql_engine, held) == before  # read, never changed

        # The next claims pass it by (SKIP LOCKED) and take the other job.
        with mysql_engine.connect() as conn:
            assert [c.job.id for c in service.claim(conn, "w:1", 2, ["default"], lease_seconds=30)] == [first]
            # Ending the holder frees the row, and the next claim takes it.
            killed = service.kill_connection(conn, holder_id, actor="test")
            assert killed.jobs == (held,)
            wait_for_lock_tables(lambda: not repository.locks.row_lock(conn, held).held, "row let go")
            assert [c.job.id for c in service.claim(conn, "w:2", 1, ["default"], lease_seconds=30)] == [held]
            (audit,) = [a for a in repository.operator.list_audit(conn, limit=5) if a["action"] == "kill"]
        assert (
            audit["actor"] == "test" and audit["job_id"] == held and f"KILL CONNECTION {holder_id}" in audit["detail"]
        )
        holder.invalidate()  # the server ended it
    finally:
        holder.close()


def test_the_probe_waits_about_a_second_at_most_and_changes_no_setting_of_the_pool(mysql_engine):
    held = enqueue(mysql_engine, "a")
    with mysql_engine.connect() as conn:
        global_before = conn.exec_driver_sql("SELECT @@global.innodb_lock_wait_timeout").scalar()
    holder = hold_rows(mysql_engine, [held])
    try:
        timings = []
        for _ in range(3):
            started = time.monotonic()
            lock = explain(mysql_engine, held)
            timings.append(time.monotonic() - started)
            assert lock.codes[0] == "locked_by_transaction"
        print("explain of a held row, in process: " + ", ".join(f"{t * 1000:.0f} ms" for t in timings))
        assert max(timings) < 5
    finally:
        holder.close()
    with mysql_engine.connect() as conn:
        assert conn.exec_driver_sql("SELECT @@global.innodb_lock_wait_timeout").scalar() == global_before
        # Every pooled connection keeps the engine's own lock wait (the probe's connection is
        # thrown away, not returned with 1 s).
        assert conn.exec_driver_sql("SELECT @@session.innodb_lock_wait_timeout").scalar() == 5


def test_only_a_connection_holding_job_rows_may_be_killed(mysql_engine):
    enqueue(mysql_engine, "a")
    other = mysql_engine.connect()
    try:
        other_id = other.exec_driver_sql("SELECT CONNECTION_ID()").scalar()
        with mysql_engine.connect() as conn, pytest.raises(InvalidState, match="holds no job_queue rows"):
            service.kill_connection(conn, other_id, actor="test")
        assert other.exec_driver_sql("SELECT 1").scalar() == 1  # still there
    finally:
        other.close()


def test_the_lock_report_lists_the_holder_with_its_jobs(mysql_engine):
    ids = [enqueue(mysql_engine, f"k{i}") for i in range(3)]
    with mysql_engine.connect() as conn:
        repository.locks.lock_report(conn)  # as the test before may have: the server caches the picture
    holder = hold_rows(mysql_engine, ids[1:])
    try:
        holder_id = holder.exec_driver_sql("SELECT CONNECTION_ID()").scalar()
        with mysql_engine.connect() as conn:
            report = repository.locks.lock_report(conn)
        assert report.unavailable is None
        mine = [t for t in report.transactions if t.connection_id == holder_id]
        assert len(mine) == 1 and mine[0].jobs == tuple(ids[1:]) and mine[0].rows_locked >= 2
    finally:
        holder.close()


def test_a_lock_taken_a_moment_ago_is_named_too(mysql_engine):
    """InnoDB's INNODB_TRX is a picture refreshed at most every 0.1 s: a row locked just after
    someone read it (here the lock report) is still named by explain, not "let go while we looked"."""
    job = enqueue(mysql_engine, "fresh")
    with mysql_engine.connect() as conn:
        for _ in range(5):
            repository.locks.lock_report(conn)  # the picture is read, so cached, now
            holder = mysql_engine.connect()
            try:
                holder.begin()
                holder.execute(sa.text("SELECT id FROM job_queue WHERE id = :id FOR UPDATE"), {"id": job})
                holder_id = holder.exec_driver_sql("SELECT CONNECTION_ID()").scalar()
                lock = repository.locks.row_lock(conn, job)
                assert lock.held and lock.unknown_why is None, lock
                assert [t.connection_id for t in lock.holders] == [holder_id]
            finally:
                holder.close()


# --- the other reasons ------------------------------------------------------------------------------


def test_runnable_counts_the_ready_jobs_ahead_in_claim_order(engine):
    ids = [enqueue(engine, f"k{i}") for i in range(3)]
    urgent = enqueue(engine, "urgent", priority=-5)
    serve(engine, "h:1", "default,other")
    e = explain(engine, ids[2])
    assert e.codes == ["runnable"]
    assert reason(e, "runnable")["ahead"] == 3 and not reason(e, "runnable")["ahead_capped"]
    assert reason(explain(engine, urgent), "runnable")["ahead"] == 0


def test_scheduled_and_retry_backoff(engine):
    later = enqueue(engine, "later", delay=3600)
    e = explain(engine, later)
    assert e.status is Status.SCHEDULED and e.codes[0] == "scheduled"
    assert reason(e, "scheduled")["ready_in_seconds"] > 3500

    retried = enqueue(engine, "retried")
    with engine.connect() as conn:
        (claimed,) = service.claim(conn, "h:1:1", 1, ["default"], lease_seconds=30)
        service.retry(conn, claimed.lease, "boom: the API said 503", 600)
    e = explain(engine, retried)
    backoff = reason(e, "retry_backoff")
    assert e.codes[0] == "retry_backoff" and backoff["attempt"] == 1 and "503" in backoff["last_error"]
    assert 500 < backoff["ready_in_seconds"] <= 600


def test_a_paused_queue_and_no_live_worker(engine):
    job = enqueue(engine, "k", queue="billing")
    serve(engine, "h:1", "default")
    e = explain(engine, job)
    missing = reason(e, "no_live_worker")
    assert missing["processes"] == [{"process": "h:1", "kind": "worker", "queues": ["default"], "state": None}]
    serve(engine, "h:2", "billing")
    assert explain(engine, job).codes == ["runnable"]
    with engine.connect() as conn:
        service.pause_queue(conn, "billing", actor="alice")
    e = explain(engine, job)
    paused = reason(e, "queue_paused")
    assert e.codes == ["queue_paused"] and paused["by"] == "alice" and paused["since"]


def test_a_full_concurrency_key_names_the_jobs_holding_it(engine):
    first = enqueue(engine, "a", task="keyed_sleep", payload={"key": "A"})
    second = enqueue(engine, "b", task="keyed_sleep", payload={"key": "A"})
    serve(engine, "h:1")
    with engine.connect() as conn:
        assert [c.job.id for c in service.claim(conn, "h:1:1", 2, ["default"], lease_seconds=30)] == [first]
    limit = reason(explain(engine, second), "concurrency_limit")
    assert limit["key"] == "keyed_sleep:A" and limit["limit"] == 1
    assert [h["job_id"] for h in limit["holders"]] == [first] and limit["holders"][0]["owner"] == "h:1:1"


def test_a_held_lease_and_terminal_states(engine):
    serve(engine, "h:1")
    running = enqueue(engine, "run")
    with engine.connect() as conn:
        (claimed,) = service.claim(conn, "h:1:3", 1, ["default"], lease_seconds=60)
    held = reason(explain(engine, running), "lease_held")
    assert held["owner"] == "h:1:3" and held["process"] == "h:1" and held["owner_alive"] is True
    assert 50 < held["lease_left_seconds"] <= 60

    with engine.connect() as conn:
        service.complete(conn, claimed.lease)
    assert explain(engine, running).codes == ["done"]

    once = enqueue(engine, "once", task="fail_first_attempt")
    with engine.connect() as conn:
        (claimed,) = service.claim(conn, "h:1:1", 1, ["default"], lease_seconds=60)
        service.fail(conn, claimed.lease, "ValueError: bad row 7")
    exhausted = reason(explain(engine, once), "attempts_exhausted")
    assert exhausted["last_error"] == "ValueError: bad row 7" and exhausted["attempts"] == 1

    by_hand = enqueue(engine, "by-hand")
    cancelled = enqueue(engine, "cancelled")
    with engine.connect() as conn:
        service.fail_job(conn, by_hand, "not wanted", actor="bob")
        service.cancel_job(conn, cancelled, actor="bob")
    assert explain(engine, by_hand).codes == ["failed"]
    assert explain(engine, cancelled).codes == ["cancelled"]


def test_no_such_job(engine, db_url):
    with pytest.raises(JobNotFound):
        explain(engine, 999)
    out = jobqueue(db_url, "explain", "999", "--json")
    assert out.returncode == 4 and "not found" in out.stderr


@pytest.mark.slow
def test_a_sigkilled_workers_expired_lease_and_the_reaper_taking_it_back(mysql_url, mysql_engine, tmp_path):
    job = enqueue(mysql_engine, "held", task="hold_first_attempt", payload={"seconds": 60})
    worker = WorkerProcess(mysql_url, tmp_path, "doomed", "--concurrency", "1", "--lease-seconds", "2")
    try:
        wait_until(lambda: row(mysql_engine, job)["status"] == "running", timeout=30, message="job running")
        owner = row(mysql_engine, job)["lease_owner"]
        assert explain(mysql_engine, job).codes == ["lease_held"]
        worker.signal(signal.SIGKILL)
        worker.proc.wait(10)
        wait_until(lambda: explain(mysql_engine, job).codes[0] == "lease_expired", timeout=15, message="lease expired")
        expired = reason(explain(mysql_engine, job), "lease_expired")
        assert expired["owner"] == owner and expired["reaped_to"] == "ready"
        assert expired["owner_heartbeat_seconds_ago"] is not None
    finally:
        worker.kill()
    assert jobqueue(mysql_url, "reap").returncode == 0
    e = explain(mysql_engine, job)
    assert e.status is Status.READY and row(mysql_engine, job)["attempts"] == 1
