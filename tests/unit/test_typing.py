"""The public API is typed (the package ships py.typed): `mypy --strict` passes on it and on an
application that uses it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PUBLIC = [
    "jobqueue/__init__.py",
    "jobqueue/core/client.py",
    "jobqueue/core/tasks.py",
    "jobqueue/core/models.py",
    "jobqueue/core/errors.py",
    "jobqueue/web/__init__.py",
    "tests/typing/public_api_usage.py",
]


def test_mypy_strict_on_the_public_api():
    assert (REPO / "jobqueue" / "py.typed").exists()
    out = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--follow-imports=silent", "--no-incremental", *PUBLIC],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert out.returncode == 0, out.stdout + out.stderr
