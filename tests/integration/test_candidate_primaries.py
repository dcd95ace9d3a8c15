"""Several candidate primaries in one setting: a process claims, enqueues and acts only on the
one that is writable, and follows it when the roles change (issue 15). Two throwaway servers,
each with the schema (no replication needed to test the routing)."""

from __future__ import annotations

import time

import pytest

from testkit.procs import WorkerProcess, jobqueue, wait_until
from webapp.core import repository
from webapp.core.db import create_engine
from webapp.core.errors import NotPrimary
from webapp.core.migrate import init_db

pytestmark = pytest.mark.slow


@pytest.fixture
def two_servers(throwaway_mariadb):
    a, b = throwaway_mariadb("--log-bin", "--binlog-format=ROW"), throwaway_mariadb("--log-bin", "--binlog-format=ROW")
    urls = []
    for server in (a, b):
        url = server.create_database("jq")
        engine = create_engine(url)
        init_db(engine)
        engine.dispose()
        urls.append(url)
    return a, b, urls


def insert_ready(server, key: str) -> None:
    server.execute("INSERT INTO job_queue (task_key, task_name, queue, priority, payload, status, run_at, attempts, "
                   "max_attempts, created_at, updated_at) VALUES "
                   f"('{key}', 'noop', 'default', 0, '{{}}', 'ready', UTC_TIMESTAMP(6), 0, 5, UTC_TIMESTAMP(6), "
                   "UTC_TIMESTAMP(6))", database="jq")


def status_on(server, key: str) -> str | None:
    rows = server.execute(f"SELECT status FROM job_queue WHERE task_key = '{key}'", database="jq")
    return rows[0][0] if rows else None


def test_the_engine_goes_to_the_writable_candidate(two_servers):
    a, b, (url_a, url_b) = two_servers
    b.execute("SET GLOBAL read_only = ON")
    engine = create_engine(f"{url_b} {url_a}")   # the read-only one first
    try:
        with engine.connect() as conn:
            res = repository.enqueue(conn, "noop", "routed")
        assert status_on(a, "routed") == "ready" and status_on(b, "routed") is None
        a.execute("SET GLOBAL read_only = ON")    # now neither is writable
        engine.dispose()
        with engine.connect() as conn:
            # Reads still answer (the dashboard stays up), from the last primary, which answers.
            assert repository.get_job(conn, res.id).task_key == "routed"
            with pytest.raises(NotPrimary):
                repository.enqueue(conn, "noop", "nowhere")
    finally:
        engine.dispose()
    assert status_on(a, "nowhere") is None and status_on(b, "nowhere") is None


def test_a_worker_follows_the_primary_when_roles_change(two_servers, tmp_path):
    a, b, (url_a, url_b) = two_servers
    b.execute("SET GLOBAL read_only = ON")
    w = WorkerProcess(f"{url_b} {url_a}", tmp_path, "w", "--concurrency", "2", "--lease-seconds", "5",
                      "--idle-cap-seconds", "0.5")
    try:
        insert_ready(a, "on-a")
        insert_ready(b, "on-b-while-replica")   # root writes through read_only; the worker must not
        wait_until(lambda: status_on(a, "on-a") == "done", timeout=15, message="the job on A runs")
        time.sleep(2)
        assert status_on(b, "on-b-while-replica") == "ready", "nothing claimed on the read-only B"
        # Failover: A is demoted, B promoted.
        a.execute("SET GLOBAL read_only = ON")
        b.execute("SET GLOBAL read_only = OFF")
        enqueued = jobqueue(f"{url_a} {url_b}", "enqueue", "noop", "--key", "after-failover")
        assert enqueued.returncode == 0, enqueued.stderr
        assert status_on(b, "after-failover") in ("ready", "running", "done") and status_on(a, "after-failover") is None
        wait_until(lambda: status_on(b, "after-failover") == "done", timeout=10,
                   message="the job enqueued on B runs there within 10 s")
        insert_ready(a, "on-a-after-demotion")
        time.sleep(3)
        assert status_on(a, "on-a-after-demotion") == "ready", "nothing more claimed on A"
    finally:
        w.stop()
    assert "event=primary_found" in w.log()
