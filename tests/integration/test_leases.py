"""The lease lifecycle inside one worker, on the real database: renewal failures, held rows in a
completion batch, lost COMMIT replies, skipped rows, the database clock, cooperative
cancellation (issue 9). The cases with several processes are in tests/acceptance/test_lease_lifecycle.py."""

from __future__ import annotations

import threading
import time

import pymysql
import pytest
import sqlalchemy as sa
from sqlalchemy.exc import OperationalError

from jobqueue.core import db, metrics, repository, service
from jobqueue.core.builtin_tasks import noop, sleep
from jobqueue.core.errors import LeaseLostError
from jobqueue.core.models import Lease, Outcome, Status
from jobqueue.core.schema import job_attempt, job_queue, job_result, worker_stats
from jobqueue.core.tasks import Registry, TaskSpec
from jobqueue.core.worker import LeaseState, Worker, WorkerConfig
from testkit.locks import hold_rows
from testkit.procs import wait_until

jq = job_queue.c


def registry_with(**handlers) -> Registry:
    reg = Registry()
    reg.register(TaskSpec("noop", noop))
    reg.register(TaskSpec("sleep", sleep))
    for name, fn in handlers.items():
        reg.register(TaskSpec(name, fn))
    return reg


def start(worker: Worker) -> threading.Thread:
    t = threading.Thread(target=worker.run, daemon=True)
    t.start()
    return t


def get(engine, job_id):
    with engine.connect() as conn:
        return repository.reads.get_job(conn, job_id)


def lost_connection() -> OperationalError:
    return OperationalError(
        "UPDATE job_queue",
        {},
        pymysql.err.OperationalError(
            2003, "Can't connect to MySQL server on '127.0.0.1' ([Errno 111] Connection refused)"
        ),
    )


# --- 3: a worker whose renewals fail learns that it lost the lease ------------------------------


def test_failing_renewals_lose_the_lease_by_its_local_deadline(engine, monkeypatch):
    seen = {}

    def patient(payload, ctx):
        seen["lost"] = ctx.lease_lost.wait(15)
        seen["after"] = time.monotonic() - seen["started"]

    def start_mark(payload, ctx):
        seen["started"] = time.monotonic()
        patient(payload, ctx)

    reg = registry_with(patient=start_mark)
    with engine.connect() as conn:
        res = service.enqueue(conn, "patient", "p1", registry=reg)

    def unreachable(conn, leases, lease_seconds):
        raise lost_connection()

    monkeypatch.setattr(service, "renew", unreachable)
    worker = Worker(engine, WorkerConfig(concurrency=1, lease_seconds=2), registry=reg)
    t = start(worker)
    try:
        wait_until(lambda: "after" in seen, timeout=15, message="the handler to hear of the loss")
    finally:
        worker.stop()
        t.join(15)
    assert seen["lost"] is True, "ctx.lease_lost was set"
    # Lost by the deadline (claim + lease - margin = 1.8 s), not later than a renewal after it.
    assert 1.0 < seen["after"] < 3.5, seen
    assert get(engine, res.id).attempts == 1


# --- 4: finished jobs are renewed while their completion waits; one held row stalls no one ------


