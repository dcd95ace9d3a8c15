"""The lock inspector and the job page's "Why isn't it running?", through the Flask test client on
MariaDB, with rows held by real second connections."""

from __future__ import annotations

import re
import threading

import pymysql
import pytest
import sqlalchemy as sa

from jobqueue.core import repository, service
from testkit.locks import hold_rows, wait_for_lock_tables
from testkit.web import VIEWER_TOKEN, api, post


def enqueue(engine, key):
    with engine.connect() as conn:
        return service.enqueue(conn, "noop", key).id


@pytest.fixture
def held_job(engine):
    """A ready job whose row a second connection holds (SELECT ... FOR UPDATE, left open)."""
    enqueue(engine, "free")
    job_id = enqueue(engine, "held")
    holder = hold_rows(engine, [job_id])
    holder_id = holder.exec_driver_sql("SELECT CONNECTION_ID()").scalar()
    yield job_id, holder_id, holder
    try:
        holder.close()
    except sa.exc.DBAPIError:
        pass  # killed by the test


def test_the_job_page_says_which_connection_holds_its_row(client, held_job):
    job_id, holder_id, _ = held_job
    page = client.get(f"/jobs/{job_id}").get_data(as_text=True)
    assert "Why isn&#39;t it running?" in page or "Why isn't it running?" in page
    assert "locked_by_transaction" in page and f"Connection {holder_id} " in page
    assert f'href="/locks#connection-{holder_id}"' in page
    panel = client.get(f"/jobs/{job_id}/explain")
    assert panel.status_code == 200 and f"Connection {holder_id} " in panel.get_data(as_text=True)
    assert client.get("/jobs/99999/explain").status_code == 404


def test_the_locks_page_lists_the_holder_and_killing_it_frees_the_job(client, engine, held_job):
    job_id, holder_id, holder = held_job
    page = client.get("/locks").get_data(as_text=True)
    row = re.search(rf'<tr id="connection-{holder_id}".*?</tr>', page, re.S).group(0)
    assert f'href="/jobs/{job_id}"' in row and "root@" in row and "Kill connection" in row
    assert "idle in transaction" in row  # on MySQL too, where its last statement is kept
    assert 'href="/locks"' in client.get("/").get_data(as_text=True)  # in the nav

    # Two confirmations: the button's dialog, then the server's page naming what it holds.
    confirm = post(client, f"/locks/{holder_id}/kill/confirm", htmx=False)
    assert confirm.status_code == 200
    text = confirm.get_data(as_text=True)
    assert f"Kill connection {holder_id}" in text and str(job_id) in text and 'name="confirm" value="yes"' in text
    assert post(client, f"/locks/{holder_id}/kill", htmx=False).status_code == 400  # no confirm: nothing done
    with engine.connect() as conn:
        assert repository.locks.row_lock(conn, job_id).held

    done = post(client, f"/locks/{holder_id}/kill", {"confirm": "yes"}, htmx=False)
    assert done.status_code == 302
    with engine.connect() as conn:
        wait_for_lock_tables(lambda: not repository.locks.row_lock(conn, job_id).held, "row let go")
        claimed = service.claim(conn, "w:1", 2, ["default"], lease_seconds=30)
        assert job_id in [c.job.id for c in claimed]
        (audit,) = [a for a in repository.operator.list_audit(conn, limit=5) if a["action"] == "kill"]
    assert audit["actor"] == "web:alice" and audit["job_id"] == job_id
    assert f"connection {holder_id}" in audit["selection"]
    assert "No transaction holds" in client.get("/locks").get_data(as_text=True)


def test_a_viewer_sees_the_holder_but_no_sql_and_cannot_kill(viewer, held_job):
    job_id, holder_id, _ = held_job
    page = viewer.get("/locks").get_data(as_text=True)
    assert f'id="connection-{holder_id}"' in page
    assert "Kill connection" not in page and "Latest deadlock" not in page
    assert post(viewer, f"/locks/{holder_id}/kill/confirm", htmx=False).status_code == 403
    assert post(viewer, f"/locks/{holder_id}/kill", {"confirm": "yes"}, htmx=False).status_code == 403


def test_another_connection_is_not_killed_from_the_page(client, engine):
    enqueue(engine, "a")
    idle = engine.connect()
    try:
        idle_id = idle.exec_driver_sql("SELECT CONNECTION_ID()").scalar()
        response = post(client, f"/locks/{idle_id}/kill", {"confirm": "yes"}, htmx=False)
        assert response.status_code == 302
        assert idle.exec_driver_sql("SELECT 1").scalar() == 1
    finally:
        idle.close()


