"""A job runs once unless its process truly dies: leases that hold through a worker's whole life.

Real worker processes on the real MariaDB, with `jobqueue reap` every second and a second worker
waiting to take anything that is let go. Each case was a reproduced defect (issue 9):

(a) shutdown: a SIGTERM with a grace longer than the lease, on a job that outlives the lease;
(b) re-claim: a forced requeue of a running job taken again by the same process;
(c) demotion: a running worker whose server turns read-only claims nothing.
"""

from __future__ import annotations

import signal
import threading
import time

import pytest
import sqlalchemy as sa

from jobqueue.core import repository, service
from jobqueue.core.db import create_engine
from jobqueue.core.migrate import init_db
from jobqueue.core.models import Status
from jobqueue.core.schema import job_queue
from testkit.procs import WorkerProcess, jobqueue, wait_until
from testkit.tasks import runs

pytestmark = pytest.mark.slow


class Reaper:
    """`jobqueue reap` every second, in the background, as an impatient operator's cron would."""

    def __init__(self, url: str):
        self.url = url
        self.stopped = threading.Event()
        self.runs = 0
        self.finished: list[float] = []  # time.monotonic() as each run ended
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while not self.stopped.wait(1.0):
            jobqueue(self.url, "reap", timeout=30)
            self.runs += 1
            self.finished.append(time.monotonic())

    def stop(self) -> None:
        self.stopped.set()
        self.thread.join(35)


def job(engine, job_id):
    with engine.connect() as conn:
        return repository.reads.get_job(conn, job_id)


def test_a_sigterm_with_grace_longer_than_the_lease_keeps_the_job_in_one_run(mysql_url, mysql_engine, tmp_path):
    marks = tmp_path / "runs.log"
    with mysql_engine.connect() as conn:
        res = service.enqueue(conn, "record_runs", "long-a", {"seconds": 9, "log": str(marks)})
    a = WorkerProcess(mysql_url, tmp_path, "a", "--concurrency", "1", "--lease-seconds", "3", "--grace-seconds", "12")
    b = reaper = None
    try:
        a.wait_for_log(rf"event=claim job_id={res.id} ")
        b = WorkerProcess(
            mysql_url, tmp_path, "b", "--concurrency", "2", "--lease-seconds", "3", "--idle-cap-seconds", "0.2"
        )
        reaper = Reaper(mysql_url)
        wait_until(lambda: runs(marks) == [("start", 1)], message="the job to start")
        ends_after = time.monotonic() + 9  # it started before we saw it, and runs 9 s
        a.signal(signal.SIGTERM)  # the grace (12 s) is longer than the lease (3 s)
        signalled = time.monotonic()
        assert a.proc.wait(30) == 0
        wait_until(lambda: job(mysql_engine, res.id).status is Status.DONE, timeout=20, message="done")
        # A reap ended after the lease the job held at the signal had run out, and before the
        # job did. (`jobqueue reap` is a whole process: under CI's load a run took 2-3 s, so
        # counting runs, as this did, said less.)
        assert any(signalled + 3.5 < t < ends_after for t in reaper.finished), (signalled, reaper.finished, ends_after)
    finally:
        if reaper:
            reaper.stop()
        a.stop()
        if b:
            b.stop()
    done = job(mysql_engine, res.id)
    assert (done.status, done.attempts) == (Status.DONE, 1)
    assert runs(marks) == [("start", 1), ("end", 1)], "ran exactly once"
    assert f"job_id={res.id} " not in b.log(), "the second worker never touched it"


def test_b_a_forced_requeue_taken_again_by_the_same_process_runs_attempts_1_and_2_never_3(
    mysql_url, mysql_engine, tmp_path
):
    marks = tmp_path / "runs.log"
    with mysql_engine.connect() as conn:
        res = service.enqueue(conn, "record_runs", "long-b", {"sleeps": {"1": 6, "2": 12}, "log": str(marks)})
    a = WorkerProcess(
        mysql_url, tmp_path, "a", "--concurrency", "2", "--lease-seconds", "3", "--idle-cap-seconds", "0.2"
    )
    reaper = None
    try:
        a.wait_for_log(rf"event=claim job_id={res.id} .*attempt=1")
        wait_until(lambda: runs(marks) == [("start", 1)], message="attempt 1 to start")
        reaper = Reaper(mysql_url)
        forced = jobqueue(mysql_url, "requeue", str(res.id), "--force")
        assert forced.returncode == 0, forced.stderr
        a.wait_for_log(rf"event=claim job_id={res.id} .*attempt=2")  # the same process, its other slot
        wait_until(lambda: job(mysql_engine, res.id).status is Status.DONE, timeout=40, message="done")
    finally:
        if reaper:
            reaper.stop()
        a.stop()
    done = job(mysql_engine, res.id)
    assert (done.status, done.attempts) == (Status.DONE, 2)
    assert sorted(runs(marks)) == [("end", 1), ("end", 2), ("start", 1), ("start", 2)], runs(marks)
    assert "attempt=3" not in a.log()


