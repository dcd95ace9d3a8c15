"""HTTPS for real (issue 12, item 7): gunicorn serving TLS with a throwaway self-signed
certificate, Chromium (ignoring only that the certificate is self-signed): HSTS is sent, the
session cookie is Secure, same-origin actions work, and a cross-origin POST carrying a valid CSRF
token is refused by Flask-WTF's strict Referer check."""

from __future__ import annotations

import html
import re

import pytest

from jobqueue.core import repository, service
from jobqueue.core.db import create_engine
from jobqueue.core.models import Status
from testkit.procs import GunicornServer, free_port
from testkit.tls import self_signed_certificate
from testkit.web import ADMIN_PASSWORD, server_env

pytestmark = pytest.mark.slow


def attacker_page(action: str, fields: dict[str, str], referrer_policy: str | None = None) -> str:
    meta = f'<meta name="referrer" content="{referrer_policy}">' if referrer_policy else ""
    inputs = "".join(f'<input type="hidden" name="{k}" value="{html.escape(v)}">' for k, v in fields.items())
    return (
        f"<!doctype html><html><head>{meta}</head><body><form method='post' action='{html.escape(action)}'>"
        f"{inputs}<button type='submit'>win a prize</button></form></body></html>"
    )


def test_https_secure_cookies_and_cross_origin_posts_refused(mysql_url, tmp_path, browser):
    from playwright.sync_api import expect

    engine = create_engine(mysql_url)
    with engine.connect() as conn:
        job_id = service.enqueue(conn, "noop", "tls-target").id
        service.fail_job(conn, job_id, "set up by the test", actor="test")
        other_id = service.enqueue(conn, "noop", "tls-other").id
    server = GunicornServer(
        mysql_url,
        tmp_path,
        web_workers=1,
        embedded_workers=0,
        extra_env=server_env(mysql_url),
        tls=self_signed_certificate(tmp_path / "tls"),
    )
    context = browser.new_context(ignore_https_errors=True)
    try:
        assert server.base.startswith("https://")
        page = context.new_page()
        first = page.goto(server.base + "/login")
        assert first.headers["strict-transport-security"] == "max-age=31536000"
        page.fill("input[name=username]", "alice")
        page.fill("input[name=password]", ADMIN_PASSWORD)
        page.click("button[type=submit]")
        expect(page.locator("#queue-table")).to_be_visible()
        (cookie,) = [c for c in context.cookies() if c["name"] == "jobqueue_session"]
        assert cookie["secure"] and cookie["httpOnly"] and cookie["sameSite"] == "Lax"

        # Same origin: the dashboard's own action goes through (its Referer is the site itself).
        page.goto(server.base + "/jobs?status=failed")
        row = page.locator(f"#job-{job_id}")
        page.once("dialog", lambda dialog: dialog.accept())
        row.locator("button", has_text="Requeue").click()
        expect(page.locator("#flash")).to_contain_text(f"Job {job_id} requeued")

        # Another origin on the same site (same host, another port: the session cookie goes along
        # under SameSite=Lax), with a token copied from a real page: refused by the Referer check.
        token = page.locator("input[name=csrf_token]").first.get_attribute("value")
        evil = f"https://127.0.0.1:{free_port()}"
        fields = {"csrf_token": token, "confirm": "yes", "reason": "cross-origin"}
        for policy, why in ((None, "does not match"), ("no-referrer", "missing")):
            context.route(
                evil + "/prize",
                lambda route, policy=policy: route.fulfill(
                    status=200,
                    content_type="text/html",
                    body=attacker_page(f"{server.base}/jobs/{other_id}/fail", fields, policy),
                ),
            )
            attack = context.new_page()
            attack.goto(evil + "/prize")
            with attack.expect_response(re.compile(rf"/jobs/{other_id}/fail$")) as answer:
                attack.click("button")
            assert answer.value.status == 400, answer.value.status
            expect(attack.locator("main")).to_contain_text("referrer")
            expect(attack.locator("main")).to_contain_text(why)
            attack.close()
            context.unroute(evil + "/prize")
        with engine.connect() as conn:
            assert repository.reads.get_job(conn, other_id).status is Status.READY
            assert repository.reads.get_job(conn, job_id).status is Status.READY
        assert server.log().count("event=csrf_refused") == 2
    finally:
        context.close()
        assert server.stop() == 0
        engine.dispose()
