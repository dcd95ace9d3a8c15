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
    assert out["job_batches"] == 0
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


# --- batches ---------------------------------------------------------------------------------------


def run_batch(engine, key, outcomes, *, callbacks_ran=True, close=True):
    """Batch `key` with a member per outcome ("done" / "failed"), each finished by a worker's
    path (so the batch counts it), its callbacks then marked done (unless not `callbacks_ran`)."""
    from jobqueue import JobQueue

    q = JobQueue(engine)
    b = q.batch(key, on_success="notify", on_failure="page_oncall", on_complete="cleanup")
    for i in range(len(outcomes)):
        b.enqueue("noop", f"{key}-m{i}", queue=f"q-{key}")
    if close:
        q.close_batch(key)
    with engine.connect() as conn:
        for outcome in outcomes:
            got = service.claim(conn, "w", 1, [f"q-{key}"], lease_seconds=60)
            assert got, f"{key}: a member to claim"
            lease = got[0].lease
            service.complete(conn, lease) if outcome == "done" else service.fail(conn, lease, "boom")
        if callbacks_ran:
            conn.execute(
                sa.update(job_queue)
                .where(jq.task_key.like(f"batch:{key}:%"))
                .values(status="done", started_at=sa.func.now(), finished_at=sa.func.now())
            )
            conn.commit()


def age(engine, key, days_ago=10.0):
    """Move batch `key`, its members and its callbacks `days_ago` days into the past."""
    from jobqueue.core.schema import job_batch

    with engine.connect() as conn:
        when = repository.reads.database_now(conn) - timedelta(days=days_ago)
        jobs = sa.or_(jq.task_key.like(f"{key}-m%"), jq.task_key.like(f"batch:{key}:%"))
        conn.execute(sa.update(job_queue).where(jobs).values(run_at=when, created_at=when))
        conn.execute(
            sa.update(job_queue).where(jobs, jq.finished_at.is_not(None)).values(started_at=when, finished_at=when)
        )
        conn.execute(
            sa.update(job_batch)
            .where(job_batch.c.batch_key == key)
            .values(
                created_at=when,
                closed_at=sa.case((job_batch.c.closed_at.is_(None), None), else_=when),
                finished_at=sa.case((job_batch.c.finished_at.is_(None), None), else_=when),
            )
        )
        conn.commit()


def batch_rows(conn, key):
    from jobqueue.core.schema import job_batch, job_batch_member

    batch_id = conn.execute(sa.select(job_batch.c.id).where(job_batch.c.batch_key == key)).scalar()
    members = count(conn, job_batch_member, job_batch_member.c.batch_id == batch_id) if batch_id else 0
    return batch_id, members


def test_a_finished_batch_past_its_keep_time_goes_with_its_members_and_its_key_stays(engine):
    from jobqueue import JobQueue
    from jobqueue.core.errors import BatchClosed

    run_batch(engine, "old", ["done", "done"])
    age(engine, "old")
    run_batch(engine, "young", ["done"])  # finished now: kept
    with engine.connect() as conn:
        counts = service.prune(conn, done_days=7, failed_days=30, pause=0)
        assert (counts.done, counts.job_batches) == (4, 1)  # 2 members, 2 callbacks; 1 batch
        assert counts.as_dict()["job_batches"] == 1
        assert batch_rows(conn, "old") == (None, 0)
        assert batch_rows(conn, "young")[0] is not None
        assert repository.retention.last_prune(conn)["batch_rows"] == 1
    q = JobQueue(engine)
    # Opening the key again finds the finished batch as it was: no new batch, no callback again.
    with engine.connect() as conn:
        shown, created = repository.batches.open_batch(conn, "old", on_success="notify", on_complete="cleanup")
    assert created is False
    assert {k: shown[k] for k in ("key", "state", "total", "done", "failed", "pending")} == {
        "key": "old",
        "state": "finished",
        "total": 2,
        "done": 2,
        "failed": 0,
        "pending": 0,
    }
    assert shown["callbacks"]["on_success"]["status"] == "done"  # from pruned_key
    with q.batch("old", on_success="notify") as b:
        with pytest.raises(BatchClosed):
            b.enqueue("noop", "old-late")
    assert q.close_batch("old")["state"] == "finished"
    assert q.batch_status("old")["state"] == "finished"
    with engine.connect() as conn:
        assert batch_rows(conn, "old") == (None, 0)
        assert count(conn, job_queue, jq.task_key.like("batch:old:%")) == 0
        assert count(conn, job_queue, jq.task_key == "old-late") == 0
        assert service.prune(conn, done_days=7, failed_days=30, pause=0).job_batches == 0