@pytest.mark.servers_only
def test_a_held_row_in_a_completion_batch_stalls_no_other_job_and_keeps_its_lease(engine):
    gate = threading.Event()

    def gated(payload, ctx):
        gate.wait(20)

    reg = registry_with(gated=gated)
    with engine.connect() as conn:
        ids = [
            r.id
            for r in service.enqueue_many(
                conn, [{"task": "gated", "task_key": f"g{i}"} for i in range(4)], registry=reg
            )
        ]
    worker = Worker(engine, WorkerConfig(concurrency=4, lease_seconds=3), registry=reg)
    t = start(worker)
    holder = None
    try:
        wait_until(lambda: len(worker.keeper.held(LeaseState.RUNNING)) == 4, message="four running")
        holder = hold_rows(engine, [ids[0]])  # a stray SELECT ... FOR UPDATE on one running job
        gate.set()
        wait_until(
            lambda: all(get(engine, i).status is Status.DONE for i in ids[1:]),
            timeout=3,
            message="the other three done at once, not after a lock-wait timeout",
        )
        time.sleep(4)  # longer than the lease: nobody may take the held job meanwhile, nor may we drop it
        assert get(engine, ids[0]).status is Status.RUNNING
        assert [h.lease.job_id for h in worker.keeper.held()] == [ids[0]]
    finally:
        if holder is not None:
            holder.rollback()
            holder.close()
    try:
        wait_until(lambda: get(engine, ids[0]).status is Status.DONE, timeout=5, message="done once let go")
    finally:
        worker.stop()
        t.join(15)
    assert all(get(engine, i).attempts == 1 for i in ids)


@pytest.mark.servers_only
@pytest.mark.parametrize("max_attempts, status, outcome", [(3, Status.SCHEDULED, "retry"), (1, Status.FAILED, "fail")])
def test_a_failed_attempt_on_a_held_row_is_written_once_it_is_let_go(engine, max_attempts, status, outcome):
    """A handler raised while another transaction held its job's row for a moment (an operator's
    action, a sweep): its retry or failure waits for the row, as a completion does. It used to
    take the answer BUSY for a lost lease: nothing written, the error forgotten, the job left
    `running` until its lease ran out and the reaper charged an attempt to it."""
    gate = threading.Event()

    def raising(payload, ctx):
        gate.wait(20)
        raise RuntimeError("boom")

    reg = registry_with(raising=raising)
    with engine.connect() as conn:
        job_id = service.enqueue(conn, "raising", "r1", max_attempts=max_attempts, registry=reg).id
    worker = Worker(engine, WorkerConfig(concurrency=1, lease_seconds=10), registry=reg)
    t = start(worker)
    try:
        wait_until(lambda: len(worker.keeper.held(LeaseState.RUNNING)) == 1, message="running")
        holder = hold_rows(engine, [job_id])
        try:
            gate.set()
            time.sleep(0.5)  # the write meets the held row
        finally:
            holder.rollback()
            holder.close()
        wait_until(lambda: get(engine, job_id).status is status, timeout=5, message=f"{outcome} written")
    finally:
        gate.set()
        worker.stop()
        t.join(15)
    with engine.connect() as conn:
        attempts = conn.execute(sa.select(job_attempt.c.outcome, job_attempt.c.error)).all()
    assert [a.outcome for a in attempts] == [outcome] and "boom" in attempts[0].error


@pytest.mark.servers_only
def test_a_shutdown_hands_back_a_job_in_hand_whose_row_is_held_for_a_moment(engine):
    """A job claimed ahead of a thread goes back to `ready` when its worker stops, even if its row
    was held by another transaction at that instant. It used to stay `running` (the release's
    BUSY taken for done) until its lease ran out."""
    gate = threading.Event()

    def gated(payload, ctx):
        gate.wait(20)

    reg = registry_with(gated=gated)
    with engine.connect() as conn:
        first, second = (
            r.id for r in service.enqueue_many(conn, [{"task": "gated", "task_key": k} for k in "ab"], registry=reg)
        )
    worker = Worker(engine, WorkerConfig(concurrency=1, prefetch=1, lease_seconds=10), registry=reg)
    t = start(worker)
    holder = None
    try:
        wait_until(lambda: len(worker.keeper) == 2, message="one running, one in hand")
        holder = hold_rows(engine, [second])
        worker.stop()
        time.sleep(0.5)  # the release meets the held row
        holder.rollback()
        holder.close()
        holder = None
        gate.set()
        t.join(15)
    finally:
        gate.set()
        if holder is not None:
            holder.rollback()
            holder.close()
        worker.stop()
        t.join(15)
    assert get(engine, first).status is Status.DONE
    job = get(engine, second)
    assert (job.status, job.attempts, job.lease_owner) == (Status.READY, 1, None)


