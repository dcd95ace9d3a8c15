"""The autoscaling signal (issue 28, item 4): GET /api/queues/<name>/scale answers a queue's ready
and running counts and its oldest ready job's age, each from one read of an index range of that
queue alone (EXPLAIN, and the entries read), on every server."""

from __future__ import annotations

import re

import pytest

from jobqueue import create_app
from jobqueue.core.repository import stats
from testkit.sql import explain, seq_rows, statements_sent
from testkit.web import VIEWER_TOKEN, app_config

VIEWER = {"Authorization": f"Bearer {VIEWER_TOKEN}"}
COLUMNS = (
    "INSERT INTO job_queue (task_key, task_name, queue, priority, payload, status, run_at, attempts, "
    "max_attempts, created_at, updated_at, lease_owner, lease_until, started_at) "
)
NOW = "UTC_TIMESTAMP(6)"


def add_jobs(conn, queue: str, status: str, n: int, *, waited: int = 0) -> None:
    """`n` jobs of `queue` in `status`; ready ones due `waited` seconds ago, plus one second per
    job from the last (the first is the oldest), running ones leased for a minute."""
    running = status == "running"
    lease = f"'h:1:1', {NOW} + INTERVAL 60 SECOND, {NOW}" if running else "NULL, NULL, NULL"
    conn.exec_driver_sql(
        COLUMNS + f"SELECT CONCAT('{queue}-{status}-', seq), 'noop', '{queue}', 0, '{{}}', '{status}', "
        f"{NOW} - INTERVAL ({waited} + {n} - seq) SECOND, {int(running)}, 5, {NOW}, {NOW}, {lease} "
        f"FROM {seq_rows(n)}"
    )


@pytest.fixture
def app(mysql_url):
    application = create_app(app_config(mysql_url))
    yield application
    application.extensions["jobqueue"].engine.dispose()


def test_the_signal_of_a_queue(app):
    with app.extensions["jobqueue"].engine.connect() as conn:
        add_jobs(conn, "mail", "ready", 3, waited=90)  # the oldest waited 92 s
        add_jobs(conn, "mail", "running", 2)
        add_jobs(conn, "mail", "done", 5)
        add_jobs(conn, "other", "ready", 4, waited=1000)
        conn.commit()
    client = app.test_client()

    answer = client.get("/api/queues/mail/scale", headers=VIEWER)
    assert answer.status_code == 200
    body = answer.get_json()
    assert set(body) == {"queue", "ready", "running", "oldest_ready_age_seconds", "capped", "cap", "now"}
    assert (body["queue"], body["ready"], body["running"], body["capped"], body["cap"]) == (
        "mail",
        3,
        2,
        [],
        stats.SCALE_CAP,
    )
    assert 92 <= body["oldest_ready_age_seconds"] < 92 + 30, body
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|\+00:00)", body["now"]), body["now"]

    # A queue with no jobs yet is one to scale to zero, not an error.
    empty = client.get("/api/queues/nothing-yet/scale", headers=VIEWER)
    assert empty.status_code == 200
    assert {k: empty.get_json()[k] for k in ("queue", "ready", "running", "oldest_ready_age_seconds", "capped")} == {
        "queue": "nothing-yet",
        "ready": 0,
        "running": 0,
        "oldest_ready_age_seconds": 0.0,
        "capped": [],
    }

    refused = client.get("/api/queues/mail/scale")
    assert refused.status_code == 401 and refused.headers["WWW-Authenticate"] == "Bearer"
    assert client.get("/api/queues/mail/scale", headers={"Authorization": "Bearer wrong"}).status_code == 401
    bad = client.get("/api/queues/no%20spaces/scale", headers=VIEWER)
    assert bad.status_code == 422 and bad.get_json()["field"] == "queue"

    # The same three figures in /metrics, per queue.
    scraped = client.get("/metrics", headers=VIEWER).get_data(as_text=True)
    assert 'jobqueue_queue_jobs{queue="mail",status="ready"} 3.0' in scraped
    assert 'jobqueue_queue_jobs{queue="mail",status="running"} 2.0' in scraped
    age = re.search(r'jobqueue_queue_oldest_ready_age_seconds\{queue="mail"\} (\S+)', scraped)
    assert age and 92 <= float(age.group(1)) < 92 + 30, scraped


