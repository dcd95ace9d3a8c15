"""What operators use every day: the server's bulk confirmation, the live refresh, run again,
per-queue retry, the workers' slots, the audit log's ids and reasons, GET /api/jobs, and the
small wordings (issue 11)."""

from __future__ import annotations

import re
from datetime import timedelta

import sqlalchemy as sa

from jobqueue.core import repository, service
from jobqueue.core.models import Status
from jobqueue.core.schema import job_queue
from jobqueue.web import dashboard
from testkit.web import VIEWER_TOKEN, api, post

jq = job_queue.c


def make_failed(engine, keys, queue="default", error="boom"):
    ids = []
    with engine.connect() as conn:
        for key in keys:
            ids.append(service.enqueue(conn, "noop", key, queue=queue).id)
        for c in service.claim(conn, "h:1:1", len(keys), [queue], lease_seconds=60):
            service.fail(conn, c.lease, error)
    return ids


def status_of(engine, job_id):
    with engine.connect() as conn:
        return repository.reads.get_job(conn, job_id).status


def test_bulk_confirmation_names_the_filter_and_counts_what_it_applies_to(client, engine):
    failed = make_failed(engine, ["f1", "f2"])
    with engine.connect() as conn:
        later = service.enqueue(conn, "noop", "later", delay=3600).id
        service.enqueue(conn, "noop", "mail-ready", queue="mail")
    html = post(client, "/jobs/bulk/confirm", {"action": "requeue", "scope": "filter", "status": "failed"}).get_data(
        as_text=True
    )
    assert "Requeue 2 jobs?" in html and "filter: status=failed" in html
    assert '<input type="hidden" name="status" value="failed">' in html and 'name="confirm" value="yes"' in html
    # Nothing was written by asking.
    assert [status_of(engine, i) for i in failed] == [Status.FAILED] * 2 and status_of(
        engine, later
    ) is Status.SCHEDULED
    # Counted among the jobs the action applies to: requeue takes failed, scheduled and running, never ready or done.
    everything = post(client, "/jobs/bulk/confirm", {"action": "requeue", "scope": "filter"}).get_data(as_text=True)
    assert "Requeue 3 jobs?" in everything and "filter: all jobs" in everything
    selected = post(
        client, "/jobs/bulk/confirm", {"action": "fail", "scope": "selected", "ids": [str(later)]}
    ).get_data(as_text=True)
    assert "Fail 1 job?" in selected and f'name="ids" value="{later}"' in selected
    none = post(client, "/jobs/bulk/confirm", {"action": "fail", "scope": "selected"}).get_data(as_text=True)
    assert "No rows ticked" in none


def test_bulk_confirmation_caps_its_count(client, engine, monkeypatch):
    with engine.connect() as conn:
        service.enqueue_many(conn, [{"task": "noop", "task_key": f"c{i}"} for i in range(30)])
    monkeypatch.setattr(dashboard.actions, "MATCH_COUNT_CAP", 25)
    html = post(client, "/jobs/bulk/confirm", {"action": "fail", "scope": "filter"}).get_data(as_text=True)
    assert "Fail 25+ jobs?" in html


def test_the_jobs_table_carries_its_filter_into_the_bulk_form(client, engine):
    make_failed(engine, ["f1"])
    part = client.get("/jobs?status=failed&queue=default", headers={"HX-Request": "true", "HX-Target": "jobs-table"})
    html = part.get_data(as_text=True)
    form = re.search(r'<form id="bulk-form".*?</form>', html, re.S).group(0)
    assert '<input type="hidden" name="status" value="failed">' in form
    assert '<input type="hidden" name="queue" value="default">' in form
    assert "disabled" not in form
    empty = client.get("/jobs?status=done", headers={"HX-Request": "true", "HX-Target": "jobs-table"})
    form = re.search(r'<form id="bulk-form".*?</form>', empty.get_data(as_text=True), re.S).group(0)
    assert form.count("disabled") == 3  # every button (requeue, fail, cancel), on "No jobs match"


def test_jobs_page_counts_matches_and_pages_both_ways(client, engine):
    with engine.connect() as conn:
        ids = [
            r.id for r in service.enqueue_many(conn, [{"task": "noop", "task_key": f"p{i:03d}"} for i in range(120)])
        ]
    html = client.get("/jobs").get_data(as_text=True)
    assert "120 jobs match all jobs." in re.sub(r"\s+", " ", html)
    older = re.search(r'href="([^"]+)" rel="next"', html).group(1).replace("&amp;", "&")
    page2 = client.get(older).get_data(as_text=True)
    newer = re.search(r'href="([^"]+)" rel="prev"', page2).group(1).replace("&amp;", "&")
    back = client.get(newer).get_data(as_text=True)
    first_ids = re.findall(r'<tr id="job-(\d+)"', html)
    assert re.findall(r'<tr id="job-(\d+)"', back) == first_ids == [str(i) for i in ids[::-1][:50]]


