"""Dashboard pages and actions through the Flask test client, on MariaDB."""

from __future__ import annotations

import re

import pytest
import sqlalchemy as sa

from jobqueue.core import repository, service
from jobqueue.core.models import Status
from jobqueue.core.schema import audit_log, job_queue
from jobqueue.web import dashboard
from testkit.web import post

jq = job_queue.c


def make_failed(engine, key="f1", error="boom"):
    with engine.connect() as conn:
        res = service.enqueue(conn, "fail_first_attempt", key)
        (c,) = service.claim(conn, "host:1:1", 1, ["default"], lease_seconds=60)
        assert c.job.id == res.id
        service.fail(conn, c.lease, error)
    return res.id


def test_every_page_renders(client, engine):
    job_id = make_failed(engine)
    with engine.connect() as conn:
        service.enqueue(conn, "noop", "n1", queue="mail")
        repository.processes.register_process(
            conn, process_id="host:99", host="host", pid=99, kind="worker", concurrency=4, queues="*"
        )
    for path in (
        "/",
        "/overview/panels",
        "/jobs",
        f"/jobs/{job_id}",
        f"/jobs/{job_id}/row",
        f"/jobs/{job_id}/summary",
        "/workers",
        "/audit",
    ):
        response = client.get(path)
        assert response.status_code == 200, path
    overview = client.get("/").get_data(as_text=True)
    assert "mail" in overview and "default" in overview
    assert 'hx-trigger="every 3s' in overview
    assert "host:99" in client.get("/workers").get_data(as_text=True)


def test_overview_counts_and_throughput(client, engine):
    make_failed(engine)
    with engine.connect() as conn:
        service.enqueue_many(conn, [{"task": "noop", "task_key": f"r{i}"} for i in range(3)])
        repository.processes.register_process(
            conn, process_id="p:1", host="p", pid=1, kind="worker", concurrency=1, queues="*"
        )
        now = repository.reads.database_now(conn).replace(second=0, microsecond=0)
        repository.processes.heartbeat(
            conn, "p:1", jobs_in_hand=0, processed=7, minute=now, stats={"completed": 7, "failed": 2}
        )
    html = client.get("/overview/panels").get_data(as_text=True)
    queue_row = re.search(r'<table class="grid" id="queue-table">.*?</table>', html, re.S).group(0)
    cells = re.findall(r'status=(\w+)">([\d,]+)', queue_row)
    assert dict(cells)["ready"] == "3" and dict(cells)["failed"] == "1"
    assert "finished 7" in html and "failed 2" in html


def test_jobs_filters_and_keyset_paging(client, engine):
    with engine.connect() as conn:
        service.enqueue_many(conn, [{"task": "noop", "task_key": f"page-{i:03d}"} for i in range(120)])
        service.enqueue(conn, "sleep", "other-1", {"seconds": 1}, queue="slow")
    seen, url = [], "/jobs?task=noop"
    while url:
        html = client.get(url).get_data(as_text=True)
        seen += re.findall(r'<td class="key">(page-\d+)</td>', html)
        nxt = re.search(r'href="([^"]+)" rel="next"', html)
        url = nxt.group(1).replace("&amp;", "&") if nxt else None
    assert len(seen) == 120 and len(set(seen)) == 120 and seen == sorted(seen, reverse=True)
    assert "other-1" in client.get("/jobs?queue=slow").get_data(as_text=True)
    assert "other-1" not in client.get("/jobs?queue=default").get_data(as_text=True)
    html = client.get("/jobs?key=page-11").get_data(as_text=True)
    assert sorted(re.findall(r'<td class="key">(page-\d+)</td>', html)) == [f"page-11{i}" for i in range(10)]
    assert "No jobs match" in client.get("/jobs?status=failed").get_data(as_text=True)
    # HTMX filter requests get only the table.
    part = client.get("/jobs?task=sleep", headers={"HX-Request": "true", "HX-Target": "jobs-table"})
    assert part.get_data(as_text=True).startswith('<div id="jobs-table">')


@pytest.mark.parametrize("query", ["status=bogus", "before=abc", "before=-1", "queue=" + "x" * 101, "key=" + "k" * 81])
def test_bad_filters_are_400(client, query):
    assert client.get("/jobs?" + query).status_code == 400


