"""Several candidate primaries in one setting: a process claims, enqueues and acts only on the
one that is writable, and follows it when the roles change (issue 15). Two throwaway servers,
each with the schema (no replication needed to test the routing)."""

from __future__ import annotations

import time

import pytest

from jobqueue import create_app
from jobqueue.core import repository, service
from jobqueue.core.db import PRIMARY_CHECK_SECONDS, create_engine, role_of
from jobqueue.core.errors import NotPrimary
from jobqueue.core.migrate import init_db
from testkit.procs import WorkerProcess, jobqueue, wait_until
from testkit.replication import read_general_log
from testkit.web import api, app_config

pytestmark = pytest.mark.slow


@pytest.fixture
def two_servers(throwaway_server):
    a, b = throwaway_server("--log-bin", "--binlog-format=ROW"), throwaway_server("--log-bin", "--binlog-format=ROW")
    urls = []
    for server in (a, b):
        url = server.create_database("jq")
        engine = create_engine(url)
        init_db(engine)
        engine.dispose()
        urls.append(url)
    return a, b, urls


def insert_ready(server, key: str, task: str = "noop", payload: str = "{}", *more_keys: str) -> None:
    values = ", ".join(
        f"('{k}', '{task}', 'default', 0, '{payload}', 'ready', UTC_TIMESTAMP(6), 0, 5, "
        "UTC_TIMESTAMP(6), UTC_TIMESTAMP(6))"
        for k in (key, *more_keys)
    )
    server.execute(
        "INSERT INTO job_queue (task_key, task_name, queue, priority, payload, status, run_at, attempts, "
        f"max_attempts, created_at, updated_at) VALUES {values}",
        database="jq",
    )


def status_on(server, key: str) -> str | None:
    rows = server.execute(f"SELECT status FROM job_queue WHERE task_key = '{key}'", database="jq")
    return rows[0][0] if rows else None


def test_the_engine_goes_to_the_writable_candidate(two_servers):
    a, b, (url_a, url_b) = two_servers
    b.execute("SET GLOBAL read_only = ON")
    engine = create_engine(f"{url_b} {url_a}")  # the read-only one first
    try:
        with engine.connect() as conn:
            res = service.enqueue(conn, "noop", "routed")
        assert status_on(a, "routed") == "ready" and status_on(b, "routed") is None
        a.execute("SET GLOBAL read_only = ON")  # now neither is writable
        engine.dispose()
        with engine.connect() as conn:
            # Reads still answer (the dashboard stays up), from the last primary, which answers.
            assert repository.reads.get_job(conn, res.id).task_key == "routed"
            with pytest.raises(NotPrimary):
                service.enqueue(conn, "noop", "nowhere")
    finally:
        engine.dispose()
    assert status_on(a, "nowhere") is None and status_on(b, "nowhere") is None


def test_a_worker_follows_the_primary_when_roles_change(two_servers, tmp_path):
    a, b, (url_a, url_b) = two_servers
    b.execute("SET GLOBAL read_only = ON")
    w = WorkerProcess(
        f"{url_b} {url_a}", tmp_path, "w", "--concurrency", "2", "--lease-seconds", "5", "--idle-cap-seconds", "0.5"
    )
    try:
        insert_ready(a, "on-a")
        insert_ready(b, "on-b-while-replica")  # root writes through read_only; the worker must not
        wait_until(lambda: status_on(a, "on-a") == "done", timeout=15, message="the job on A runs")
        time.sleep(2)
        assert status_on(b, "on-b-while-replica") == "ready", "nothing claimed on the read-only B"
        # Failover: A is demoted, B promoted.
        a.execute("SET GLOBAL read_only = ON")
        b.execute("SET GLOBAL read_only = OFF")
        enqueued = jobqueue(f"{url_a} {url_b}", "enqueue", "noop", "--key", "after-failover")
        assert enqueued.returncode == 0, enqueued.stderr
        assert status_on(b, "after-failover") in ("ready", "running", "done") and status_on(a, "after-failover") is None
        wait_until(
            lambda: status_on(b, "after-failover") == "done",
            timeout=10,
            message="the job enqueued on B runs there within 10 s",
        )
        insert_ready(a, "on-a-after-demotion")
        time.sleep(3)
        assert status_on(a, "on-a-after-demotion") == "ready", "nothing more claimed on A"
    finally:
        w.stop()
    assert "event=primary_found" in w.log()


def test_a_process_finds_a_newly_promoted_primary_within_about_a_second(two_servers):
    """While no candidate is writable the pool keeps a connection to one that answers, marked not
    writable. Such a connection must be checked again soon, not after the 5 s a connection to a
    writable primary waits: in the failover drill, processes that reconnected to the replica just
    before its promotion sat on it up to 5 s more, their leases ran out and finished handlers'
    results waited (docs/scale-out.md)."""
    a, b, (url_a, url_b) = two_servers
    a.execute("SET GLOBAL read_only = ON")
    b.execute("SET GLOBAL read_only = ON")
    engine = create_engine(f"{url_a} {url_b}", pool_size=1)
    try:
        with engine.connect() as conn:
            with pytest.raises(NotPrimary):
                service.enqueue(conn, "noop", "while-none-is-writable")
        b.execute("SET GLOBAL read_only = OFF")  # B is promoted
        time.sleep(1.5)
        assert 1.5 < PRIMARY_CHECK_SECONDS
        with engine.connect() as conn:
            service.enqueue(conn, "noop", "after-the-promotion")
    finally:
        engine.dispose()
    assert status_on(b, "after-the-promotion") == "ready"


