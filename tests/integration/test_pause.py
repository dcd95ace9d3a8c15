"""Pause and resume: within about a second of a pause no process claims from the queue, enqueue
still works, running jobs finish, a queue can be paused before it has any job, and the claim's
statement does not change (the EXPLAIN test in test_mysql_locking still holds)."""

from __future__ import annotations

import importlib
import json
import threading
import time
from datetime import timedelta

import pytest
import sqlalchemy as sa
from click.testing import CliRunner

from jobqueue.core import repository, service
from jobqueue.core.cli import main
from jobqueue.core.models import EmptyClaim
from jobqueue.core.schema import audit_log, job_queue
from jobqueue.core.worker import Worker, WorkerConfig
from testkit.procs import WorkerProcess, wait_until

jq = job_queue.c


def add(conn, queue, n, task="noop", **payload):
    return [
        r.id
        for r in service.enqueue_many(
            conn, [{"task": task, "task_key": f"{queue}-{i}", "queue": queue, "payload": payload} for i in range(n)]
        )
    ]


def statuses(engine, queue):
    with engine.connect() as conn:
        return dict(
            conn.execute(sa.select(jq.status, sa.func.count()).where(jq.queue == queue).group_by(jq.status)).all()
        )


def test_pause_and_resume_are_idempotent_audited_and_work_before_any_job(engine):
    with engine.connect() as conn:
        first = service.pause_queue(conn, "later", actor="tester")
        assert (first.queue, first.paused, first.changed, first.changed_by) == ("later", True, True, "tester")
        assert service.pause_queue(conn, "later", actor="other").changed is False
        assert repository.claim.paused_queues(conn) == {"later"}
        rows, _ = repository.stats.list_queues(conn)
        assert [(r["queue"], r["paused"], r["changed_by"], sum(r["counts"].values())) for r in rows] == [
            ("later", True, "tester", 0)
        ]
        # Enqueue still works; the jobs wait.
        add(conn, "later", 2)
        assert repository.claim.ready_queues(conn) == []
        report = repository.claim.classify_empty(conn, None)
        assert report.kind is EmptyClaim.IDLE and report.skipped == 0  # nothing to do, not "contended"
        back = service.resume_queue(conn, "later", actor="tester")
        assert (back.paused, back.changed) == (False, True)
        assert repository.claim.ready_queues(conn) == ["later"]
        actions = conn.execute(sa.select(audit_log.c.action, audit_log.c.selection).order_by(audit_log.c.id)).all()
        assert [tuple(a) for a in actions] == [("pause", "queue later"), ("resume", "queue later")]


def test_cli_pause_resume_and_queues(db_url):
    runner = CliRunner()

    def run(*args):
        return runner.invoke(main, ["--database-url", db_url, *args], obj={})

    out = run("pause", "mail")
    assert out.exit_code == 0 and json.loads(out.stdout) == {"queue": "mail", "paused": True}
    assert json.loads(run("pause", "mail").stdout) == {"queue": "mail", "paused": True}  # not an error
    run("enqueue", "noop", "--key", "k1")
    listing = json.loads(run("queues", "--json").stdout)["queues"]
    assert [(q["queue"], q["paused"], q["counts"]["ready"]) for q in listing] == [
        ("default", False, 1),
        ("mail", True, 0),
    ]
    table = run("queues").stdout
    assert "mail" in table and "paused" in table and "default" in table
    assert json.loads(run("resume", "mail").stdout) == {"queue": "mail", "paused": False}
    assert run("pause", "no spaces").exit_code == 2


@pytest.mark.parametrize("queues", [None, ("held", "open")], ids=["every-queue", "listed-queues"])
def test_a_worker_leaves_a_paused_queue_alone_and_takes_it_up_on_resume(engine, queues):
    with engine.connect() as conn:
        add(conn, "held", 5)
        service.pause_queue(conn, "held", actor="tester")
        add(conn, "open", 5)
    worker = Worker(engine, WorkerConfig(concurrency=2, queues=queues, idle_cap_seconds=0.2))
    t = threading.Thread(target=worker.run, daemon=True)
    t.start()
    try:
        wait_until(lambda: statuses(engine, "open") == {"done": 5}, timeout=10, message="open queue done")
        assert statuses(engine, "held") == {"ready": 5}
        with engine.connect() as conn:
            service.resume_queue(conn, "held", actor="tester")
        wait_until(lambda: statuses(engine, "held") == {"done": 5}, timeout=10, message="held queue done")
    finally:
        worker.stop()
        t.join(10)


@pytest.mark.slow
def test_a_paused_queue_gets_no_claim_for_10_s_while_another_keeps_running(mysql_url, mysql_engine, tmp_path):
    """Real worker processes, one on every queue and one with a list of queues: from 2 s after the
    pause until the resume 12 s after it, no job of the paused queue is claimed (started_at, the
    claim's time on the database clock), while the other queue keeps being claimed; after the
    resume the paused queue drains."""
    with mysql_engine.connect() as conn:
        add(conn, "held", 300, task="slow_noop", seconds=0.1)
        add(conn, "busy", 1500, task="slow_noop", seconds=0.05)
    workers = [
        WorkerProcess(mysql_url, tmp_path, "all", "--concurrency", "4"),
        WorkerProcess(mysql_url, tmp_path, "listed", "--concurrency", "4", "--queues", "held,busy"),
    ]
    try:
        wait_until(lambda: statuses(mysql_engine, "held").get("done", 0) >= 10, timeout=30, message="held jobs run")
        with mysql_engine.connect() as conn:
            paused_at = service.pause_queue(conn, "held", actor="tester").changed_at
        window = (paused_at + timedelta(seconds=2), paused_at + timedelta(seconds=12))
        wait_until(lambda: _db_now(mysql_engine) >= window[1], timeout=20, interval=0.2, message="12 s")
        with mysql_engine.connect() as conn:
            resumed_at = service.resume_queue(conn, "held", actor="tester").changed_at
            held_claims = _claims(conn, "held", *window)
            busy_claims = _claims(conn, "busy", *window)
            left = statuses(mysql_engine, "held").get("ready", 0)
        assert held_claims == 0, f"{held_claims} claims from the paused queue"
        assert busy_claims > 50, f"the other queue stalled ({busy_claims} claims in 10 s)"
        assert left > 0
        wait_until(lambda: statuses(mysql_engine, "held") == {"done": 300}, timeout=60, message="held drains")
        with mysql_engine.connect() as conn:
            assert _claims(conn, "held", resumed_at, resumed_at + timedelta(seconds=60)) == left
    finally:
        codes = [w.stop() for w in workers]
    assert codes == [0, 0]


