"""Concurrency limits per key (@task(..., concurrency_key=..., concurrency_limit=N)): at most N
jobs of one key run at once, across claims, threads and processes; the others stay ready and
run when a place frees up; places come back however a job stops running."""

from __future__ import annotations

import json
import threading
import time
from collections import defaultdict

import pytest
import sqlalchemy as sa

from jobqueue.core import repository, service
from jobqueue.core.errors import ValidationError
from jobqueue.core.models import EmptyClaim, Outcome, Status
from jobqueue.core.schema import concurrency_key, job_queue
from testkit.procs import WorkerProcess, jobqueue, wait_until

jq = job_queue.c


def keyed(conn, key, n, prefix=None, task="keyed_sleep", **payload):
    return [service.enqueue(conn, task, f"{prefix or key}-{i}", {"key": key, **payload}).id for i in range(n)]


def running_of(conn, key):
    return conn.execute(sa.select(sa.func.count()).where(jq.concurrency_key == key, jq.status == "running")).scalar()


def test_a_job_without_its_key_is_refused_at_enqueue(engine):
    with engine.connect() as conn:
        with pytest.raises(ValidationError, match="payload lacks 'key'") as err:
            service.enqueue(conn, "keyed_sleep", "k1", {"other": 1})
        assert err.value.field == "payload"
        with pytest.raises(ValidationError, match="must be a string or a number"):
            service.enqueue(conn, "keyed_sleep", "k2", {"key": {"nested": 1}})
        assert conn.execute(sa.select(sa.func.count()).select_from(job_queue)).scalar() == 0


def test_cli_refuses_a_job_without_its_key_with_exit_2(db_url):
    out = jobqueue(db_url, "enqueue", "keyed_sleep", "--key", "k1", "--payload", '{"x": 1}', "--tasks", "testkit.tasks")
    assert out.returncode == 2, out.stderr
    assert "payload lacks 'key'" in out.stderr


def test_one_job_per_key_runs_and_the_rest_wait_in_claim_order(engine):
    with engine.connect() as conn:
        a = keyed(conn, "A", 3)
        b = keyed(conn, "B", 2)
        free = service.enqueue(conn, "noop", "free").id
        cycle = service.claim_cycle(conn, [f"w:{i}" for i in range(10)], ["default"], lease_seconds=60)
        assert sorted(c.job.id for c in cycle.claimed) == sorted([a[0], b[0], free])
        assert cycle.limited == 3
        assert cycle.report.kind is EmptyClaim.LIMITED and cycle.report.skipped == 0
        assert repository.reads.get_job(conn, a[1]).status is Status.READY
        # Nothing more while the places are held.
        again = service.claim_cycle(conn, ["w:1", "w:2"], ["default"], lease_seconds=60)
        assert again.claimed == [] and again.report.kind is EmptyClaim.LIMITED
        # A completion frees its key's place, and the next job of that key (in claim order) takes it,
        # in the same transaction as the completion.
        lease_a = next(c.lease for c in cycle.claimed if c.job.id == a[0])
        refill = service.claim_cycle(conn, [], ["default"], lease_seconds=60, completions=[lease_a])
        assert refill.completed[(a[0], 1)] is Outcome.OK
        assert [c.job.id for c in refill.claimed] == [a[1]]
        assert running_of(conn, "keyed_sleep:A") == 1 and running_of(conn, "keyed_sleep:B") == 1


def test_a_limit_of_two(engine):
    with engine.connect() as conn:
        ids = keyed(conn, "K", 5, task="keyed_pair")
        got = service.claim(conn, "w", 5, ["default"], lease_seconds=60)
        assert sorted(c.job.id for c in got) == ids[:2]


def test_the_claim_looks_past_a_full_key_at_the_head_of_the_queue(engine):
    with engine.connect() as conn:
        head = keyed(conn, "busy", 60)
        other = keyed(conn, "quiet", 1)[0]
        service.claim(conn, "first", 1, ["default"], lease_seconds=60)  # takes busy's place
        got = service.claim(conn, "w", 4, ["default"], lease_seconds=60)
        assert [c.job.id for c in got] == [other]
        assert repository.reads.get_job(conn, head[1]).status is Status.READY