# --- 6: a lost COMMIT reply: the retry recognises its own write ---------------------------------


@pytest.fixture
def commit_reply_lost(engine, monkeypatch):
    """Make the next COMMIT land in the database but its reply never arrive (the connection
    drops right after), as when the network goes between the server's commit and its answer."""
    dialect = engine.dialect
    real = dialect.do_commit
    armed = {"left": 0}

    def do_commit(dbapi_connection):
        real(dbapi_connection)
        if armed["left"]:
            armed["left"] -= 1
            if engine.dialect.name in ("mysql", "mariadb"):
                dbapi_connection.close()
                raise dialect.loaded_dbapi.OperationalError(2013, "Lost connection to MySQL server during query")
            raise __import__("sqlite3").OperationalError("disk I/O error: database is locked")

    monkeypatch.setattr(dialect, "do_commit", do_commit)
    return armed


@pytest.mark.servers_only
def test_enqueue_after_a_lost_commit_reply_is_not_a_duplicate(engine, commit_reply_lost, caplog):
    commit_reply_lost["left"] = 1
    with engine.connect() as conn:
        res = service.enqueue(conn, "noop", "lost-reply-1", {"a": 1})
        assert res.duplicate is False and res.status is Status.READY
        assert conn.execute(sa.select(sa.func.count()).select_from(job_queue)).scalar() == 1
        conn.rollback()  # end the read's transaction: the next enqueue is its own again
        again = service.enqueue(conn, "noop", "lost-reply-1", {"a": 1})
    assert again.duplicate is True and again.id == res.id  # a real replay still is one
    assert "event=db_retry" in caplog.text and caplog.text.count("event=duplicate_enqueue") == 1


@pytest.mark.servers_only
def test_record_result_and_retry_after_a_lost_commit_reply_report_success(engine, commit_reply_lost, caplog):
    with engine.connect() as conn:
        service.enqueue(conn, "noop", "r1")
        (c,) = service.claim(conn, "w", 1, ["default"], lease_seconds=30)
        commit_reply_lost["left"] = 1
        assert service.record_result(conn, c.lease, "r1", {"file": "a"}) is True
        assert "event=duplicate_result" not in caplog.text
        assert conn.execute(sa.select(sa.func.count()).select_from(job_result)).scalar() == 1
        assert service.record_result(conn, c.lease, "r1", {"file": "b"}) is False  # a real duplicate
        commit_reply_lost["left"] = 1
        assert service.retry(conn, c.lease, "boom", 60) is Outcome.OK
        job = repository.reads.get_job(conn, c.job.id)
        assert job.status is Status.SCHEDULED
        attempts = conn.execute(sa.select(job_attempt.c.outcome)).scalars().all()
    assert attempts == ["retry"] and "event=lease_lost" not in caplog.text


@pytest.mark.servers_only
def test_complete_after_a_lost_commit_reply_is_ok(engine, commit_reply_lost, caplog):
    with engine.connect() as conn:
        service.enqueue(conn, "noop", "c1")
        (c,) = service.claim(conn, "w", 1, ["default"], lease_seconds=30)
        commit_reply_lost["left"] = 1
        assert service.complete(conn, c.lease) is Outcome.OK
        assert repository.reads.get_job(conn, c.job.id).status is Status.DONE
    assert "event=lease_lost" not in caplog.text


