"""The dashboard's workflow pages (issue 27): blocked jobs in every status filter, count and bulk
action; the Batches list and detail pages; members through the jobs list's `batch` filter; the
rate limits on the overview's queue rows."""

from __future__ import annotations

import re

from jobqueue import JobQueue
from jobqueue.core import repository, service
from jobqueue.core.models import Status
from jobqueue.core.schema import job_queue
from testkit.web import api, post

jq = job_queue.c


def blocked_child(engine, parent: str = "p1", child: str = "c1") -> tuple[int, int]:
    with engine.connect() as conn:
        p = service.enqueue(conn, "noop", parent)
        c = service.enqueue(conn, "noop", child, after=[parent])
    return p.id, c.id


def status_of(engine, job_id: int) -> Status:
    with engine.connect() as conn:
        return repository.reads.get_job(conn, job_id).status


def test_blocked_is_a_status_filter_and_an_overview_count(client, engine):
    parent, child = blocked_child(engine)
    html = client.get("/jobs?status=blocked").get_data(as_text=True)
    assert f"/jobs/{child}" in html and f'/jobs/{parent}"' not in html
    assert '<option value="blocked"' in client.get("/jobs").get_data(as_text=True)
    overview = client.get("/").get_data(as_text=True)
    assert '<th scope="col">blocked</th>' in overview
    assert re.search(r'status=blocked">1</a>', overview)


def test_requeue_of_a_blocked_job_is_refused_with_the_reason(client, engine):
    _, child = blocked_child(engine)
    html = post(client, f"/jobs/{child}/requeue", {"confirm": "yes"}).get_data(as_text=True)
    assert "blocked: it runs when its parents are done" in html
    assert status_of(engine, child) is Status.BLOCKED


def test_bulk_requeue_says_why_blocked_jobs_were_left(client, engine):
    parent, child = blocked_child(engine)
    with engine.connect() as conn:
        (c,) = service.claim(conn, "h:1:1", 1, ["default"], lease_seconds=60)
        assert c.job.id == parent
        service.fail(conn, c.lease, "boom")
    # The parent failed: the child (on_parent_failure=cancel by default) was cancelled; block another.
    _, other = blocked_child(engine, "p2", "c2")
    html = post(
        client,
        "/jobs/bulk",
        {"confirm": "yes", "action": "requeue", "scope": "selected", "ids": [str(parent), str(other)]},
    ).get_data(as_text=True)
    assert "1 job requeued" in html
    assert "1 blocked (it runs when its parents are done; cancel it instead)" in html
    assert status_of(engine, other) is Status.BLOCKED
    assert child  # cancelled with its parent, not part of this selection


def test_bulk_cancel_takes_blocked_jobs(client, engine):
    _, child = blocked_child(engine)
    html = post(
        client, "/jobs/bulk", {"confirm": "yes", "action": "cancel", "scope": "filter", "status": "blocked"}
    ).get_data(as_text=True)
    assert "1 job cancelled." in html
    assert status_of(engine, child) is Status.CANCELLED


def nightly(engine) -> dict[str, int]:
    """Batch "nightly": m0 done, m1 failed, m2 pending, closed; its on_failure fired."""
    q = JobQueue(engine)
    with q.batch("nightly", on_failure="noop", on_success="noop", payload={"day": "2026-12-04"}) as b:
        ids = {f"m{i}": b.enqueue("noop", f"m{i}").id for i in range(3)}
    with engine.connect() as conn:
        for key, how in (("m0", "done"), ("m1", "failed")):
            for _ in range(5):
                (c,) = service.claim(conn, "h:1:1", 1, ["default"], lease_seconds=60)
                if c.job.task_key == key:
                    break
                service.release(conn, c.lease)
            (service.complete(conn, c.lease) if how == "done" else service.fail(conn, c.lease, "boom"))
    return ids


def test_batches_list_shows_state_progress_and_times(client, engine):
    nightly(engine)
    JobQueue(engine).batch("later")  # open, empty
    html = client.get("/batches").get_data(as_text=True)
    assert 'href="/batches/nightly"' in html and 'href="/batches/later"' in html
    assert html.index("/batches/later") < html.index("/batches/nightly")  # newest first
    assert 'aria-label="progress: 1 done, 1 failed, 0 cancelled, 1 pending of 3"' in html
    assert "1 done</span> · <span" in html  # the counts as text, not colour only
    closed = client.get("/batches?state=closed").get_data(as_text=True)
    assert "/batches/nightly" in closed and "/batches/later" not in closed
    assert "/batches/nightly" not in client.get("/batches?state=open").get_data(as_text=True)
    assert client.get("/batches?state=bogus").status_code == 400
    assert client.get("/batches?before=x").status_code == 400
    assert 'href="/batches"' in client.get("/").get_data(as_text=True)  # in the navigation


def test_batches_list_pages_by_keyset(client, engine, monkeypatch):
    q = JobQueue(engine)
    for i in range(5):
        q.batch(f"b{i}")
    monkeypatch.setattr("jobqueue.web.dashboard.batches.PAGE_SIZE", 2)
    seen, url = [], "/batches"
    while url:
        html = client.get(url).get_data(as_text=True)
        seen += re.findall(r'href="/batches/(b[0-9])"', html)
        m = re.search(r'href="(/batches\?before=[0-9]+)" rel="next"', html)
        url = m.group(1) if m else None
    assert seen == ["b4", "b3", "b2", "b1", "b0"]


