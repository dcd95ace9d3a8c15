"""examples/django_shop, run (issue 28): Django's tasks framework on the queue. The checks
(django_shop_checks.py) run inside the shop's own manage.py against a real server: an enqueue in
an atomic block exists exactly when it commits, get_result maps status, return value, errors and
timestamps, priority / run_after / queue_name / takes_context / async tasks, our worker runs them,
the shop's order view rolls back with its task, and the dashboard is reached as staff and refused
to others.

Django 5.2 LTS with the django-tasks backport runs in this interpreter, on every selected server;
Django 6 needs Python 3.12+ and runs in a venv of its own, built once and cached (outside the
checkout: JOBQUEUE_DJANGO6_VENV, default ~/.cache/jobqueue/venv-django6-py312), on the first
selected server."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from testkit.procs import REPO, cli_env
from testkit.venvs import cached_venv, python312
from tests.conftest import database_on, selected_servers

SHOP = REPO / "examples" / "django_shop"
CHECKS = Path(__file__).with_name("django_shop_checks.py")
DJANGO6 = "Django>=6.0,<7"
VENV = Path(os.environ.get("JOBQUEUE_DJANGO6_VENV", Path.home() / ".cache" / "jobqueue" / "venv-django6-py312"))


def run_shop(python: str, url: str) -> str:
    """The shop's migrations, then the checks, with `python`; their output."""
    env = cli_env(SHOP_DATABASE_URL=url.replace("mysql+pymysql://", "mysql://", 1))
    out = ""
    for args in (["migrate", "-v0"], ["shell", "-c", f"import runpy; runpy.run_path({str(CHECKS)!r})"]):
        done = subprocess.run(
            [python, "manage.py", *args], cwd=SHOP, env=env, capture_output=True, text=True, timeout=600
        )
        assert done.returncode == 0, f"manage.py {args[0]}:\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}"
        out += done.stdout
    return out


@pytest.mark.slow
def test_the_django_shop_on_django_5_2_with_the_backport(mysql_url):
    out = run_shop(sys.executable, mysql_url)
    assert "django 5.2" in out and "framework django_tasks.base" in out and "django shop checks passed" in out


def django6_python() -> str:
    """The cached venv's interpreter, (re)built when the project's dependencies change: those
    dependencies and Django 6 (the project itself comes from the checkout, on PYTHONPATH)."""
    requirements = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"] + [DJANGO6]
    return cached_venv(VENV, requirements, python312("JOBQUEUE_PYTHON312"))


@pytest.mark.slow
def test_the_django_shop_on_django_6(request):
    python = django6_python()
    with database_on(selected_servers(request.config)[0]) as url:
        out = run_shop(python, url)
    assert "django 6." in out and "framework django.tasks.base" in out and "django shop checks passed" in out
