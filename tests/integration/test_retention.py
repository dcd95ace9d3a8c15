"""Retention: finished jobs pruned past their keep time, by primary key in batches of at most
1,000 with pauses; their attempts (and results) go with them; their task_keys keep answering
duplicate: true."""

from __future__ import annotations

import json
import threading
from datetime import timedelta

import pytest
import sqlalchemy as sa
from click.testing import CliRunner

from jobqueue.core import repository, service
from jobqueue.core.cli import main
from jobqueue.core.models import Status
from jobqueue.core.retention import Pruner
from jobqueue.core.schema import job_attempt, job_queue, job_result, prune_run, pruned_key
from jobqueue.core.worker import Worker, WorkerConfig
from testkit.procs import wait_until
from testkit.sql import seq_rows

jq = job_queue.c


def make_finished(conn, prefix, n, status="done", days_ago=10.0, attempts=True):
    """n jobs finished `days_ago` days ago (by the database clock), each with an attempt row and,
    for done ones, a result."""
    ids = [r.id for r in service.enqueue_many(conn, [{"task": "noop", "task_key": f"{prefix}{i}"} for i in range(n)])]
    now = repository.reads.database_now(conn)
    when = now - timedelta(days=days_ago)
    conn.execute(
        sa.update(job_queue)
        .where(jq.id.in_(ids))
        .values(status=status, run_at=when, started_at=when, finished_at=when, attempts=1, lease_owner="old:1:1")
    )
    if attempts:
        conn.execute(
            sa.insert(job_attempt),
            [
                {
                    "job_id": i,
                    "attempt": 1,
                    "worker": "old:1:1",
                    "started_at": when,
                    "finished_at": when,
                    "outcome": "retry",
                    "error": "x",
                }
                for i in ids
            ],
        )
    if status == "done":
        conn.execute(
            sa.insert(job_result),
            [
                {
                    "task_key": f"{prefix}{k}",
                    "job_id": i,
                    "attempt": 1,
                    "worker": "old",
                    "result": {},
                    "created_at": when,
                }
                for k, i in enumerate(ids)
            ],
        )
    conn.commit()
    return ids


def count(conn, table, *where):
    return conn.execute(sa.select(sa.func.count()).select_from(table).where(*where)).scalar()


def test_prune_deletes_old_finished_jobs_with_their_attempts_and_keeps_their_keys(engine):
    with engine.connect() as conn:
        old_done = make_finished(conn, "od", 25)
        make_finished(conn, "rd", 5, days_ago=2)  # done, but recent: kept
        make_finished(conn, "of", 4, status="failed", days_ago=40)
        make_finished(conn, "rf", 3, status="failed", days_ago=10)  # failed 10 days ago: kept (30)
        make_finished(conn, "oc", 2, status="cancelled", days_ago=40)
        service.enqueue(conn, "noop", "still-ready")
        sleeps = []
        counts = service.prune(
            conn,
            done_days=7,
            failed_days=30,
            keys_days=365,
            batch_size=10,
            sleep=sleeps.append,
            pause=0.01,
            by="tester",
        )
        assert (counts.done, counts.failed, counts.cancelled, counts.attempts, counts.results) == (25, 4, 2, 31, 25)
        assert counts.batches == 4 and len(sleeps) == 4 and min(sleeps) >= 0.01
        left = dict(conn.execute(sa.select(jq.status, sa.func.count()).group_by(jq.status)).all())
        assert left == {"done": 5, "failed": 3, "ready": 1}
        assert count(conn, job_attempt) == 8 and count(conn, job_result) == 5
        assert count(conn, pruned_key) == 31
        # Replays of pruned keys: duplicate, with the old job's id and final status; nothing written.
        again = service.enqueue(conn, "noop", "od3")
        assert again.duplicate and again.id == old_done[3] and again.status is Status.DONE
        batch = service.enqueue_many(conn, [{"task": "noop", "task_key": k} for k in ("of0", "oc1", "new-one")])
        assert [(r.duplicate, r.status) for r in batch] == [
            (True, Status.FAILED),
            (True, Status.CANCELLED),
            (False, Status.READY),
        ]
        last = repository.retention.last_prune(conn)
        assert (last["done_rows"], last["failed_rows"], last["cancelled_rows"], last["batches"], last["run_by"]) == (
            25,
            4,
            2,
            4,
            "tester",
        )
        assert last["finished_at"] is not None


