"""Cancellation: a terminal status `cancelled`, immediate from ready, scheduled and failed; a
running job's lease is fenced (its completion changes nothing) and its handler's ctx.lease_lost
is set. A cancelled job's task_key stays taken."""

from __future__ import annotations

import json
import re
import threading
import time

import pytest
import sqlalchemy as sa
from click.testing import CliRunner

from jobqueue.core import repository, service
from jobqueue.core.builtin_tasks import noop
from jobqueue.core.cli import main
from jobqueue.core.errors import InvalidState, JobBusy, JobNotFound
from jobqueue.core.models import Outcome, Status
from jobqueue.core.repository.operator import JobFilter
from jobqueue.core.schema import audit_log, job_queue
from jobqueue.core.tasks import Registry, TaskSpec
from jobqueue.core.worker import Worker, WorkerConfig
from testkit.locks import hold_rows
from testkit.procs import WorkerProcess, wait_until

jq = job_queue.c


@pytest.fixture
def run(db_url):
    runner = CliRunner()
    return lambda *args: runner.invoke(main, ["--database-url", db_url, *args], obj={})


def test_cancel_from_ready_scheduled_and_failed_is_immediate(engine):
    with engine.connect() as conn:
        ready = service.enqueue(conn, "noop", "r").id
        scheduled = service.enqueue(conn, "noop", "s", delay=3600).id
        failed = service.enqueue(conn, "noop", "f", max_attempts=1).id
        (c,) = service.claim(conn, "w", 1, ["default"], lease_seconds=60)
        assert c.job.id == ready
        service.release(conn, c.lease)
        (c,) = service.claim(conn, "w", 1, ["default"], lease_seconds=60)
        (c2,) = service.claim(conn, "w", 1, ["default"], lease_seconds=60)
        service.release(conn, c.lease)
        assert c2.job.id == failed and service.fail(conn, c2.lease, "broken") is Outcome.OK
        for job_id, before in ((ready, Status.READY), (scheduled, Status.SCHEDULED), (failed, Status.FAILED)):
            result = service.cancel_job(conn, job_id, "not wanted", actor="tester")
            assert (result.before, result.after, result.changed) == (before, Status.CANCELLED, True)
            job = repository.reads.get_job(conn, job_id)
            assert job.status is Status.CANCELLED and job.finished_at is not None and job.lease_until is None
        assert repository.reads.get_job(conn, failed).last_error == "broken"  # the failure is kept
        audits = conn.execute(
            sa.select(
                audit_log.c.action,
                audit_log.c.job_id,
                audit_log.c.before_status,
                audit_log.c.after_status,
                audit_log.c.detail,
            )
        ).all()
        assert [tuple(a) for a in audits] == [
            ("cancel", ready, "ready", "cancelled", "not wanted"),
            ("cancel", scheduled, "scheduled", "cancelled", "not wanted"),
            ("cancel", failed, "failed", "cancelled", "not wanted"),
        ]
        # Nothing claims a cancelled job, and a second cancel changes nothing.
        assert service.claim(conn, "w", 5, ["default"], lease_seconds=60) == []
        assert service.cancel_job(conn, ready).changed is False
        counts = {(q, s): n for q, s, n in repository.stats.count_by_status(conn)}
        assert counts[("default", "cancelled")] == 3


def test_a_done_job_is_not_cancelled_and_a_missing_one_is_not_found(engine):
    with engine.connect() as conn:
        job_id = service.enqueue(conn, "noop", "d").id
        (c,) = service.claim(conn, "w", 1, ["default"], lease_seconds=60)
        service.complete(conn, c.lease)
        with pytest.raises(InvalidState, match="already done"):
            service.cancel_job(conn, job_id)
        with pytest.raises(JobNotFound):
            service.cancel_job(conn, 999999)
        assert repository.reads.get_job(conn, job_id).status is Status.DONE


def test_a_cancelled_key_stays_taken(engine):
    with engine.connect() as conn:
        first = service.enqueue(conn, "noop", "once")
        service.cancel_job(conn, first.id)
        again = service.enqueue(conn, "noop", "once")
        assert again.duplicate and again.id == first.id and again.status is Status.CANCELLED
    worker = Worker(engine, WorkerConfig(concurrency=1, burst=True))
    assert worker.run() == 0 and worker.processed == 0


