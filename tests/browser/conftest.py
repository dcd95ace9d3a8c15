"""Debian's Chromium driven by Playwright, against the real app under gunicorn."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from testkit.procs import REPO, GunicornServer
from testkit.web import ADMIN_PASSWORD, server_env

CHROMIUM = "/usr/bin/chromium"
ARTIFACTS = REPO / "test-artifacts"


@pytest.fixture
def browser():
    from playwright.sync_api import sync_playwright

    if not Path(CHROMIUM).exists():
        pytest.fail("Chromium is missing: scripts/test installs Debian's chromium package")
    with sync_playwright() as p:
        b = p.chromium.launch(
            executable_path=CHROMIUM,
            args=[
                "--no-sandbox",
                "--disable-gpu",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--no-first-run",
            ],
        )
        yield b
        b.close()


@pytest.fixture
def quiet_server(mysql_url, tmp_path):
    """gunicorn with no embedded workers: nothing moves unless the test moves it."""
    server = GunicornServer(mysql_url, tmp_path, web_workers=1, embedded_workers=0, extra_env=server_env(mysql_url))
    yield server
    assert server.stop() == 0


class Watched:
    """A page with its JavaScript errors and requests recorded."""

    def __init__(self, page):
        self.page = page
        self.errors: list[str] = []
        self.requests: list[str] = []
        page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: self.errors.append(str(e)))
        page.on("request", lambda r: self.requests.append(r.url))


def sign_in(browser, base: str, **context) -> Watched:
    from playwright.sync_api import expect

    ctx = browser.new_context(viewport=context.pop("viewport", {"width": 1280, "height": 1000}), **context)
    page = ctx.new_page()
    watched = Watched(page)
    page.goto(base + "/")
    expect(page).to_have_url(re.compile(r"/login"))
    page.fill("input[name=username]", "alice")
    page.fill("input[name=password]", ADMIN_PASSWORD)
    page.click("button[type=submit]")
    expect(page.locator("h1")).to_have_text("Overview")
    return watched