def test_pruned_keys_never_run_again(engine):
    with engine.connect() as conn:
        make_finished(conn, "gone", 3)
        service.prune(conn, done_days=7, failed_days=30)
        for i in range(3):
            assert service.enqueue(conn, "noop", f"gone{i}").duplicate
    worker = Worker(engine, WorkerConfig(concurrency=1, burst=True))
    assert worker.run() == 0 and worker.processed == 0


def test_zero_keeps_jobs_forever_and_dry_run_deletes_nothing(engine):
    with engine.connect() as conn:
        make_finished(conn, "d", 3, days_ago=100)
        make_finished(conn, "f", 2, status="failed", days_ago=100)
        dry = service.prune(conn, done_days=7, failed_days=30, dry_run=True)
        assert (dry.done, dry.failed, dry.dry_run) == (3, 2, True)
        assert count(conn, job_queue) == 5 and count(conn, prune_run) == 0
        kept = service.prune(conn, done_days=0, failed_days=0)
        assert (kept.done, kept.failed) == (0, 0) and count(conn, job_queue) == 5


def test_keys_are_forgotten_after_their_keep_time(engine):
    with engine.connect() as conn:
        make_finished(conn, "k", 3)
        service.prune(conn, done_days=7, failed_days=30, keys_days=365)
        conn.execute(
            sa.update(pruned_key)
            .where(pruned_key.c.task_key == "k0")
            .values(pruned_at=repository.reads.database_now(conn) - timedelta(days=400))
        )
        conn.commit()
        counts = service.prune(conn, done_days=7, failed_days=30, keys_days=365)
        assert counts.keys_expired == 1
        assert not service.enqueue(conn, "noop", "k0").duplicate  # free again
        assert service.enqueue(conn, "noop", "k1").duplicate


def test_batches_are_capped_at_1000(mysql_engine):
    with mysql_engine.connect() as conn:
        conn.exec_driver_sql(
            "INSERT INTO job_queue (task_key, task_name, queue, priority, payload, status, run_at, attempts, "
            "max_attempts, created_at, updated_at, finished_at) SELECT CONCAT('old-', seq), 'noop', 'default', 0, "
            "'{}', 'done', UTC_TIMESTAMP(6) - INTERVAL 9 DAY, 1, 5, UTC_TIMESTAMP(6) - INTERVAL 9 DAY, "
            f"UTC_TIMESTAMP(6) - INTERVAL 9 DAY, UTC_TIMESTAMP(6) - INTERVAL 9 DAY FROM {seq_rows(2500)}"
        )
        conn.commit()
        counts = service.prune(conn, done_days=7, failed_days=30, batch_size=5000, pause=0)
        assert (counts.done, counts.batches) == (2500, 3)


def test_a_row_held_elsewhere_is_left_for_the_next_pass(mysql_engine):
    from testkit.locks import hold_rows

    with mysql_engine.connect() as conn:
        ids = make_finished(conn, "h", 3)
    holder = hold_rows(mysql_engine, ids[:1])
    try:
        with mysql_engine.connect() as conn:
            counts = service.prune(conn, done_days=7, failed_days=30, pause=0)
            assert counts.done == 2
    finally:
        holder.rollback()
        holder.close()
    with mysql_engine.connect() as conn:
        assert service.prune(conn, done_days=7, failed_days=30, pause=0).done == 1


def test_cli_prune(db_url, engine):
    with engine.connect() as conn:
        make_finished(conn, "c", 4, days_ago=3)
        make_finished(conn, "x", 2, status="failed", days_ago=3)
    runner = CliRunner()

    def run(*args):
        return runner.invoke(main, ["--database-url", db_url, *args], obj={})

    dry = run("prune", "--done-older-than", "1", "--dry-run")
    assert dry.exit_code == 0, dry.output
    assert json.loads(dry.stdout)["done"] == 4 and json.loads(dry.stdout)["dry_run"] is True
    default = json.loads(run("prune").stdout)  # 7 and 30 days: nothing that young
    assert (default["done"], default["failed"]) == (0, 0)
    out = json.loads(run("prune", "--done-older-than", "1", "--failed-older-than", "2").stdout)
    assert (out["done"], out["failed"], out["attempts"], out["dry_run"]) == (4, 2, 6, False)
    assert run("prune", "--done-older-than", "-1").exit_code == 2