def test_c_a_worker_whose_server_turns_read_only_claims_nothing_and_resumes(throwaway_server, tmp_path):
    server = throwaway_server("--log-bin", "--binlog-format=ROW")
    url = server.create_database("jq")
    engine = create_engine(url)
    init_db(engine)
    w = WorkerProcess(url, tmp_path, "a", "--concurrency", "2", "--lease-seconds", "5", "--idle-cap-seconds", "0.5")
    try:
        w.wait_for_log("event=idle ")
        server.execute("SET GLOBAL read_only = ON")  # the primary is demoted under the running worker
        time.sleep(2)
        # root holds SUPER, so read_only does not stop its writes: the job row lands anyway (as a
        # misrouted write would), and only the worker's own check stands between it and a claim.
        server.execute(
            "INSERT INTO job_queue (task_key, task_name, queue, priority, payload, status, run_at, "
            "attempts, max_attempts, created_at, updated_at) VALUES ('after-demotion', 'noop', "
            "'default', 0, '{}', 'ready', UTC_TIMESTAMP(6), 0, 5, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6))",
            database="jq",
        )
        time.sleep(10)
        with engine.connect() as conn:
            row = conn.execute(
                sa.select(job_queue.c.status, job_queue.c.attempts).where(job_queue.c.task_key == "after-demotion")
            ).one()
        assert (row.status, row.attempts) == ("ready", 0), "nothing was claimed on the read-only server"
        assert "event=not_primary" in w.log()
        refused = jobqueue(url, "enqueue", "noop", "--key", "refused")
        assert refused.returncode == 75 and "read-only" in refused.stderr  # enqueue: try again later
        server.execute("SET GLOBAL read_only = OFF")
        wait_until(
            lambda: job(engine, row_id(engine, "after-demotion")).status is Status.DONE,
            timeout=20,
            message="claims resume once the server is writable",
        )
        assert "event=claiming_resumed" in w.log()
    finally:
        w.stop()
        engine.dispose()
    assert w.proc.returncode == 0


def row_id(engine, key: str) -> int:
    with engine.connect() as conn:
        return conn.execute(sa.select(job_queue.c.id).where(job_queue.c.task_key == key)).scalar()


def test_c_embedded_workers_say_in_api_health_that_they_stopped_claiming(throwaway_server, tmp_path):
    import json
    import urllib.error
    import urllib.request

    from testkit.procs import GunicornServer
    from testkit.web import VIEWER_TOKEN, server_env

    server = throwaway_server("--log-bin", "--binlog-format=ROW")
    url = server.create_database("jq")
    engine = create_engine(url)
    init_db(engine)
    engine.dispose()
    web = GunicornServer(
        url, tmp_path, web_workers=1, embedded_workers=2, extra_env={**server_env(url), "JOBQUEUE_LEASE_SECONDS": "5"}
    )

    def health() -> dict:
        req = urllib.request.Request(web.base + "/api/health", headers={"Authorization": f"Bearer {VIEWER_TOKEN}"})
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                return json.loads(r.read())
        except urllib.error.HTTPError as exc:
            with exc:
                return json.loads(exc.read())

    def embedded_state() -> str | None:
        mine = [w for w in health().get("workers", []) if w.get("this_process")]
        return mine[0]["state"] if mine else None

    try:
        wait_until(lambda: embedded_state() == "claiming", timeout=20, message="the embedded worker claiming")
        server.execute("SET GLOBAL read_only = ON")
        wait_until(lambda: embedded_state() == "not_primary", timeout=15, message="/api/health to say so")
        report = health()
        assert report["status"] == "problem"
        assert any(c["name"] == "workers" and "not claiming" in c["detail"] for c in report["checks"])
        server.execute("SET GLOBAL read_only = OFF")
        wait_until(lambda: embedded_state() == "claiming", timeout=15, message="claiming again")
    finally:
        web.stop()
    assert "event=not_primary" in web.log() and "event=claiming_resumed" in web.log()