@pytest.mark.servers_only
@pytest.mark.parametrize(
    "action, running, after",
    [("cancel", False, Status.CANCELLED), ("fail", True, Status.FAILED), ("requeue", True, Status.READY)],
)
def test_an_operator_action_after_a_lost_commit_reply_answers_what_it_did(
    engine, commit_reply_lost, action, running, after
):
    """The soak saw it on MySQL: a cancel whose COMMIT landed but whose reply never came was run
    again by the transaction's retry, which found the job cancelled and answered `changed:
    false`, as if someone else had. A fail answered 409 (already failed), a forced requeue of a
    running job `changed: false` (or, had a worker claimed it in between, would have requeued it
    a second time). The retry now finds its own audit row and answers what the first try did."""
    with engine.connect() as conn:
        job_id = service.enqueue(conn, "noop", f"op-{action}").id
        if running:
            service.claim(conn, "w", 1, ["default"], lease_seconds=30)
        before = Status.RUNNING if running else Status.READY
        commit_reply_lost["left"] = 1
        if action == "cancel":
            result = service.cancel_job(conn, job_id, "lost reply", actor="ops")
        elif action == "fail":
            result = service.fail_job(conn, job_id, "lost reply", actor="ops")
        else:
            result = service.requeue_job(conn, job_id, force=True, actor="ops")
        assert (result.before, result.after, result.changed) == (before, after, True)
        assert repository.reads.get_job(conn, job_id).status is after
        audited = conn.execute(sa.text("SELECT actor, action FROM audit_log WHERE job_id = :id"), {"id": job_id}).all()
        attempts = conn.execute(sa.select(job_attempt.c.outcome).where(job_attempt.c.job_id == job_id)).scalars().all()
    assert [tuple(r) for r in audited] == [("ops", action)]
    assert len(attempts) == (1 if running else 0)


@pytest.mark.servers_only
def test_an_operator_action_in_the_callers_transaction_reads_no_audit_row_first(engine):
    """The caller owns that transaction and its retries: the action's first statement is still
    its locking read, so a REPEATABLE READ caller's snapshot is not taken earlier than before."""
    sent: list[str] = []

    def record(conn, cursor, statement, *args):
        sent.append(" ".join(statement.split()).lower())

    with engine.connect() as conn:
        job_id = service.enqueue(conn, "noop", "op-in-callers").id
        conn.commit()
        sa.event.listen(engine, "before_cursor_execute", record)
        try:
            with conn.begin():
                assert service.cancel_job(conn, job_id, "theirs", actor="ops").changed
        finally:
            sa.event.remove(engine, "before_cursor_execute", record)
    job_reads = [s for s in sent if "from job_queue" in s or "from audit_log" in s]
    assert "from job_queue" in job_reads[0] and "for update" in job_reads[0], job_reads


@pytest.mark.servers_only
def test_a_bulk_action_after_a_lost_commit_reply_counts_what_it_did(engine, commit_reply_lost):
    """The same for a bulk action's batch: its retry found the jobs already cancelled (no longer
    eligible) and counted 0 changed, 3 skipped, for a batch that cancelled all 3."""
    with engine.connect() as conn:
        ids = [r.id for r in service.enqueue_many(conn, [{"task": "noop", "task_key": f"bulk-{i}"} for i in range(3)])]
        commit_reply_lost["left"] = 1
        result = service.bulk_action(conn, "cancel", actor="ops", ids=ids)
        assert (result.changed, result.skipped, result.finished) == (3, 0, True)
        assert {repository.reads.get_job(conn, i).status for i in ids} == {Status.CANCELLED}
        audited = conn.execute(sa.text("SELECT action, count FROM audit_log")).all()
    assert [tuple(r) for r in audited] == [("bulk_cancel", 3)]


@pytest.mark.servers_only
def test_a_bulk_batch_after_a_lost_commit_reply_counts_what_it_passed_over(engine, commit_reply_lost):
    """And what the batch passed over: a job already finished is skipped, on the first try and
    so in the answer to the retry (which used to say 0 skipped). The audit row says so too."""
    with engine.connect() as conn:
        ids = [r.id for r in service.enqueue_many(conn, [{"task": "noop", "task_key": f"over-{i}"} for i in range(3)])]
        service.cancel_job(conn, ids[0], actor="ops")
        commit_reply_lost["left"] = 1
        result = service.bulk_action(conn, "fail", actor="ops", ids=ids, reason="bad batch")
        assert (result.changed, result.busy, result.skipped, result.finished) == (2, 0, 1, True)
        detail = conn.execute(sa.text("SELECT detail FROM audit_log WHERE action = 'bulk_fail'")).scalar_one()
    assert detail == f"ids {ids[1]},{ids[2]}; passed over 0 busy, 1 skipped, 0 blocked; reason: bad batch"