def test_live_refresh_sends_only_the_rows_that_changed(client, engine):
    with engine.connect() as conn:
        a, b = (service.enqueue(conn, "noop", k).id for k in ("a", "b"))
    html = client.get("/jobs").get_data(as_text=True)
    versions = dict(re.findall(r'name="live" value="(\d+):([^"]+)"', html))
    assert set(versions) == {str(a), str(b)} and 'id="jobs-live" hx-get=' in html
    live = [f"{k}:{v}" for k, v in versions.items()]
    same = client.get("/jobs/live", query_string={"live": live}).get_data(as_text=True)
    assert "<tr" not in same and 'hx-trigger="every 2s' in same  # nothing changed, keep polling
    with engine.connect() as conn:
        (first,) = service.claim(conn, "h:1:1", 1, ["default"], lease_seconds=60)
    assert first.job.id == a
    moved = client.get("/jobs/live", query_string={"live": live}).get_data(as_text=True)
    assert re.findall(r'<tr id="job-(\d+)"', moved) == [str(a)] and 'hx-swap-oob="true"' in moved
    assert "<template>" in moved
    with engine.connect() as conn:
        (second,) = service.claim(conn, "h:1:1", 1, ["default"], lease_seconds=60)
        service.complete_many(conn, [first.lease, second.lease])
    settled = client.get("/jobs/live", query_string={"live": live}).get_data(as_text=True)
    assert sorted(re.findall(r'<tr id="job-(\d+)"', settled)) == sorted([str(a), str(b)])
    assert "hx-trigger" not in settled.split("<template>")[0]  # nothing moves: the poll stops
    assert client.get("/jobs/live", query_string={"live": "1:<x>"}).status_code == 400


def test_detail_panel_answers_204_while_unchanged(client, engine):
    with engine.connect() as conn:
        job_id = service.enqueue(conn, "noop", "s").id
    html = client.get(f"/jobs/{job_id}").get_data(as_text=True)
    url = re.search(r'hx-get="([^"]+/summary[^"]+)"', html).group(1).replace("&amp;", "&")
    assert client.get(url).status_code == 204
    with engine.connect() as conn:
        service.claim(conn, "h:1:1", 1, ["default"], lease_seconds=60)
    changed = client.get(url)
    assert changed.status_code == 200 and "running" in changed.get_data(as_text=True)


def test_run_again_asks_twice_then_runs(client, engine):
    with engine.connect() as conn:
        job_id = service.enqueue(conn, "noop", "done-1").id
        (c,) = service.claim(conn, "h:1:1", 1, ["default"], lease_seconds=60)
        service.complete(conn, c.lease)
    row = client.get("/jobs").get_data(as_text=True)
    assert "Run again" in row
    first = post(client, f"/jobs/{job_id}/requeue", {"confirm": "yes"}).get_data(as_text=True)
    assert "record_result still keeps one result row per task_key" in first
    assert 'name="again" value="yes"' in first and "Run again, for sure" in first
    assert status_of(engine, job_id) is Status.DONE
    second = post(client, f"/jobs/{job_id}/requeue", {"confirm": "yes", "again": "yes"}).get_data(as_text=True)
    assert "runs again (done → ready)" in second and 'id="jobs-live" hx-get=' in second  # its row is live again
    assert status_of(engine, job_id) is Status.READY
    # The API says what it needs the same way.
    with engine.connect() as conn:
        (c,) = service.claim(conn, "h:1:1", 1, ["default"], lease_seconds=60)
        service.complete(conn, c.lease)
    refused = api(client, "POST", f"/api/jobs/{job_id}/requeue", json={})
    assert refused.status_code == 409 and refused.get_json()["needs"] == "again"
    assert api(client, "POST", f"/api/jobs/{job_id}/requeue", json={"again": True}).get_json()["before"] == "done"


