"""A start gate for benchmark subprocesses, so that N processes start working together.

Interpreter start-up and imports take a second or more per process and vary from one process to
the next; without a gate a 4-process run is really a 1-, then 2-, then 4-process run. Each
process calls `wait()` once it has imported everything (for `jobqueue worker`: the task module
bench.gate_tasks, loaded with `--tasks`, calls it; that happens after the CLI's imports and before
the engine and the worker exist), says so with a file `ready-<pid>` in $BENCH_GATE_DIR, and blocks
until the harness creates `go` there (`Gate.open`). Without $BENCH_GATE_DIR it does nothing.
"""

from __future__ import annotations

import os
import time

ENV = "BENCH_GATE_DIR"
COUNT_ENV = "BENCH_COUNT_DIR"


def write_count(name: str, value: int) -> None:
    folder = os.environ.get(COUNT_ENV)
    if folder:
        with open(os.path.join(folder, f"{name}-{os.getpid()}"), "w") as fh:
            fh.write(str(value))


def count_commits() -> None:
    """Count every COMMIT this process's SQLAlchemy engines send; written at exit (see
    ProcRun.commits). Costs one Python call per transaction, the same for every configuration."""
    if not os.environ.get(COUNT_ENV):
        return
    import atexit

    import sqlalchemy as sa

    commits = [0]

    @sa.event.listens_for(sa.engine.Engine, "commit")
    def _commit(conn) -> None:
        commits[0] += 1

    atexit.register(lambda: write_count("commits", commits[0]))


def wait(timeout: float = 120.0) -> None:
    folder = os.environ.get(ENV)
    if not folder:
        return
    with open(os.path.join(folder, f"ready-{os.getpid()}"), "w"):
        pass
    go = os.path.join(folder, "go")
    deadline = time.monotonic() + timeout
    while not os.path.exists(go):
        if time.monotonic() > deadline:
            raise SystemExit(f"bench gate: no 'go' in {folder} after {timeout:.0f}s")
        time.sleep(0.002)


class Gate:
    """The harness side: a fresh folder, the env var to hand to the children, and `open()`."""

    def __init__(self, folder: str):
        self.folder = folder
        os.makedirs(folder, exist_ok=True)
        for name in os.listdir(folder):
            os.unlink(os.path.join(folder, name))

    @property
    def env(self) -> dict[str, str]:
        return {ENV: self.folder}

    def ready(self) -> int:
        return sum(1 for name in os.listdir(self.folder) if name.startswith("ready-"))

    def wait_ready(self, n: int, timeout: float = 60.0, alive=lambda: True) -> None:
        deadline = time.monotonic() + timeout
        while self.ready() < n:
            if time.monotonic() > deadline or not alive():
                raise RuntimeError(f"only {self.ready()} of {n} processes reached the start gate")
            time.sleep(0.01)

    def open(self) -> None:
        with open(os.path.join(self.folder, "go"), "w"):
            pass
