"""No handler starts after its job was taken back (issue 25, defects 1 and 4).

A worker with more leases than threads (--prefetch) holds jobs whose handlers have not started:
`running` in the database, waiting in hand for a thread. An operator may cancel, fail or
force-requeue such a job, or pause its queue, while it waits. Once that action has answered, its
handler must never start; a job of a paused queue goes back to `ready` with its attempts kept.

Real worker processes; the handlers (testkit.tasks.record_runs) write the wall-clock time they
started, and the test compares it with the time the operator's command returned.
"""

from __future__ import annotations

import time

import pytest
import sqlalchemy as sa

from jobqueue.core import service
from jobqueue.core.schema import job_queue
from testkit.procs import WorkerProcess, jobqueue, wait_until

jq = job_queue.c


def enqueue_runs(engine, tmp_path, n: int, seconds: float, queue: str = "default") -> list[int]:
    with engine.connect() as conn:
        return [
            r.id
            for r in service.enqueue_many(
                conn,
                [
                    {
                        "task": "record_runs",
                        "task_key": f"{queue}-{i}",
                        "queue": queue,
                        "payload": {"seconds": seconds, "log": str(tmp_path / f"runs-{queue}-{i}.log")},
                    }
                    for i in range(n)
                ],
            )
        ]


def starts(tmp_path, queue: str, i: int) -> list[tuple[int, float]]:
    """(attempt, wall-clock time) of each start of job i's handler."""
    try:
        lines = (tmp_path / f"runs-{queue}-{i}.log").read_text().split("\n")
    except FileNotFoundError:
        return []
    return [(int(p[1]), float(p[3])) for p in (line.split() for line in lines) if p and p[0] == "start"]


def rows(engine, ids):
    with engine.connect() as conn:
        return {
            r.id: (r.status, r.attempts)
            for r in conn.execute(sa.select(jq.id, jq.status, jq.attempts).where(jq.id.in_(ids))).all()
        }


@pytest.mark.parametrize("action", [("cancel",), ("fail",), ("requeue", "--force")], ids=lambda a: a[0])
def test_a_prefetched_job_taken_back_by_an_operator_never_starts_afterwards(mysql_url, mysql_engine, tmp_path, action):
    """Three 3 s jobs, one thread and two prefetched: the second job waits in hand while the
    first runs. The operator takes it back; its first attempt's handler never starts after the
    command answered (a forced requeue's attempt 2 may run later, anywhere)."""
    ids = enqueue_runs(mysql_engine, tmp_path, 3, seconds=3)
    worker = WorkerProcess(mysql_url, tmp_path, "w1", "--concurrency", "1", "--prefetch", "2")
    try:
        wait_until(
            lambda: rows(mysql_engine, ids) == {i: ("running", 1) for i in ids} and starts(tmp_path, "default", 0),
            timeout=20,
            message="all three claimed, the first started",
        )
        assert not starts(tmp_path, "default", 1), "the second job started while the first ran"
        done = jobqueue(mysql_url, *action, str(ids[1]))
        answered = time.time()
        assert done.returncode == 0, done.stderr
        # The third job starts once the first ends (~3 s): by then the second would have started.
        wait_until(lambda: starts(tmp_path, "default", 2), timeout=15, message="the third job started")
        time.sleep(0.5)
        late = [
            (attempt, round(at - answered, 3))
            for attempt, at in starts(tmp_path, "default", 1)
            if attempt == 1 and at >= answered
        ]
        assert late == [], f"attempt 1 of job {ids[1]} started {late[0][1]} s after `{' '.join(action)}` answered"
        expected = {"cancel": "cancelled", "fail": "failed"}.get(action[0])
        if expected:
            assert rows(mysql_engine, [ids[1]])[ids[1]][0] == expected
        else:
            wait_until(
                lambda: rows(mysql_engine, [ids[1]])[ids[1]] == ("done", 2),
                timeout=20,
                message="the requeued job done by its second attempt",
            )
    finally:
        code = worker.stop()
    assert code == 0, worker.log()[-3000:]


def test_prefetched_jobs_of_a_paused_queue_never_start_and_go_back_ready_with_their_attempts(
    mysql_url, mysql_engine, tmp_path
):
    """One thread, three prefetched 2 s jobs; the queue is paused while the first runs. The first
    finishes; none of the others starts after the pause answered; they are `ready` again with
    attempts = 1 (the claim's, kept), and run after the resume."""
    ids = enqueue_runs(mysql_engine, tmp_path, 4, seconds=2, queue="held")
    worker = WorkerProcess(mysql_url, tmp_path, "w1", "--concurrency", "1", "--prefetch", "3", "--queues", "held")
    try:
        wait_until(
            lambda: rows(mysql_engine, ids) == {i: ("running", 1) for i in ids} and starts(tmp_path, "held", 0),
            timeout=20,
            message="all four claimed, the first started",
        )
        done = jobqueue(mysql_url, "pause", "held")
        answered = time.time()
        assert done.returncode == 0, done.stderr
        wait_until(lambda: rows(mysql_engine, ids[:1])[ids[0]] == ("done", 1), timeout=10, message="the first done")
        time.sleep(2.5)  # before the fix, the second started as the first ended
        late = {
            i: round(at - answered, 3) for i in range(1, 4) for _, at in starts(tmp_path, "held", i) if at >= answered
        }
        assert late == {}, f"handlers started this many seconds after the pause answered: {late}"
        # On a loaded machine the first may end, and the second start, before the command returns.
        waited = [ids[i] for i in range(1, 4) if not starts(tmp_path, "held", i)]
        assert len(waited) >= 2, "the pause came too late to test anything"
        wait_until(
            lambda: rows(mysql_engine, waited) == {i: ("ready", 1) for i in waited},
            timeout=10,
            message=f"the prefetched jobs released to ready with attempts kept ({rows(mysql_engine, ids)})",
        )
        assert jobqueue(mysql_url, "resume", "held").returncode == 0
        wait_until(
            lambda: rows(mysql_engine, waited) == {i: ("done", 2) for i in waited},
            timeout=30,
            message="the released jobs run after the resume",
        )
    finally:
        code = worker.stop()
    assert code == 0, worker.log()[-3000:]
