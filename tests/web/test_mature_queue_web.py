"""The API endpoints and dashboard controls of issue 13: cancel (single and bulk), pause and
resume, recurring jobs, retention. Admin only, confirmed, audited."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
import sqlalchemy as sa

from jobqueue.core import repository, service
from jobqueue.core.models import Status
from jobqueue.core.schema import job_queue
from testkit.web import VIEWER_TOKEN, api, csrf_token, post

jq = job_queue.c


def job(engine, job_id):
    with engine.connect() as conn:
        return repository.reads.get_job(conn, job_id)


# --- API -------------------------------------------------------------------------------------------


def test_api_cancel(client, engine):
    with engine.connect() as conn:
        job_id = service.enqueue(conn, "noop", "c1").id
        done_id = service.enqueue(conn, "noop", "c2").id
    r = api(client, "POST", f"/api/jobs/{job_id}/cancel", json={"reason": "not needed"})
    assert r.status_code == 200 and r.get_json() == {
        "id": job_id,
        "before": "ready",
        "after": "cancelled",
        "changed": True,
    }
    with engine.connect() as conn:
        (c,) = service.claim(conn, "w", 1, ["default"], lease_seconds=60)
        service.complete(conn, c.lease)
    refused = api(client, "POST", f"/api/jobs/{done_id}/cancel")
    assert refused.status_code == 409 and refused.get_json()["status"] == "done"
    assert api(client, "POST", "/api/jobs/999999/cancel").status_code == 404
    assert api(client, "POST", f"/api/jobs/{job_id}/cancel", json={"reason": 5}).status_code == 422
    assert api(client, "POST", f"/api/jobs/{job_id}/cancel", token=VIEWER_TOKEN).status_code == 403
    # A replay of the cancelled key is a duplicate.
    replay = api(client, "POST", "/api/jobs", json={"task": "noop", "task_key": "c1"})
    assert replay.status_code == 200 and replay.get_json()["duplicate"] is True
    assert replay.get_json()["status"] == "cancelled"


def test_api_pause_resume_and_queues(client, engine):
    r = api(client, "POST", "/api/queues/mail/pause")
    assert r.status_code == 200 and r.get_json() == {"queue": "mail", "paused": True, "changed": True}
    assert api(client, "POST", "/api/queues/mail/pause").get_json()["changed"] is False
    assert api(client, "POST", "/api/queues/mail/pause", token=VIEWER_TOKEN).status_code == 403
    assert api(client, "POST", "/api/queues/bad%20name/pause").status_code == 422
    listed = api(client, "GET", "/api/queues", token=VIEWER_TOKEN).get_json()["queues"]
    assert [(q["queue"], q["paused"], q["changed_by"]) for q in listed] == [("mail", True, "api:ops")]
    with engine.connect() as conn:
        service.cancel_job(conn, service.enqueue(conn, "noop", "m1", queue="mail").id)
    scraped = api(client, "GET", "/metrics", token=VIEWER_TOKEN).get_data(as_text=True)
    assert 'jobqueue_queue_paused{queue="mail"} 1.0' in scraped
    assert 'jobqueue_queue_jobs{queue="mail",status="cancelled"} 1.0' in scraped
    assert api(client, "POST", "/api/queues/mail/resume").get_json() == {
        "queue": "mail",
        "paused": False,
        "changed": True,
    }


def test_api_recurring(client, engine):
    body = {"name": "hourly", "cron": "0 * * * *", "task": "noop", "payload": {"x": 1}, "queue": "reports"}
    r = api(client, "POST", "/api/recurring", json=body)
    assert r.status_code == 201, r.get_json()
    data = r.get_json()
    assert (data["name"], data["cron"], data["task"], data["enabled"], data["created"]) == (
        "hourly",
        "0 * * * *",
        "noop",
        True,
        True,
    )
    assert api(client, "POST", "/api/recurring", json={**body, "cron": "30 * * * *"}).status_code == 200
    bad = api(client, "POST", "/api/recurring", json={**body, "cron": "every hour"})
    assert bad.status_code == 422 and bad.get_json()["field"] == "cron"
    assert api(client, "POST", "/api/recurring", json={**body, "extra": 1}).status_code == 422
    assert api(client, "POST", "/api/recurring", data="[]", content_type="application/json").status_code == 400
    listed = api(client, "GET", "/api/recurring", token=VIEWER_TOKEN).get_json()["recurring"]
    assert [(s["name"], s["cron"]) for s in listed] == [("hourly", "30 * * * *")]
    assert api(client, "POST", "/api/recurring/hourly/disable").get_json()["enabled"] is False
    assert api(client, "POST", "/api/recurring/hourly/enable").get_json()["enabled"] is True
    assert api(client, "POST", "/api/recurring/nope/enable").status_code == 404
    assert api(client, "DELETE", "/api/recurring/hourly", token=VIEWER_TOKEN).status_code == 403
    assert api(client, "DELETE", "/api/recurring/hourly").get_json() == {"name": "hourly", "removed": True}
    assert api(client, "DELETE", "/api/recurring/hourly").status_code == 404


def test_api_retention_and_prune(client, engine):
    with engine.connect() as conn:
        ids = [r.id for r in service.enqueue_many(conn, [{"task": "noop", "task_key": f"p{i}"} for i in range(3)])]
        long_ago = repository.reads.database_now(conn) - timedelta(days=10)
        conn.execute(
            sa.update(job_queue).where(jq.id.in_(ids)).values(status="done", run_at=long_ago, finished_at=long_ago)
        )
        conn.commit()
    info = api(client, "GET", "/api/retention", token=VIEWER_TOKEN).get_json()
    assert (info["keep_done_days"], info["keep_failed_days"], info["last_prune"]) == (7.0, 30.0, None)
    dry = api(client, "POST", "/api/prune", json={"dry_run": True}).get_json()
    assert dry["done"] == 3 and dry["dry_run"] is True
    assert api(client, "POST", "/api/prune", json={"done_older_than": -1}).status_code == 422
    # A dry run asked for with anything but true is refused, not taken as a real prune.
    assert api(client, "POST", "/api/prune", json={"dry_run": 1}).status_code == 422
    assert api(client, "POST", "/api/prune", json={"dry_run": "yes"}).status_code == 422
    assert api(client, "GET", "/api/retention").get_json()["last_prune"] is None
    assert api(client, "POST", "/api/prune", token=VIEWER_TOKEN).status_code == 403
    done = api(client, "POST", "/api/prune").get_json()
    assert (done["done"], done["finished"]) == (3, True)
    last = api(client, "GET", "/api/retention").get_json()["last_prune"]
    assert (last["done"], last["by"]) == (3, "api:ops")


# --- dashboard -------------------------------------------------------------------------------------


def test_cancel_button_single_and_bulk(client, viewer, engine):
    with engine.connect() as conn:
        ids = [r.id for r in service.enqueue_many(conn, [{"task": "noop", "task_key": f"b{i}"} for i in range(4)])]
    page = client.get("/jobs").get_data(as_text=True)
    assert f'action="/jobs/{ids[0]}/cancel"' in page and 'name="action" value="cancel"' in page
    assert "/cancel" not in viewer.get("/jobs").get_data(as_text=True)
    assert post(client, f"/jobs/{ids[0]}/cancel", {}).status_code == 400  # needs confirmation
    assert post(viewer, f"/jobs/{ids[0]}/cancel", {"confirm": "yes"}).status_code == 403
    html = post(client, f"/jobs/{ids[0]}/cancel", {"confirm": "yes"}).get_data(as_text=True)
    assert html.lstrip().startswith(f'<tr id="job-{ids[0]}" class="status-cancelled"')
    assert "cancelled (ready → cancelled)" in html
    bulk = post(
        client,
        "/jobs/bulk",
        {"confirm": "yes", "action": "cancel", "scope": "selected", "ids": [str(i) for i in ids[1:3]]},
    )
    assert "2 jobs cancelled" in bulk.get_data(as_text=True)
    by_filter = post(client, "/jobs/bulk", {"confirm": "yes", "action": "cancel", "scope": "filter", "status": "ready"})
    assert "1 job cancelled" in by_filter.get_data(as_text=True)
    assert {job(engine, i).status for i in ids} == {Status.CANCELLED}
    with engine.connect() as conn:
        actions = [a["action"] for a in repository.operator.list_audit(conn)]
    assert actions == ["bulk_cancel", "bulk_cancel", "cancel"]
    assert "cancelled" in client.get("/jobs?status=cancelled").get_data(as_text=True)


def test_pause_and_resume_from_the_overview(client, viewer, engine):
    with engine.connect() as conn:
        service.enqueue(conn, "noop", "q1", queue="mail")
    overview = client.get("/").get_data(as_text=True)
    assert 'action="/queues/mail/pause"' in overview and "Pause queue mail?" in overview
    assert "/queues/mail/pause" not in viewer.get("/").get_data(as_text=True)
    assert post(client, "/queues/mail/pause", {}).status_code == 400
    assert post(viewer, "/queues/mail/pause", {"confirm": "yes"}).status_code == 403
    html = post(client, "/queues/mail/pause", {"confirm": "yes"}).get_data(as_text=True)
    assert 'id="overview-panels"' in html and "Queue mail paused." in html
    assert re.search(r"paused by web:alice, [\d.]+ m?s ago", html)
    assert 'action="/queues/mail/resume"' in html
    with engine.connect() as conn:
        assert repository.claim.paused_queues(conn) == {"mail"}
    html = post(client, "/queues/mail/resume", {"confirm": "yes"}).get_data(as_text=True)
    assert "Queue mail resumed." in html and "resumed by web:alice" in html


def test_recurring_page(client, viewer, engine):
    assert 'href="/recurring"' in client.get("/").get_data(as_text=True)
    assert "No recurring jobs yet" in client.get("/recurring").get_data(as_text=True)
    token = client.token
    added = client.post(
        "/recurring",
        data={
            "csrf_token": token,
            "confirm": "yes",
            "name": "tick",
            "cron": "*/5 * * * *",
            "task": "noop",
            "payload": '{"a": 1}',
            "queue": "",
        },
        follow_redirects=True,
    )
    page = added.get_data(as_text=True)
    assert "Recurring job tick added" in page and "*/5 * * * *" in page and "enabled" in page
    bad = client.post(
        "/recurring",
        data={"csrf_token": token, "confirm": "yes", "name": "bad", "cron": "* *", "task": "noop"},
        follow_redirects=True,
    ).get_data(as_text=True)
    assert "must have 5 fields" in bad
    assert 'action="/recurring/tick/disable"' in page and "data-confirm=" in page
    assert "/recurring/tick/disable" not in viewer.get("/recurring").get_data(as_text=True)
    assert (
        viewer.post("/recurring/tick/disable", data={"csrf_token": viewer.token, "confirm": "yes"}).status_code == 403
    )
    assert client.post("/recurring/tick/disable", data={"csrf_token": token}).status_code == 400
    page = client.post(
        "/recurring/tick/disable", data={"csrf_token": token, "confirm": "yes"}, follow_redirects=True
    ).get_data(as_text=True)
    assert "Recurring job tick disabled" in page and 'action="/recurring/tick/enable"' in page
    with engine.connect() as conn:
        row = repository.recurring.get_recurring(conn, "tick")
        assert row["enabled"] is False
        service.set_recurring_enabled(conn, "tick", True, actor="t")
        run = service.enqueue_due_recurring(
            conn, now=repository.recurring.get_recurring(conn, "tick")["next_run_at"]
        ).runs[0]
    page = client.get("/recurring").get_data(as_text=True)
    assert f'href="/jobs/{run.id}"' in page  # the last run and its job
    page = client.post(
        "/recurring/tick/remove", data={"csrf_token": token, "confirm": "yes"}, follow_redirects=True
    ).get_data(as_text=True)
    assert "Recurring job tick removed" in page and "No recurring jobs yet" in page
    with engine.connect() as conn:
        actions = [a["action"] for a in repository.operator.list_audit(conn)]
    assert actions[:3] == ["recurring_remove", "recurring_enable", "recurring_disable"]


def test_overview_shows_retention_and_the_last_prune(client, engine):
    html = client.get("/").get_data(as_text=True)
    assert "Done jobs kept 7 days" in html and "failed and cancelled jobs 30 days" in html
    assert "No prune has run yet" in html
    with engine.connect() as conn:
        service.prune(conn, done_days=7, failed_days=30, by="tester")
    html = client.get("/overview/panels").get_data(as_text=True)
    assert "Last prune by tester" in html and "0 done" in html


@pytest.mark.parametrize("path", ["/recurring"])
def test_new_pages_refuse_anonymous_requests(app, path):
    c = app.test_client()
    assert c.get(path).status_code == 302
    token = csrf_token(c)
    for action in ("/jobs/1/cancel", "/queues/q/pause", "/queues/q/resume", "/recurring", "/recurring/x/remove"):
        assert c.post(action, headers={"X-CSRFToken": token}).status_code in (302, 401)
