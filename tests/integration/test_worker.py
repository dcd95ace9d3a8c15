"""The worker loop in-process against a real database: batches, retries, renewals, shutdown,
wake-ups. Process-level behaviour (signals, kills) is in tests/acceptance."""

from __future__ import annotations

import signal
import threading
import time

import pymysql
import sqlalchemy as sa
from sqlalchemy.exc import OperationalError

from jobqueue.core import repository, service
from jobqueue.core.builtin_tasks import noop
from jobqueue.core.models import Status
from jobqueue.core.schema import job_queue
from jobqueue.core.tasks import Registry, TaskSpec
from jobqueue.core.worker import Worker, WorkerConfig
from testkit.procs import WorkerProcess, wait_until

jq = job_queue.c


def registry_with(**handlers) -> Registry:
    reg = Registry()
    reg.register(TaskSpec("noop", noop))
    for name, (fn, opts) in handlers.items():
        reg.register(TaskSpec(name, fn, **opts))
    return reg


def start(worker: Worker) -> threading.Thread:
    t = threading.Thread(target=worker.run, daemon=True)
    t.start()
    return t


def job(engine, job_id):
    with engine.connect() as conn:
        return repository.reads.get_job(conn, job_id)


def test_burst_worker_processes_every_job_once(engine):
    with engine.connect() as conn:
        service.enqueue_many(conn, [{"task": "noop", "task_key": f"k{i}"} for i in range(60)])
    worker = Worker(engine, WorkerConfig(concurrency=4, burst=True), registry=registry_with())
    assert worker.run() == 0
    with engine.connect() as conn:
        rows = conn.execute(sa.select(jq.status, jq.attempts)).all()
    assert len(rows) == 60 and {(r.status, r.attempts) for r in rows} == {("done", 1)}
    assert worker.processed == 60


def test_claims_are_batched_to_idle_slots(engine):
    seen = []
    gate = threading.Event()

    def blocker(payload, ctx):
        seen.append(ctx.worker_id)
        gate.wait(10)

    with engine.connect() as conn:
        service.enqueue_many(conn, [{"task": "noop", "task_key": f"k{i}"} for i in range(10)])
        conn.execute(sa.update(job_queue).values(task_name="block"))
        conn.commit()
    worker = Worker(engine, WorkerConfig(concurrency=3, lease_seconds=30), registry=registry_with(block=(blocker, {})))
    t = start(worker)
    try:
        wait_until(lambda: len(seen) == 3, message="three slots busy")
        time.sleep(0.3)
        assert len(worker.in_hand()) == 3  # no more claimed than idle slots
        assert sorted(seen) == sorted(worker.slot_id(s) for s in (1, 2, 3))
    finally:
        gate.set()
        wait_until(lambda: len(seen) == 10, message="all jobs")
        worker.stop()
        t.join(10)


def test_handler_errors_retry_with_backoff_then_fail(engine):
    def boom(payload, ctx):
        raise ValueError(f"broken input on attempt {ctx.attempt}")

    with engine.connect() as conn:
        res = service.enqueue(conn, "boom", "b1", max_attempts=3, registry=registry_with(boom=(boom, {})))
    worker = Worker(
        engine, WorkerConfig(concurrency=1), registry=registry_with(boom=(boom, {"retry_base_seconds": 0.05}))
    )
    t = start(worker)
    try:
        wait_until(lambda: job(engine, res.id).status is Status.FAILED, timeout=10, message="failed for good")
    finally:
        worker.stop()
        t.join(10)
    failed = job(engine, res.id)
    assert failed.attempts == 3 and failed.last_error.startswith("ValueError: broken input on attempt 3")
    with engine.connect() as conn:
        history = repository.reads.list_attempts(conn, res.id)
    assert [h["outcome"] for h in history] == ["retry", "retry", "fail"]


def test_long_job_keeps_its_lease_by_renewal(engine):
    def slow(payload, ctx):
        time.sleep(2.5)

    with engine.connect() as conn:
        res = service.enqueue(conn, "slow", "s1", registry=registry_with(slow=(slow, {})))
    worker = Worker(engine, WorkerConfig(concurrency=1, lease_seconds=1), registry=registry_with(slow=(slow, {})))
    t = start(worker)
    try:
        wait_until(lambda: job(engine, res.id).status is Status.DONE, timeout=10, message="done")
    finally:
        worker.stop()
        t.join(10)
    assert job(engine, res.id).attempts == 1  # never reaped although the job outlived its lease 2x


