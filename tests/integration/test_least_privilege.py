"""The queue runs as an account with SELECT, INSERT, UPDATE, DELETE on its database and nothing
else, and `jobqueue doctor` warns about accounts that read_only does not bind (issue 12, item
10), on a throwaway mariadbd (restarted read-only); and the same account on each shared server,
a user of the test's own."""

from __future__ import annotations

import json
import threading
import time
import uuid

import pymysql
import pytest
import sqlalchemy as sa
from sqlalchemy.pool import NullPool

from jobqueue import create_app
from jobqueue.core import privileges, repository, service
from jobqueue.core.db import create_engine
from jobqueue.core.repository import doorbell
from testkit.procs import jobqueue
from testkit.web import app_config, csrf_token, login
from tests.conftest import SERVERS

APP_GRANTS = "GRANT SELECT, INSERT, UPDATE, DELETE ON jq.* TO '{user}'@'127.0.0.1'"


def privileges_check(url: str) -> dict:
    result = jobqueue(url, "doctor", "--json")
    assert result.returncode == 0, result.stderr + result.stdout
    return {c["name"]: c for c in json.loads(result.stdout)}["privileges"]


def make_user(server, user: str, *grants: str) -> str:
    server.execute(f"CREATE USER '{user}'@'127.0.0.1' IDENTIFIED BY '{user}-pw'")
    for grant in grants:
        server.execute(grant.format(user=user))
    return server.url("jq").replace("root@", f"{user}:{user}-pw@")


@pytest.mark.slow
def test_the_queue_runs_on_least_privilege_and_doctor_warns_about_the_rest(throwaway_mariadb):
    server = throwaway_mariadb()
    root_url = server.create_database("jq")
    assert jobqueue(root_url, "init-db").returncode == 0  # the migration account: root here
    app_url = make_user(server, "jq_app", APP_GRANTS)

    # Everything the queue does, as the app account.
    assert jobqueue(app_url, "init-db").returncode == 0  # nothing to migrate: no DDL needed
    for i in range(3):
        assert jobqueue(app_url, "enqueue", "noop", "--key", f"lp-{i}").returncode == 0
    burst = jobqueue(app_url, "worker", "--burst", "--concurrency", "2")
    assert burst.returncode == 0, burst.stderr
    assert jobqueue(app_url, "reap").returncode == 0
    stats = json.loads(jobqueue(app_url, "stats", "--json").stdout)
    assert stats["totals"]["done"] == 3
    app = create_app(app_config(app_url))
    try:
        c = app.test_client()
        assert login(c).status_code == 302 and c.get("/jobs").status_code == 200
        # Other connections' transactions need PROCESS: the Locks page and explain say so.
        assert c.get("/").status_code == 200
        assert "needs the PROCESS privilege" in c.get("/locks").get_data(as_text=True)
        held = json.loads(jobqueue(app_url, "enqueue", "noop", "--key", "lp-held").stdout)["id"]
        holder = pymysql.connect(host=server.host, port=server.port, user="root", database="jq")
        try:
            holder.cursor().execute(f"SELECT id FROM job_queue WHERE id = {held} FOR UPDATE")
            out = jobqueue(app_url, "explain", str(held), "--json")
            assert out.returncode == 0, out.stderr
            locked = json.loads(out.stdout)["reasons"]
            assert locked[0]["code"] == "locked_by_transaction" and "PROCESS" in locked[0]["unknown_why"]
        finally:
            holder.close()
        assert c.post("/logout", data={"csrf_token": csrf_token(c)}).status_code == 302
    finally:
        app.extensions["jobqueue"].engine.dispose()

    ok = privileges_check(app_url)
    assert ok["verdict"] == "ok" and "jq_app@127.0.0.1" in ok["detail"] and "schema" not in ok["detail"]

    root = privileges_check(root_url)
    assert root["verdict"] == "warning" and "ALL PRIVILEGES" in root["detail"] and "Least privilege" in root["advice"]

    migrator = privileges_check(
        make_user(
            server,
            "jq_migrate",
            "GRANT SELECT, INSERT, UPDATE, DELETE, CREATE, ALTER, INDEX, DROP ON jq.* TO '{user}'@'127.0.0.1'",
        )
    )
    assert migrator["verdict"] == "ok" and "init-db" in migrator["detail"]

    exempt_url = make_user(server, "jq_exempt", APP_GRANTS, "GRANT READ_ONLY ADMIN ON *.* TO '{user}'@'127.0.0.1'")
    exempt = privileges_check(exempt_url)
    assert exempt["verdict"] == "warning" and "READ_ONLY ADMIN" in exempt["detail"]
    assert (
        privileges_check(make_user(server, "jq_super", APP_GRANTS, "GRANT SUPER ON *.* TO '{user}'@'127.0.0.1'"))[
            "detail"
        ].count("SUPER")
        == 1
    )

    too_little = privileges_check(make_user(server, "jq_reader", "GRANT SELECT ON jq.* TO '{user}'@'127.0.0.1'"))
    assert too_little["verdict"] == "warning" and "lacks DELETE, INSERT, UPDATE" in too_little["detail"]

    # Why it matters: on a server made read-only, the app account's write is refused, the exempt
    # account's goes through (and so would a queue's claims, were they not refused by preflight).
    server.restart("--read-only")
    refused = jobqueue(app_url, "enqueue", "noop", "--key", "after-read-only")
    assert refused.returncode != 0
    exempt_conn = pymysql.connect(
        host=server.host, port=server.port, user="jq_exempt", password="jq_exempt-pw", database="jq", autocommit=True
    )
    try:
        with exempt_conn.cursor() as cur:
            assert cur.execute("UPDATE job_queue SET priority = 1 WHERE task_key = 'lp-0'") == 1
    finally:
        exempt_conn.close()


