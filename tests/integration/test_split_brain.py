"""Two writable candidate primaries (issue 25, defect 6): a worker given "A B" claims, renews and
completes on one server at a time, drops connections to the other, and while it sees both
writable it claims nothing, says so in its log, in /api/health and on the dashboard, and goes on
when one of them is read-only again. Real worker processes."""

from __future__ import annotations

import time

import pytest

from jobqueue.core.db import PEER_CHECK_SECONDS, create_engine
from jobqueue.core.migrate import init_db
from testkit.procs import WorkerProcess, wait_until
from testkit.web import api, signed_in_app
from tests.conftest import database_on

pytestmark = pytest.mark.slow

JOBS = 300
PASSWORD = "jq-split-brain"


def insert_jobs(server, keys, seconds: float) -> None:
    values = ", ".join(
        f"('{k}', 'slow_noop', 'default', 0, '{{\"seconds\": {seconds}}}', 'ready', UTC_TIMESTAMP(6), "
        "0, 5, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6))"
        for k in keys
    )
    server.execute(
        "INSERT INTO job_queue (task_key, task_name, queue, priority, payload, status, run_at, attempts, "
        f"max_attempts, created_at, updated_at) VALUES {values}",
        database="jq",
    )


def claimed(server) -> set[str]:
    return {k for (k,) in server.execute("SELECT task_key FROM job_queue WHERE attempts > 0", database="jq")}


def count(server, status: str) -> int:
    return server.execute(f"SELECT COUNT(*) FROM job_queue WHERE status = '{status}'", database="jq")[0][0]


@pytest.fixture
def two_servers(throwaway_mariadb):
    """Two throwaway servers with the schema, the same jobs (as if B had replicated A until a
    failover) and an account without SUPER, so that read_only binds it and it can be locked out."""
    servers, urls = [], []
    for _ in range(2):
        server = throwaway_mariadb("--log-bin", "--binlog-format=ROW")
        engine = create_engine(server.create_database("jq"))
        init_db(engine)
        engine.dispose()
        server.execute(f"CREATE USER 'jq'@'%' IDENTIFIED BY '{PASSWORD}'")
        server.execute("GRANT SELECT, INSERT, UPDATE, DELETE ON jq.* TO 'jq'@'%'")
        server.execute("GRANT SLAVE MONITOR ON *.* TO 'jq'@'%'")
        insert_jobs(server, [f"job-{n}" for n in range(JOBS)], seconds=0.2)
        servers.append(server)
        urls.append(f"mysql+pymysql://jq:{PASSWORD}@{server.host}:{server.port}/jq")
    return servers, urls


def kill_some_connections_of_jq(server) -> int:
    """A network blip: every other connection of the worker's account dropped."""
    ids = [i for (i,) in server.execute("SELECT id FROM information_schema.PROCESSLIST WHERE user = 'jq' ORDER BY id")]
    for i in ids[::2]:
        server.execute(f"KILL CONNECTION {i}")
    return len(ids[::2])


def test_a_failover_that_left_the_old_primary_writable(two_servers, tmp_path):
    """A worker on A; B is promoted while A stays writable, and A refuses the worker's new
    connections for a moment (some of its connections dropped). The worker moves to B and
    nothing more is claimed on A; once it sees A writable too it claims nothing at all, and says
    so (log, heartbeat, /api/health, dashboard), until A is made read-only; then it goes on on B.
    Before the fix its pool kept the connections to A that survived: claims went to both."""
    (a, b), (url_a, url_b) = two_servers
    b.execute("SET GLOBAL read_only = ON")  # the standby
    w = WorkerProcess(
        f"{url_a} {url_b}", tmp_path, "w", "--concurrency", "4", "--lease-seconds", "5", "--idle-cap-seconds", "0.5"
    )
    # The dashboard of the side the worker moves to.
    with signed_in_app(b.url("jq")) as (_, client):
        run_the_failover(a, b, w, client)
    log = w.log()
    assert "event=claiming_resumed" in log and "after=split_brain" in log
    assert count(b, "running") == 0
    left_on_a = count(a, "running")
    assert left_on_a <= 8, "at most the jobs in hand when A dropped the worker (4 threads + 4 prefetched)"
    print(f"left running on A {left_on_a}")


