"""The three kinds of empty claim, produced for real on MariaDB and told apart from SQL errors,
in the worker's counters and in its log."""

from __future__ import annotations

import logging

import pytest

from jobqueue.core import metrics, repository, service
from jobqueue.core.models import EmptyClaim
from jobqueue.core.worker import Worker, WorkerConfig
from testkit.locks import hold_rows


def empty(kind: str, queues: str = "default") -> float:
    return metrics.REGISTRY.get_sample_value("jobqueue_empty_claims_total", {"kind": kind, "queues": queues}) or 0.0


def sample(name: str, **labels) -> float:
    return metrics.REGISTRY.get_sample_value(name, labels) or 0.0


@pytest.fixture
def worker(mysql_engine):
    w = Worker(mysql_engine, WorkerConfig(concurrency=2, queues=["default"], lease_seconds=60))
    w.claimer._idle_log.interval = 0  # log every empty claim, so each one can be read back
    return w


def test_idle(worker, caplog):
    before = empty("idle")
    delay = worker.run_once()
    assert worker.last_empty.kind is EmptyClaim.IDLE
    assert empty("idle") == before + 1
    assert 0 < delay <= worker.config.idle_cap_seconds
    line = [r for r in caplog.records if "event=idle " in r.getMessage()][-1]
    assert line.levelno == logging.INFO and line.name == "jobqueue.worker"


def test_contended_counts_skipped_rows(worker, mysql_engine, caplog):
    with mysql_engine.connect() as conn:
        ids = [r.id for r in service.enqueue_many(conn, [{"task": "noop", "task_key": f"k{i}"} for i in range(3)])]
    holder = hold_rows(mysql_engine, ids)
    try:
        before, skipped = empty("contended"), sample("jobqueue_rows_skipped_total")
        delay = worker.run_once()
        assert worker.last_empty.kind is EmptyClaim.CONTENDED and worker.last_empty.skipped == 3
        assert empty("contended") == before + 1
        assert sample("jobqueue_rows_skipped_total") == skipped + 3
        assert delay < 0.1  # contended retries soon
        assert any("event=contended " in m and "skipped=3" in m for m in caplog.messages)
    finally:
        holder.rollback()
        holder.close()


def test_waiting_on_leases_sleeps_until_about_the_next_expiry(worker, mysql_engine, caplog):
    with mysql_engine.connect() as conn:
        service.enqueue(conn, "noop", "held-elsewhere")
        service.claim(conn, "other:1:1", 1, ["default"], lease_seconds=1.5)
    before = empty("waiting_on_leases")
    delay = worker.run_once()
    report = worker.last_empty
    assert report.kind is EmptyClaim.WAITING and report.next_lease_expiry > report.db_now
    assert empty("waiting_on_leases") == before + 1
    assert 1.0 <= delay <= worker.config.idle_cap_seconds
    assert any("event=waiting_on_leases " in m and "next_lease_expiry=" in m for m in caplog.messages)


def test_sql_errors_are_errors_not_empty_claims(worker, mysql_engine, caplog):
    before_idle, before_errors = empty("idle"), sample("jobqueue_sql_errors_total", operation="claim")
    with mysql_engine.connect() as conn:
        conn.exec_driver_sql("RENAME TABLE job_queue TO job_queue_away")
    try:
        worker.run_once()
    finally:
        with mysql_engine.connect() as conn:
            conn.exec_driver_sql("RENAME TABLE job_queue_away TO job_queue")
    assert sample("jobqueue_sql_errors_total", operation="claim") == before_errors + 1
    assert empty("idle") == before_idle
    errors = [r for r in caplog.records if "event=sql_error" in r.getMessage()]
    assert errors and errors[-1].levelno == logging.ERROR and "1146" in errors[-1].getMessage()
    # And it recovers on the next turn.
    worker.run_once()
    assert worker.last_empty.kind is EmptyClaim.IDLE


def test_idle_lines_are_rate_limited(mysql_engine, caplog):
    w = Worker(mysql_engine, WorkerConfig(concurrency=1, queues=["default"]))
    for _ in range(20):
        w.run_once()
    assert sum("event=idle " in m for m in caplog.messages) == 1
    # Every turn is counted: the first as an empty claim, the idle worker's later turns as the
    # probes they are (a probe is not a claim).
    probes = metrics.REGISTRY.get_sample_value("jobqueue_idle_probes_total", {"kind": "idle", "queues": "default"}) or 0
    assert empty("idle") >= 1 and empty("idle") + probes >= 20


def test_heartbeat_flushes_activity_per_minute(worker, mysql_engine):
    worker.start_threads()
    try:
        worker.run_once()
        worker.heartbeat()
        with mysql_engine.connect() as conn:
            rows = repository.stats.activity(conn, repository.reads.database_now(conn).replace(second=0, microsecond=0))
            processes, _ = repository.processes.list_processes(conn)
    finally:
        worker.stop()
        worker.shutdown()
    assert sum(r["empty_idle"] for r in rows) >= 1
    assert [p["id"] for p in processes] == [worker.id]
