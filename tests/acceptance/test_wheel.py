"""The wheel a user would get from a package index works (issue 23: every test ran from an
editable install, and the wheel left out whole packages). Built from this checkout, installed
(not editable) into a fresh virtualenv, and used from a folder outside the checkout: it imports,
serves a page with its templates and static files, and runs a job."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
import zipfile
from pathlib import Path

import pytest

from testkit.procs import REPO, free_port

pytestmark = pytest.mark.slow


def run(*cmd, cwd: Path, env: dict | None = None, timeout: float = 300) -> str:
    done = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{cmd} exited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(the virtualenv's bin folder, the wheel's file names)."""
    root = tmp_path_factory.mktemp("wheel")
    run(sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", root / "dist", REPO, cwd=root)
    wheel = next((root / "dist").glob("jobqueue-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    run(sys.executable, "-m", "venv", root / "venv", cwd=root)
    bin_dir = root / "venv" / "bin"
    run(bin_dir / "python", "-m", "pip", "install", "--quiet", "--disable-pip-version-check", wheel, cwd=root)
    return bin_dir, names


def clean_env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JOBQUEUE_", "PYTHON"))}
    env.update(JOBQUEUE_DATABASE_URL=f"sqlite:///{tmp_path / 'jq.sqlite3'}", JOBQUEUE_LOG_LEVEL="WARNING")
    return env


def test_the_wheel_ships_the_package_and_not_the_test_kit(installed):
    _, names = installed
    for needed in (
        "jobqueue/core/repository/claim.py",
        "jobqueue/core/worker/loop.py",
        "jobqueue/core/migrations/versions/0001_job_queue.py",
        "jobqueue/core/migrations/script.py.mako",
        "jobqueue/templates/dashboard/overview.html",
        "jobqueue/static/htmx.min.js",
        "jobqueue/py.typed",
        "jobqueue/django/management/commands/jobqueue_worker.py",
        "webapp/__init__.py",
    ):
        assert needed in names, f"{needed} is missing from the wheel"
    assert not [n for n in names if n.startswith(("testkit/", "tests/", "bench/", "soak/", "drill/"))]


def test_the_installed_wheel_imports_serves_and_runs_a_job(installed, tmp_path):
    bin_dir, _ = installed
    env = clean_env(tmp_path)
    # Imported from the virtualenv, not from this checkout, under the new name and the old one.
    where = run(
        bin_dir / "python",
        "-W",
        "error",
        "-c",
        "import jobqueue, jobqueue.web; from jobqueue import JobQueue, task; "
        "from jobqueue.web import init_dashboard; print(jobqueue.__file__)",
        cwd=tmp_path,
        env=env,
    )
    assert str(bin_dir.parent) in where and str(REPO) not in where
    old = subprocess.run(
        [bin_dir / "python", "-c", "from webapp import JobQueue; print(JobQueue.__module__)"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert old.returncode == 0 and old.stdout.strip() == "jobqueue.core.client", old.stderr
    assert "DeprecationWarning" in old.stderr and "import jobqueue" in old.stderr, old.stderr
    assert (
        subprocess.run(
            [bin_dir / "python", "-c", "import testkit"], cwd=tmp_path, env=env, capture_output=True
        ).returncode
        != 0
    )

    # A job, by the command line of the wheel.
    run(bin_dir / "jobqueue", "init-db", cwd=tmp_path, env=env)
    added = json.loads(run(bin_dir / "jobqueue", "enqueue", "noop", "--key", "wheel-1", cwd=tmp_path, env=env))
    run(bin_dir / "jobqueue", "worker", "--burst", cwd=tmp_path, env=env)
    shown = json.loads(run(bin_dir / "jobqueue", "show", str(added["id"]), "--json", cwd=tmp_path, env=env))
    assert shown["status"] == "done", shown

    # A page with its templates and a static file, from the wheel's gunicorn entry.
    port = free_port()
    log_path = tmp_path / "serve.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [bin_dir / "jobqueue", "serve", "--dev", "--port", str(port)],
            cwd=tmp_path,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/login", timeout=2) as r:
                    page = r.read().decode()
                    break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, log_path.read_text()[-3000:]
                time.sleep(0.2)
        assert "<form" in page and "password" in page
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/static/htmx.min.js", timeout=5) as r:
            assert r.status == 200 and len(r.read()) > 10_000
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        assert proc.wait(60) == 0, log_path.read_text()[-3000:]
