"""Rate limits (@task(..., rate_limit="N/s|m|h", rate_key=...)): at most N starts of a task (or
of one value of its rate_key) in each fixed window of the database clock, across claims and
processes; jobs over the limit stay ready and run in a later window."""

from __future__ import annotations

import collections

import pytest
import sqlalchemy as sa

from jobqueue.core import repository, service
from jobqueue.core.models import EmptyClaim
from jobqueue.core.schema import job_queue
from jobqueue.core.tasks import TaskSpec, task
from testkit.procs import WorkerProcess, wait_until

jq = job_queue.c


@pytest.mark.parametrize("bad", ["0/s", "-1/m", "5/d", "5", "five/s", "5/", "/s", 5, "1.5/s"])
def test_a_bad_rate_limit_is_refused_at_import(bad):
    with pytest.raises(ValueError, match="rate_limit must be a positive whole number"):
        TaskSpec("t", print, rate_limit=bad)


def test_a_rate_key_needs_a_rate_limit():
    with pytest.raises(ValueError, match="rate_key needs a rate_limit"):
        task("t_rate_key_alone", rate_key="customer")(print)


def test_per_key_buckets_are_independent_and_a_missing_field_shares_one(engine):
    with engine.connect() as conn:
        for c in ("a", "b"):
            for i in range(3):
                service.enqueue(conn, "rate_per_customer", f"{c}{i}", {"customer": c})
        lacking = [service.enqueue(conn, "rate_per_customer", f"x{i}", {}).id for i in range(3)]
        free = service.enqueue(conn, "noop", "free").id
        cycle = service.claim_cycle(conn, [f"w:{i}" for i in range(20)], ["default"], lease_seconds=60)
        took = collections.Counter(c.job.payload.get("customer") for c in cycle.claimed)
        assert took == {"a": 2, "b": 2, None: 3}  # None: two without the field, and the free job
        assert free in {c.job.id for c in cycle.claimed}
        assert sum(1 for c in cycle.claimed if c.job.id in lacking) == 2
        assert cycle.limited == 3
        assert cycle.report.kind is EmptyClaim.LIMITED and cycle.report.next_allowed is not None
        # Nothing more in this window (an hour), whoever asks.
        again = service.claim_cycle(conn, ["w:1", "w:2"], ["default"], lease_seconds=60)
        assert again.claimed == [] and again.report.kind is EmptyClaim.LIMITED
        assert again.report.next_allowed > again.report.db_now


def test_tasks_without_a_limit_are_unaffected(engine):
    with engine.connect() as conn:
        limited = [service.enqueue(conn, "rate_per_customer", f"l{i}", {"customer": "z"}).id for i in range(5)]
        free = [service.enqueue(conn, "noop", f"f{i}").id for i in range(5)]
        cycle = service.claim_cycle(conn, [f"w:{i}" for i in range(10)], ["default"], lease_seconds=60)
        ids = {c.job.id for c in cycle.claimed}
        assert set(free) <= ids and len(ids & set(limited)) == 2


def test_explain_says_rate_limited_with_the_next_start(engine):
    with engine.connect() as conn:
        ids = [service.enqueue(conn, "rate_per_customer", f"e{i}", {"customer": "q"}).id for i in range(3)]
        service.claim_cycle(conn, ["w:1", "w:2", "w:3"], ["default"], lease_seconds=60)
        out = repository.explain.explain(conn, ids[2])
    reasons = {r.code: r for r in out.reasons}
    assert "rate_limited" in reasons, out
    assert reasons["rate_limited"].data["next_start_at"] and reasons["rate_limited"].data["starts"] == 2