def _waiting_statement(mysql_url_parts, job_id, started: threading.Event):
    """A third connection waiting for the held row, with SQL text that says whose it is."""
    conn = pymysql.connect(**mysql_url_parts)
    cur = conn.cursor()
    cur.execute("SET SESSION innodb_lock_wait_timeout = 20")
    started.set()
    try:
        cur.execute(f"SELECT id /* secret-marker */ FROM job_queue WHERE id = {int(job_id)} FOR UPDATE")
    except pymysql.err.Error:
        pass
    finally:
        conn.rollback()
        conn.close()


def test_sql_text_is_for_admins_only(client, viewer, engine, held_job):
    job_id, holder_id, holder = held_job
    url = engine.url
    parts = dict(
        host=url.host, port=url.port or 3306, user=url.username, password=url.password or "", database=url.database
    )
    started = threading.Event()
    waiter = threading.Thread(target=_waiting_statement, args=(parts, job_id, started), daemon=True)
    waiter.start()
    try:
        started.wait(5)
        with engine.connect() as conn:
            wait_for_lock_tables(
                lambda: any(t.waiting_for for t in repository.locks.lock_report(conn).transactions), "the waiter shows"
            )
        assert "secret-marker" in client.get("/locks").get_data(as_text=True)
        assert "secret-marker" not in viewer.get("/locks").get_data(as_text=True)
    finally:
        holder.rollback()  # the waiter gets the row, then lets go
        waiter.join(25)


def test_the_explain_api(client, held_job):
    job_id, holder_id, _ = held_job
    answer = api(client, "GET", f"/api/jobs/{job_id}/explain")
    assert answer.status_code == 200
    data = answer.get_json()
    assert data["job_id"] == job_id and data["status"] == "ready"
    assert data["reasons"][0]["code"] == "locked_by_transaction" and data["reasons"][0]["connection_id"] == holder_id
    assert "statement" in data["reasons"][0]
    seen = api(client, "GET", f"/api/jobs/{job_id}/explain", token=VIEWER_TOKEN).get_json()
    assert seen["reasons"][0]["connection_id"] == holder_id and seen["reasons"][0]["statement"] is None
    assert api(client, "GET", "/api/jobs/99999/explain").status_code == 404


def test_the_latest_deadlock_is_shown_to_admins(client, viewer, engine):
    a_id, b_id = enqueue(engine, "a"), enqueue(engine, "b")
    a, b = engine.connect(), engine.connect()
    lock = "SELECT id FROM job_queue WHERE id = {} FOR UPDATE"
    outcome: list[BaseException | None] = []
    try:
        a.begin()
        b.begin()
        a.exec_driver_sql(lock.format(a_id))
        b.exec_driver_sql(lock.format(b_id))

        def a_takes_b():
            try:
                a.exec_driver_sql(lock.format(b_id))
                outcome.append(None)
            except sa.exc.DBAPIError as exc:
                outcome.append(exc)

        t = threading.Thread(target=a_takes_b)
        t.start()
        with engine.connect() as conn:
            wait_for_lock_tables(
                lambda: any(tr.waiting_for for tr in repository.locks.lock_report(conn).transactions), "a waits for b"
            )
        try:
            b.exec_driver_sql(lock.format(a_id))  # the cycle: one of the two is chosen as the victim
        except sa.exc.DBAPIError as exc:
            outcome.append(exc)
        b.rollback()
        t.join(10)
        a.rollback()
    finally:
        a.close()
        b.close()
    assert any(e is not None and e.orig.args[0] == 1213 for e in outcome)
    page = client.get("/locks").get_data(as_text=True)
    assert "Latest deadlock" in page and "TRANSACTION" in page
    assert "Latest deadlock" not in viewer.get("/locks").get_data(as_text=True)