def test_worker_maintenance_prunes_when_due(engine, monkeypatch):
    monkeypatch.setenv("JOBQUEUE_KEEP_DONE_DAYS", "1")
    with engine.connect() as conn:
        make_finished(conn, "w", 30, days_ago=2)
    worker = Worker(engine, WorkerConfig(concurrency=1, prune_every_seconds=1, idle_cap_seconds=0.2))
    t = threading.Thread(target=worker.run, daemon=True)
    t.start()
    try:
        wait_until(lambda: worker.pruner.last is not None, timeout=15, message="a prune pass")
    finally:
        worker.stop()
        t.join(10)
    assert worker.pruner.last.done == 30
    with engine.connect() as conn:
        assert count(conn, job_queue) == 0 and repository.retention.last_prune(conn)["run_by"] == worker.id
        # Another process right after: not due yet.
        assert not repository.retention.prune_due(conn, 3600)


def test_a_pass_not_due_costs_one_read_and_no_thread_until_it_falls_due(engine):
    # Every idle worker asks. Asking from a thread of its own took a second pooled connection
    # at the moment the loop's own sweep used the first: the pool grew by one connection (and its
    # set-up statements) at an idle worker's first minute. Asking every minute cost two
    # statements a minute for an answer that changes once an hour.
    with engine.connect() as conn:
        service.prune(conn, done_days=7, failed_days=30, keys_days=365, by="another")  # a pass just ran
    clock = [1000.0]
    pruner = Pruner(engine, name="w", every_seconds=3600, clock=lambda: clock[0])
    threads = threading.active_count()
    sent = []
    sa.event.listen(engine, "before_cursor_execute", lambda conn, cursor, statement, *rest: sent.append(statement))

    def reads() -> list[str]:  # SQLite's BEGIN IMMEDIATE is no query
        return [s.split()[0].upper() for s in sent if not s.startswith("BEGIN")]

    assert pruner.maybe_start() is False
    assert pruner._thread is None and threading.active_count() == threads
    assert reads() == ["SELECT"]
    for minutes in (1, 10, 59):
        clock[0] = 1000.0 + minutes * 60
        assert pruner.maybe_start() is False
    assert reads() == ["SELECT"]
    clock[0] = 1000.0 + 3601
    with engine.connect() as conn:  # as if another process started the pass meanwhile
        service.prune(conn, done_days=7, failed_days=30, keys_days=365, by="another")
    sent.clear()
    assert pruner.maybe_start() is False and reads() == ["SELECT"] and pruner._thread is None


def test_a_pass_due_runs_in_a_thread_of_its_own_and_the_next_is_asked_for_when_due(engine):
    clock = [1000.0]
    pruner = Pruner(engine, name="w", every_seconds=3600, clock=lambda: clock[0])
    assert pruner.maybe_start() is True
    pruner._thread.join(30)
    assert pruner.last is not None
    with engine.connect() as conn:
        assert repository.retention.last_prune(conn)["run_by"] == "w" and not repository.retention.prune_due(conn, 3600)
    sent = []
    sa.event.listen(engine, "before_cursor_execute", lambda conn, cursor, statement, *rest: sent.append(statement))
    clock[0] += 3599
    assert pruner.maybe_start() is False and sent == []


@pytest.mark.parametrize("name, value", [("JOBQUEUE_KEEP_DONE_DAYS", "-1"), ("JOBQUEUE_KEEP_FAILED_DAYS", "lots")])
def test_bad_retention_settings_are_refused(monkeypatch, name, value):
    from jobqueue.core.settings import Settings, SettingsError

    monkeypatch.setenv(name, value)
    with pytest.raises(SettingsError, match=name):
        Settings.from_env()
