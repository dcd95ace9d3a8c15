"""The web app for real: gunicorn with 2 worker processes, each with embedded workers, processes
200 jobs exactly once, and a graceful stop releases what is still running."""

from __future__ import annotations

import re
from collections import Counter

import pytest
import sqlalchemy as sa

from jobqueue.core import repository
from jobqueue.core.db import create_engine
from jobqueue.core.models import Status
from jobqueue.core.schema import job_queue, worker_process
from testkit.procs import GunicornServer, wait_until
from testkit.web import api_post, server_env

pytestmark = pytest.mark.slow
jq = job_queue.c


def test_two_gunicorn_workers_with_embedded_workers_process_each_job_once(mysql_url, tmp_path):
    engine = create_engine(mysql_url)
    server = GunicornServer(mysql_url, tmp_path, web_workers=2, embedded_workers=3, extra_env=server_env(mysql_url))
    try:
        for i in range(200):
            body = api_post(
                server.base, "/api/jobs", {"task": "slow_noop", "task_key": f"g-{i}", "payload": {"seconds": 0.05}}
            )
            assert body["duplicate"] is False
        with engine.connect() as conn:
            wait_until(
                lambda: repository.stats.count_by_status(conn) == [("default", "done", 200)],
                timeout=60,
                message="200 jobs done",
            )
            rows = conn.execute(sa.select(jq.id, jq.attempts, jq.lease_owner)).all()
            processes = conn.execute(sa.select(worker_process.c.id, worker_process.c.kind)).all()
    finally:
        code = server.stop()
    assert code == 0
    log = server.log()
    claims = Counter(int(m) for m in re.findall(r"event=claim job_id=(\d+) ", log))
    assert len(claims) == 200 and set(claims.values()) == {1}, claims.most_common(3)
    assert {r.attempts for r in rows} == {1}
    pids = {r.lease_owner.split(":")[1] for r in rows}
    assert len(processes) == 2 and {p.kind for p in processes} == {"embedded"}
    assert len(pids) == 2, "both gunicorn workers took jobs"
    assert "Traceback" not in log
    with engine.connect() as conn:
        stopped = conn.execute(sa.select(worker_process.c.stopped_at)).scalars().all()
    assert all(s is not None for s in stopped), "each process marked itself stopped"
    engine.dispose()


def test_graceful_stop_releases_running_jobs(mysql_url, tmp_path):
    engine = create_engine(mysql_url)
    server = GunicornServer(mysql_url, tmp_path, web_workers=1, embedded_workers=1, extra_env={**server_env(mysql_url)})
    try:
        job = api_post(
            server.base, "/api/jobs", {"task": "hold_first_attempt", "task_key": "long", "payload": {"seconds": 120}}
        )
        with engine.connect() as conn:
            wait_until(lambda: repository.reads.get_job(conn, job["id"]).status is Status.RUNNING, message="running")
    finally:
        code = server.stop()
    assert code == 0
    with engine.connect() as conn:
        back = repository.reads.get_job(conn, job["id"])
    assert back.status is Status.READY and back.attempts == 1
    assert "event=released" in server.log()
    engine.dispose()
