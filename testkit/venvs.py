"""Python 3.12 venvs of their own, built once and cached: Django 6 needs Python 3.12+, the
project's venv runs 3.11. Two use them: the Django 6 shop test (tests/integration/
test_django_shop.py) and the MySQL peers of the benchmark (bench/peers_venv.py).

A venv is rebuilt when its requirements change (a stamp file holds their hash), and a lock file
beside it lets processes that ask at once (the test suite's per-server processes) build it once.
"""

from __future__ import annotations

import fcntl
import glob
import hashlib
import os
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

STAMP = ".requirements-sha256"


def python312(*env_vars: str) -> str:
    """A Python 3.12+ that starts (a pyenv shim may name one it cannot run): the first of the
    interpreters named by `env_vars`, pyenv's, python3.12 and python3.13 on PATH."""
    candidates = [
        *(os.environ.get(name) for name in env_vars),
        *sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.1[2-9]*/bin/python3"))),
        shutil.which("python3.12"),
        shutil.which("python3.13"),
    ]
    for candidate in filter(None, candidates):
        works = subprocess.run(
            [candidate, "-c", "import sys; sys.exit(sys.version_info < (3, 12))"], capture_output=True
        )
        if works.returncode == 0:
            return candidate
    named = " or ".join(env_vars) or "PATH"
    raise RuntimeError(f"Django 6 needs Python 3.12+: none runs here (set {named})")


class VenvBuildFailed(RuntimeError):
    """pip could not install the requirements; the message holds the end of its output."""


def cached_venv(venv: Path, requirements: Sequence[str], python: str) -> str:
    """The interpreter of `venv` with `requirements` installed by `python`'s venv module, built
    now if it is missing or was built for other requirements."""
    venv.parent.mkdir(parents=True, exist_ok=True)
    with open(venv.with_name(venv.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        want = hashlib.sha256("\n".join(requirements).encode()).hexdigest()
        stamp = venv / STAMP
        exe = venv / "bin" / "python"
        if exe.exists() and stamp.exists() and stamp.read_text() == want:
            return str(exe)
        shutil.rmtree(venv, ignore_errors=True)
        subprocess.run([python, "-m", "venv", str(venv)], check=True)
        done = subprocess.run(
            [str(exe), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", *requirements],
            capture_output=True,
            text=True,
            timeout=900,
        )
        if done.returncode != 0:
            raise VenvBuildFailed(f"pip install into {venv} failed:\n{done.stdout[-2000:]}{done.stderr[-4000:]}")
        stamp.write_text(want)
        return str(exe)
