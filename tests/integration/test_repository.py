"""The repository's verbs against a real database: MariaDB, and SQLite where the behaviour is
shared."""

from __future__ import annotations

import threading
import time

import pytest
import sqlalchemy as sa

from jobqueue.core import repository, service
from jobqueue.core.db import db_now
from jobqueue.core.errors import InvalidState, JobNotFound, LeaseStillValid, PayloadTooLarge, ValidationError
from jobqueue.core.models import EmptyClaim, Lease, Outcome, Status
from jobqueue.core.schema import job_queue, job_result
from jobqueue.core.tasks import LeaseLostError


def count(conn, table=job_queue, *where):
    return conn.execute(sa.select(sa.func.count()).select_from(table).where(*where)).scalar()


def add(conn, n, prefix="k", **kw):
    return service.enqueue_many(conn, [{"task": "noop", "task_key": f"{prefix}{i}", **kw} for i in range(n)])


def test_enqueue_then_duplicate_writes_nothing(engine, caplog):
    with engine.connect() as conn:
        first = service.enqueue(conn, "noop", "order-1", {"a": 1})
        second = service.enqueue(conn, "noop", "order-1", {"a": 2})
        assert not first.duplicate and second.duplicate
        assert second.id == first.id
        assert count(conn) == 1
        assert repository.reads.get_job(conn, first.id).payload == {"a": 1}
    assert "event=duplicate_enqueue" in caplog.text and "task_key=order-1" in caplog.text


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"task_name": "nope"}, "task"),
        ({"task_key": ""}, "task_key"),
        ({"task_key": "x" * 81}, "task_key"),
        ({"task_key": "bad\nkey"}, "task_key"),
        ({"task_key": " padded"}, "task_key"),
        ({"payload": [1, 2]}, "payload"),
        ({"payload": "text"}, "payload"),
        ({"payload": {"x": float("nan")}}, "payload"),
        ({"queue": "no spaces"}, "queue"),
        ({"priority": "high"}, "priority"),
        ({"priority": True}, "priority"),
        ({"priority": 10**6}, "priority"),
        ({"delay": -1}, "delay"),
        ({"delay": "soon"}, "delay"),
        ({"max_attempts": 0}, "max_attempts"),
        ({"max_attempts": 2.5}, "max_attempts"),
    ],
)
def test_bad_input_is_rejected_and_writes_nothing(engine, kwargs, field):
    args = {"task_name": "noop", "task_key": "k1", "payload": {}, **kwargs}
    with engine.connect() as conn:
        with pytest.raises(ValidationError) as err:
            service.enqueue(conn, args.pop("task_name"), args.pop("task_key"), args.pop("payload"), **args)
        assert err.value.field == field
        assert count(conn) == 0


def test_payload_size_limit(engine, monkeypatch):
    monkeypatch.setenv("JOBQUEUE_MAX_PAYLOAD_BYTES", "100")
    with engine.connect() as conn:
        with pytest.raises(PayloadTooLarge):
            service.enqueue(conn, "noop", "big", {"blob": "x" * 200})
        assert count(conn) == 0


def test_batch_enqueue_is_all_or_nothing_and_reports_duplicates(engine):
    with engine.connect() as conn:
        service.enqueue(conn, "noop", "k1")
        with pytest.raises(ValidationError, match="job 2"):
            service.enqueue_many(
                conn,
                [
                    {"task": "noop", "task_key": "k2"},
                    {"task": "noop", "task_key": "k3"},
                    {"task": "noop", "task_key": ""},
                ],
            )
        assert count(conn) == 1
        res = service.enqueue_many(
            conn, [{"task": "noop", "task_key": f"k{i}"} for i in range(1, 6)] + [{"task": "noop", "task_key": "k5"}]
        )
        assert [r.duplicate for r in res] == [True, False, False, False, False, True]
        assert res[-1].id == res[-2].id
        assert count(conn) == 5


def test_claim_takes_ready_jobs_in_priority_then_id_order(engine):
    with engine.connect() as conn:
        add(conn, 3, "low", priority=5)
        add(conn, 2, "high", priority=-1)
        claimed = service.claim(conn, ["w:1:1", "w:1:2", "w:1:3"], 3, ["default"], lease_seconds=30)
        assert [c.job.task_key for c in claimed] == ["high0", "high1", "low0"]
        assert [c.lease.owner for c in claimed] == ["w:1:1", "w:1:2", "w:1:3"]
        for c in claimed:
            job = repository.reads.get_job(conn, c.job.id)
            assert job.status is Status.RUNNING and job.attempts == 1 and job.lease_owner == c.lease.owner
            assert job.lease_until > job.started_at


