"""Every page in Chromium: no WCAG 2 A/AA violation (axe-core), no JavaScript error, live parts
refreshing, usable at 390 px and in dark mode. Writes the README's screenshots to
docs/screenshots/."""

from __future__ import annotations

import pytest

from jobqueue import JobQueue
from jobqueue.core import repository, service
from jobqueue.core.db import create_engine
from jobqueue.core.models import Status
from jobqueue.core.tasks import TaskSpec, handled_elsewhere
from testkit.procs import REPO, GunicornServer, wait_until
from testkit.web import ADMIN_TOKEN, api_post, server_env
from tests.browser.conftest import ARTIFACTS, sign_in

pytestmark = pytest.mark.slow
AXE = REPO / "node_modules" / "axe-core" / "axe.min.js"
SCREENSHOTS = REPO / "docs" / "screenshots"
WCAG = ["wcag2a", "wcag2aa", "wcag21a", "wcag21aa"]


def axe_violations(page) -> list[dict]:
    if not AXE.exists():
        pytest.fail(f"axe-core is missing at {AXE}: scripts/ensure-services installs it (npm install axe-core)")
    # Evaluated through the DevTools protocol, which the page's CSP does not govern: the page
    # itself still runs no inline script.
    if not page.evaluate("() => typeof window.axe === 'object'"):
        page.evaluate(AXE.read_text() + "\n;0")
    result = page.evaluate("tags => axe.run(document, {runOnly: {type: 'tag', values: tags}})", WCAG)
    return [
        {"id": v["id"], "help": v["help"], "nodes": [n["html"][:200] for n in v["nodes"][:3]]}
        for v in result["violations"]
    ]


@pytest.fixture
def busy_server(mysql_url, tmp_path):
    """gunicorn with two embedded workers, a failed job with its traceback, a running job, done
    jobs, a bulk action and a job run again in the audit log."""
    engine = create_engine(mysql_url)
    server = GunicornServer(mysql_url, tmp_path, web_workers=1, embedded_workers=2, extra_env=server_env(mysql_url))
    try:
        with engine.connect() as conn:
            failed = service.enqueue(
                conn,
                "fail_first_attempt",
                "nightly-report-2026-11-29",
                {"day": "2026-11-29", "recipients": ["ops@example.com"]},
            ).id
            service.enqueue_many(
                conn, [{"task": "noop", "task_key": f"invoice-{i}", "payload": {"invoice": i}} for i in range(8)]
            )
            service.enqueue_many(
                conn,
                [
                    {"task": "export_orders", "task_key": f"export-{i}", "queue": "exports", "payload": {"rows": 3}}
                    for i in range(3)
                ],
            )
            wait_until(
                lambda: repository.reads.get_job(conn, failed).status is Status.FAILED,
                timeout=20,
                message="the job to fail",
            )
            wait_until(
                lambda: (
                    repository.reads.count_matching(conn, repository.operator.JobFilter(status=Status.DONE))[0] >= 11
                ),
                timeout=20,
                message="the jobs to finish",
            )
            service.enqueue(conn, "sleep", "transcode-42", {"seconds": 60}, queue="default")
            service.enqueue(conn, "noop", "tomorrow", delay=86400)
            # Workflows: a job waiting for "tomorrow", a finished batch, an open one with a job
            # waiting, and a rate-limited task on the exports queue.
            service.enqueue(conn, "noop", "after-tomorrow", after=["tomorrow"])
            with conn.begin():
                repository.task_definitions.register_tasks(
                    conn, "elsewhere:1", [TaskSpec("export_invoices", handled_elsewhere, "exports", rate_limit="100/m")]
                )
            service.enqueue(conn, "export_invoices", "export-invoices-december", queue="exports", delay=86400)
        client = JobQueue(engine)
        with client.batch("invoices-2026-11", on_success="noop", payload={"month": "2026-11"}) as b:
            for i in range(4):
                b.enqueue("noop", f"invoice-2026-11-{i}")
        client.batch("imports-2026-12", on_complete="noop").enqueue("noop", "import-2026-12-01", delay=86400)
        with engine.connect() as conn:
            wait_until(
                lambda: repository.batches.show(conn, "invoices-2026-11")["state"] == "finished",
                timeout=20,
                message="the batch to finish",
            )
            done = repository.reads.get_job_by_key(conn, "invoice-3").id
            ids = [repository.reads.get_job_by_key(conn, f"invoice-{i}").id for i in (5, 6)]
        api_post(server.base, f"/api/jobs/{done}/requeue", {"again": True}, token=ADMIN_TOKEN)
        with engine.connect() as conn:
            service.bulk_action(
                conn,
                "fail",
                actor="web:alice",
                ids=[service.enqueue(conn, "noop", f"x-{i}", delay=600).id for i in range(3)] + ids,
                reason="customer cancelled the order",
            )
            wait_until(
                lambda: repository.reads.get_job_by_key(conn, "transcode-42").status is Status.RUNNING,
                timeout=20,
                message="the long job to run",
            )
        yield server, failed
    finally:
        assert server.stop() == 0
        engine.dispose()


