"""The source document's four acceptance groups, with real worker processes on the real MariaDB:
same-row contention, empty queue, crash recovery, duplicate messages."""

from __future__ import annotations

import json
import os
import signal
import time
import uuid

import pytest
import sqlalchemy as sa

from jobqueue.core import repository, service
from jobqueue.core.db import create_engine
from jobqueue.core.models import Lease, Outcome, Status
from jobqueue.core.schema import job_attempt, job_queue, job_result
from testkit.procs import WorkerProcess, claimed_ids, cli_env, jobqueue, wait_until

pytestmark = pytest.mark.slow
jq = job_queue.c


def statuses(engine) -> dict[str, int]:
    with engine.connect() as conn:
        return dict(conn.execute(sa.select(jq.status, sa.func.count()).group_by(jq.status)).all())


def lock_waits(engine) -> int:
    """Transactions of this test's database waiting for a row lock right now (the server is
    shared: other databases' waits are not ours)."""
    with engine.connect() as conn:
        return conn.exec_driver_sql(
            "SELECT COUNT(*) FROM information_schema.INNODB_TRX t JOIN information_schema.PROCESSLIST p "
            "ON p.ID = t.trx_mysql_thread_id WHERE t.trx_state = 'LOCK WAIT' AND p.DB = DATABASE()"
        ).scalar()


def test_same_row_contention(mysql_url, mysql_engine, tmp_path):
    """3 worker processes, 12 jobs, a paused transaction holding the 3 oldest ready rows: each job
    is claimed exactly once, nobody waits on the held rows, and they are processed after the
    transaction ends."""

    def jobs(keys):
        return [{"task": "slow_noop", "task_key": f"job-{i}", "payload": {"seconds": 0.3}} for i in keys]

    with mysql_engine.connect() as conn:
        held = [r.id for r in service.enqueue_many(conn, jobs(range(3)))]
        lock_wait_timeout = conn.exec_driver_sql("SELECT @@GLOBAL.innodb_lock_wait_timeout").scalar()

    holder = mysql_engine.connect()
    holder.begin()
    holder.execute(
        sa.text("SELECT id FROM job_queue FORCE INDEX (PRIMARY) WHERE id IN :ids FOR UPDATE").bindparams(
            sa.bindparam("ids", expanding=True)
        ),
        {"ids": held},
    ).all()
    workers = [
        WorkerProcess(mysql_url, tmp_path, f"w{n}", "--concurrency", "2", "--lease-seconds", "30") for n in range(3)
    ]
    try:
        # All three are up and polling the held rows before the other nine arrive.
        for w in workers:
            w.wait_for_log(r"event=contended ")
        with mysql_engine.connect() as conn:
            ids = held + [r.id for r in service.enqueue_many(conn, jobs(range(3, 12)))]
        started = time.monotonic()
        samples = []
        while statuses(mysql_engine).get("done", 0) < 9:
            samples.append(lock_waits(mysql_engine))
            assert time.monotonic() - started < 20, statuses(mysql_engine)
            time.sleep(0.02)
        # Every other row was processed while the held ones stayed locked, far sooner than a
        # single lock wait would have taken.
        elapsed = time.monotonic() - started
        assert elapsed < lock_wait_timeout
        for _ in range(20):
            samples.append(lock_waits(mysql_engine))
            time.sleep(0.02)
        assert max(samples) == 0, "a worker waited on a row lock"
        with mysql_engine.connect() as conn:
            for job_id in held:
                job = repository.reads.get_job(conn, job_id)
                assert job.status is Status.READY and job.attempts == 0
        # The workers saw the held rows as contended (3 skipped), not as an empty queue.
        assert all("skipped=3" in w.log() for w in workers)
    finally:
        holder.rollback()
        holder.close()
    try:
        wait_until(lambda: statuses(mysql_engine) == {"done": 12}, timeout=15, message="all 12 jobs done")
    finally:
        codes = [w.stop() for w in workers]
    assert codes == [0, 0, 0]
    counts = claimed_ids(*workers)
    assert sorted(counts) == sorted(ids) and set(counts.values()) == {1}, counts
    with mysql_engine.connect() as conn:
        rows = conn.execute(sa.select(jq.id, jq.attempts, jq.lease_owner)).all()
    assert {r.attempts for r in rows} == {1}
    assert len({r.lease_owner.split(":")[2] for r in rows}) == 3, "all three workers took part"
    for w in workers:
        assert "ERROR" not in w.log()