@pytest.fixture
def two_logged_servers(throwaway_server, tmp_path):
    servers, urls = [], []
    for _n in range(2):
        server = throwaway_server("--log-bin", "--binlog-format=ROW", general_log=True)
        server.general_log_path = server.general_log_file
        url = server.create_database("jq")
        engine = create_engine(url)
        init_db(engine)
        engine.dispose()
        servers.append(server)
        urls.append(url)
    return servers, urls


def executed_statements_in(path, pattern: str) -> list[str]:
    import re

    wanted = re.compile(pattern, re.IGNORECASE | re.DOTALL)
    return [
        e.argument for e in read_general_log(path) if e.command in ("Query", "Execute") and wanted.search(e.argument)
    ]


def claims_sent(*servers) -> int:
    return sum(
        len(executed_statements_in(s.general_log_path, r"FROM job_queue .*FOR UPDATE SKIP LOCKED")) for s in servers
    )


def test_no_claim_is_sent_to_a_server_known_to_be_read_only(two_logged_servers):
    """A claim that reads the read-only flags of its server (demoted under an open connection)
    marks the connection, and a claim on a connection whose server is known not to be writable
    sends nothing: a worker with no writable candidate only checks, about once a second, whether
    one became writable, instead of sending claims a replica refuses."""
    (a, b), (url_a, url_b) = two_logged_servers
    b.execute("SET GLOBAL read_only = ON")
    insert_ready(a, "ready-on-a")
    engine = create_engine(f"{url_a} {url_b}", pool_size=1)
    try:
        with engine.connect() as conn:
            assert role_of(conn).writable
            a.execute("SET GLOBAL read_only = ON")  # demoted under the open connection
            before = claims_sent(a, b)
            with pytest.raises(NotPrimary):
                service.claim_cycle(conn, ["t:1:1"], ["default"], lease_seconds=5)
            assert claims_sent(a, b) == before + 1, "the first claim went out, and read the flags"
            assert not role_of(conn).writable, "which marked the connection"
            for _ in range(3):
                with pytest.raises(NotPrimary):
                    service.claim_cycle(conn, ["t:1:1"], ["default"], lease_seconds=5)
            assert claims_sent(a, b) == before + 1, "nothing more was sent to a server known to be read-only"
        with engine.connect() as conn:  # the next checkout, within NOT_WRITABLE_CHECK_SECONDS
            with pytest.raises(NotPrimary):
                service.claim_cycle(conn, ["t:1:1"], ["default"], lease_seconds=5)
        assert claims_sent(a, b) == before + 1
    finally:
        engine.dispose()
    assert status_on(a, "ready-on-a") == "ready"


def test_the_web_takes_writes_again_soon_after_the_primary_does(throwaway_server):
    """A web process that saw its primary read-only (a switchover, a botched one undone) refused
    every POST for a minute after the server was writable again: the check before each write
    kept its refusal as long as its all-clear. In the soak, a cancel retried for 60 s against
    503s and gave up. A refusal is now checked again as soon as a pooled connection's role is."""
    server = throwaway_server()
    url = server.create_database("jq")
    assert jobqueue(url, "init-db").returncode == 0
    app = create_app(app_config(url))
    client = app.test_client()
    try:
        server.execute("SET GLOBAL read_only = ON")
        refused = api(client, "POST", "/api/jobs", json={"task": "noop", "task_key": "while-read-only"})
        assert refused.status_code == 503, refused.get_data(as_text=True)
        server.execute("SET GLOBAL read_only = OFF")
        started = time.monotonic()
        wait_until(
            lambda: api(client, "POST", "/api/jobs", json={"task": "noop", "task_key": "after"}).status_code == 201,
            timeout=PRIMARY_CHECK_SECONDS + 5,
            interval=0.3,
            message="the API takes an enqueue again",
        )
        taken_after = time.monotonic() - started
    finally:
        app.extensions["jobqueue"].engine.dispose()
    assert status_on(server, "after") == "ready" and status_on(server, "while-read-only") is None
    print(f"writes taken again {taken_after:.1f} s after read_only = OFF")


def test_a_worker_started_while_only_a_read_only_candidate_answers_waits_for_the_primary(two_servers, tmp_path):
    """The primary down and the other candidate read-only when a worker starts: the worker waits
    (not_primary) and claims once the primary is back. It exited 1 instead ("This connection is
    closed": the pool gave up after the checkout hook dropped the read-only server's connection
    twice, which the start-up wait did not count as the database being away)."""
    a, b, (url_a, url_b) = two_servers
    b.execute("SET GLOBAL read_only = ON")
    a.stop()
    w = WorkerProcess(
        f"{url_a} {url_b}", tmp_path, "w", "--concurrency", "2", "--lease-seconds", "5", "--idle-cap-seconds", "0.5"
    )
    try:
        time.sleep(4)  # start-up, preflight tried more than once
        assert w.proc.poll() is None, f"the worker exited {w.proc.returncode}:\n{w.log()[-2000:]}"
        a.start()
        insert_ready(a, "after-restart")
        wait_until(lambda: status_on(a, "after-restart") == "done", timeout=20, message="the job on A runs")
    finally:
        w.stop()