def test_every_page_is_accessible_in_light_dark_and_narrow(busy_server, browser, mysql_url):
    from playwright.sync_api import expect

    server, failed = busy_server
    engine = create_engine(mysql_url)
    with engine.connect() as conn:
        blocked = repository.reads.get_job_by_key(conn, "after-tomorrow").id
    engine.dispose()
    pages = {
        "overview": "/",
        "jobs": "/jobs",
        "jobs failed": "/jobs?status=failed",
        "search": "/jobs?q=recipients",
        "failed job": f"/jobs/{failed}",
        "blocked": "/jobs?status=blocked",
        "blocked job": f"/jobs/{blocked}",
        "batches": "/batches",
        "batches open": "/batches?state=open",
        "finished batch": "/batches/invoices-2026-11",
        "open batch": "/batches/imports-2026-12",
        "batch members": "/jobs?batch=invoices-2026-11",
        "workers": "/workers",
        "audit": "/audit",
        "health": "/health",
        "locks": "/locks",
        "not found": "/jobs/999999",
    }
    problems: dict[str, list] = {}
    for scheme in ("light", "dark"):
        watched = sign_in(browser, server.base, color_scheme=scheme)
        page = watched.page
        for name, path in pages.items():
            page.goto(server.base + path)
            page.wait_for_timeout(300)
            found = axe_violations(page)
            if found:
                problems[f"{scheme} {name}"] = found
            if name == "not found":  # the browser reports the page's own 404
                watched.errors[:] = [e for e in watched.errors if "status of 404" not in e]
        # The bulk confirmation and the time-zone switch are on screen too.
        page.goto(server.base + "/jobs?status=failed")
        page.check("input[name=scope][value=filter]")
        page.click("#bulk-form button[value=requeue]")
        expect(page.locator("#bulk-status .confirm")).to_contain_text("status=failed")
        if found := axe_violations(page):
            problems[f"{scheme} bulk confirmation"] = found
        page.click("#time-zone")
        expect(page.locator("#time-zone")).to_have_text("Times: local")
        page.click("#time-zone")
        if scheme == "dark":
            background = page.evaluate("getComputedStyle(document.body).backgroundColor")
            assert background == "rgb(18, 22, 28)", background
        page.context.close()
        assert not watched.errors, (scheme, watched.errors)
    watched = sign_in(browser, server.base)
    watched.page.context.clear_cookies()
    watched.page.goto(server.base + "/login")
    if found := axe_violations(watched.page):
        problems["login"] = found
    watched.page.context.close()
    assert not problems, problems


def test_narrow_screen_keeps_the_navigation(busy_server, browser):
    server, _ = busy_server
    watched = sign_in(browser, server.base, viewport={"width": 390, "height": 844})
    page = watched.page
    for path in ("/", "/jobs", "/workers", "/audit", "/health", "/locks", "/batches", "/batches/invoices-2026-11"):
        page.goto(server.base + path)
        page.wait_for_timeout(200)
        width = page.evaluate("document.documentElement.scrollWidth")
        wide = page.evaluate("""() => [...document.querySelectorAll('body *')]
            .filter(e => e.getBoundingClientRect().right > 391 && !(e.parentElement && e.parentElement.closest('.scroll')))
            .slice(0, 5).map(e => e.tagName + '.' + e.className + ' ' + Math.round(e.getBoundingClientRect().right))""")
        assert width <= 390, (path, width, wide)
        for link in page.locator("header.top a, header.top button").all():
            box = link.bounding_box()
            assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= 390, (path, link.inner_text(), box)
    page.goto(server.base + "/")
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "overview-390px.png"), full_page=True)
    page.context.close()
    assert not watched.errors, watched.errors


def test_screenshots_for_the_readme(busy_server, browser):
    from playwright.sync_api import expect

    server, failed = busy_server
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    watched = sign_in(browser, server.base, viewport={"width": 1280, "height": 900})
    page = watched.page
    page.goto(server.base + "/")
    expect(page.locator("#running-table")).to_contain_text("transcode-42")
    page.wait_for_timeout(3500)  # one refresh of the panels
    page.screenshot(path=str(SCREENSHOTS / "overview.png"), full_page=True)
    page.goto(server.base + f"/jobs/{failed}")
    expect(page.locator("#job-summary .badge")).to_have_text("failed")
    expect(page.locator("#job-summary pre.error")).to_contain_text("on purpose")
    page.screenshot(path=str(SCREENSHOTS / "failed-job.png"), full_page=True)
    page.goto(server.base + "/batches")
    expect(page.locator("#batches")).to_contain_text("invoices-2026-11")
    page.screenshot(path=str(ARTIFACTS / "batches.png"), full_page=True)
    page.goto(server.base + "/batches/invoices-2026-11")
    expect(page.locator("#batch-callbacks")).to_contain_text("batch:invoices-2026-11:success")
    page.screenshot(path=str(ARTIFACTS / "batch.png"), full_page=True)
    page.goto(server.base + "/workers")
    expect(page.locator("#workers")).to_contain_text("transcode-42".replace("transcode-42", "sleep"))
    page.screenshot(path=str(ARTIFACTS / "workers.png"), full_page=True)
    page.context.close()
    assert not watched.errors, watched.errors
