"""Where a worker's start-up goes: the phases of an empty `jobqueue worker --burst` and of a
worker's first claim, as median milliseconds since the process was spawned.

    python -m bench.startup_phases [--runs 11] [--compare OTHER_CHECKOUT]

With --compare, another checkout's `jobqueue` (say, an exported older commit) runs alternately
with this one's, under the same conditions. Each child is `jobqueue` run through a harness that
stamps the time of the phases (it imports the worker's modules itself, right after the CLI's, so
the import phase is measured apart from the rest; the garbage collector is paused as the console
entry point pauses it, where the checkout has that). bench/startup.py times the same processes
from outside, without a harness.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict

HARNESS = r"""
import atexit, json, sys, time
T = [("python_ready", time.time())]
out = sys.argv.pop(1)
def mark(name): T.append((name, time.time()))
atexit.register(lambda: (mark("atexit"), json.dump(T, open(out, "w"))))
import jobqueue.cli
try:
    from jobqueue.core.cli import pause_collector
    pause_collector()
except ImportError:
    pass
mark("import_cli")
import jobqueue.core.task_modules, jobqueue.core.worker
from jobqueue.core.worker import claimer, loop, maintenance
mark("import_command")
def stamp(cls, name, label=None):
    f = getattr(cls, name)
    label = label or name
    def wrapped(*a, **k):
        mark(label + ":start")
        try:
            return f(*a, **k)
        finally:
            mark(label + ":end")
    setattr(cls, name, wrapped)
for name in ("_wait_for_database", "_register", "start_threads", "shutdown"):
    stamp(loop.Worker, name)
stamp(maintenance.Maintenance, "turn", "_maintenance")
stamp(claimer.Claimer, "cycle", "_cycle")
import sqlalchemy as sa
sa.event.listen(sa.pool.Pool, "connect", lambda *a: mark("connect"))
jobqueue.cli.run()
"""


def _one(root: str, url: str, first_claim: bool) -> dict[str, float]:
    import sqlalchemy as sa

    env = {**os.environ, "PYTHONPATH": root, "JOBQUEUE_DATABASE_URL": url}
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # bytecode written and reused, as for users
    fd, out = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        conn.exec_driver_sql("DELETE FROM job_queue")
    if first_claim:
        from jobqueue.core import service
        from jobqueue.core.db import create_engine

        ours = create_engine(url, pool_size=1)
        with ours.connect() as conn:
            service.enqueue(conn, "noop", f"phases-{time.time()}")
        ours.dispose()
    args = ["worker", "--concurrency", "1"] if first_claim else ["worker", "--burst"]
    spawned = time.time()
    proc = subprocess.Popen(
        [sys.executable, "-c", HARNESS, out, *args],
        env=env,
        cwd=root,  # "" first on sys.path
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    claimed = None
    if first_claim:
        while claimed is None:
            time.sleep(0.005)
            with engine.connect() as conn:
                claimed = conn.exec_driver_sql("SELECT UNIX_TIMESTAMP(started_at) FROM job_queue").scalar()
        time.sleep(0.2)
        proc.terminate()
    proc.wait(60)
    exited = time.time()
    engine.dispose()
    with open(out) as fh:
        stamps: dict[str, float] = {}
        for name, at in json.load(fh):
            stamps.setdefault(name, (at - spawned) * 1000)  # the first of each
    os.unlink(out)

    def between(a: str, b: str) -> float:
        return stamps[b] - stamps[a]

    phases = {
        "interpreter": stamps["python_ready"],
        "import the CLI": between("python_ready", "import_cli"),
        "import the command": between("import_cli", "import_command"),
        "engine, first connect": between("import_command", "connect"),
        "preflight": between("connect", "_wait_for_database:end"),
        "register the process": between("_register:start", "_register:end"),
        "threads started": between("_register:end", "start_threads:end"),
        "maintenance": between("_maintenance:start", "_maintenance:end"),
    }
    if first_claim:
        phases["first claim (its started_at)"] = float(claimed) * 1000 - spawned * 1000
    else:
        phases["claim (finds nothing)"] = between("_cycle:start", "_cycle:end")
        phases["shutdown"] = between("shutdown:start", "shutdown:end")
        phases["exit"] = (exited - spawned) * 1000 - stamps["shutdown:end"]
        phases["total"] = (exited - spawned) * 1000
    return phases


def main() -> int:
    from bench import common

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=11)
    p.add_argument("--compare", default=None, help="another checkout whose jobqueue runs alternately")
    a = p.parse_args()
    roots = [("this", str(common.REPO))] + ([("compare", a.compare)] if a.compare else [])
    url = common.create_mysql_db("phases")
    try:
        for first_claim in (False, True):
            acc: dict[str, dict[str, list[float]]] = {name: defaultdict(list) for name, _ in roots}
            for i in range(a.runs):
                for name, root in roots if i % 2 == 0 else roots[::-1]:
                    for phase, ms in _one(root, url, first_claim).items():
                        acc[name][phase].append(ms)
            print(
                "first claim (worker --concurrency 1, one job waiting)" if first_claim else "empty worker --burst",
                f"- median ms since spawn over {a.runs} runs",
            )
            print(f"{'phase':32}" + "".join(f"{name:>10}" for name, _ in roots))
            for phase in acc["this"]:
                print(f"{phase:32}" + "".join(f"{statistics.median(acc[name][phase]):10.1f}" for name, _ in roots))
            print("load average", " ".join(f"{x:.2f}" for x in os.getloadavg()), "\n")
    finally:
        common.drop_leftovers()
    return 0


if __name__ == "__main__":
    sys.exit(main())
