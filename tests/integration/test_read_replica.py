"""JOBQUEUE_READ_URL: the dashboard's read-only pages read from a replica and show its lag; the
actions, the API and the health checks stay on the primary, and nothing is ever written to the
replica (issue 15). A real GTID primary and replica (testkit.replication) with general logs, so
the test reads what each server was sent."""

from __future__ import annotations

import re

import pytest
from sqlalchemy.exc import DBAPIError

from jobqueue.core import repository, service
from jobqueue.core.db import create_engine, error_code
from jobqueue.core.migrate import init_db
from testkit.replication import executed_statements
from testkit.web import api, post, signed_in_app

pytestmark = pytest.mark.slow

LIST_JOBS = r"ORDER BY job_queue\.id DESC"  # the jobs page's keyset read
CLIENT_WRITES = r"^\s*(INSERT|UPDATE|DELETE|REPLACE)\b"


@pytest.fixture
def replicated(replication_cluster):
    cluster = replication_cluster(replicas=1, general_log=True)
    primary_url = cluster.primary.create_database("jq")
    engine = create_engine(primary_url)
    init_db(engine)
    cluster.wait_caught_up()
    replica_url = cluster.replicas[0].url("jq")
    yield cluster, engine, primary_url, replica_url
    engine.dispose()


@pytest.fixture
def read_app(replicated):
    cluster, engine, primary_url, replica_url = replicated
    with signed_in_app(primary_url, READ_URL=replica_url) as signed_in:
        yield signed_in


def header_source(html: str) -> str:
    m = re.search(r'<span id="read-source"[^>]*>(.*?)</span>', html, re.DOTALL)
    assert m, "no read-source in the page header"
    return " ".join(m.group(1).split())


def test_read_only_pages_read_from_the_replica_and_show_its_lag(replicated, read_app):
    cluster, engine, _, _ = replicated
    app, client = read_app
    replica = cluster.replicas[0]
    with engine.connect() as conn:
        first = service.enqueue(conn, "noop", "seen-on-both")
    cluster.wait_caught_up()
    # Caught up, yet MySQL may say 1 s for a moment, and again at the next event from the primary
    # (the app's own heartbeats): its figure counts from the last event's timestamp, in whole
    # seconds, and the page shows what the server says. A caught-up replica shows 0-2 s.
    page = client.get("/jobs").get_data(as_text=True)
    assert "seen-on-both" in page
    source = header_source(page)
    m = re.fullmatch(rf"read from replica {re.escape(replica.host)}:{replica.port}: (\d+) s behind the primary", source)
    assert m and int(m.group(1)) <= 2, source
    assert executed_statements(replica, LIST_JOBS), "the jobs page read from the replica"
    assert not executed_statements(cluster.primary, LIST_JOBS), "and not from the primary"
    for path in ("/", "/overview/panels", f"/jobs/{first.id}", "/workers", "/audit"):
        response = client.get(path)
        assert response.status_code == 200, path
        assert "read-source" in response.get_data(as_text=True), f"{path} says where it read from"

    # The replica stops applying: its pages go stale and say so; the API and the actions do not.
    cluster.stop_sql_thread()
    with engine.connect() as conn:
        later = service.enqueue(conn, "noop", "only-on-the-primary")
    page = client.get("/jobs").get_data(as_text=True)
    assert "only-on-the-primary" not in page
    assert "replication not running (IO Yes, SQL No)" in header_source(page)
    assert api(client, "GET", f"/api/jobs/{later.id}").status_code == 200, "the API reads the primary"
    answer = post(client, f"/jobs/{later.id}/fail", {"confirm": "yes", "reason": "operator"})
    assert answer.status_code == 200 and "failed" in answer.get_data(as_text=True)
    with engine.connect() as conn:
        assert repository.reads.get_job(conn, later.id).status.value == "failed"
    assert executed_statements(replica, CLIENT_WRITES) == [], "nothing was ever written to the replica"
    cluster.start_sql_thread()
    cluster.wait_caught_up()


def test_the_read_engine_cannot_write_even_as_a_super_user(read_app):
    app, _ = read_app
    # Root has SUPER, which read_only does not stop; the READ ONLY session does.
    with app.extensions["jobqueue"].read_engine.connect() as conn:
        with pytest.raises(DBAPIError) as refused:
            conn.exec_driver_sql(
                "INSERT INTO audit_log (at, actor, action, count) VALUES (UTC_TIMESTAMP(6), 'x', 'x', 0)"
            )
        conn.rollback()
    assert error_code(refused.value) == 1792  # ER_CANT_EXECUTE_IN_READ_ONLY_TRANSACTION


def test_an_unreachable_replica_falls_back_to_the_primary_and_says_so(replicated, read_app):
    cluster, engine, _, _ = replicated
    app, client = read_app
    with engine.connect() as conn:
        service.enqueue(conn, "noop", "while-the-replica-is-down")
    cluster.replicas[0].stop()
    app.extensions["jobqueue"].read_engine.dispose()
    page = client.get("/jobs")
    assert page.status_code == 200
    text = page.get_data(as_text=True)
    assert "while-the-replica-is-down" in text
    assert "the replica did not answer; read from the primary" in header_source(text)