@pytest.fixture
def limited_user(mysql_url):
    """A MySQL account with table-level grants on the test database, which a test can revoke to
    provoke real SQL errors (table-level privilege changes apply to open connections at once)."""
    db = sa.engine.make_url(mysql_url).database
    user = f"jqt_{uuid.uuid4().hex[:10]}"
    password = uuid.uuid4().hex
    admin = create_engine(mysql_url)
    with admin.connect() as conn:
        tables = (
            conn.exec_driver_sql("SELECT table_name FROM information_schema.tables WHERE table_schema = DATABASE()")
            .scalars()
            .all()
        )

    def grant():
        with admin.connect() as conn:
            for table in tables:
                conn.exec_driver_sql(
                    f"GRANT SELECT, INSERT, UPDATE, DELETE ON `{db}`.`{table}` TO '{user}'@'127.0.0.1'"
                )

    def revoke():
        with admin.connect() as conn:
            conn.exec_driver_sql(f"REVOKE ALL PRIVILEGES ON `{db}`.`job_queue` FROM '{user}'@'127.0.0.1'")

    with admin.connect() as conn:
        conn.exec_driver_sql(f"CREATE USER '{user}'@'127.0.0.1' IDENTIFIED BY '{password}'")
    grant()
    url = sa.engine.make_url(mysql_url).set(username=user, password=password).render_as_string(hide_password=False)
    try:
        yield url, grant, revoke
    finally:
        with admin.connect() as conn:
            conn.exec_driver_sql(f"DROP USER IF EXISTS '{user}'@'127.0.0.1'")
        admin.dispose()


def test_empty_queue_is_idle_not_an_error_and_sql_errors_are_logged_and_survived(limited_user, mysql_url, tmp_path):
    url, grant, revoke = limited_user
    worker = WorkerProcess(url, tmp_path, "idle", "--concurrency", "3", "--idle-cap-seconds", "0.4")
    try:
        worker.wait_for_log(r"event=idle ")
        time.sleep(3)  # several backoff cycles at the cap
        assert worker.alive()
        log = worker.log()
        assert "ERROR" not in log and "sql_error" not in log
        # Idle is reported, but rate-limited: one line, not one per poll.
        assert log.count("event=idle ") == 1

        revoke()
        worker.wait_for_log(r"ERROR jobqueue\.worker event=sql_error .*1142")
        assert worker.alive()

        grant()
        engine = create_engine(mysql_url)
        with engine.connect() as conn:
            job = service.enqueue(conn, "noop", "after-recovery")
        wait_until(
            lambda: repository.reads.get_job(engine.connect(), job.id).status is Status.DONE,
            timeout=10,
            message="the worker to recover and run a job",
        )
        engine.dispose()
        assert worker.alive()
    finally:
        assert worker.stop() == 0


def test_crash_recovery_after_sigkill(mysql_url, mysql_engine, tmp_path):
    with mysql_engine.connect() as conn:
        job = service.enqueue(conn, "hold_first_attempt", "transcode-7", {"seconds": 120})
    a = WorkerProcess(mysql_url, tmp_path, "a", "--concurrency", "1", "--lease-seconds", "2")
    try:
        a.wait_for_log(rf"event=claim job_id={job.id} ")
        with mysql_engine.connect() as conn:
            held = repository.reads.get_job(conn, job.id)
        assert held.status is Status.RUNNING and held.attempts == 1
        a.signal(signal.SIGKILL)
        a.proc.wait(5)
    finally:
        a.kill()

    with mysql_engine.connect() as conn:
        # Nobody completes it, nobody returns it early: the lease is still running out.
        assert jobqueue(mysql_url, "reap").stdout.strip() == '{"failed": 0, "promoted": 0, "reclaimed": 0}'
        wait_until(
            lambda: (
                repository.reads.get_job(conn, job.id).lease_until
                < conn.exec_driver_sql("SELECT UTC_TIMESTAMP(6)").scalar()
            ),
            timeout=5,
            message="the lease to expire",
        )
        conn.rollback()
        out = json.loads(jobqueue(mysql_url, "reap").stdout)
        assert out["reclaimed"] == 1
        back = repository.reads.get_job(conn, job.id)
        assert back.status is Status.READY and back.attempts == 1 and back.lease_owner is None

    b = WorkerProcess(mysql_url, tmp_path, "b", "--concurrency", "1", "--lease-seconds", "2")
    try:
        b.wait_for_log(rf"event=complete job_id={job.id} .*attempt=2")
    finally:
        assert b.stop() == 0
    with mysql_engine.connect() as conn:
        done = repository.reads.get_job(conn, job.id)
        assert done.status is Status.DONE and done.attempts == 2 and ":b:" in done.lease_owner
        # The killed worker's late completion is refused by the fence and changes nothing.
        assert service.complete(conn, Lease(job.id, held.lease_owner, 1)) is Outcome.LEASE_LOST
        assert repository.reads.get_job(conn, job.id) == done
        history = conn.execute(sa.select(job_attempt.c.attempt, job_attempt.c.outcome, job_attempt.c.worker)).all()
    assert [(h.attempt, h.outcome, h.worker) for h in history] == [(1, "lease_expired", held.lease_owner)]


