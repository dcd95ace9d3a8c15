"""The jobs page in Chromium: bulk actions apply to exactly the filter on screen, ticked rows stay
ticked under live refresh, and the live refresh is one request per page per interval."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from jobqueue.core import service
from jobqueue.core.db import create_engine
from jobqueue.core.models import Outcome
from jobqueue.core.schema import job_queue
from tests.browser.conftest import sign_in

pytestmark = pytest.mark.slow
jq = job_queue.c


@pytest.fixture
def engine(mysql_url):
    e = create_engine(mysql_url)
    yield e
    e.dispose()


def statuses(engine) -> dict[str, str]:
    with engine.connect() as conn:
        return dict(conn.execute(sa.select(jq.task_key, jq.status)).all())


def make_failed(conn, keys):
    for key in keys:
        service.enqueue(conn, "noop", key)
    (claimed) = service.claim(conn, "h:1:1", len(keys), ["default"], lease_seconds=60)
    for c in claimed:
        service.fail(conn, c.lease, "boom")


def test_bulk_over_the_filter_applies_the_filter_on_screen(quiet_server, engine, browser):
    from playwright.sync_api import expect

    with engine.connect() as conn:
        make_failed(conn, ["failed-1", "failed-2", "failed-3"])
        service.enqueue(conn, "noop", "later", delay=3600)  # scheduled
        service.enqueue_many(conn, [{"task": "noop", "task_key": f"mail-{i}", "queue": "mail"} for i in range(3)])
    before = statuses(engine)
    watched = sign_in(browser, quiet_server.base)
    page = watched.page
    page.goto(quiet_server.base + "/jobs")
    # Only the table is swapped by the select; the bulk form must follow it.
    page.select_option("select[name=status]", "failed")
    expect(page.locator("#bulk-form input[name=status]")).to_have_value("failed")  # the new table is in
    expect(page.locator("#jobs-table tbody tr")).to_have_count(3)
    page.check("input[name=scope][value=filter]")
    page.click("#bulk-form button[value=requeue]")
    confirm = page.locator("#bulk-status")
    expect(confirm).to_contain_text("status=failed")
    expect(confirm).to_contain_text("3 jobs")
    confirm.locator("button", has_text="Requeue 3 jobs").click()
    expect(confirm).to_contain_text("3 jobs requeued.")
    after = statuses(engine)
    assert {k: after[k] for k in ("failed-1", "failed-2", "failed-3")} == dict.fromkeys(
        ("failed-1", "failed-2", "failed-3"), "ready"
    )
    assert after["later"] == "scheduled"
    assert {k: v for k, v in after.items() if k.startswith("mail-")} == {
        k: v for k, v in before.items() if k.startswith("mail-")
    }

    # Fail in the same place: ready jobs of queue default only.
    page.select_option("select[name=queue]", "default")
    page.select_option("select[name=status]", "ready")
    expect(page.locator("#bulk-form input[name=status]")).to_have_value("ready")
    expect(page.locator("#bulk-form input[name=queue]")).to_have_value("default")
    expect(page.locator("#jobs-table tbody tr")).to_have_count(3)
    page.check("input[name=scope][value=filter]")
    page.click("#bulk-form button[value=fail]")
    expect(confirm).to_contain_text("queue=default")
    expect(confirm).to_contain_text("status=ready")
    confirm.locator("button", has_text="Fail 3 jobs").click()
    expect(confirm).to_contain_text("3 jobs failed.")
    after = statuses(engine)
    assert [after[f"failed-{i}"] for i in (1, 2, 3)] == ["failed"] * 3
    assert after["later"] == "scheduled"
    assert all(after[f"mail-{i}"] == "ready" for i in range(3))
    assert not watched.errors, watched.errors


def test_ticked_rows_stay_ticked_and_one_request_refreshes_the_page(quiet_server, engine, browser):
    from playwright.sync_api import expect

    with engine.connect() as conn:
        ids = [
            r.id for r in service.enqueue_many(conn, [{"task": "noop", "task_key": f"live-{i:02d}"} for i in range(40)])
        ]
    watched = sign_in(browser, quiet_server.base)
    page = watched.page
    page.goto(quiet_server.base + "/jobs")
    expect(page.locator("#jobs-table tbody tr")).to_have_count(40)
    box = page.locator(f"#job-{ids[5]} input[name=ids]")
    box.check()
    watched.requests.clear()
    page.wait_for_timeout(10_000)
    refreshes = [u for u in watched.requests if "/jobs" in u]
    print(f"live refresh: {len(refreshes)} requests in 10 s for a page of 40 moving rows")
    assert len(refreshes) <= 10, f"{len(refreshes)} requests in 10 s: {refreshes[:12]}"
    assert len(refreshes) >= 2, "the page did not refresh itself"
    expect(box).to_be_checked()

    # A hidden tab does not poll; shown again, it catches up at once.
    page.evaluate("""() => {
        Object.defineProperty(document, "hidden", {configurable: true, get: () => true});
        document.dispatchEvent(new Event("visibilitychange"));
    }""")
    watched.requests.clear()
    page.wait_for_timeout(5000)
    assert [u for u in watched.requests if "/jobs" in u] == [], "polled while the tab was hidden"
    page.evaluate("""() => {
        Object.defineProperty(document, "hidden", {configurable: true, get: () => false});
        document.dispatchEvent(new Event("visibilitychange"));
    }""")
    page.wait_for_timeout(800)
    assert [u for u in watched.requests if "/jobs/live" in u], "no refresh when the tab came back"

    # A row that changes is swapped in place, its tick kept.
    with engine.connect() as conn:
        claimed = service.claim(conn, "h:1:1", 40, ["default"], lease_seconds=300)
    moved = page.locator(f"#job-{ids[5]}")
    expect(moved.locator(".badge")).to_have_text("running", timeout=6000)
    expect(moved.locator("input[name=ids]")).to_be_checked()
    with engine.connect() as conn:
        outcomes = service.complete_many(conn, [c.lease for c in claimed])
    # Nothing else holds these rows (the web process's promoter once held the first running one
    # and left it running on the page).
    assert set(outcomes.values()) == {Outcome.OK}
    expect(moved.locator(".badge")).to_have_text("done", timeout=6000)
    expect(moved.locator("input[name=ids]")).to_be_checked()
    # Nothing moves any more: the refresh stops.
    page.wait_for_timeout(2500)
    watched.requests.clear()
    page.wait_for_timeout(5000)
    assert [u for u in watched.requests if "/jobs" in u] == []
    assert not watched.errors, watched.errors
