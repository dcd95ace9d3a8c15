"""The Python 3.12 venv the MySQL peers run in (bench/mysql_peers.py): Django 6 needs Python 3.12+,
and the peers are Django 6 task backends (dj-queue, django-tasks-db), a Django app (django-q2) and a
SQLAlchemy queue (firm-queue), none of which belongs in the project's own venv.

    python -m bench.peers_venv          # build or refresh it; prints its interpreter

It lives in .venv-peers/ (BENCH_PEERS_VENV elsewhere) and is rebuilt when REQUIREMENTS change (a
stamp file holds their hash). mysqlclient, Django's recommended MySQL driver, compiles against
the C client: `apt-get install default-libmysqlclient-dev pkg-config` first. firm-queue's `[mysql]`
extra is PyMySQL, the driver its docs name for MySQL/MariaDB. The checkout reaches the peers on
PYTHONPATH (bench/peer_apps/ imports only the standard library and the peers).
"""

from __future__ import annotations

import glob
import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

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


def python312() -> str:
    """A Python 3.12+ that starts (a pyenv shim may name one it cannot run)."""
    candidates = [
        os.environ.get("BENCH_PYTHON312"),
        *sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.1[2-9]*/bin/python3"))),
        shutil.which("python3.12"),
        shutil.which("python3.13"),
    ]
    for candidate in filter(None, candidates):
        ok = subprocess.run([candidate, "-c", "import sys; sys.exit(sys.version_info < (3, 12))"], capture_output=True)
        if ok.returncode == 0:
            return candidate
    raise RuntimeError("the MySQL peers need Python 3.12+ (Django 6): none runs here (set BENCH_PYTHON312)")


def python() -> str:
    """The venv's interpreter, built (or rebuilt, when REQUIREMENTS changed) first. A lock file
    beside it lets processes that ask at once (the test suite's per-server processes) build it
    once."""
    import fcntl

    VENV.parent.mkdir(parents=True, exist_ok=True)
    with open(VENV.with_name(VENV.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _build()


def _build() -> str:
    want = hashlib.sha256("\n".join(REQUIREMENTS).encode()).hexdigest()
    stamp = VENV / ".bench-peers-requirements"
    exe = VENV / "bin" / "python"
    if exe.exists() and stamp.exists() and stamp.read_text() == want:
        return str(exe)
    shutil.rmtree(VENV, ignore_errors=True)
    subprocess.run([python312(), "-m", "venv", str(VENV)], check=True)
    done = subprocess.run(
        [str(exe), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", *REQUIREMENTS],
        capture_output=True,
        text=True,
        timeout=900,
    )
    if done.returncode != 0:
        hint = ""
        if "mysql_config" in done.stderr or "pkg-config" in done.stderr:
            hint = "\n(mysqlclient needs the C client: apt-get install default-libmysqlclient-dev pkg-config)"
        raise RuntimeError(f"pip install into {VENV} failed:\n{done.stdout[-2000:]}{done.stderr[-4000:]}{hint}")
    stamp.write_text(want)
    return str(exe)


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