def test_claim_respects_queues_and_empty_claim_is_not_an_error(engine):
    with engine.connect() as conn:
        service.enqueue(conn, "noop", "a", queue="mail")
        assert service.claim(conn, "w", 5, ["default"], lease_seconds=30) == []
        report = repository.claim.classify_empty(conn, ["default"])
        assert report.kind is EmptyClaim.IDLE
        got = service.claim(conn, "w", 5, ["default", "mail"], lease_seconds=30)
        assert [c.job.task_key for c in got] == ["a"]
        report = repository.claim.classify_empty(conn, ["mail"])
        assert report.kind is EmptyClaim.WAITING and report.next_lease_expiry is not None


def test_delayed_job_is_scheduled_until_due(engine):
    with engine.connect() as conn:
        # Due in an hour, then made due by moving run_at back: a short real delay could pass
        # before the first promote on a loaded machine.
        res = service.enqueue(conn, "noop", "later", delay=3600)
        assert res.status is Status.SCHEDULED
        assert service.claim(conn, "w", 1, ["default"], lease_seconds=30) == []
        assert repository.claim.classify_empty(conn, ["default"]).next_scheduled is not None
        assert service.promote_due(conn) == 0
        conn.execute(sa.update(job_queue).where(job_queue.c.id == res.id).values(run_at=db_now()))
        conn.commit()
        assert service.promote_due(conn) == 1
        assert len(service.claim(conn, "w", 1, ["default"], lease_seconds=30)) == 1


def test_fenced_writes_need_owner_and_attempt(engine, caplog):
    with engine.connect() as conn:
        add(conn, 1)
        (c,) = service.claim(conn, "w1", 1, ["default"], lease_seconds=30)
        wrong_owner = Lease(c.lease.job_id, "w2", c.lease.attempt)
        wrong_attempt = Lease(c.lease.job_id, c.lease.owner, c.lease.attempt + 1)
        assert service.complete(conn, wrong_owner) is Outcome.LEASE_LOST
        assert service.complete(conn, wrong_attempt) is Outcome.LEASE_LOST
        assert service.renew_leases(conn, [wrong_owner], 30) == {c.lease.job_id: Outcome.LEASE_LOST}
        assert repository.reads.get_job(conn, c.job.id).status is Status.RUNNING
        assert service.renew_leases(conn, [c.lease], 30) == {c.lease.job_id: Outcome.OK}
        assert service.complete(conn, c.lease) is Outcome.OK
        # Finalized once: a second completion or a failure of the same lease changes nothing.
        assert service.fail(conn, c.lease, "late") is Outcome.LEASE_LOST
        job = repository.reads.get_job(conn, c.job.id)
        assert job.status is Status.DONE and job.finished_at is not None and job.last_error is None
    assert caplog.text.count("event=lease_lost") == 4


def test_retry_then_fail_keeps_error_and_attempt_history(engine):
    with engine.connect() as conn:
        service.enqueue(conn, "noop", "r", max_attempts=2)
        (c,) = service.claim(conn, "w", 1, ["default"], lease_seconds=30)
        assert service.retry(conn, c.lease, "boom 1", delay_seconds=0) is Outcome.OK
        job = repository.reads.get_job(conn, c.job.id)
        assert job.status is Status.SCHEDULED and job.last_error == "boom 1" and job.lease_owner is None
        assert service.promote_due(conn) == 1
        (c2,) = service.claim(conn, "w", 1, ["default"], lease_seconds=30)
        assert c2.lease.attempt == 2
        assert service.fail(conn, c2.lease, "boom 2") is Outcome.OK
        job = repository.reads.get_job(conn, c.job.id)
        assert job.status is Status.FAILED and job.attempts == 2 and job.last_error == "boom 2"
        history = repository.reads.list_attempts(conn, c.job.id)
        assert [(h["attempt"], h["outcome"], h["error"]) for h in history] == [
            (1, "retry", "boom 1"),
            (2, "fail", "boom 2"),
        ]
        assert history[0]["worker"] == "w"