def test_stop_releases_unfinished_jobs_after_grace(engine, caplog):
    gate = threading.Event()

    def stuck(payload, ctx):
        gate.wait(30)

    with engine.connect() as conn:
        res = service.enqueue(conn, "stuck", "st", registry=registry_with(stuck=(stuck, {})))
    worker = Worker(engine, WorkerConfig(concurrency=2, grace_seconds=0.3), registry=registry_with(stuck=(stuck, {})))
    t = start(worker)
    wait_until(lambda: job(engine, res.id).status is Status.RUNNING, message="running")
    worker.stop()
    t.join(10)
    gate.set()
    back = job(engine, res.id)
    assert back.status is Status.READY and back.attempts == 1 and back.lease_owner is None
    assert "event=released" in caplog.text


def test_enqueue_in_the_same_process_wakes_an_idle_worker(engine):
    started = {}

    def mark(payload, ctx):
        started[ctx.task_key] = time.monotonic()

    reg = registry_with(mark=(mark, {}))
    worker = Worker(engine, WorkerConfig(concurrency=1, idle_cap_seconds=30), registry=reg)
    t = start(worker)
    try:
        time.sleep(1.5)  # backoff has grown well past a second
        enqueued = time.monotonic()
        with engine.connect() as conn:
            service.enqueue(conn, "mark", "wake", registry=reg)
        wait_until(lambda: "wake" in started, timeout=10, message="job start")
    finally:
        worker.stop()
        t.join(10)
    assert started["wake"] - enqueued < 1.0, "the worker slept out its backoff instead of waking"


def test_sigterm_releases_running_job_and_exits_zero(mysql_url, mysql_engine, tmp_path):
    with mysql_engine.connect() as conn:
        res = service.enqueue(conn, "hold_first_attempt", "long", {"seconds": 60})
    w = WorkerProcess(mysql_url, tmp_path, "t", "--concurrency", "1", "--grace-seconds", "0.5")
    w.wait_for_log(rf"event=claim job_id={res.id} ")
    w.signal(signal.SIGTERM)
    assert w.proc.wait(10) == 0
    w.stop()
    back = job(mysql_engine, res.id)
    assert back.status is Status.READY and back.attempts == 1
    assert "event=released" in w.log()


def _lost_connection() -> OperationalError:
    return OperationalError(
        "SELECT 1",
        {},
        pymysql.err.OperationalError(
            2003, "Can't connect to MySQL server on '127.0.0.1' ([Errno 111] Connection refused)"
        ),
    )


def test_record_result_rides_out_a_database_outage(engine, monkeypatch):
    """Found by the soak: during a database restart, ctx.record_result() raised the lost
    connection into the handler, so an attempt that had done its work counted as failed and ran
    again (on its last attempt the job would have failed for good). Like a completion, the
    result write is retried while the database is away; it is fenced and keyed by task_key, so
    retrying cannot record it twice."""
    real = service.record_result
    calls = []

    def down_twice(conn, lease, task_key, result):
        calls.append(lease.attempt)
        if len(calls) <= 2:
            raise _lost_connection()
        return real(conn, lease, task_key, result)

    monkeypatch.setattr(service, "record_result", down_twice)
    runs = []

    def work(payload, ctx):
        runs.append(ctx.attempt)
        assert ctx.record_result({"ok": True}) is True

    reg = registry_with(work=(work, {}))
    with engine.connect() as conn:
        res = service.enqueue(conn, "work", "w1", max_attempts=1, registry=reg)
    worker = Worker(engine, WorkerConfig(concurrency=1), registry=reg)
    t = start(worker)
    try:
        wait_until(lambda: job(engine, res.id).status in (Status.DONE, Status.FAILED), timeout=15, message="finished")
    finally:
        worker.stop()
        t.join(10)
    done = job(engine, res.id)
    assert (done.status, done.attempts, done.last_error) == (Status.DONE, 1, None)
    assert runs == [1] and calls == [1, 1, 1]
    with engine.connect() as conn:
        assert repository.reads.get_result(conn, "w1")["result"] == {"ok": True}


def test_record_result_does_not_retry_a_result_the_database_refuses(engine):
    """Only lost connections and lock trouble are waited out: a result that cannot be stored
    fails the attempt at once."""

    def bad(payload, ctx):
        ctx.record_result({"not json": object()})

    reg = registry_with(bad=(bad, {}))
    with engine.connect() as conn:
        res = service.enqueue(conn, "bad", "b1", max_attempts=1, registry=reg)
    worker = Worker(engine, WorkerConfig(concurrency=1), registry=reg)
    t = start(worker)
    started = time.monotonic()
    try:
        wait_until(lambda: job(engine, res.id).status is Status.FAILED, timeout=15, message="failed")
    finally:
        worker.stop()
        t.join(10)
    assert time.monotonic() - started < 4
    assert "not JSON serializable" in job(engine, res.id).last_error
