"""`async def` handlers: 1,000 jobs each awaiting 100 ms of asyncio.sleep, run by one
`jobqueue worker --concurrency 200 --burst` process.

The ideal is the longest batch the concurrency allows: 1000 / 200 x 0.1 s = 0.5 s. Measured: the
jobs' own window (MIN(started_at) .. MAX(finished_at) from the database, as bench/throughput.py
reads it), the process's whole run (spawn to exit: start-up and shutdown included), and its
thread count (the most /proc/<pid>/status reported while it ran).

    python -m bench.async_sleep [--jobs 1000] [--concurrency 200] [--seconds 0.1] [--prefetch N]
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import time

from bench import common
from jobqueue.core import service
from jobqueue.core.db import create_engine
from jobqueue.core.tasks import task


@task("async_sleep")
async def async_sleep(payload, ctx) -> None:
    await asyncio.sleep(payload.get("seconds", 0.1))


def threads_of(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("Threads:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def enqueue(url: str, jobs: int, seconds: float) -> None:
    engine = create_engine(url, pool_size=1)
    try:
        with engine.connect() as conn:
            service.enqueue_many(
                conn,
                [{"task": "async_sleep", "task_key": f"a{i}", "payload": {"seconds": seconds}} for i in range(jobs)],
            )
    finally:
        engine.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=200)
    parser.add_argument("--seconds", type=float, default=0.1)
    parser.add_argument("--prefetch", type=int, default=None, help="the worker's --prefetch (default: automatic)")
    args = parser.parse_args()
    ideal = args.jobs / args.concurrency * args.seconds
    with common.mysql_db("async_sleep") as url:
        enqueue(url, args.jobs, args.seconds)
        extra = ["--prefetch", str(args.prefetch)] if args.prefetch is not None else []
        cmd = common.worker_cmd(url, args.concurrency, *extra, tasks="bench.async_sleep", log_level="warning")
        spawned = time.perf_counter()
        proc = subprocess.Popen(cmd, env=common.child_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        most_threads = 0
        while proc.poll() is None:
            most_threads = max(most_threads, threads_of(proc.pid) or 0)
            time.sleep(0.01)
        whole = time.perf_counter() - spawned
        if proc.returncode != 0:
            raise SystemExit(f"worker exited {proc.returncode}: {proc.stderr.read().decode()[-2000:]}")
        window = common.db_window(url)
        status = common.count_status(url)
    print(
        f"{args.jobs} jobs x await asyncio.sleep({args.seconds:g}), one worker process, "
        f"--concurrency {args.concurrency} --burst" + "".join(f" {a}" for a in extra)
    )
    print(f"  done:                 {status.get('done', 0)} of {args.jobs}")
    print(
        f"  first start..last finish: {window.seconds:.3f} s  (ideal {ideal:.3f} s, ratio {window.seconds / ideal:.2f})"
    )
    print(f"  claims:               {window.claims}")
    print(f"  whole process:        {whole:.3f} s  (spawn to exit)")
    print(f"  threads (most seen):  {most_threads}")


if __name__ == "__main__":
    main()