def test_a_batch_is_kept_while_open_closed_or_its_callbacks_pending_and_by_its_members_keep_time(engine):
    from jobqueue import JobQueue

    q = JobQueue(engine)
    q.batch("opened", on_complete="cleanup")  # open, never closed
    run_batch(engine, "closed", ["done", "done"], close=False)  # members finished, batch still open
    run_batch(engine, "pending", ["done"], callbacks_ran=False)  # finished; callbacks not run yet
    run_batch(engine, "failing", ["done", "failed"])  # a failure: kept as failed jobs are (30 days)
    for key in ("opened", "closed", "pending", "failing"):
        age(engine, key)
    with engine.connect() as conn:
        counts = service.prune(conn, done_days=7, failed_days=30, pause=0)
        assert counts.job_batches == 0
        for key in ("opened", "closed", "pending", "failing"):
            assert batch_rows(conn, key)[0] is not None, key
        assert batch_rows(conn, "failing")[1] == 1  # the failed member is kept 30 days, and its batch
    age(engine, "failing", days_ago=40)
    with engine.connect() as conn:
        assert service.prune(conn, done_days=7, failed_days=30, pause=0).job_batches == 1
        assert batch_rows(conn, "failing") == (None, 0)
        # The callbacks of the pending batch run: then it goes too.
        conn.execute(
            sa.update(job_queue)
            .where(jq.task_key.like("batch:pending:%"))
            .values(status="done", started_at=sa.func.now(), finished_at=sa.func.now())
        )
        conn.commit()
    age(engine, "pending")
    with engine.connect() as conn:
        assert service.prune(conn, done_days=7, failed_days=30, pause=0).job_batches == 1


def test_a_dry_run_counts_batches_without_deleting(engine):
    from jobqueue.core.schema import job_batch

    run_batch(engine, "dry", ["done", "done"])
    age(engine, "dry")
    with engine.connect() as conn:
        dry = service.prune(conn, done_days=7, failed_days=30, dry_run=True)
        assert (dry.done, dry.job_batches, dry.dry_run) == (4, 1, True)
        assert count(conn, job_batch) == 1 and count(conn, job_queue) == 4
        assert service.prune(conn, done_days=0, failed_days=0, dry_run=True).job_batches == 0


def test_a_pruned_batch_key_is_forgotten_with_the_job_keys(engine):
    run_batch(engine, "again", ["done"])
    age(engine, "again")
    with engine.connect() as conn:
        service.prune(conn, done_days=7, failed_days=30, keys_days=365, pause=0)
        conn.execute(
            sa.text("UPDATE pruned_batch SET pruned_at = :t"),
            {"t": repository.reads.database_now(conn) - timedelta(days=400)},
        )
        conn.commit()
        counts = service.prune(conn, done_days=7, failed_days=30, keys_days=365, pause=0)
        assert counts.keys_expired == 1
    with engine.connect() as conn:
        shown, created = repository.batches.open_batch(conn, "again", on_complete="cleanup")
    assert created is True and shown["state"] == "open"


def test_opening_a_key_in_a_transaction_older_than_its_prune_finds_the_pruned_batch(mysql_engine, db_server):
    # A caller's REPEATABLE READ transaction whose snapshot predates the prune: its consistent
    # read would not see pruned_batch's new row and would open a second batch of the same key.
    # MariaDB 11.6.2+ (innodb_snapshot_isolation) refuses the locking read instead (1020): the
    # caller hears TransactionConflict, runs its transaction again, and finds the pruned batch.
    from jobqueue.core.errors import TransactionConflict
    from jobqueue.core.schema import job_batch

    run_batch(mysql_engine, "late", ["done"])
    age(mysql_engine, "late")
    with mysql_engine.connect() as caller:
        caller = caller.execution_options(isolation_level="REPEATABLE READ")
        caller.begin()
        assert count(caller, job_batch, job_batch.c.batch_key == "late") == 1  # the snapshot
        with mysql_engine.connect() as conn:
            assert service.prune(conn, done_days=7, failed_days=30, pause=0).job_batches == 1
        try:
            shown, created = repository.batches.open_batch(caller, "late", on_complete="cleanup")
            assert db_server != "mariadb11"
        except TransactionConflict:
            assert db_server == "mariadb11"
            caller.rollback()
            caller.begin()
            shown, created = repository.batches.open_batch(caller, "late", on_complete="cleanup")
        caller.commit()
    assert (created, shown["state"], shown["total"]) == (False, "finished", 1)
    with mysql_engine.connect() as conn:
        assert batch_rows(conn, "late") == (None, 0)