def test_overview_offers_retry_all_failed_per_queue_through_the_bulk_confirmation(client, viewer, engine):
    make_failed(engine, ["m1", "m2"], queue="mail")
    make_failed(engine, ["d1"])
    html = client.get("/overview/panels").get_data(as_text=True)
    forms = re.findall(r'<form method="post" action="/jobs/bulk/confirm".*?</form>', html, re.S)
    # Per queue with failed jobs: retry all failed, and discard (cancel) all failed.
    assert len(forms) == 4 and all('name="status" value="failed"' in f for f in forms)
    assert "Retry all failed of queue mail" in html and "Discard all failed of queue default" in html
    assert "Retry all failed" not in viewer.get("/overview/panels").get_data(as_text=True)
    confirm = post(
        client, "/jobs/bulk/confirm", {"action": "requeue", "scope": "filter", "status": "failed", "queue": "mail"}
    ).get_data(as_text=True)
    assert "Requeue 2 jobs?" in confirm and "status=failed queue=mail" in confirm
    done = post(
        client,
        "/jobs/bulk",
        {"confirm": "yes", "action": "requeue", "scope": "filter", "status": "failed", "queue": "mail"},
    ).get_data(as_text=True)
    assert "2 jobs requeued." in done
    with engine.connect() as conn:
        page = repository.reads.page_jobs(conn, repository.operator.JobFilter(status=Status.FAILED))
    assert [j.task_key for j in page.jobs] == ["d1"]


def test_operator_failures_count_on_the_throughput_chart(client, engine):
    with engine.connect() as conn:
        ids = [service.enqueue(conn, "noop", f"o{i}").id for i in range(3)]
        service.fail_job(conn, ids[0], "no longer needed", actor="web:alice")
        service.bulk_action(conn, "fail", actor="web:alice", ids=ids[1:])
    html = client.get("/overview/panels").get_data(as_text=True)
    assert "failed 3 (3 by an operator)" in html


def test_workers_page_lists_each_slot_and_the_process_state(client, engine):
    with engine.connect() as conn:
        job_id = service.enqueue(conn, "sleep", "long-1", {"seconds": 600}).id
        service.enqueue(conn, "noop", "other")
        (c,) = service.claim(conn, "host:7:1", 1, ["default"], lease_seconds=60)
        repository.processes.register_process(
            conn, process_id="host:7", host="host", pid=7, kind="worker", concurrency=2, queues="*"
        )
        repository.processes.heartbeat(
            conn,
            "host:7",
            jobs_in_hand=2,
            processed=5,
            stats={},
            state={
                "state": "not_primary",
                "detail": "the server is read-only (a replica)",
                "slots": [
                    {
                        "slot": 1,
                        "job_id": job_id,
                        "attempt": 1,
                        "task": "sleep",
                        "queue": "default",
                        "state": "running",
                        "running_seconds": 12.0,
                        "held_seconds": 12.5,
                        "lease_left_seconds": 48.0,
                        "lost_reason": None,
                        "lost_seconds_ago": None,
                        "handler_running": True,
                    },
                    {
                        "slot": 2,
                        "job_id": 77,
                        "attempt": 3,
                        "task": "export_orders",
                        "queue": "default",
                        "state": "lost",
                        "running_seconds": 90.0,
                        "held_seconds": 91.0,
                        "lease_left_seconds": -30.0,
                        "lost_reason": "renew",
                        "lost_seconds_ago": 40.0,
                        "handler_running": True,
                    },
                ],
            },
        )
    html = re.sub(r"\s+", " ", client.get("/workers").get_data(as_text=True))
    assert "not primary" in html and "the server is read-only (a replica)" in html
    assert f'<a href="/jobs/{job_id}">{job_id}</a>' in html and "export_orders" in html
    assert re.search(r"lease lost 4\d s ago, handler still running", html), html
    assert re.search(r"1[2-9](\.\d)? s", html)  # running time, moved on since the heartbeat
    panel = client.get("/workers/panel").get_data(as_text=True)
    assert panel.lstrip().startswith('<div id="workers-panel"') and 'hx-trigger="every 5s' in panel
    overview = client.get("/overview/panels").get_data(as_text=True)
    assert "(lease lost)" in overview and "not primary" in overview