def test_filter_values_with_sql_and_html_metacharacters_are_harmless(client, engine):
    make_failed(engine)
    for value in ("' OR 1=1 --", "<script>alert(1)</script>", "%", "_", "\\"):
        response = client.get("/jobs", query_string={"key": value, "queue": value, "task": value})
        assert response.status_code == 200
        html = response.get_data(as_text=True)
        assert "No jobs match" in html and "<script>alert(1)</script>" not in html


def test_payload_and_errors_are_escaped(client, engine):
    with engine.connect() as conn:
        res = service.enqueue(conn, "noop", "xss", {"html": "<script>alert('x')</script>"})
        (c,) = service.claim(conn, "h:1:1", 1, ["default"], lease_seconds=60)
        service.fail(conn, c.lease, "<img src=x onerror=alert(1)>")
    for path in (f"/jobs/{res.id}", "/jobs", "/"):
        html = client.get(path).get_data(as_text=True)
        assert "<script>alert" not in html and "<img src=x" not in html
    assert "&lt;script&gt;" in client.get(f"/jobs/{res.id}").get_data(as_text=True)


def test_requeue_failed_job_updates_row_in_place_and_audits(client, engine):
    job_id = make_failed(engine)
    response = post(client, f"/jobs/{job_id}/requeue", {"confirm": "yes"})
    html = response.get_data(as_text=True)
    assert response.status_code == 200
    assert html.lstrip().startswith(f'<tr id="job-{job_id}" class="status-ready"')
    assert 'hx-swap-oob="true"' in html and "requeued (failed → ready)" in html
    with engine.connect() as conn:
        job = repository.reads.get_job(conn, job_id)
        assert job.status is Status.READY and job.attempts == 1 and job.max_attempts == 2
        (entry,) = repository.operator.list_audit(conn)
    assert (entry["actor"], entry["action"], entry["job_id"], entry["before_status"], entry["after_status"]) == (
        "web:alice",
        "requeue",
        job_id,
        "failed",
        "ready",
    )
    assert f"job {job_id}" in client.get("/audit").get_data(as_text=True)


def test_actions_need_confirmation(client, engine):
    job_id = make_failed(engine)
    assert post(client, f"/jobs/{job_id}/requeue", {}).status_code == 400
    with engine.connect() as conn:
        assert repository.reads.get_job(conn, job_id).status is Status.FAILED


def test_fail_with_reason_from_the_detail_page(client, engine):
    with engine.connect() as conn:
        job_id = service.enqueue(conn, "noop", "to-fail").id
    html = post(
        client, f"/jobs/{job_id}/fail", {"confirm": "yes", "reason": "customer cancelled", "view": "detail"}
    ).get_data(as_text=True)
    assert 'id="job-summary"' in html and "customer cancelled" in html
    with engine.connect() as conn:
        job = repository.reads.get_job(conn, job_id)
    assert job.status is Status.FAILED and job.last_error == "customer cancelled"


def test_requeue_running_job_with_valid_lease_asks_then_fences(client, engine):
    with engine.connect() as conn:
        service.enqueue(conn, "noop", "busy-worker")
        (c,) = service.claim(conn, "h:1:1", 1, ["default"], lease_seconds=300)
    first = post(client, f"/jobs/{c.job.id}/requeue", {"confirm": "yes"}).get_data(as_text=True)
    assert "still valid" in first and "Requeue anyway" in first and 'name="force" value="yes"' in first
    with engine.connect() as conn:
        assert repository.reads.get_job(conn, c.job.id).status is Status.RUNNING
    post(client, f"/jobs/{c.job.id}/requeue", {"confirm": "yes", "force": "yes"})
    with engine.connect() as conn:
        assert repository.reads.get_job(conn, c.job.id).status is Status.READY
        assert service.complete(conn, c.lease).value == "lease_lost"


def test_action_on_a_locked_job_answers_busy(client, engine):
    job_id = make_failed(engine)
    holder = engine.connect()
    holder.begin()
    holder.execute(sa.text("SELECT id FROM job_queue WHERE id = :id FOR UPDATE"), {"id": job_id})
    try:
        html = post(client, f"/jobs/{job_id}/requeue", {"confirm": "yes"}).get_data(as_text=True)
        assert "busy" in html and "try again" in html
    finally:
        holder.rollback()
        holder.close()
    with engine.connect() as conn:
        assert repository.reads.get_job(conn, job_id).status is Status.FAILED


