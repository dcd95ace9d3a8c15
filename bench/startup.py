"""Start-up: what a user waits for before the queue does anything.

    python -m bench.startup [--runs N]

Times whole processes, alternating so that machine noise hits each alike (medians of N runs):
- `python -c "import sqlalchemy, pymysql"`: the floor any Python MySQL client pays;
- `jobqueue enqueue noop --key ...` against MariaDB: target at most 1.5x the floor;
- `jobqueue worker --burst` on an empty queue (start, preflight, one look, stop): target 0.6 s;
- a worker's first claim: from spawning `jobqueue worker` to the database's `started_at` of a
  waiting job (the same machine's clock): target 0.4 s.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from datetime import UTC
from typing import Any

import sqlalchemy as sa

from bench import common
from jobqueue.core import service
from jobqueue.core.db import create_engine
from jobqueue.core.schema import job_queue


def _timed(argv: list[str], env: dict[str, str]) -> float:
    started = time.perf_counter()
    subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True, cwd=common.REPO)
    return time.perf_counter() - started


def _first_claim(url: str, env: dict[str, str], key: str) -> float:
    engine = create_engine(url, pool_size=1)
    try:
        with engine.connect() as conn:
            job = service.enqueue(conn, "noop", key)
        spawned = time.time()
        proc = subprocess.Popen(
            common.jobqueue_cmd() + ["--database-url", url, "worker", "--concurrency", "1"],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            cwd=common.REPO,
        )
        try:
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                with engine.connect() as conn:
                    started = conn.execute(sa.select(job_queue.c.started_at).where(job_queue.c.id == job.id)).scalar()
                if started is not None:
                    return started.replace(tzinfo=UTC).timestamp() - spawned
                time.sleep(0.01)
            raise RuntimeError("the worker never claimed the job")
        finally:
            proc.terminate()
            proc.wait(20)
    finally:
        engine.dispose()


def run(ctx: Any = None, runs: int | None = None) -> dict[str, Any]:
    runs = runs or (3 if getattr(ctx, "quick", False) else 15)
    url = common.create_mysql_db("startup")
    env = common.child_env(JOBQUEUE_DATABASE_URL=url)  # bytecode written and reused, as for users
    floor, enqueue, burst, first = [], [], [], []
    cli = common.jobqueue_cmd()
    for i in range(runs):
        floor.append(_timed([sys.executable, "-c", "import sqlalchemy, pymysql"], env))
        enqueue.append(_timed(cli + ["enqueue", "noop", "--key", f"startup-{i}"], env))
        with create_engine(url, pool_size=1).connect() as conn:  # the burst worker finds an empty queue
            conn.execute(sa.delete(job_queue))
            conn.commit()
        burst.append(_timed(cli + ["worker", "--burst"], env))
        first.append(_first_claim(url, env, f"first-{i}"))
    m = {
        name: common.median(values)
        for name, values in (
            ("import_floor", floor),
            ("enqueue", enqueue),
            ("empty_burst", burst),
            ("first_claim", first),
        )
    }
    return {
        "runs": runs,
        "seconds": {"import_floor": floor, "enqueue": enqueue, "empty_burst": burst, "first_claim": first},
        "median": m,
        "enqueue_vs_floor": common.ratio(m["enqueue"], m["import_floor"]),
        "targets": {"enqueue_vs_floor_max": 1.5, "empty_burst_max_s": 0.6, "first_claim_max_s": 0.4},
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=15)
    a = p.parse_args()
    try:
        res = run(runs=a.runs)
    finally:
        common.drop_leftovers()
    m = res["median"]
    print(json.dumps(m, indent=1))
    print(f"enqueue / import floor: {res['enqueue_vs_floor']:.2f}x (target <= 1.5)")
    print(
        f"empty --burst run: {m['empty_burst']:.3f} s (target <= 0.6); first claim: {m['first_claim']:.3f} s "
        f"(target <= 0.4)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