def test_on_each_server_a_restricted_account_runs_the_queue_and_doctor_names_what_it_lacks(mysql_url, db_server):
    """The same least-privilege account on the shared MariaDB 10.11, MySQL 9.7 and MariaDB 11.8
    (a user of its own, dropped after; no global setting touched): the queue and the doorbell
    need nothing beyond DML on the database; naming a lock's holder needs PROCESS, and on MySQL
    SELECT on three performance_schema tables, which doctor names while they are missing."""
    user = f"jqlp_{uuid.uuid4().hex[:10]}"
    database = mysql_url.rsplit("/", 1)[1]
    admin = sa.create_engine(SERVERS[db_server] + "/", poolclass=NullPool)

    def as_root(*statements: str) -> None:
        with admin.begin() as c:
            for statement in statements:
                c.exec_driver_sql(statement)

    as_root(f"CREATE USER '{user}'@'127.0.0.1' IDENTIFIED BY 'pw-{user}'")
    engine = None
    try:
        as_root(f"GRANT SELECT, INSERT, UPDATE, DELETE ON `{database}`.* TO '{user}'@'127.0.0.1'")
        app_url = mysql_url.replace("root@", f"{user}:pw-{user}@")
        for i in range(3):
            assert jobqueue(app_url, "enqueue", "noop", "--key", f"lp-{i}").returncode == 0
        burst = jobqueue(app_url, "worker", "--burst", "--concurrency", "2")
        assert burst.returncode == 0, burst.stderr
        assert json.loads(jobqueue(app_url, "stats", "--json").stdout)["totals"]["done"] == 3

        lacking = privileges_check(app_url)
        assert lacking["verdict"] == "ok" and "without PROCESS" in lacking["detail"]
        assert ("SELECT on performance_schema.data_locks" in lacking["detail"]) is (db_server == "mysql")

        # The doorbell: this account sees its own sleeper and ends its SLEEP, with no privilege.
        engine = create_engine(app_url, pool_size=4)
        woken: list[bool] = []
        sleeper = engine.connect().execution_options(isolation_level="AUTOCOMMIT")
        thread = threading.Thread(target=lambda: woken.append(doorbell.wait_for_ring(sleeper, 30, None)))
        thread.start()
        try:
            with engine.connect() as conn:
                deadline = time.monotonic() + 10
                while not (found := doorbell.sleepers(conn)) and time.monotonic() < deadline:
                    time.sleep(0.05)
                assert len(found) == 1
                assert doorbell.ring(conn, [s.connection_id for s in found]) == 1
            thread.join(10)
            assert woken == [True]
        finally:
            thread.join(30)
            sleeper.close()

        # A held row: who holds it cannot be read, and the page says which privileges would.
        with engine.connect() as conn:
            held = service.enqueue(conn, "noop", "lp-held").id
        holder = admin.connect()
        try:
            holder.exec_driver_sql(f"SELECT id FROM `{database}`.job_queue WHERE id = {held} FOR UPDATE")
            with engine.connect() as conn:
                unknown = repository.locks.row_lock(conn, held)
                report = repository.locks.lock_report(conn)
            assert unknown.held and "PROCESS" in unknown.unknown_why
            assert "PROCESS" in report.unavailable and report.transactions == []
            assert ("performance_schema.data_locks" in report.unavailable) is (db_server == "mysql")

            grants = [f"GRANT PROCESS ON *.* TO '{user}'@'127.0.0.1'"]
            if db_server == "mysql":
                grants += [
                    f"GRANT SELECT ON performance_schema.{t} TO '{user}'@'127.0.0.1'"
                    for t in privileges.PERFORMANCE_SCHEMA_TABLES
                ]
            as_root(*grants)
            engine.dispose()  # new sessions, with the new privileges
            holder_id = holder.exec_driver_sql("SELECT CONNECTION_ID()").scalar()
            with engine.connect() as conn:
                named = repository.locks.row_lock(conn, held)
                report = repository.locks.lock_report(conn)
            assert [t.connection_id for t in named.holders] == [holder_id]
            assert [(t.connection_id, t.jobs) for t in report.transactions] == [(holder_id, (held,))]
        finally:
            holder.close()
        enough = privileges_check(app_url)
        assert enough["verdict"] == "ok" and "without" not in enough["detail"]
    finally:
        if engine is not None:
            engine.dispose()
        as_root(f"DROP USER '{user}'@'127.0.0.1'")
        admin.dispose()