def _claims(conn, queue, start, end):
    return conn.execute(
        sa.select(sa.func.count()).where(jq.queue == queue, jq.started_at >= start, jq.started_at < end)
    ).scalar()


def _db_now(engine):
    with engine.connect() as conn:
        return repository.reads.database_now(conn)


# --- a pause is serialised with claims (issue 25, defect 3) ---------------------------------------


def claimed(engine, queue):
    with engine.connect() as conn:
        return conn.execute(sa.select(jq.id, jq.started_at).where(jq.queue == queue, jq.status != "ready")).all()


@pytest.mark.parametrize("queues", [None, ("held",)], ids=["every-queue", "listed-queues"])
def test_no_claim_commits_after_the_pause_answered_though_the_cycle_read_the_queues_before_it(
    mysql_engine, monkeypatch, queues
):
    """The worker read its queues (the paused set, or the ready queues) and stalls before its
    claim transaction; the queue is paused meanwhile. Once the pause has answered, that claim
    takes nothing from it."""
    with mysql_engine.connect() as conn:
        add(conn, "held", 3)
    real, stalled, go = service.claim_cycle, threading.Event(), threading.Event()

    def stalling(*args, **kwargs):
        if not go.is_set():
            stalled.set()
            go.wait(10)
        return real(*args, **kwargs)

    monkeypatch.setattr(service, "claim_cycle", stalling)
    worker = Worker(mysql_engine, WorkerConfig(concurrency=2, queues=queues, idle_cap_seconds=0.2, doorbell=False))
    t = threading.Thread(target=worker.run, daemon=True)
    t.start()
    try:
        assert stalled.wait(10), "the worker never reached its claim"
        with mysql_engine.connect() as conn:
            service.pause_queue(conn, "held", actor="tester")
        go.set()
        time.sleep(1.0)
        assert claimed(mysql_engine, "held") == [], "claims committed after the pause answered"
    finally:
        go.set()
        worker.stop()
        t.join(10)


@pytest.mark.parametrize("row", ["queue row present", "queue row missing"])
def test_a_pause_waits_for_a_claim_in_flight_and_no_claim_commits_after_it_answered(mysql_engine, monkeypatch, row):
    """A claim transaction stalls after its locking pick; a pause sent meanwhile answers only
    once that claim committed (the claim's queue-state lock), and from then on nothing of the
    queue is claimed. A queue that never had a queue_state row has nothing to lock yet: the pause
    (which creates it) answers at once, and the claim, reading the row again under its lock
    before taking anything, takes nothing."""
    claim_module = importlib.import_module("jobqueue.core.repository.claim")  # the facade's `claim` is a function

    with mysql_engine.connect() as conn:
        add(conn, "held", 6)
        if row == "queue row present":
            service.resume_queue(conn, "held", actor="tester")
    # split_rows reads the rows of the locking pick (with the queue states, the lock of finished
    # jobs, or alone): stalling there stalls the claim with its locks taken.
    real, stalled, go = claim_module.split_rows, threading.Event(), threading.Event()

    def stalling(*args, **kwargs):
        rows = real(*args, **kwargs)
        if not go.is_set():
            stalled.set()
            go.wait(10)
        return rows

    monkeypatch.setattr(claim_module, "split_rows", stalling)
    worker = Worker(
        mysql_engine, WorkerConfig(concurrency=2, prefetch=0, queues=("held",), idle_cap_seconds=0.2, doorbell=False)
    )
    paused: list = []

    def pause():
        with mysql_engine.connect() as conn:
            paused.append(service.pause_queue(conn, "held", actor="tester"))
            paused.append(time.monotonic())

    t = threading.Thread(target=worker.run, daemon=True)
    pauser = threading.Thread(target=pause, daemon=True)
    t.start()
    try:
        assert stalled.wait(10), "the worker never picked"
        pauser.start()
        time.sleep(1.0)
        if row == "queue row missing":
            assert paused, "the pause waited though the claim had no queue row to lock"
            go.set()
            time.sleep(1.0)
            assert claimed(mysql_engine, "held") == [], "a claim committed after the pause answered"
            return
        assert not paused, "the pause answered while a claim of its queue was in flight"
        released = time.monotonic()
        go.set()
        pauser.join(10)
        assert paused and paused[1] >= released
        time.sleep(1.0)
        taken = claimed(mysql_engine, "held")
        assert len(taken) == 2, taken  # the stalled claim's, committed before the pause answered
        assert all(at <= paused[0].changed_at for _, at in taken), (taken, paused[0].changed_at)
    finally:
        go.set()
        worker.stop()
        t.join(10)