def test_counts_beyond_the_cap_are_reported_capped(mysql_engine, monkeypatch):
    monkeypatch.setattr(stats, "SCALE_CAP", 10)
    with mysql_engine.connect() as conn:
        add_jobs(conn, "mail", "ready", 25, waited=5)
        add_jobs(conn, "mail", "running", 10)
        conn.commit()
        signal = stats.scale_signal(conn, "mail")
    assert (signal.ready, signal.running, signal.capped) == (10, 10, frozenset({"ready"}))
    assert signal.oldest_ready_age_seconds >= 29


def _entries_read(conn) -> int:
    """Index entries and rows this session has read (its Handler_read_* counters: MySQL has no
    session Rows_read, and the server-wide Innodb_rows_read counts other tests' reads too)."""
    return sum(int(v) for _, v in conn.exec_driver_sql("SHOW SESSION STATUS LIKE 'Handler_read%%'").all())


@pytest.mark.parametrize(
    "queue, ready, running, path", [("mail", 50, 20, "ix_ready_pick"), ("huge", 12_000, 0, "ix_due")]
)
def test_each_figure_is_one_bounded_index_read(mysql_engine, queue, ready, running, path):
    """Among 70,000 rows of other queues and statuses, the signal of a queue reads that queue's
    entries only: the counts index-only on ix_ready_pick, the age on ix_ready_pick (a few ready
    jobs) or the first entry in ix_due order (more than AGE_WINDOW), never a filesort."""
    with mysql_engine.connect() as conn:
        add_jobs(conn, "mail", "ready", 50, waited=60)
        add_jobs(conn, "mail", "running", 20)
        add_jobs(conn, "huge", "ready", 12_000, waited=30_000)  # older than every other ready job
        add_jobs(conn, "other", "ready", 20_000, waited=100)
        add_jobs(conn, "mail", "done", 30_000)
        add_jobs(conn, "other", "done", 20_000)
        conn.exec_driver_sql("ANALYZE TABLE job_queue")
        conn.commit()

        before = _entries_read(conn)
        signal = stats.scale_signal(conn, queue)
        read = _entries_read(conn) - before
        assert (signal.ready, signal.running, signal.capped) == (ready, running, frozenset())
        # The counts (n + 1 entries each, and as many rows of the derived table they count), the
        # age (the queue's entries and their rows, or one entry): nothing of the other 70,000 rows.
        assert read <= 2 * (ready + 1) + 2 * (running + 1) + (2 * ready if path == "ix_ready_pick" else 1) + 50, read

        statements = statements_sent(mysql_engine, lambda: stats.scale_signal(conn, queue), lambda s: "job_queue" in s)
        assert len(statements) == 2, statements
        counts, age = [explain(conn, s.replace("%", "%%")) for s in statements]
        reads = [r for r in counts if r["table"] == "job_queue"]
        assert len(reads) == 2, counts
        for r in reads:
            assert r["key"] == "ix_ready_pick" and r["type"] == "ref", counts
            assert "Using index" in (r["Extra"] or "") and "filesort" not in (r["Extra"] or ""), counts
            assert int(r["rows"]) <= 3 * ready + 1_000, counts  # an estimate (0.5x-2x) of the range
        (r,) = [r for r in age if r["table"] == "job_queue"]
        assert r["key"] == path and "filesort" not in (r["Extra"] or ""), age
        if path == "ix_due":
            assert "Using index" in (r["Extra"] or ""), age
        else:
            assert int(r["rows"]) <= 3 * ready + 1_000, age
