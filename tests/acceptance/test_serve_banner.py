"""A newcomer's first run: `jobqueue serve --dev` and `scripts/run-app` end their start-up with
the URL, the login and (in development mode) an API token, after every start-up line of gunicorn
and of its workers (issue 11, defect 5)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

import pytest

from testkit.procs import REPO, cli_env, free_port

pytestmark = pytest.mark.slow
STARTUP = re.compile(
    r"Booting worker|Control socket|event=dev_mode|event=embedded_started|event=worker_started|"
    r"Listening at|Using worker|event=migrated|enqueued \d+ demo jobs"
)


def run_until_banner(cmd: list[str], env: dict, log_path, quiet_seconds: float = 4.0) -> str:
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO, start_new_session=True)
    try:
        deadline = time.monotonic() + 90
        while "API token:" not in log_path.read_text():
            assert proc.poll() is None and time.monotonic() < deadline, log_path.read_text()[-3000:]
            time.sleep(0.1)
        time.sleep(quiet_seconds)  # whatever start-up is still to come has come by now
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        assert proc.wait(60) == 0, log_path.read_text()[-3000:]
    return log_path.read_text()


def banner_lines(output: str, port: int) -> tuple[list[str], int]:
    lines = output.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("jobqueue dashboard: "))
    assert lines[start] == f"jobqueue dashboard: http://127.0.0.1:{port}/"
    assert re.fullmatch(r"login: admin / \S+ +\(development mode, localhost only\)", lines[start + 1])
    assert lines[start + 2].startswith("API token: ")
    return lines, start


def test_serve_dev_prints_the_login_last(tmp_path):
    port = free_port()
    env = cli_env(JOBQUEUE_INSTANCE_PATH=str(tmp_path), JOBQUEUE_WEB_WORKERS="2")
    for name in ("JOBQUEUE_DATABASE_URL", "JOBQUEUE_USERS", "JOBQUEUE_API_TOKENS", "JOBQUEUE_DEV_PASSWORD"):
        env.pop(name, None)
    output = run_until_banner(
        [sys.executable, "-m", "jobqueue.cli", "serve", "--dev", "--port", str(port)], env, tmp_path / "serve.log"
    )
    lines, start = banner_lines(output, port)
    before, after = lines[:start], lines[start + 3 :]
    assert sum("event=worker_started" in line for line in before) == 2, output  # both web processes
    late = [
        line
        for line in after
        if line.strip()
        and "Handling signal" not in line
        and not re.search(r"event=(worker_stopping|worker_stopped|embedded_stopped)|Worker exiting|Shutting down", line)
    ]
    assert late == [], output


def test_run_app_prints_the_login_after_start_up_on_its_port(tmp_path):
    port = free_port()
    env = cli_env(JOBQUEUE_INSTANCE_PATH=str(tmp_path), PORT=str(port))
    for name in ("JOBQUEUE_DATABASE_URL", "JOBQUEUE_USERS", "JOBQUEUE_API_TOKENS", "JOBQUEUE_DEV_PASSWORD"):
        env.pop(name, None)
    output = run_until_banner([str(REPO / "scripts" / "run-app")], env, tmp_path / "run-app.log")
    lines, start = banner_lines(output, port)
    assert not [line for line in lines[start:] if STARTUP.search(line)], output
    assert "BuildBackendWarning" not in output and "warning:" not in output.lower()
