"""What pacing bulk actions by replica lag costs (issue 14): a bulk requeue of 20,000 failed jobs
(service.bulk_action over the filter status=failed, batches of 500) on a throwaway GTID primary
with one replica (testkit.replication), three ways, each from the same 20,000 failed jobs:

- not watched: no JOBQUEUE_REPLICA_URLS (pace=None), the behaviour before pacing;
- watched, caught up: the replica's lag read before every batch (ReplicaWatch.wait), never over;
- watched, lagging: the replica's SQL thread held by a row lock (hold_sql_thread) until its
  lag is over the bound, released HOLD_SECONDS after the bulk starts: the bulk waits, then ends.

    python -m bench.replica_pacing [--jobs 20000] [--rounds 3]

Prints the medians and the ratios; nothing here changes the shared server.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time
from pathlib import Path

import sqlalchemy as sa

from jobqueue.core import service
from jobqueue.core.db import create_engine
from jobqueue.core.migrate import init_db
from jobqueue.core.models import Status
from jobqueue.core.replica_watch import ReplicaWatch
from jobqueue.core.repository.operator import JobFilter
from jobqueue.core.schema import job_queue
from jobqueue.core.task_modules import load_task_modules
from testkit.replication import ReplicationCluster

LAG_LIMIT = 2
HOLD_SECONDS = 6.0


def lag_over(watch: ReplicaWatch, seconds: int) -> None:
    while True:
        (report,) = watch.read()
        if report.seconds is not None and report.seconds > seconds:
            return
        time.sleep(0.2)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    load_task_modules()
    with tempfile.TemporaryDirectory(prefix="jq-pacing-") as tmp:
        cluster = ReplicationCluster.create(Path(tmp), replicas=1).start()
        try:
            url = cluster.primary.create_database("jq")
            engine = create_engine(url)
            init_db(engine)
            with engine.connect() as conn:
                for start in range(0, args.jobs, 5000):
                    service.enqueue_many(
                        conn,
                        [{"task": "noop", "task_key": f"p-{i}"} for i in range(start, min(args.jobs, start + 5000))],
                    )
            watch = ReplicaWatch([cluster.replicas[0].url()], LAG_LIMIT)
            results: dict[str, list[tuple[float, float, float]]] = {
                "not watched": [],
                "watched, caught up": [],
                "watched, lagging": [],
            }

            def reset() -> None:
                with engine.begin() as conn:
                    conn.execute(sa.update(job_queue).values(status="failed", attempts=1, last_error="x"))
                cluster.wait_caught_up(timeout=120)

            def bulk(pace) -> tuple[float, float]:
                with engine.connect() as conn:
                    t0 = time.perf_counter()
                    res = service.bulk_action(
                        conn, "requeue", actor="bench", job_filter=JobFilter(status=Status.FAILED), pace=pace
                    )
                    assert res.changed == args.jobs, res
                    return time.perf_counter() - t0, res.paused_seconds

            for _ in range(args.rounds):
                reset()
                results["not watched"].append((*bulk(None), 0.0))
                reset()
                results["watched, caught up"].append((*bulk(watch.wait), 0.0))
                reset()
                outcome: list[tuple[float, float]] = []
                with cluster.hold_sql_thread():
                    lag_over(watch, LAG_LIMIT)
                    (before,) = watch.read()
                    # The hold ends with this block: the bulk runs beside it, HOLD_SECONDS long.
                    runner = threading.Thread(target=lambda: outcome.append(bulk(watch.wait)))
                    runner.start()
                    time.sleep(HOLD_SECONDS)
                runner.join()
                results["watched, lagging"].append((*outcome[0], float(before.seconds or 0)))
            watch.dispose()
            engine.dispose()
        finally:
            cluster.cleanup()
    base = statistics.median(s for s, _, _ in results["not watched"])
    print(
        f"bulk requeue of {args.jobs:,} jobs, batches of 500, {args.rounds} rounds (medians; other sessions "
        "may share the CPU)"
    )
    for name, runs in results.items():
        seconds = statistics.median(s for s, _, _ in runs)
        paused = statistics.median(p for _, p, _ in runs)
        lag = max(behind for _, _, behind in runs)
        extra = (
            f", paused {paused:.1f} s (lag {lag:.0f} s at the start, bound {LAG_LIMIT} s, held {HOLD_SECONDS:g} s)"
            if name == "watched, lagging"
            else ""
        )
        print(f"  {name:<20} {seconds:6.2f} s  ({args.jobs / seconds:,.0f} jobs/s, {seconds / base:.2f}x){extra}")
        print(f"  {'':<20} runs: {', '.join(f'{s:.2f}' for s, _, _ in runs)}")


if __name__ == "__main__":
    main()