def test_record_result_once_per_task_key_and_only_with_the_lease(engine, caplog):
    with engine.connect() as conn:
        add(conn, 1)
        (c,) = service.claim(conn, "w1", 1, ["default"], lease_seconds=30)
        assert service.record_result(conn, c.lease, "k0", {"file": "a"}) is True
        assert service.record_result(conn, c.lease, "k0", {"file": "b"}) is False
        with pytest.raises(LeaseLostError):
            service.record_result(conn, Lease(c.lease.job_id, "intruder", c.lease.attempt), "k0", {"file": "c"})
        rows = conn.execute(sa.select(job_result)).all()
        assert len(rows) == 1 and rows[0].result == {"file": "a"} and rows[0].worker == "w1"
    assert "event=duplicate_result" in caplog.text


def test_reap_returns_only_expired_leases_and_keeps_attempts(engine):
    with engine.connect() as conn:
        add(conn, 3)
        short = service.claim(conn, "dead", 2, ["default"], lease_seconds=1)
        (alive,) = service.claim(conn, "alive", 1, ["default"], lease_seconds=60)
        assert service.reap(conn).reclaimed == 0
        time.sleep(1.1)
        # One of the short leases gets renewed just in time: the reaper must not take it.
        assert service.renew_leases(conn, [short[0].lease], 60)[short[0].lease.job_id] is Outcome.OK
        result = service.reap(conn)
        assert (result.reclaimed, result.failed) == (1, 0)
        back = repository.reads.get_job(conn, short[1].job.id)
        assert back.status is Status.READY and back.attempts == 1 and back.lease_owner is None
        assert repository.reads.get_job(conn, short[0].job.id).status is Status.RUNNING
        assert repository.reads.get_job(conn, alive.job.id).status is Status.RUNNING
        # The dead worker's late completion is refused by the fence.
        assert service.complete(conn, short[1].lease) is Outcome.LEASE_LOST
        (again,) = service.claim(conn, "w2", 1, ["default"], lease_seconds=60)
        assert again.job.id == short[1].job.id and again.lease.attempt == 2
        outcomes = [h["outcome"] for h in repository.reads.list_attempts(conn, again.job.id)]
        assert outcomes == ["lease_expired"]


def test_reap_fails_jobs_without_attempts_left(engine):
    with engine.connect() as conn:
        service.enqueue(conn, "noop", "once", max_attempts=1)
        (c,) = service.claim(conn, "dead", 1, ["default"], lease_seconds=1)
        time.sleep(1.1)
        assert service.reap(conn).failed == 1
        job = repository.reads.get_job(conn, c.job.id)
        assert job.status is Status.FAILED and job.attempts == 1 and "no attempts left" in job.last_error


def test_reap_in_batches(engine):
    with engine.connect() as conn:
        add(conn, 7)
        service.claim(conn, "dead", 7, ["default"], lease_seconds=1)
        time.sleep(1.1)
        result = service.reap(conn, batch_size=3)
        assert (result.reclaimed, result.batches) == (7, 3)


def test_release_returns_job_with_attempts(engine):
    with engine.connect() as conn:
        add(conn, 1, max_attempts=1)
        (c,) = service.claim(conn, "w", 1, ["default"], lease_seconds=60)
        assert service.release(conn, c.lease) is Outcome.OK
        job = repository.reads.get_job(conn, c.job.id)
        # Interrupted on its last attempt by a shutdown: one more is allowed, attempts kept.
        assert job.status is Status.READY and job.attempts == 1 and job.max_attempts == 2
        (again,) = service.claim(conn, "w", 1, ["default"], lease_seconds=60)
        assert again.lease.attempt == 2 <= again.job.max_attempts


def test_operator_requeue_and_fail(engine):
    with engine.connect() as conn:
        service.enqueue(conn, "noop", "op", max_attempts=1)
        (c,) = service.claim(conn, "w", 1, ["default"], lease_seconds=60)
        with pytest.raises(LeaseStillValid):
            service.requeue_job(conn, c.job.id)
        res = service.requeue_job(conn, c.job.id, force=True, actor="alice")
        assert (res.before, res.after, res.changed) == (Status.RUNNING, Status.READY, True)
        job = repository.reads.get_job(conn, c.job.id)
        # attempts kept; one more attempt allowed although max_attempts was 1
        assert job.attempts == 1 and job.max_attempts == 2
        assert service.complete(conn, c.lease) is Outcome.LEASE_LOST  # old lease fenced
        assert service.requeue_job(conn, c.job.id).changed is False
        res = service.fail_job(conn, c.job.id, "operator says no")
        assert res.after is Status.FAILED
        assert repository.reads.get_job(conn, c.job.id).last_error == "operator says no"
        with pytest.raises(InvalidState):
            service.fail_job(conn, c.job.id)
        assert service.requeue_job(conn, c.job.id).after is Status.READY
        with pytest.raises(JobNotFound):
            service.requeue_job(conn, 999999)


