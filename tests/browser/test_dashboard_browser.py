"""A real browser (Debian's Chromium, driven by Playwright) against the real app under gunicorn:
log in, find a failed job, requeue it, and watch its row turn ready and then done as an embedded
worker runs it. Screenshots land in test-artifacts/."""

from __future__ import annotations

import re

import pytest

from jobqueue.core import repository, service
from jobqueue.core.db import create_engine
from jobqueue.core.models import Status
from testkit.procs import GunicornServer, wait_until
from testkit.web import ADMIN_PASSWORD, server_env
from tests.browser.conftest import ARTIFACTS

pytestmark = pytest.mark.slow


def test_requeue_a_failed_job_and_watch_it_finish(mysql_url, tmp_path, browser):
    from playwright.sync_api import expect

    ARTIFACTS.mkdir(exist_ok=True)
    engine = create_engine(mysql_url)
    server = GunicornServer(mysql_url, tmp_path, web_workers=1, embedded_workers=2, extra_env=server_env(mysql_url))
    try:
        with engine.connect() as conn:
            job_id = service.enqueue(conn, "fail_first_attempt", "nightly-report", {"day": "2026-11-29"}).id
            wait_until(
                lambda: repository.reads.get_job(conn, job_id).status is Status.FAILED,
                timeout=20,
                message="the job to fail",
            )
            service.enqueue_many(conn, [{"task": "noop", "task_key": f"ok-{i}"} for i in range(5)])

        page = browser.new_page(viewport={"width": 1280, "height": 1000})
        errors: list[str] = []
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(server.base + "/")
        expect(page).to_have_url(re.compile(r"/login"))
        page.fill("input[name=username]", "alice")
        page.fill("input[name=password]", ADMIN_PASSWORD)
        page.click("button[type=submit]")
        expect(page.locator("#queue-table")).to_be_visible()

        page.click("text=Jobs")
        # The click returns once the jobs page starts loading; its scripts are deferred, so the
        # select can be changed before HTMX listens for it (CI on MySQL once: the change was
        # lost and the table stayed unfiltered). A person takes longer than the page's load.
        page.wait_for_load_state("load")
        page.select_option("select[name=status]", "failed")
        # The filtered table replaces the whole one: act on its row, not on the unfiltered table's
        # (a click there, then the filtered table drawn from before the requeue, shows it failed).
        expect(page).to_have_url(re.compile(r"status=failed"))
        row = page.locator(f"#job-{job_id}")
        expect(row.locator(".badge")).to_have_text("failed")
        expect(row.locator("td.error")).to_contain_text(
            "first attempt fails <b>on purpose</b>"
        )  # escaped, shown as text

        page.once("dialog", lambda dialog: dialog.accept())
        row.locator("button", has_text="Requeue").click()
        expect(page.locator("#flash")).to_contain_text(f"Job {job_id} requeued")
        # The row updates itself: ready (or already running), then done once a worker ran it.
        expect(row.locator(".badge")).to_have_text(re.compile("ready|running|done"))
        expect(row.locator(".badge")).to_have_text("done", timeout=20_000)
        expect(row.locator("td.num")).to_have_text("2/2")

        page.goto(server.base + f"/jobs/{job_id}")
        expect(page.locator("#attempts")).to_contain_text("fail")
        expect(page.locator("#job-summary .badge")).to_have_text("done")

        page.goto(server.base + "/audit")
        expect(page.locator("main")).to_contain_text("web:alice")

        polls: list[str] = []
        page.on("request", lambda r: polls.append(r.url) if "/overview/panels" in r.url else None)
        page.goto(server.base + "/")
        expect(page.locator("#running-table")).to_be_visible()
        page.wait_for_timeout(3500)  # one polling round: the panel swaps itself without errors
        assert len(polls) >= 1
        page.screenshot(path=str(ARTIFACTS / "overview.png"), full_page=True)

        # A hidden tab stops polling; showing it again refreshes at once.
        page.evaluate("""() => {
            Object.defineProperty(document, "hidden", {configurable: true, get: () => true});
            Object.defineProperty(document, "visibilityState", {configurable: true, get: () => "hidden"});
            document.dispatchEvent(new Event("visibilitychange"));
        }""")
        polls.clear()
        page.wait_for_timeout(7000)
        assert polls == [], "polled while the tab was hidden"
        page.evaluate("""() => {
            Object.defineProperty(document, "hidden", {configurable: true, get: () => false});
            Object.defineProperty(document, "visibilityState", {configurable: true, get: () => "visible"});
            document.dispatchEvent(new Event("visibilitychange"));
        }""")
        page.wait_for_timeout(800)
        assert len(polls) >= 1, "no refresh when the tab came back"
        assert not errors, errors
    finally:
        assert server.stop() == 0
        engine.dispose()
    with engine.connect() as conn:
        job = repository.reads.get_job(conn, job_id)
    assert job.status is Status.DONE and job.attempts == 2