@pytest.mark.parametrize("how", ["requeue", "fail", "cancel", "reap", "retry", "release"])
def test_places_come_back_however_a_job_stops_running(engine, how):
    with engine.connect() as conn:
        ids = keyed(conn, "P", 3)
        (holder,) = service.claim(conn, "w1", 1, ["default"], lease_seconds=1 if how == "reap" else 60)
        assert service.claim(conn, "w2", 1, ["default"], lease_seconds=60) == []
        if how == "requeue":
            service.requeue_job(conn, holder.job.id, force=True)
        elif how == "fail":
            service.fail_job(conn, holder.job.id, "operator says no")
        elif how == "cancel":
            service.cancel_job(conn, holder.job.id)
        elif how == "reap":
            time.sleep(1.1)
            assert service.reap(conn).reclaimed == 1
        elif how == "retry":
            assert service.retry(conn, holder.lease, "boom", 60) is Outcome.OK
        else:
            assert service.release(conn, holder.lease) is Outcome.OK
        (nxt,) = service.claim(conn, "w2", 1, ["default"], lease_seconds=60)
        # Requeue, reap and release put the holder back first in line; the others free its place
        # for the next job.
        assert nxt.job.id == (ids[0] if how in ("requeue", "reap", "release") else ids[1])
        assert running_of(conn, "keyed_sleep:P") == 1


def test_a_missing_key_row_comes_back_with_the_safest_limit(engine):
    with engine.connect() as conn:
        ids = keyed(conn, "gone", 2, task="keyed_pair")
        conn.execute(sa.delete(concurrency_key))
        conn.commit()
        assert service.claim(conn, "w", 2, ["default"], lease_seconds=60) == []
        assert conn.execute(sa.select(concurrency_key.c.max_running)).scalar() == 1
        assert [c.job.id for c in service.claim(conn, "w", 2, ["default"], lease_seconds=60)] == ids[:1]
        # The next enqueue of the task sets the task's own limit again.
        service.enqueue(conn, "keyed_pair", "gone-9", {"key": "gone"})
        assert conn.execute(sa.select(concurrency_key.c.max_running)).scalar() == 2