def test_batches_state_filter_reads_a_bounded_window(engine):
    q = JobQueue(engine)
    q.batch("old-open")
    for i in range(4):
        q.close_batch(q.batch(f"c{i}").key)
    with engine.connect() as conn:
        import jobqueue.core.repository.batches as batches

        original = batches.STATE_WINDOW
        batches.STATE_WINDOW = 3
        try:
            first = batches.page_batches(conn, state="open", limit=10)
            assert first.batches == [] and first.older is not None  # looked at 3, goes on below
            second = batches.page_batches(conn, state="open", before=first.older, limit=10)
            assert [b["key"] for b in second.batches] == ["old-open"] and second.older is None
        finally:
            batches.STATE_WINDOW = original


def test_batch_page_shows_counts_callbacks_payload_and_members(client, engine):
    ids = nightly(engine)
    with engine.connect() as conn:
        failure_job = repository.batches.show(conn, "nightly")["callbacks"]["on_failure"]["job_id"]
    html = client.get("/batches/nightly").get_data(as_text=True)
    assert 'aria-label="progress: 1 done, 1 failed, 0 cancelled, 1 pending of 3"' in html
    assert f'href="/jobs/{failure_job}"' in html and "batch:nightly:failure" in html
    assert "not enqueued yet" in html  # on_success: a member is still pending
    assert "2026-12-04" in html
    for job_id in ids.values():
        assert f'href="/jobs/{job_id}"' in html
    assert 'href="/jobs?batch=nightly"' in html and 'href="/jobs?batch=nightly&amp;status=failed"' in html
    assert client.get("/batches/nosuchbatch").status_code == 404
    assert client.get("/batches/" + "x" * 70).status_code == 404


def test_members_get_every_jobs_filter_and_bulk_actions(client, engine):
    ids = nightly(engine)
    with engine.connect() as conn:
        service.enqueue(conn, "noop", "outsider")
    html = client.get("/jobs?batch=nightly").get_data(as_text=True)
    listed = set(map(int, re.findall(r'id="job-([0-9]+)"', html)))
    assert listed == set(ids.values())
    assert "batch=nightly" in html and 'name="batch" value="nightly"' in html
    failed = client.get("/jobs?batch=nightly&status=failed").get_data(as_text=True)
    assert set(map(int, re.findall(r'id="job-([0-9]+)"', failed))) == {ids["m1"]}
    confirm = post(client, "/jobs/bulk/confirm", {"action": "cancel", "scope": "filter", "batch": "nightly"}).get_data(
        as_text=True
    )
    assert "batch=nightly" in confirm and "2 jobs" in confirm  # m1 failed, m2 ready
    done = post(
        client, "/jobs/bulk", {"confirm": "yes", "action": "cancel", "scope": "filter", "batch": "nightly"}
    ).get_data(as_text=True)
    assert "2 jobs cancelled, 1 skipped" in done  # m0 is done
    with engine.connect() as conn:
        shown = repository.batches.show(conn, "nightly")
        outsider = repository.reads.get_job_by_key(conn, "outsider")
    assert (shown["done"], shown["failed"], shown["cancelled"], shown["state"]) == (1, 0, 2, "finished")
    assert outsider.status is Status.READY


def test_api_lists_a_batchs_members(client, engine):
    ids = nightly(engine)
    body = api(client, "GET", "/api/jobs?batch=nightly&limit=2").get_json()
    assert [j["id"] for j in body["jobs"]] == [ids["m2"], ids["m1"]] and body["matches"] == 3
    assert api(client, "GET", "/api/jobs?batch=").status_code == 400  # strict: given empty


def test_overview_shows_rate_limits_on_their_queue_rows(client, engine):
    from jobqueue.core.tasks import TaskSpec, handled_elsewhere

    specs = [
        TaskSpec("send_mail", handled_elsewhere, "mail", rate_limit="4/h"),
        TaskSpec("per_customer", handled_elsewhere, "mail", rate_limit="10/m", rate_key="customer"),
    ]
    with engine.connect() as conn:
        with conn.begin():
            repository.task_definitions.register_tasks(conn, "h:1", specs)
        service.enqueue(conn, "send_mail", "s1")  # found among the registered tasks: its bucket written
        before = repository.reads.database_now(conn)
        (c,) = service.claim(conn, "h:1:1", 1, ["mail"], lease_seconds=60)
        assert c.job.task_key == "s1"
    html = client.get("/").get_data(as_text=True)
    with engine.connect() as conn:
        after = repository.reads.database_now(conn)
    row = re.search(r'<th scope="row">mail(.*?)</th>', html, re.S).group(1)
    # One start taken in this hour's window (4 left again if the hour turned meanwhile).
    left = 3 if before.hour == after.hour else 4
    assert f"send_mail: 4/h, {left} left, next window" in row
    assert "per_customer: 10/m per customer" in row