def test_requeue_of_done_job_is_refused(engine):
    with engine.connect() as conn:
        add(conn, 1)
        (c,) = service.claim(conn, "w", 1, ["default"], lease_seconds=60)
        service.complete(conn, c.lease)
        with pytest.raises(InvalidState):
            service.requeue_job(conn, c.job.id)


def test_count_by_status(engine):
    with engine.connect() as conn:
        add(conn, 3)
        service.enqueue(conn, "noop", "m", queue="mail")
        service.claim(conn, "w", 1, ["default"], lease_seconds=60)
        assert repository.stats.count_by_status(conn) == [
            ("default", "ready", 2),
            ("default", "running", 1),
            ("mail", "ready", 1),
        ]


def test_every_queue_with_ready_jobs_has_its_oldest_ready_job(engine):
    """The oldest ready job per queue was read from the oldest `oldest_window` ready jobs of all
    queues: a queue whose jobs were all newer than another queue's backlog had none, and
    /metrics reported its oldest ready age as 0, so an alert on a stuck queue beside a busy one
    never fired. Every queue with ready jobs now has its own oldest, whatever the window."""

    def run_at(job_id: int):
        return conn.execute(sa.select(job_queue.c.run_at).where(job_queue.c.id == job_id)).scalar().replace(tzinfo=None)

    with engine.connect() as conn:
        add(conn, 5)  # the backlog: older than the others' jobs
        time.sleep(0.01)
        mail = service.enqueue(conn, "noop", "late-mail", queue="mail")  # fewer than the window
        bulk = service.enqueue_many(
            conn, [{"task": "noop", "task_key": f"bulk-{i}", "queue": "bulk"} for i in range(4)]
        )  # more than the window
        summaries, _ = repository.stats.queue_summaries(conn, oldest_window=3)
        by_queue = {q.queue: q.oldest_ready and q.oldest_ready.replace(tzinfo=None) for q in summaries}
        assert by_queue["mail"] == run_at(mail.id)
        assert by_queue["bulk"] == min(run_at(b.id) for b in bulk)
        assert by_queue["default"] is not None
        cached = repository.stats.CountsCache(2.0, oldest_window=3).summaries(conn)[0]
        assert {q.queue: q.oldest_ready and q.oldest_ready.replace(tzinfo=None) for q in cached} == by_queue