def test_cancelling_a_running_job_fences_its_lease_and_tells_its_handler(engine):
    """In process: the handler hears of it at the next renewal (a third of the 3 s lease), and the
    completion its worker then tries changes nothing."""
    told = threading.Event()
    returned = threading.Event()

    def wait_for_it(payload, ctx):
        if ctx.lease_lost.wait(10):
            told.set()
        returned.set()

    reg = Registry()
    reg.register(TaskSpec("noop", noop))
    reg.register(TaskSpec("wait", wait_for_it))
    with engine.connect() as conn:
        res = service.enqueue(conn, "wait", "w1", registry=reg)
    worker = Worker(engine, WorkerConfig(concurrency=1, lease_seconds=3), registry=reg)
    t = threading.Thread(target=worker.run, daemon=True)
    t.start()
    try:
        wait_until(lambda: _job(engine, res.id).status is Status.RUNNING, message="running")
        with engine.connect() as conn:
            result = service.cancel_job(conn, res.id, actor="tester")
        cancelled_at = time.monotonic()
        assert (result.before, result.after) == (Status.RUNNING, Status.CANCELLED)
        assert told.wait(3), "ctx.lease_lost was not set within one renewal"
        assert time.monotonic() - cancelled_at <= 1.0 + 0.5  # renewals every lease/3 = 1 s
        assert returned.wait(5)
        time.sleep(0.5)  # the worker's completion cycle runs
    finally:
        worker.stop()
        t.join(10)
    job = _job(engine, res.id)
    assert job.status is Status.CANCELLED and job.attempts == 1
    with engine.connect() as conn:
        history = repository.reads.list_attempts(conn, res.id)
    assert [(h["attempt"], h["outcome"]) for h in history] == [(1, "cancelled")]


def test_cancel_a_running_job_in_a_worker_process(mysql_url, mysql_engine, tmp_path):
    """A real worker process: the running job is cancelled; its handler sees ctx.lease_lost, returns,
    and the completion afterwards changes nothing."""
    with mysql_engine.connect() as conn:
        res = service.enqueue(conn, "until_lease_lost", "long", {"seconds": 30})
    w = WorkerProcess(mysql_url, tmp_path, "c", "--concurrency", "1", "--lease-seconds", "3")
    try:
        w.wait_for_log(rf"event=claim job_id={res.id} ")
        with mysql_engine.connect() as conn:
            assert service.cancel_job(conn, res.id, actor="tester").before is Status.RUNNING
        w.wait_for_log(rf"event=handler_saw lease_lost_seen=True job_id={res.id}", timeout=5)
        w.wait_for_log(rf"event=handler_finished_after_lease_lost job_id={res.id} ", timeout=5)
    finally:
        assert w.stop() == 0
    assert re.search(rf"event=lease_lost operation=renew job_id={res.id} .*now_status=cancelled", w.log())
    job = _job(mysql_engine, res.id)
    assert job.status is Status.CANCELLED and job.attempts == 1
    assert "event=complete " not in w.log()


def test_cancel_answers_busy_at_once_when_the_row_is_locked(mysql_engine):
    with mysql_engine.connect() as conn:
        job_id = service.enqueue(conn, "noop", "busy").id
    holder = hold_rows(mysql_engine, [job_id])
    try:
        with mysql_engine.connect() as conn:
            started = time.monotonic()
            with pytest.raises(JobBusy):
                service.cancel_job(conn, job_id)
            assert time.monotonic() - started < 0.5
    finally:
        holder.rollback()
        holder.close()


def test_bulk_cancel_by_ids_and_by_filter(engine):
    with engine.connect() as conn:
        ids = [r.id for r in service.enqueue_many(conn, [{"task": "noop", "task_key": f"b{i}"} for i in range(12)])]
        (running,) = service.claim(conn, "w", 1, ["default"], lease_seconds=60)
        by_ids = service.bulk_action(conn, "cancel", actor="tester", ids=ids[:4])
        # The running job (ids[0]) has a valid lease: skipped without force.
        assert (by_ids.changed, by_ids.skipped) == (3, 1)
        by_filter = service.bulk_action(
            conn, "cancel", actor="tester", job_filter=JobFilter(status=Status.READY), batch_size=5
        )
        assert by_filter.changed == 8 and by_filter.finished
        forced = service.bulk_action(conn, "cancel", actor="tester", ids=[running.job.id], force=True)
        assert forced.changed == 1
        assert {s for _, s, _ in repository.stats.count_by_status(conn)} == {"cancelled"}
        assert service.complete(conn, running.lease) is Outcome.LEASE_LOST
        # A cancelled job can be requeued by an operator (it has not run, or its run was stopped).
        assert service.requeue_job(conn, ids[5]).after is Status.READY


def test_cli_cancel_exit_codes(run, engine):
    job_id = json.loads(run("enqueue", "noop", "--key", "k1").stdout)["id"]
    out = run("cancel", str(job_id), "--reason", "typo")
    assert out.exit_code == 0, out.output
    assert json.loads(out.stdout) == {"id": job_id, "before": "ready", "after": "cancelled", "changed": True}
    assert json.loads(run("cancel", str(job_id)).stdout)["changed"] is False
    assert run("cancel", "999999").exit_code == 4
    done_id = json.loads(run("enqueue", "noop", "--key", "k2").stdout)["id"]
    with engine.connect() as conn:
        (c,) = service.claim(conn, "w", 1, ["default"], lease_seconds=60)
        service.complete(conn, c.lease)
    refused = run("cancel", str(done_id))
    assert refused.exit_code == 3 and "already done" in refused.output
    stats = json.loads(run("stats", "--json").stdout)
    assert stats["totals"]["cancelled"] == 1 and stats["totals"]["done"] == 1


def _job(engine, job_id):
    with engine.connect() as conn:
        return repository.reads.get_job(conn, job_id)
