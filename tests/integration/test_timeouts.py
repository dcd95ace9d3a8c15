"""Job timeouts (@task(..., timeout_seconds=N)): an attempt still running after N seconds fails
as `timeout`, retried by the usual backoff until max_attempts; its lease is no longer renewed
and its handler's ctx.lease_lost is set."""

from __future__ import annotations

import threading
import time

import pytest

from jobqueue.core import repository, service
from jobqueue.core.builtin_tasks import noop
from jobqueue.core.models import Status
from jobqueue.core.tasks import Registry, TaskSpec
from jobqueue.core.worker import Worker, WorkerConfig
from testkit.procs import wait_until


def test_a_2_s_timeout_on_a_5_s_job_fails_the_attempt_as_timeout(engine):
    seen: list[tuple[int, bool, float]] = []

    def slow(payload, ctx):
        started = time.monotonic()
        # A handler that cooperates stops when told; ours waits up to the job's 5 s.
        told = ctx.lease_lost.wait(5)
        seen.append((ctx.attempt, told, time.monotonic() - started))
        if not told:
            time.sleep(max(0.0, 5 - (time.monotonic() - started)))

    reg = Registry()
    reg.register(TaskSpec("noop", noop))
    reg.register(TaskSpec("slow", slow, timeout_seconds=2, retry_base_seconds=0.1, retry_cap_seconds=0.2))
    with engine.connect() as conn:
        res = service.enqueue(conn, "slow", "t1", max_attempts=2, registry=reg)
    worker = Worker(engine, WorkerConfig(concurrency=2, lease_seconds=30), registry=reg)
    t = threading.Thread(target=worker.run, daemon=True)
    t.start()
    try:
        wait_until(lambda: _job(engine, res.id).status is Status.FAILED, timeout=20, message="failed for good")
    finally:
        worker.stop()
        t.join(15)
    job = _job(engine, res.id)
    assert job.attempts == 2 and job.last_error == "timed out after 2 s"
    with engine.connect() as conn:
        history = repository.reads.list_attempts(conn, res.id)
    assert [(h["attempt"], h["outcome"], h["error"]) for h in history] == [
        (1, "timeout", "timed out after 2 s"),
        (2, "timeout", "timed out after 2 s"),
    ]
    # Each handler heard of it (ctx.lease_lost) about 2 s in, not at the end of its 5 s.
    assert [a for a, told, _ in seen] == [1, 2] and all(told for _, told, _ in seen)
    assert all(1.9 <= took < 3.0 for _, _, took in seen), seen


def test_a_job_within_its_timeout_completes(engine):
    reg = Registry()
    reg.register(TaskSpec("quick", lambda payload, ctx: time.sleep(0.2), timeout_seconds=2))
    with engine.connect() as conn:
        res = service.enqueue(conn, "quick", "q1", registry=reg)
    worker = Worker(engine, WorkerConfig(concurrency=1, burst=True), registry=reg)
    assert worker.run() == 0
    assert _job(engine, res.id).status is Status.DONE


def test_timeout_must_be_positive():
    with pytest.raises(ValueError, match="timeout_seconds"):
        TaskSpec("bad", noop, timeout_seconds=0)


def _job(engine, job_id):
    with engine.connect() as conn:
        return repository.reads.get_job(conn, job_id)