def test_duplicate_messages_give_one_result(mysql_url, mysql_engine, tmp_path):
    export_dir = tmp_path / "exports"
    env = cli_env(JOBQUEUE_EXPORT_DIR=str(export_dir))
    first = jobqueue(
        mysql_url,
        "enqueue",
        "export_then_hang",
        "--tasks",
        "testkit.tasks",
        "--key",
        "orders-2026-11",
        "--payload",
        '{"rows": 4}',
        env=env,
    )
    replay = jobqueue(
        mysql_url,
        "enqueue",
        "export_then_hang",
        "--tasks",
        "testkit.tasks",
        "--key",
        "orders-2026-11",
        "--payload",
        '{"rows": 4}',
        env=env,
    )
    assert first.returncode == replay.returncode == 0, (first.stderr, replay.stderr)
    first, replay_out = json.loads(first.stdout), json.loads(replay.stdout)
    assert first["duplicate"] is False and replay_out["duplicate"] is True and replay_out["id"] == first["id"]
    assert "event=duplicate_enqueue" in replay.stderr and "task_key=orders-2026-11" in replay.stderr
    job_id = first["id"]

    # Worker a does the export and records it, then stalls (SIGSTOP) before it can complete.
    a = WorkerProcess(mysql_url, tmp_path, "a", "--concurrency", "1", "--lease-seconds", "2", env=env)
    b = None
    try:
        wait_until(
            lambda: os.path.exists(export_dir) and any(p.suffix == ".csv" for p in export_dir.iterdir()),
            message="worker a to write the export",
        )
        with mysql_engine.connect() as conn:
            wait_until(lambda: repository.reads.get_result(conn, "orders-2026-11"), message="worker a's result row")
        a.signal(signal.SIGSTOP)
        # Worker b reaps the expired lease and runs the handler a second time.
        b = WorkerProcess(mysql_url, tmp_path, "b", "--concurrency", "1", "--lease-seconds", "2", env=env)
        b.wait_for_log(rf"event=complete job_id={job_id} .*attempt=2", timeout=20)
        a.signal(signal.SIGCONT)
        a.wait_for_log(rf"event=lease_lost .*job_id={job_id}")
    finally:
        if a.alive():
            a.signal(signal.SIGCONT)
        codes = [a.stop()] + ([b.stop()] if b else [])
    assert codes == [0] * len(codes)

    assert "event=duplicate_result" in b.log() and "task_key=orders-2026-11" in b.log()
    files = sorted(p.name for p in export_dir.iterdir())
    assert files == ["orders-2026-11.csv"], files
    with mysql_engine.connect() as conn:
        results = conn.execute(sa.select(job_result)).all()
        job = repository.reads.get_job(conn, job_id)
    assert len(results) == 1 and results[0].attempt == 1 and results[0].result["rows"] == 4
    assert job.status is Status.DONE and job.attempts == 2
    # a's late completion was refused: its lease_lost line names attempt 1
    assert "attempt=1" in a.wait_for_log(rf"event=lease_lost [^\n]*job_id={job_id}[^\n]*").group(0)
