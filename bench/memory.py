"""7. Memory: RSS of one `jobqueue worker --concurrency 8` process over N (1,000,000) no-op jobs,
sampled with psutil every 0.2 s from the start gate to the end. Target: flat, no growth.

"Flat" is judged after warm-up (the first 10% of the jobs: pools fill, statement caches warm):
the median RSS of the last quarter of the run against the median of the quarter after warm-up
must not grow by more than max(2 MiB, 2%). The slope (MiB per 10,000 jobs, least squares over the
run after warm-up) is reported too.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import psutil
import sqlalchemy as sa
from sqlalchemy.pool import NullPool

from bench import common
from bench.common import log


def run(ctx) -> dict[str, Any]:
    jobs = ctx.memory_jobs
    with common.mysql_db("mem") as url:
        t0 = time.perf_counter()
        common.enqueue_noops(url, jobs)
        enqueue_s = time.perf_counter() - t0
        log(f"memory: enqueued {jobs} jobs in {enqueue_s:.1f}s")
        samples: list[tuple[float, float, int]] = []  # (seconds since gate, rss MiB, jobs done)
        done = [0]
        stop = threading.Event()
        engine = sa.create_engine(url, poolclass=NullPool)

        def count_loop() -> None:
            # Jobs done = all - not yet done, counted on the live statuses' index (a count of the
            # done rows would read up to a million index entries a second beside the worker).
            with engine.connect() as conn:
                while not stop.wait(2.0):
                    left = conn.exec_driver_sql(
                        "SELECT COUNT(*) FROM job_queue WHERE status IN ('ready', 'running')"
                    ).scalar()
                    done[0] = jobs - left
                    conn.rollback()

        run_ = common.ProcRun([common.worker_cmd(url, 8)])
        run_.start(ctx.log_dir)
        proc = psutil.Process(run_.procs[0].pid)
        counter = threading.Thread(target=count_loop, daemon=True)
        counter.start()
        try:
            while run_.poll():
                try:
                    rss = proc.memory_info().rss / 2**20
                except psutil.Error:
                    break
                samples.append((time.perf_counter() - run_.t_gate, rss, done[0]))
                time.sleep(0.2)
            run_.wait(60)
        finally:
            stop.set()
            counter.join(5)
            engine.dispose()
        run_.check()
        win = common.db_window(url)
    if win.done != jobs:
        raise RuntimeError(f"memory: {win.done} of {jobs} done")
    total_t = samples[-1][0] if samples else 0
    warm = [s for s in samples if s[2] >= 0.10 * jobs]
    if len(warm) < 8:
        warm = samples[len(samples) // 10 :]
    q = max(1, len(warm) // 4)
    early = common.median([s[1] for s in warm[:q]])
    late = common.median([s[1] for s in warm[-q:]])
    slope = _slope([(s[2], s[1]) for s in warm]) * 10_000
    growth = late - early
    return {
        "jobs": jobs,
        "concurrency": 8,
        "jobs_per_s": win.jobs_per_s,
        "run_s": total_t,
        "rss_start_mib": samples[0][1] if samples else float("nan"),
        "rss_peak_mib": max(s[1] for s in samples) if samples else float("nan"),
        "rss_end_mib": samples[-1][1] if samples else float("nan"),
        "rss_after_warmup_mib": early,
        "rss_last_quarter_mib": late,
        "growth_mib": growth,
        "slope_mib_per_10k_jobs": slope,
        "pass": growth <= max(2.0, 0.02 * early),
        "samples": [(round(t, 2), round(r, 2), d) for t, r, d in samples],
    }


def _slope(points: list[tuple[float, float]]) -> float:
    n = len(points)
    if n < 2:
        return float("nan")
    mx = sum(p[0] for p in points) / n
    my = sum(p[1] for p in points) / n
    sxx = sum((p[0] - mx) ** 2 for p in points)
    return sum((p[0] - mx) * (p[1] - my) for p in points) / sxx if sxx else float("nan")