def test_counts_cache_is_shared_until_its_seconds_pass_or_an_operator_acts(engine, monkeypatch):
    """What every tab, /metrics and /api/stats of one process read: the same figures until they
    are live_seconds old (history 15 times as long), recounted at once after an operator action
    in this process, and each pair capped (done at HISTORY_CAP, shown as capped, never guessed)."""
    from jobqueue.core.repository import stats

    clock = [1000.0]
    monkeypatch.setattr(stats.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(stats, "CAPS", {**stats.CAPS, "done": 2})
    cache = repository.stats.CountsCache(2.0)
    with engine.connect() as conn:
        jobs = add(conn, 3)
        conn.execute(sa.update(job_queue).where(job_queue.c.id.in_([j.id for j in jobs])).values(status="done"))
        conn.commit()
        add(conn, 2, prefix="r")

        def seen():
            (q,), _ = cache.summaries(conn)
            return q.counts["ready"], q.counts["done"], q.capped

        assert seen() == (2, 2, frozenset({"done"}))  # 3 done, capped at 2
        add(conn, 1, prefix="s")
        clock[0] += 1.9
        assert seen() == (2, 2, frozenset({"done"}))  # within 2 s: the same figures
        clock[0] += 0.2
        assert seen() == (3, 2, frozenset({"done"}))  # live recounted, history kept
        failed = service.fail_job(conn, jobs[0].id + 3, "no")  # a ready job, by an operator
        assert failed.changed
        assert cache.summaries(conn)[0][0].counts["failed"] == 1  # forgotten at once
        assert repository.stats.queue_summaries(conn)[0][0].counts["ready"] == 2  # direct callers: fresh

    fresh = repository.stats.CountsCache(0)
    with engine.connect() as conn:
        add(conn, 1, prefix="t")
        assert fresh.summaries(conn)[0][0].counts["ready"] == 3


def test_history_that_is_due_is_recounted_behind_the_request(mysql_engine, monkeypatch):
    """At 5,000,000 rows counting the finished jobs (up to FAILED_CAP failed per queue) took
    0.1-0.2 s in whichever overview request found it due: one request in 20 was slow. The
    request that finds it due now starts the recount on a thread of its own and answers with the
    figures it had. Each recount is held here, after counting, on purpose: nobody waits for it,
    and one that an operator's action overtakes is dropped instead of putting back older counts.
    (MariaDB only: SQLite's transactions all take its one write lock, so a held recount there
    holds every request.)"""
    from jobqueue.core.repository import stats

    clock = [1000.0]
    monkeypatch.setattr(stats.time, "monotonic", lambda: clock[0])
    counts = stats._counts
    gates = [(threading.Event(), threading.Event()) for _ in range(2)]  # (counted, go on) per recount

    def held(c, statuses, cap):
        found = counts(c, statuses, cap)
        if threading.current_thread().name == "jobqueue-history-counts":
            counted, go_on = gates.pop(0)
            counted.set()
            assert go_on.wait(10)
        return found

    monkeypatch.setattr(stats, "_counts", held)
    (first, let_first_go), (second, let_second_go) = gates
    cache = repository.stats.CountsCache(2.0)
    with mysql_engine.connect() as conn:
        jobs = add(conn, 3)

        def failed() -> int:
            return cache.summaries(conn)[0][0].counts["failed"]

        try:
            assert failed() == 0  # the first count: in the request
            conn.execute(sa.update(job_queue).where(job_queue.c.id == jobs[0].id).values(status="failed"))
            conn.commit()
            clock[0] += 31  # live and history both due
            assert failed() == 0  # answered while the recount is held
            assert first.wait(10)
            assert cache.summaries(conn)[0][0].counts["ready"] == 2  # live counts: fresh, in the request
            assert failed() == 0
            let_first_go.set()
            cache.wait(10)
            assert failed() == 1

            conn.execute(sa.update(job_queue).where(job_queue.c.id == jobs[1].id).values(status="failed"))
            conn.commit()
            clock[0] += 31
            assert failed() == 1  # the second recount starts, counts 2, is held
            assert second.wait(10)
            assert service.fail_job(conn, jobs[2].id, "no").changed  # forgets: counted in the request
            assert failed() == 3
            let_second_go.set()
            cache.wait(10)
            assert failed() == 3  # the overtaken recount's 2 is dropped
        finally:
            let_first_go.set()
            let_second_go.set()


def test_due_counts_are_read_again_only_after_a_write_to_job_queue(mysql_engine, monkeypatch):
    """MariaDB: a refresh whose counts are due reads job_queue's UPDATE_TIME (one statement) and
    counts again only if a write was committed since the last count; a write right after a
    count, in the same second, is seen at the next refresh all the same."""
    from jobqueue.core.repository import stats

    clock = [1000.0]
    monkeypatch.setattr(stats.time, "monotonic", lambda: clock[0])
    cache = repository.stats.CountsCache(2.0)
    sent: list[str] = []

    def grab(c, cursor, statement, params, context, executemany):
        sent.append(statement)

    def ready() -> tuple[int, list[str]]:
        sent.clear()
        clock[0] += 31  # live and history counts both due
        (q,), _ = cache.summaries(conn)
        return q.counts["ready"], [s for s in sent if "FROM job_queue" in s]

    with mysql_engine.connect() as conn:
        add(conn, 2)
        time.sleep(1.1)  # UPDATE_TIME is kept to the second
        sa.event.listen(mysql_engine, "before_cursor_execute", grab)
        try:
            n, counted = ready()
            assert n == 2 and counted
            n, counted = ready()
            assert n == 2 and counted == []  # nothing written: the stamp alone
            add(conn, 1, prefix="r")  # in the second of the last count, or after it
            n, counted = ready()
            assert n == 3 and counted
            add(conn, 1, prefix="s")  # straight after a count
            assert ready()[0] == 4
        finally:
            sa.event.remove(mysql_engine, "before_cursor_execute", grab)
