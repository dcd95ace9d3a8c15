"""The Python 3.12 venv the MySQL peers run in (bench/mysql_peers.py): Django 6 needs Python 3.12+,
and the peers are Django 6 task backends (dj-queue, django-tasks-db), a Django app (django-q2) and a
SQLAlchemy queue (firm-queue), none of which belongs in the project's own venv.

    python -m bench.peers_venv          # build or refresh it; prints its interpreter

It lives in .venv-peers/ (BENCH_PEERS_VENV elsewhere) and is rebuilt when REQUIREMENTS change
(testkit/venvs.py, as the Django 6 shop test's venv is); BENCH_PYTHON312 names the interpreter.
mysqlclient, Django's recommended MySQL driver, compiles against the C client: `apt-get install
default-libmysqlclient-dev pkg-config` first. firm-queue's `[mysql]`
extra is PyMySQL, the driver its docs name for MySQL/MariaDB. The checkout reaches the peers on
PYTHONPATH (bench/peer_apps/ imports only the standard library and the peers).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from testkit.venvs import VenvBuildFailed, cached_venv, python312

REPO = Path(__file__).resolve().parents[1]
VENV = Path(os.environ.get("BENCH_PEERS_VENV", REPO / ".venv-peers"))

# The lowest versions measured (issue 29); newer ones are taken as they come.
REQUIREMENTS = [
    "Django>=6.0",
    "dj-queue>=0.14",
    "django-tasks-db>=0.13",
    "firm-queue[mysql]>=1.0",
    "django-q2>=1.11",
    "mysqlclient>=2.2.1",
]


def python() -> str:
    """The venv's interpreter, built (or rebuilt, when REQUIREMENTS changed) first
    (testkit/venvs.py)."""
    try:
        return cached_venv(VENV, REQUIREMENTS, python312("BENCH_PYTHON312"))
    except VenvBuildFailed as exc:
        if "mysql_config" in str(exc) or "pkg-config" in str(exc):
            raise VenvBuildFailed(
                f"{exc}\n(mysqlclient needs the C client: apt-get install default-libmysqlclient-dev pkg-config)"
            ) from None
        raise


def versions(exe: str) -> dict[str, str]:
    """The peers' installed versions, for the results."""
    code = (
        "import json, importlib.metadata as m\n"
        "names = ['Django', 'dj-queue', 'django-tasks-db', 'firm-queue', 'django-q2', 'mysqlclient', 'PyMySQL']\n"
        "print(json.dumps({n: m.version(n) for n in names}))\n"
    )
    import json

    out = subprocess.run([exe, "-c", code], capture_output=True, text=True, check=True)
    return {"python": subprocess.run([exe, "-V"], capture_output=True, text=True).stdout.split()[-1]} | json.loads(
        out.stdout
    )


if __name__ == "__main__":
    exe = python()
    print(exe)
    print(versions(exe), file=sys.stderr)