def test_wrong_state_and_unknown_job(client, engine):
    with engine.connect() as conn:
        service.enqueue(conn, "noop", "d")
        (c,) = service.claim(conn, "h:1:1", 1, ["default"], lease_seconds=60)
        service.complete(conn, c.lease)
    assert "is done" in post(client, f"/jobs/{c.job.id}/requeue", {"confirm": "yes"}).get_data(as_text=True)
    assert post(client, "/jobs/999999/requeue", {"confirm": "yes"}).status_code == 404
    assert client.get("/jobs/999999").status_code == 404


def test_non_htmx_action_redirects_with_flash(client, engine):
    job_id = make_failed(engine)
    response = post(client, f"/jobs/{job_id}/requeue", {"confirm": "yes"}, htmx=False)
    assert response.status_code == 302
    assert "requeued" in client.get(response.headers["Location"]).get_data(as_text=True)


def test_bulk_selected(client, engine):
    ids = [make_failed(engine, f"f{i}") for i in range(3)]
    html = post(
        client,
        "/jobs/bulk",
        {"confirm": "yes", "action": "requeue", "scope": "selected", "ids": [str(i) for i in ids[:2]]},
    ).get_data(as_text=True)
    assert "2 jobs requeued." in html
    with engine.connect() as conn:
        assert [repository.reads.get_job(conn, i).status for i in ids] == [Status.READY, Status.READY, Status.FAILED]


def test_bulk_over_a_filter_runs_in_bounded_chunks(client, engine, monkeypatch):
    with engine.connect() as conn:
        service.enqueue_many(conn, [{"task": "noop", "task_key": f"b{i}"} for i in range(1200)])
        conn.execute(sa.update(job_queue).values(status="failed", attempts=1, last_error="x"))
        conn.commit()
        service.enqueue(conn, "noop", "stays-ready")
    monkeypatch.setattr(dashboard.actions, "BULK_TIME_BUDGET", 0.0)  # one batch per request
    data = {"confirm": "yes", "action": "requeue", "scope": "filter", "status": "failed"}
    requests = 0
    while True:
        requests += 1
        html = post(client, "/jobs/bulk", data).get_data(as_text=True)
        if 'hx-trigger="load"' not in html:
            break
        data = dict(re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)">', html))
        assert data["scope"] == "filter" and data["after"]
    assert "1200 jobs requeued." in html
    assert requests == 3  # 500 + 500 + 200, each a short request of its own
    with engine.connect() as conn:
        counts = dict(conn.execute(sa.select(jq.status, sa.func.count()).group_by(jq.status)).all())
        audits = conn.execute(sa.select(audit_log.c.action, audit_log.c.count, audit_log.c.selection)).all()
    assert counts == {"ready": 1201}
    assert sum(a.count for a in audits) == 1200 and {a.action for a in audits} == {"bulk_requeue"}
    assert all(a.selection == "filter: status=failed" for a in audits)


def test_bulk_skips_busy_rows_instead_of_waiting(client, engine):
    ids = [make_failed(engine, f"f{i}") for i in range(4)]
    holder = engine.connect()
    holder.begin()
    holder.execute(sa.text("SELECT id FROM job_queue FORCE INDEX (PRIMARY) WHERE id = :id FOR UPDATE"), {"id": ids[0]})
    try:
        html = post(
            client,
            "/jobs/bulk",
            {"confirm": "yes", "action": "fail", "scope": "selected", "ids": [str(i) for i in ids]},
        ).get_data(as_text=True)
        assert "4 skipped" in html  # already failed: fail does not apply
        html = post(
            client,
            "/jobs/bulk",
            {"confirm": "yes", "action": "requeue", "scope": "selected", "ids": [str(i) for i in ids]},
        ).get_data(as_text=True)
        assert "3 jobs requeued, 1 busy" in html
    finally:
        holder.rollback()
        holder.close()


def test_viewer_sees_but_cannot_act(viewer, engine):
    job_id = make_failed(engine)
    html = viewer.get("/jobs").get_data(as_text=True)
    assert "failed" in html and "Requeue" not in html and 'id="bulk-form"' not in html
    assert post(viewer, f"/jobs/{job_id}/requeue", {"confirm": "yes"}).status_code == 403
    assert (
        post(
            viewer, "/jobs/bulk", {"confirm": "yes", "action": "requeue", "scope": "selected", "ids": [str(job_id)]}
        ).status_code
        == 403
    )
    with engine.connect() as conn:
        assert repository.reads.get_job(conn, job_id).status is Status.FAILED