def test_concurrent_claimers_never_exceed_the_limit(mysql_engine):
    with mysql_engine.connect() as conn:
        for key in "ABC":
            keyed(conn, key, 20)
        service.enqueue_many(conn, [{"task": "noop", "task_key": f"n{i}"} for i in range(40)])
    over: list[str] = []
    done = defaultdict(int)
    lock = threading.Lock()

    def claimer(n):
        with mysql_engine.connect() as conn:
            idle = 0
            while idle < 20:
                got = service.claim(conn, [f"w{n}:{i}" for i in range(3)], 3, ["default"], lease_seconds=60)
                if not got:
                    idle += 1
                    time.sleep(0.01)
                    continue
                idle = 0
                for key in "ABC":
                    if running_of(conn, f"keyed_sleep:{key}") > 1:
                        over.append(key)
                conn.commit()
                outcomes = service.complete_many(conn, [c.lease for c in got])
                assert set(outcomes.values()) == {Outcome.OK}
                with lock:
                    for c in got:
                        done[c.job.concurrency_key or "free"] += 1

    threads = [threading.Thread(target=claimer, args=(n,)) for n in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert over == []
    assert dict(done) == {"keyed_sleep:A": 20, "keyed_sleep:B": 20, "keyed_sleep:C": 20, "free": 40}


@pytest.mark.slow
def test_three_workers_of_eight_threads_never_run_two_jobs_of_one_key_at_once(mysql_url, mysql_engine, tmp_path):
    """300 jobs over 5 keys, limit 1, 3 worker processes x 8 threads: from the jobs' own start and
    end times, no two jobs of one key overlap, and all 300 finish (no deadlock, no lost place)."""
    log = tmp_path / "runs.log"
    with mysql_engine.connect() as conn:
        service.enqueue_many(
            conn,
            [
                {
                    "task": "keyed_sleep",
                    "task_key": f"j{i}",
                    "payload": {"key": f"k{i % 5}", "seconds": 0.02, "log": str(log)},
                }
                for i in range(300)
            ],
        )
    workers = [
        WorkerProcess(mysql_url, tmp_path, f"w{n}", "--concurrency", "8", "--lease-seconds", "10") for n in range(3)
    ]
    try:
        wait_until(
            lambda: log.exists() and len(log.read_text().splitlines()) >= 300,
            timeout=120,
            interval=0.2,
            message="300 runs",
        )
        wait_until(lambda: _count(mysql_engine, "done") == 300, timeout=30, message="300 done")
    finally:
        codes = [w.stop() for w in workers]
    assert codes == [0, 0, 0]
    runs = defaultdict(list)
    for line in log.read_text().splitlines():
        key, job_id, attempt, start, end = line.split()
        runs[key].append((float(start), float(end), int(job_id)))
    assert sorted(len(v) for v in runs.values()) == [60] * 5
    for key, spans in runs.items():
        spans.sort()
        for (_s1, e1, j1), (s2, _e2, j2) in zip(spans, spans[1:]):
            assert s2 >= e1, f"key {key}: job {j2} started at {s2} before job {j1} ended at {e1}"
    logs = "".join(w.log() for w in workers)
    assert "Deadlock" not in logs and "event=sql_error" not in logs


def _count(engine, status):
    with engine.connect() as conn:
        return conn.execute(sa.select(sa.func.count()).where(jq.status == status)).scalar()


@pytest.mark.slow
def test_a_sigkilled_holder_gives_its_place_back_when_its_lease_is_reaped(mysql_url, mysql_engine, tmp_path):
    log = tmp_path / "runs.log"
    with mysql_engine.connect() as conn:
        first = service.enqueue(
            conn, "keyed_sleep", "hold", {"key": "x", "seconds": 60, "later_seconds": 0.5, "log": str(log)}
        ).id
    holder = WorkerProcess(mysql_url, tmp_path, "holder", "--concurrency", "2", "--lease-seconds", "2")
    holder.wait_for_log(rf"event=claim job_id={first} ")
    with mysql_engine.connect() as conn:
        second = service.enqueue(conn, "keyed_sleep", "next", {"key": "x", "seconds": 0, "log": str(log)}).id
    holder.kill()
    other = WorkerProcess(mysql_url, tmp_path, "other", "--concurrency", "2", "--lease-seconds", "10")
    try:
        # The dead holder's lease expires, the reaper returns its job, and the key's place with it:
        # the reaped job runs again first (claim order), then the other, never both at once.
        wait_until(lambda: _count(mysql_engine, "done") == 2, timeout=30, message="both jobs of key x done")
    finally:
        assert other.stop() == 0
    assert "event=reclaimed" in other.log()
    runs = sorted(tuple(line.split()) for line in log.read_text().splitlines())
    assert [(r[1], r[2]) for r in sorted(runs, key=lambda r: float(r[3]))] == [(str(first), "2"), (str(second), "1")]
    (_, _, _, s1, e1), (_, _, _, s2, e2) = sorted(runs, key=lambda r: float(r[3]))
    assert float(s2) >= float(e1)


def test_api_refuses_a_job_without_its_key_with_422(mysql_url):
    from jobqueue import create_app
    from testkit.web import ADMIN_TOKEN, app_config

    app = create_app(app_config(mysql_url))
    try:
        response = app.test_client().post(
            "/api/jobs",
            json={"task": "keyed_sleep", "task_key": "k", "payload": {}},
            headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
        )
        assert response.status_code == 422 and json.loads(response.data)["field"] == "payload"
    finally:
        app.extensions["jobqueue"].engine.dispose()