@pytest.mark.slow
def test_three_worker_processes_never_start_more_than_the_limit_in_a_second(mysql_url, mysql_engine, tmp_path):
    """40 jobs of a 5/s task, 3 worker processes x 4 threads: counted by the jobs' started_at (the
    database clock), at most 5 start in any one second, and all 40 are done in about 8 s."""
    with mysql_engine.connect() as conn:
        service.enqueue_many(conn, [{"task": "rate_five", "task_key": f"r{i}", "payload": {}} for i in range(40)])
    workers = [WorkerProcess(mysql_url, tmp_path, f"w{n}", "--concurrency", "4") for n in range(3)]
    try:
        wait_until(lambda: _count(mysql_engine, "done") == 40, timeout=30, interval=0.2, message="40 done")
    finally:
        codes = [w.stop() for w in workers]
    assert codes == [0, 0, 0]
    with mysql_engine.connect() as conn:
        starts = conn.execute(sa.select(jq.started_at).where(jq.task_name == "rate_five")).scalars().all()
    per_second = collections.Counter(s.replace(microsecond=0) for s in starts)
    assert max(per_second.values()) <= 5, sorted(per_second.items())
    # At least 8 windows: 40 starts at 5 a window cannot fit in fewer, so the first start to the
    # last spans over 6 s. (How soon after 8 s they finish depends on the machine's load: the
    # wait above bounds it; a speed figure is not asserted here.)
    assert len(per_second) >= 8, sorted(per_second.items())
    span = (max(starts) - min(starts)).total_seconds()
    assert span >= 6, span
    logs = "".join(w.log() for w in workers)
    assert "Deadlock" not in logs and "event=sql_error" not in logs


def _count(engine, status):
    with engine.connect() as conn:
        return conn.execute(sa.select(sa.func.count()).where(jq.status == status, jq.task_name == "rate_five")).scalar()


def test_a_claim_held_across_a_window_boundary_counts_its_start_where_started_at_says(mysql_engine):
    """A 1/s task. A claim reads its bucket's window (second W0) and takes one job; before its
    UPDATE stamps started_at, it waits (on purpose: its next queue's job has a concurrency key,
    and another connection holds that table by LOCK TABLES) until the database clock is in a
    later second W1. Its start has started_at in W1, so it must count in W1: a claim right after
    in W1 takes nothing. Counted in W0 (the window read with the lock), that claim would start a
    second job in W1."""
    import threading

    with mysql_engine.connect() as conn:
        service.enqueue_many(
            conn,
            [{"task": "rate_one", "task_key": f"one{i}", "payload": {}, "queue": "rated"} for i in range(2)]
            + [{"task": "keyed_sleep", "task_key": "keyed", "payload": {"key": "k"}, "queue": "keyed"}],
        )
    holder = mysql_engine.connect()
    holder.exec_driver_sql("LOCK TABLES concurrency_key WRITE")
    first: list = []
    claimer = threading.Thread(
        target=lambda: first.append(_claim(mysql_engine, ["w:1", "w:2"], ["rated", "keyed"])), daemon=True
    )
    try:
        claimer.start()
        with mysql_engine.connect() as conn:
            db = conn.exec_driver_sql("SELECT DATABASE()").scalar()

            def waiting() -> bool:
                rows = conn.exec_driver_sql("SHOW PROCESSLIST").all()
                return any(r[3] == db and (r[6] or "").startswith("Waiting for table metadata lock") for r in rows)

            wait_until(waiting, timeout=30, interval=0.01, message="the claim waiting on concurrency_key")
            # The claim read its window before it waited: cross into a later second.
            w0 = conn.exec_driver_sql("SELECT UTC_TIMESTAMP(6)").scalar().replace(microsecond=0)
            wait_until(
                lambda: conn.exec_driver_sql("SELECT UTC_TIMESTAMP(6)").scalar().replace(microsecond=0) > w0,
                timeout=5,
                interval=0.002,
                message="the next second",
            )
    finally:
        holder.exec_driver_sql("UNLOCK TABLES")
        holder.close()
    claimer.join(30)
    assert first and sorted(c.job.task_key for c in first[0].claimed) == ["keyed", "one0"]
    second = _claim(mysql_engine, ["w:3"], ["rated"])
    with mysql_engine.connect() as conn:
        starts = conn.execute(sa.select(jq.started_at).where(jq.task_name == "rate_one", jq.started_at.is_not(None)))
        per_second = collections.Counter(s.replace(microsecond=0) for s in starts.scalars())
    assert max(per_second.values()) <= 1, sorted(per_second.items())
    assert second.claimed == [] and second.report.kind is EmptyClaim.LIMITED


def _claim(engine, owners, queues):
    with engine.connect() as conn:
        return service.claim_cycle(conn, owners, queues, lease_seconds=60)