def run_the_failover(a, b, w, client) -> None:
    try:
        wait_until(lambda: len(claimed(a)) >= 20, timeout=30, message="the worker claims on A")
        # The failover: A refuses the worker's account for a moment and drops some of its
        # connections; B is promoted. A stays writable.
        a.execute("ALTER USER 'jq'@'%' ACCOUNT LOCK")
        killed = kill_some_connections_of_jq(a)
        b.execute("SET GLOBAL read_only = OFF")
        w.wait_for_log(r"event=primary_found address=" + f"{b.host}:{b.port}", timeout=20)
        time.sleep(1.0)
        on_a_at_switch = claimed(a)
        a.execute("ALTER USER 'jq'@'%' ACCOUNT UNLOCK")  # both writable from here on
        unlocked = time.monotonic()
        w.wait_for_log(r"event=two_primaries ", timeout=PEER_CHECK_SECONDS + 5)
        detected_after = time.monotonic() - unlocked
        time.sleep(1.0)  # a claim cycle already under way when it was seen
        on_b_when_seen = claimed(b)
        wait_until(
            lambda: "split_brain" in api(client, "GET", "/api/health").get_data(as_text=True),
            timeout=5,
            interval=0.2,
            message="/api/health names the worker's state",
        )
        health = api(client, "GET", "/api/health")
        assert health.status_code == 503, health.get_data(as_text=True)
        worker = next(x for x in health.get_json()["workers"] if x["id"].endswith(":w"))
        assert worker["state"] == "split_brain" and "two writable primaries" in worker["detail"], worker
        page = client.get("/workers").get_data(as_text=True)
        assert "split brain" in page and "two writable primaries" in page
        time.sleep(4.0)
        assert claimed(b) == on_b_when_seen, "nothing claimed on B while A is writable too"
        assert claimed(a) == on_a_at_switch, "nothing claimed on A after the worker moved to B"
        # The old primary is made read-only: the worker goes on, on B.
        a.execute("SET GLOBAL read_only = ON")
        w.wait_for_log(r"event=two_primaries_resolved", timeout=PEER_CHECK_SECONDS + 5)
        wait_until(lambda: count(b, "done") == JOBS, timeout=60, message="B's jobs all run")
        assert claimed(a) == on_a_at_switch
        print(
            f"killed {killed} connections; split seen {detected_after:.1f} s after A was writable again; "
            f"claimed on A {len(on_a_at_switch)}"
        )
    finally:
        w.stop()


def test_two_writable_shared_servers_get_no_claim(db_server, tmp_path):
    """The same database name on two shared servers (both writable, nothing global changed): a
    worker given both claims on neither and says why; its heartbeat (on the chosen one) too."""
    other = "mysql" if db_server == "mariadb" else "mariadb"  # the second 'host'

    with database_on(db_server) as url_a, database_on(other) as url_b:
        for url in (url_a, url_b):
            engine = create_engine(url)
            with engine.begin() as conn:
                conn.exec_driver_sql(
                    "INSERT INTO job_queue (task_key, task_name, queue, priority, payload, status, run_at, attempts, "
                    "max_attempts, created_at, updated_at) VALUES ('only', 'slow_noop', 'default', 0, '{}', 'ready', "
                    "UTC_TIMESTAMP(6), 0, 5, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6))"
                )
            engine.dispose()
        w = WorkerProcess(f"{url_a} {url_b}", tmp_path, "w", "--concurrency", "2", "--idle-cap-seconds", "0.5")
        try:
            w.wait_for_log(r"event=two_primaries ", timeout=15)
            time.sleep(3.0)
            states = []
            for url in (url_a, url_b):
                engine = create_engine(url)
                with engine.connect() as conn:
                    states.append(conn.exec_driver_sql("SELECT status, attempts FROM job_queue").all())
                    beat = conn.exec_driver_sql("SELECT state FROM worker_process").all()
                engine.dispose()
                if url == url_a:
                    assert beat and "split_brain" in beat[0][0], beat
            assert states == [[("ready", 0)], [("ready", 0)]], states
        finally:
            w.stop()
