"""The dashboard's workflow pages (issue 27): blocked jobs in every status filter, count and bulk
action; the Batches list and detail pages; members through the jobs list's `batch` filter; the
rate limits on the overview's queue rows."""

from __future__ import annotations

import re

from jobqueue.core import repository, service
from jobqueue.core.models import Status
from jobqueue.core.schema import job_queue
from testkit.web import post

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