def test_audit_log_shows_the_ids_and_the_reason_and_refreshes(client, engine):
    with engine.connect() as conn:
        ids = [service.enqueue(conn, "noop", f"a{i}").id for i in range(30)]
        chosen = [ids[3], ids[7], ids[12], ids[16]]
        service.bulk_action(conn, "fail", actor="web:alice", ids=chosen, reason="customer cancelled")
        service.bulk_action(conn, "fail", actor="web:alice", ids=ids[17:], reason="duplicate orders")
        service.fail_job(conn, ids[0], "wrong address", actor="cli:ops")
    html = client.get("/audit").get_data(as_text=True)
    text = re.sub(r"<[^>]+>", "", html)
    assert ", ".join(map(str, chosen)) in text  # the ids, not "4..17"
    assert "reason: customer cancelled" in text and "wrong address" in text
    for i in chosen:
        assert f'href="/jobs/{i}"' in html
    assert 'id="audit-page" hx-get="/audit"' in html and 'hx-trigger="every 5s' in html
    part = client.get("/audit", headers={"HX-Request": "true", "HX-Target": "audit-page"}).get_data(as_text=True)
    assert part.lstrip().startswith('<div id="audit-page"')


def test_list_api_filters_pages_and_refuses_bad_input(client, engine):
    make_failed(engine, ["f1"], error="ConnectionError: smtp down")
    with engine.connect() as conn:
        ids = [
            r.id
            for r in service.enqueue_many(
                conn, [{"task": "noop", "task_key": f"api-{i}", "payload": {"order": i}} for i in range(7)]
            )
        ]
        service.enqueue(conn, "noop", "mail-1", queue="mail")
    first = api(client, "GET", "/api/jobs?queue=default&limit=3", token=VIEWER_TOKEN)
    data = first.get_json()
    assert first.status_code == 200 and [j["task_key"] for j in data["jobs"]] == ["api-6", "api-5", "api-4"]
    assert data["next_before"] == ids[4] and data["matches"] == 8
    rest = api(client, "GET", f"/api/jobs?queue=default&limit=500&before={data['next_before']}").get_json()
    assert [j["task_key"] for j in rest["jobs"]] == ["api-3", "api-2", "api-1", "api-0", "f1"]
    assert rest["next_before"] is None
    assert [j["task_key"] for j in api(client, "GET", "/api/jobs?q=smtp+DOWN").get_json()["jobs"]] == ["f1"]
    assert api(client, "GET", "/api/jobs?status=failed").get_json()["jobs"][0]["last_error"].startswith("Connection")
    assert api(client, "GET", "/api/jobs?key=api-&task=noop&limit=1").get_json()["jobs"][0]["task_key"] == "api-6"
    with engine.connect() as conn:
        before = conn.execute(sa.select(sa.func.count()).select_from(job_queue)).scalar()
    for bad in (
        "limit=501",
        "limit=0",
        "status=nope",
        "before=x",
        "before=²",
        "after=1",
        "q=" + "x" * 201,
        "colour=red",
        "status=",
        "q=a%09b",
        "limit=5&limit=6",
    ):
        answer = api(client, "GET", "/api/jobs?" + bad)
        assert answer.status_code == 400 and answer.get_json()["field"], bad
    with engine.connect() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(job_queue)).scalar() == before
    assert client.get("/api/jobs").status_code == 401  # a session cookie is not a token


def test_wrong_token_is_called_invalid_and_a_missing_one_missing(client):
    assert api(client, "GET", "/api/stats", token="x" * 30).get_json()["error"] == "invalid bearer token"
    assert client.get("/api/stats").get_json()["error"] == "missing bearer token"
    anonymous = client.application.test_client()
    for path in ("/metrics", "/api/health"):
        assert (
            anonymous.get(path, headers={"Authorization": "Bearer " + "y" * 30}).get_json()["error"]
            == "invalid bearer token"
        )
        assert anonymous.get(path).get_json()["error"] == "missing bearer token"


def test_one_health_check_is_not_all_1_checks(client, monkeypatch):
    monkeypatch.setattr(
        dashboard.overview,
        "health_summary",
        lambda: {"status": "ok", "error": None, "flagged": [], "checks": [{"name": "server", "verdict": "ok"}]},
    )
    html = client.get("/overview/panels").get_data(as_text=True)
    assert "All 1 checks" not in html and "The one check is ok." in html


def test_times_are_relative_with_the_exact_utc_time_on_hover(client, engine):
    with engine.connect() as conn:
        job_id = service.enqueue(conn, "noop", "t1").id
        conn.execute(
            sa.update(job_queue)
            .where(jq.id == job_id)
            .values(created_at=repository.reads.database_now(conn) - timedelta(minutes=3))
        )
        conn.commit()
    html = client.get("/jobs").get_data(as_text=True)
    m = re.search(
        r'<time datetime="([^"]+)Z" data-now="[^"]+" data-rel="ago" title="([^"]+) UTC">3 min ago</time>', html
    )
    assert m and m.group(2) == m.group(1)[:19].replace("T", " ")
    assert 'id="time-zone"' in html
