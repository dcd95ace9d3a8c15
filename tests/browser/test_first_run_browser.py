"""A newcomer's first run in a real browser: `jobqueue serve --dev` with two gunicorn worker
processes, sign in once with the printed password, and stay signed in over 30 page loads and the
fragments' own refreshes, whichever process answers (issue 23, defect 1: each process hashed the
generated password with its own salt, so a session made by one was refused by the other)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

import pytest

from testkit.procs import cli_env, free_port

pytestmark = pytest.mark.slow

PAGES = ["/", "/jobs", "/jobs?status=done", "/workers", "/recurring", "/audit", "/locks", "/sessions"]


@pytest.fixture
def dev_server(tmp_path):
    port = free_port()
    env = cli_env(JOBQUEUE_INSTANCE_PATH=str(tmp_path), JOBQUEUE_WEB_WORKERS="2")
    for name in (
        "JOBQUEUE_DATABASE_URL",
        "JOBQUEUE_USERS",
        "JOBQUEUE_API_TOKENS",
        "JOBQUEUE_DEV_PASSWORD",
        "JOBQUEUE_SECRET_KEY",
    ):
        env.pop(name, None)
    log_path = tmp_path / "serve.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "jobqueue.cli", "serve", "--dev", "--demo", "--port", str(port)],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=tmp_path,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 90
        while not (found := re.search(r"login: admin / (\S+)", log_path.read_text())):
            assert proc.poll() is None and time.monotonic() < deadline, log_path.read_text()[-3000:]
            time.sleep(0.1)
        yield f"http://127.0.0.1:{port}", found.group(1), log_path
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        assert proc.wait(60) == 0, log_path.read_text()[-3000:]


def test_a_session_holds_in_every_process_of_serve_dev(dev_server, browser):
    from playwright.sync_api import expect

    base, password, log_path = dev_server
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    page.goto(base + "/")
    page.fill("input[name=username]", "admin")
    page.fill("input[name=password]", password)
    page.click("button[type=submit]")
    expect(page.locator("h1")).to_have_text("Overview")

    # Each load in a context of its own with the same cookies: a new connection every time, as a
    # person's clicks make once gunicorn's keep-alive (2 s) has lapsed, so that both processes answer.
    cookies = context.storage_state()
    for i in range(30):
        path = PAGES[i % len(PAGES)]
        other = browser.new_context(storage_state=cookies)
        response = other.new_page().goto(base + path)
        landed = response.url if response is not None else ""
        other.close()
        assert response is not None and response.status == 200, (path, response and response.status)
        assert "/login" not in landed, f"signed out at page load {i + 1} ({path}):\n{log_path.read_text()[-3000:]}"
    # The overview's fragments refresh themselves (HTMX polling): still signed in after several.
    page.goto(base + "/")
    refreshes: list[str] = []
    page.on("request", lambda r: refreshes.append(r.url) if r.headers.get("hx-request") else None)
    page.wait_for_timeout(11000)
    assert len(refreshes) >= 2, refreshes
    expect(page.locator("h1")).to_have_text("Overview")
    assert "/login" not in page.url
    assert "session_ended" not in log_path.read_text(), log_path.read_text()[-3000:]