def test_the_overview_counts_deadlocks_and_lock_wait_timeouts_per_minute(client, engine):
    from jobqueue.web.dashboard import LOCK_MINUTES, LockCounterMinutes

    LOCK_MINUTES.__init__()  # this process's samples start now
    assert "deadlocks (server)" in client.get("/").get_data(as_text=True)
    job_id = enqueue(engine, "t")
    holder = hold_rows(engine, [job_id])
    try:
        with engine.connect() as conn:
            conn.exec_driver_sql("SET SESSION innodb_lock_wait_timeout = 1")
            with pytest.raises(sa.exc.OperationalError):
                conn.exec_driver_sql(f"SELECT id FROM job_queue WHERE id = {job_id} FOR UPDATE")
            conn.invalidate()  # not back into the pool with a 1 s lock wait
    finally:
        holder.close()
    page = client.get("/overview/panels").get_data(as_text=True)
    count = re.search(r"lock-wait timeouts \(server\): <strong[^>]*>([\d,]+)</strong>", page).group(1)
    assert int(count.replace(",", "")) >= 1

    # The sums per minute, from running totals sampled at any moments.
    from datetime import datetime, timedelta

    history, t0 = LockCounterMinutes(minutes=3), datetime(2026, 1, 1, 12, 0, 10)
    assert history.record(t0, {"deadlocks": 5, "lock_timeouts": 9}) == [
        {"minute": t0.replace(second=0), "deadlocks": 0, "lock_timeouts": 0}
    ]
    history.record(t0 + timedelta(seconds=20), {"deadlocks": 7, "lock_timeouts": 9})
    rows = history.record(t0 + timedelta(minutes=2), {"deadlocks": 8, "lock_timeouts": 12})
    assert [(r["deadlocks"], r["lock_timeouts"]) for r in rows] == [(2, 0), (1, 3)]
    rows = history.record(t0 + timedelta(minutes=4), None)  # the oldest minute drops out
    assert [(r["deadlocks"], r["lock_timeouts"]) for r in rows] == [(1, 3)]


def test_a_holder_of_more_locks_than_are_read_is_shown_without_its_jobs_on_mysql(
    client, engine, db_server, monkeypatch
):
    """MySQL: data_locks walks every lock of a transaction whatever the query asks, under InnoDB's
    trx_sys mutex; a transaction locking more than MYSQL_LOCK_ROWS rows (lowered to 5 here) is
    shown from INNODB_TRX alone. MariaDB finds holders by probing and has no such limit."""
    from jobqueue.core.repository import locks

    monkeypatch.setattr(locks, "MYSQL_LOCK_ROWS", 5)
    ids = [enqueue(engine, f"many-{i}") for i in range(8)]
    holder = hold_rows(engine, ids)
    try:
        holder_id = holder.exec_driver_sql("SELECT CONNECTION_ID()").scalar()
        page = client.get("/locks").get_data(as_text=True)
        row = re.search(rf'<tr id="connection-{holder_id}".*?</tr>', page, re.S).group(0)
        with engine.connect() as conn:
            one = repository.locks.row_lock(conn, ids[0])
        if db_server == "mysql":
            assert "not read: it locks over" in row and f'href="/jobs/{ids[0]}"' not in row
            assert "Kill connection" not in row
            assert (
                one.held
                and one.holders == ()
                and f"{holder_id}" in one.unknown_why
                and "lock over 5 rows" in one.unknown_why
            )
            refused = post(client, f"/locks/{holder_id}/kill/confirm", htmx=False)
            assert holder.exec_driver_sql("SELECT 1").scalar() == 1 and refused.status_code != 500
        else:
            assert f'href="/jobs/{ids[0]}"' in row and "not read" not in row
            assert [t.connection_id for t in one.holders] == [holder_id]
    finally:
        holder.close()


def test_a_second_waiter_is_not_named_as_the_rows_holder(client, engine, held_job):
    """Two connections wait for the held row. The server's lock-wait tables (MariaDB) say the
    second waits behind the first as well as behind the holder: only the holder is named, on the
    job's panel and the Locks page, and the Kill button is offered for it alone."""
    job_id, holder_id, holder = held_job
    url = engine.url
    parts = dict(
        host=url.host, port=url.port or 3306, user=url.username, password=url.password or "", database=url.database
    )
    waiters = []
    try:
        for _ in range(2):
            started = threading.Event()
            t = threading.Thread(target=_waiting_statement, args=(parts, job_id, started), daemon=True)
            t.start()
            started.wait(5)
            waiters.append(t)
            with engine.connect() as conn:
                n = len(waiters)
                wait_for_lock_tables(
                    lambda: sum(bool(t.waiting_for) for t in repository.locks.lock_report(conn).transactions) == n,
                    f"{n} waiters show",
                )
        with engine.connect() as conn:
            assert [t.connection_id for t in repository.locks.row_lock(conn, job_id).holders] == [holder_id]
            report = repository.locks.lock_report(conn).transactions
        assert [t.connection_id for t in report if job_id in t.jobs] == [holder_id]
        assert len([t for t in report if t.waiting_for == (job_id,)]) == 2
        page = client.get("/locks").get_data(as_text=True)
        assert page.count(">Kill connection</button>") == 1
    finally:
        holder.rollback()  # the waiters get the row in turn, then let go
        for t in waiters:
            t.join(25)