@pytest.mark.servers_only
def test_a_pause_after_a_lost_commit_reply_says_it_paused(engine, commit_reply_lost):
    """And for a pause: its retry found the queue paused and answered `changed: false`."""
    with engine.connect() as conn:
        commit_reply_lost["left"] = 1
        state = service.pause_queue(conn, "lost-reply", actor="ops")
        assert (state.paused, state.changed, state.changed_by) == (True, True, "ops")
        assert state.changed_at is not None
        audited = conn.execute(sa.text("SELECT action, selection FROM audit_log")).all()
    assert [tuple(r) for r in audited] == [("pause", "queue lost-reply")]


@pytest.mark.servers_only
def test_disabling_a_schedule_after_a_lost_commit_reply_says_it_changed(engine, commit_reply_lost):
    """And for a recurring schedule's disable: its retry found it disabled and said unchanged."""
    with engine.connect() as conn:
        service.upsert_recurring(conn, "lost-reply", cron="* * * * *", task="noop", actor="ops")
        commit_reply_lost["left"] = 1
        row, changed = service.set_recurring_enabled(conn, "lost-reply", False, actor="ops")
        assert (row["enabled"], changed) == (False, True)
        audited = (
            conn.execute(sa.text("SELECT action FROM audit_log WHERE action LIKE 'recurring_%able'")).scalars().all()
        )
    assert audited == ["recurring_disable"]


# --- 7: every ready row a claim passes by is counted ------------------------------------------


def skipped() -> float:
    return metrics.REGISTRY.get_sample_value("jobqueue_rows_skipped_total") or 0.0


@pytest.mark.servers_only
def test_a_claim_that_took_fewer_rows_than_it_asked_counts_the_rows_it_passed_by(engine):
    with engine.connect() as conn:
        ids = [r.id for r in service.enqueue_many(conn, [{"task": "noop", "task_key": f"s{i}"} for i in range(6)])]
    holder = hold_rows(engine, ids[:5])
    try:
        before = skipped()
        with engine.connect() as conn:
            got = service.claim(conn, "w", 3, ["default"], lease_seconds=30)
        assert [c.job.id for c in got] == [ids[5]]
        assert skipped() == before + 5
    finally:
        holder.rollback()
        holder.close()


# --- 8: per-minute activity by the database clock ------------------------------------------------


@pytest.mark.sqlite_only
def test_activity_minutes_come_from_the_database_clock(engine, monkeypatch):
    shifted = time.time() + 7200  # the database's clock two hours ahead of this host's
    monkeypatch.setattr(db.clock, "sqlite_clock", lambda: shifted)
    with engine.connect() as conn:
        repository.processes.register_process(
            conn, process_id="h:1", host="h", pid=1, kind="worker", concurrency=1, queues="*"
        )
        repository.processes.heartbeat(conn, "h:1", jobs_in_hand=0, processed=1, stats={"completed": 1})
        minute = conn.execute(sa.select(worker_stats.c.minute)).scalar()
    expected = time.strftime("%Y-%m-%d %H:%M", time.gmtime(shifted))
    assert str(minute).startswith(expected), (minute, expected)


# --- 9: cooperative cancellation ------------------------------------------------------------