def test_pause_a_queue_cancel_a_job_and_manage_a_recurring_job(mysql_url, tmp_path, browser):
    """The controls of issue 13 in a real browser: every one asks for confirmation first (HTMX's
    hx-confirm, or app.js for plain forms, with no inline script)."""
    from playwright.sync_api import expect

    engine = create_engine(mysql_url)
    server = GunicornServer(mysql_url, tmp_path, web_workers=1, embedded_workers=0, extra_env=server_env(mysql_url))
    try:
        with engine.connect() as conn:
            job_id = service.enqueue(conn, "noop", "to-cancel", queue="mail").id
        page = browser.new_page(viewport={"width": 1280, "height": 1000})
        errors: list[str] = []
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(server.base + "/login")
        page.fill("input[name=username]", "alice")
        page.fill("input[name=password]", ADMIN_PASSWORD)
        page.click("button[type=submit]")

        mail = page.locator("#queue-table tr", has_text="mail")
        page.once("dialog", lambda dialog: dialog.dismiss())  # a dismissed dialog changes nothing
        mail.locator("button", has_text="Pause").click()
        expect(mail.locator(".badge.active")).to_be_visible()
        page.once("dialog", lambda dialog: dialog.accept())
        mail.locator("button", has_text="Pause").click()
        expect(page.locator("#flash")).to_contain_text("Queue mail paused.")
        expect(page.locator("#queue-table tr", has_text="mail").locator(".badge.paused")).to_be_visible()

        page.goto(server.base + "/jobs")
        row = page.locator(f"#job-{job_id}")
        page.once("dialog", lambda dialog: dialog.accept())
        row.locator("button", has_text="Cancel").click()
        expect(row.locator(".badge")).to_have_text("cancelled")

        page.goto(server.base + "/recurring")
        page.fill("input[name=name]", "nightly")
        page.fill("input[name=cron]", "0 3 * * *")
        page.select_option("select[name=task]", "noop")
        page.once("dialog", lambda dialog: dialog.dismiss())
        page.click("text=Save")
        expect(page.locator("#recurring")).to_contain_text("No recurring jobs yet")
        page.once("dialog", lambda dialog: dialog.accept())
        page.click("text=Save")
        expect(page.locator("#flash")).to_contain_text("Recurring job nightly added")
        page.once("dialog", lambda dialog: dialog.accept())
        page.locator("#recurring button", has_text="Disable").click()
        expect(page.locator("#recurring .badge")).to_have_text("disabled")
        page.screenshot(path=str(ARTIFACTS / "recurring.png"), full_page=True)
        assert not errors, errors
    finally:
        assert server.stop() == 0
        engine.dispose()
    with engine.connect() as conn:
        assert repository.reads.get_job(conn, job_id).status is Status.CANCELLED
        assert repository.claim.paused_queues(conn) == {"mail"}
        assert repository.recurring.get_recurring(conn, "nightly")["enabled"] is False
