"""The layout's rules, checked: the core never imports Flask, every setting is in docs/configuration.md,
and the command line starts quickly because it imports only what a command uses."""

from __future__ import annotations

import pkgutil
import subprocess
import sys
from pathlib import Path

import jobqueue.core
from jobqueue.core import settings

REPO = Path(__file__).resolve().parents[2]


def core_modules() -> list[str]:
    return sorted(
        m.name for m in pkgutil.walk_packages(jobqueue.core.__path__, "jobqueue.core.") if ".migrations" not in m.name
    )


def test_no_module_of_the_core_imports_flask():
    modules = core_modules()
    assert "jobqueue.core.repository.claim" in modules and "jobqueue.core.worker.leases" in modules
    code = (
        "import importlib, sys\n"
        f"for name in {modules!r}:\n"
        "    importlib.import_module(name)\n"
        "bad = sorted(m for m in sys.modules if m == 'flask' or m.startswith(('flask.', 'flask_', 'jobqueue.web')))\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True)
    assert out.stdout.strip() == "", f"the core imported {out.stdout.strip()}"


def test_only_jobqueue_django_imports_django():
    # Django is an extra (jobqueue[django]): the core and the web app never import it.
    import jobqueue.web

    web = sorted(m.name for m in pkgutil.walk_packages(jobqueue.web.__path__, "jobqueue.web."))
    code = (
        "import importlib, sys\n"
        f"for name in {core_modules() + web!r}:\n"
        "    importlib.import_module(name)\n"
        "print(','.join(sorted(m for m in sys.modules if m.split('.')[0] in ('django', 'django_tasks'))))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True)
    assert out.stdout.strip() == "", f"imported {out.stdout.strip()}"


def test_a_queue_command_imports_neither_flask_nor_alembic_nor_prometheus():
    code = (
        "import sys\n"
        "from jobqueue.cli import cli\n"
        "try:\n"
        "    cli(['--help'], obj={})\n"
        "except SystemExit:\n"
        "    pass\n"
        "import jobqueue.core.repository, jobqueue.core.db\n"
        "heavy = [m for m in ('flask', 'alembic', 'prometheus_client', 'werkzeug') if m in sys.modules]\n"
        "print(','.join(heavy), file=sys.stderr)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True)
    assert out.stderr.strip() == "", f"imported at start-up: {out.stderr.strip()}"


def test_a_worker_registering_reads_its_totals_without_importing_prometheus():
    # Registration comes before the first claim; prometheus_client (~10-20 ms to import) is made
    # by the first metric a claim counts, after the claim.
    code = (
        "import sys\n"
        "from jobqueue.core import metrics\n"
        "assert metrics.stat_totals()['completed'] == 0\n"
        "print('prometheus_client' in sys.modules)\n"
        "metrics.COMPLETED.labels(queue='q').inc(2)\n"
        "print(metrics.stat_totals()['completed'])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True)
    assert out.stdout.split() == ["False", "2"]


def test_the_configuration_page_is_made_from_the_settings():
    page = (REPO / "docs" / "configuration.md").read_text()
    assert page == settings.markdown_page(), (
        "docs/configuration.md differs from jobqueue/core/settings.py; run "
        "`python -m jobqueue.core.settings > docs/configuration.md`"
    )


def test_settings_parse_and_refuse_with_the_variable_named():
    s = settings.Settings.from_env(
        {
            "JOBQUEUE_DATABASE_URL": "mysql://a/b  mysql://c/d",
            "JOBQUEUE_DEV": "yes",
            "JOBQUEUE_EMBEDDED_QUEUES": "a, b,,",
            "JOBQUEUE_LEASE_SECONDS": "30",
        }
    )
    assert s.database_urls == ("mysql://a/b", "mysql://c/d") and s.database_url == "mysql://a/b"
    assert s.dev is True and s.embedded_queues == ("a", "b") and s.lease_seconds == 30.0
    for env, word in (
        ({"JOBQUEUE_DEV": "maybe"}, "JOBQUEUE_DEV"),
        ({"JOBQUEUE_EMBEDDED_WORKERS": "x"}, "EMBEDDED"),
        ({"JOBQUEUE_LEASE_SECONDS": "0"}, "LEASE_SECONDS"),
    ):
        try:
            settings.Settings.from_env(env)
        except settings.SettingsError as exc:
            assert word in str(exc)
        else:
            raise AssertionError(f"{env} accepted")
    every = {s.name for s in settings.SETTINGS}
    for path in (REPO / "jobqueue").rglob("*.py"):
        if path.name == "settings.py":
            continue
        text = path.read_text()
        assert 'environ.get("JOBQUEUE_' not in text and 'getenv("JOBQUEUE_' not in text, (
            f"{path} reads a JOBQUEUE_ variable itself; declare it in jobqueue/core/settings.py"
        )
    assert "DATABASE_URL" in every