@pytest.mark.servers_only
def test_an_operator_failing_a_running_job_stops_its_handler_within_a_renewal(engine, caplog):
    reg = registry_with()
    with engine.connect() as conn:
        res = service.enqueue(conn, "sleep", "long-sleep", {"seconds": 60}, registry=reg)
    worker = Worker(engine, WorkerConfig(concurrency=1, lease_seconds=3), registry=reg)
    t = start(worker)
    try:
        wait_until(lambda: worker.keeper.held(LeaseState.RUNNING), message="running")
        with engine.connect() as conn:
            service.fail_job(conn, res.id, "customer cancelled", actor="test")
        failed_at = time.monotonic()
        wait_until(lambda: len(worker.keeper) == 0, timeout=5, message="the handler stopped and the slot freed")
        assert time.monotonic() - failed_at < worker.config.renew_seconds + 1.5
    finally:
        worker.stop()
        t.join(15)
    job = get(engine, res.id)
    assert job.status is Status.FAILED and job.last_error == "customer cancelled"  # the fenced write changed nothing
    assert "event=handler_lease_lost" in caplog.text


@pytest.mark.servers_only
def test_slots_show_a_lost_lease_whose_handler_still_runs(engine):
    gate = threading.Event()

    def stubborn(payload, ctx):
        gate.wait(30)  # ignores ctx.lease_lost

    reg = registry_with(stubborn=stubborn)
    with engine.connect() as conn:
        res = service.enqueue(conn, "stubborn", "st", registry=reg)
    worker = Worker(engine, WorkerConfig(concurrency=1, lease_seconds=3, heartbeat_seconds=0.5), registry=reg)
    t = start(worker)
    try:
        wait_until(lambda: worker.keeper.held(LeaseState.RUNNING), message="running")
        with engine.connect() as conn:
            service.requeue_job(conn, res.id, force=True, actor="test")
        wait_until(lambda: worker.keeper.held(LeaseState.LOST), timeout=5, message="the lease known lost")
        (slot,) = [s for s in worker.status()["slots"] if s["job_id"] == res.id and s["attempt"] == 1]
        assert slot["state"] == "lost" and slot["handler_running"] is True and slot["lost_reason"] == "renew"

        def heard():
            with engine.connect() as conn:
                processes, _ = repository.processes.list_processes(conn)
            return [s for p in processes for s in p["slots"] if s["job_id"] == res.id and s["state"] == "lost"]

        assert wait_until(heard, timeout=5, message="the heartbeat to carry it")[0]["task"] == "stubborn"
    finally:
        gate.set()
        worker.stop()
        t.join(15)


def test_a_lost_lease_refuses_record_result(engine):
    with engine.connect() as conn:
        service.enqueue(conn, "noop", "x")
        (c,) = service.claim(conn, "w", 1, ["default"], lease_seconds=30)
        service.requeue_job(conn, c.job.id, force=True)
        with pytest.raises(LeaseLostError):
            service.record_result(conn, c.lease, "x", {"late": True})
        assert service.complete(conn, Lease(c.job.id, c.lease.owner, c.lease.attempt)) is Outcome.LEASE_LOST


def test_a_process_does_not_reap_its_own_finished_attempt_whose_write_is_pending(engine):
    """The held-row case above has a race once the row is let go: this worker's own reaper (its
    lease expired while it could not renew) against its completion. `keep` settles it: the
    process's reaper leaves its finished attempts to their final write; other leases are reaped."""
    with engine.connect() as conn:
        ids = [r.id for r in service.enqueue_many(conn, [{"task": "noop", "task_key": f"k{i}"} for i in range(2)])]
        claimed = service.claim(conn, "w:1", 2, ["default"], lease_seconds=30)
        conn.execute(
            sa.update(job_queue).where(job_queue.c.id.in_(ids)).values(lease_until=db.db_after(-60_000_000))
        )  # both leases a minute past
        conn.commit()
        mine = next(c.lease for c in claimed if c.job.id == ids[0])
        result = service.reap(conn, keep=[(mine.job_id, mine.attempt)])
        assert [j.job_id for j in result.jobs] == [ids[1]]
        assert get(engine, ids[0]).status is Status.RUNNING
        assert service.complete(conn, mine) is Outcome.OK  # the pending write lands
    assert get(engine, ids[0]).status is Status.DONE and get(engine, ids[0]).attempts == 1
