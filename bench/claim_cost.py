"""3. Claim cost as finished rows pile up: 0, 100,000 and 1,000,000 done/failed rows in job_queue.

One database per size: the finished rows are loaded first (multi-row INSERTs through PyMySQL's
executemany, which batches VALUES lists up to ~1 MB a statement), then N ready no-op jobs are
enqueued after them, as in a table that has been in use. The sizes are then measured round-robin,
each measurement starting from the same N jobs put back to ready:

- claim only: service.claim(limit=1) in a loop on one connection, our code path (claims/s);
- end to end: `jobqueue worker --concurrency 4` over the N jobs (jobs/s from the database).

Plus the claim SELECT's EXPLAIN and ANALYZE (rows the server really read) at each size.
"""

from __future__ import annotations

import random
import time
from datetime import datetime, timedelta
from typing import Any

import pymysql
import sqlalchemy as sa

from bench import common
from bench.common import log
from bench.raw_loop import connect_args
from jobqueue.core import repository, service
from jobqueue.core.db import create_engine

INSERT = (
    "INSERT INTO job_queue (task_key, task_name, queue, priority, payload, status, run_at, lease_owner, "
    "lease_until, attempts, max_attempts, started_at, last_error, created_at, updated_at, finished_at) "
    "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)"
)


def load_finished(url: str, n: int, *, chunk: int = 20_000) -> float:
    """Insert n finished rows (98% done, 2% failed); returns seconds."""
    if n == 0:
        return 0.0
    conn = pymysql.connect(**connect_args(url))
    rng = random.Random(7)
    base = datetime(2026, 1, 1)
    t0 = time.perf_counter()
    try:
        with conn.cursor() as cur:
            for lo in range(0, n, chunk):
                rows = []
                for i in range(lo, min(n, lo + chunk)):
                    ts = base + timedelta(seconds=i * 0.5)
                    failed = rng.random() < 0.02
                    rows.append(
                        (
                            f"hist-{i}",
                            "noop",
                            "default",
                            0,
                            "{}",
                            "failed" if failed else "done",
                            ts,
                            f"loader:1:{i % 8 + 1}",
                            None,
                            1,
                            5,
                            ts,
                            "boom" if failed else None,
                            ts,
                            ts + timedelta(milliseconds=3),
                            ts + timedelta(milliseconds=3),
                        )
                    )
                cur.executemany(INSERT, rows)
                conn.commit()
        return time.perf_counter() - t0
    finally:
        conn.close()


def reset_jobs(url: str, min_id: int) -> None:
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    with engine.begin() as conn:
        conn.exec_driver_sql(
            "UPDATE job_queue SET status='ready', lease_owner=NULL, lease_until=NULL, attempts=0, started_at=NULL, "
            f"finished_at=NULL, updated_at=UTC_TIMESTAMP(6) WHERE id > {int(min_id)}"
        )
    engine.dispose()


def explain(url: str) -> dict[str, Any]:
    engine = create_engine(url, pool_size=1)
    try:
        with engine.connect() as conn:
            plan = repository.claim.explain_claim(conn, "default", 1)
            flavour = repository.claim.flavour(conn)
            stmt = (
                repository.claim.pick_statement(flavour)
                .params(queue="default", limit=1)
                .compile(dialect=conn.dialect, compile_kwargs={"literal_binds": True})
            )
            # The statement run for real, with the rows it read: MariaDB's ANALYZE, MySQL 8.0's
            # EXPLAIN ANALYZE (a tree of text). It locks one row: inside a transaction we roll back.
            prefix = "ANALYZE" if flavour == "mariadb" else "EXPLAIN ANALYZE"
            analyzed = [dict(r._mapping) for r in conn.exec_driver_sql(f"{prefix} {stmt}").all()]
            conn.rollback()
            conn.exec_driver_sql("ANALYZE TABLE job_queue").all()  # fresh statistics for the size below
            size = conn.exec_driver_sql(
                "SELECT data_length + index_length FROM information_schema.TABLES "
                "WHERE table_schema = DATABASE() AND table_name = 'job_queue'"
            ).scalar()
        return {"explain": plan, "analyze": analyzed, "table_bytes": int(size or 0)}
    finally:
        engine.dispose()


def claim_only(url: str, claims: int) -> float:
    """service.claim(limit=1) `claims` times on one connection; returns claims/s."""
    engine = create_engine(url, pool_size=1)
    try:
        with engine.connect() as conn:
            service.claim(conn, "bench:0:1", 1, ["default"], lease_seconds=60)  # warm the statement cache
            t0 = time.perf_counter()
            for _ in range(claims):
                got = service.claim(conn, "bench:0:1", 1, ["default"], lease_seconds=60)
                if not got:
                    raise RuntimeError("ran out of ready jobs in the claim-only loop")
            return claims / (time.perf_counter() - t0)
    finally:
        engine.dispose()


def run(ctx) -> dict[str, Any]:
    sizes = ctx.claim_sizes
    jobs = ctx.jobs
    claims = min(2000, jobs - 10)
    dbs: dict[int, dict[str, Any]] = {}
    try:
        for size in sizes:
            url = common.create_mysql_db(f"cc{size}")
            load_s = load_finished(url, size)
            eng = sa.create_engine(url, poolclass=sa.pool.NullPool)
            with eng.connect() as conn:
                max_id = conn.exec_driver_sql("SELECT COALESCE(MAX(id), 0) FROM job_queue").scalar()
            eng.dispose()
            enqueue_s = common.enqueue_noops(url, jobs)
            dbs[size] = {
                "url": url,
                "min_id": max_id,
                "load_s": load_s,
                "enqueue_jobs_per_s": jobs / enqueue_s,
                "claims_per_s": [],
                "worker_jobs_per_s": [],
            }
            log(
                f"claim cost: loaded {size} finished rows in {load_s:.1f}s "
                f"({size / load_s if load_s else 0:.0f} rows/s)"
            )
        for size in sizes:
            dbs[size]["plan"] = explain(dbs[size]["url"])
        for r in range(ctx.rounds):
            order = sizes if r % 2 == 0 else list(reversed(sizes))
            for size in order:
                d = dbs[size]
                reset_jobs(d["url"], d["min_id"])
                cps = claim_only(d["url"], claims)
                reset_jobs(d["url"], d["min_id"])
                run_ = common.ProcRun([common.worker_cmd(d["url"], 4)])
                run_.start(ctx.log_dir)
                run_.wait(max(120.0, jobs / 50))
                run_.check()
                win = common.db_window(d["url"], min_id=d["min_id"])
                if win.done != jobs:
                    raise RuntimeError(f"claim cost {size}: {win.done} of {jobs} done")
                d["claims_per_s"].append(cps)
                d["worker_jobs_per_s"].append(win.jobs_per_s)
                log(
                    f"claim cost round {r + 1}/{ctx.rounds} size {size}: claim-only {cps:.0f}/s, "
                    f"worker c4 {win.jobs_per_s:.0f} jobs/s"
                )
    finally:
        for d in dbs.values():
            common.drop_mysql_db(d["url"])
    base = dbs[sizes[0]]
    out = []
    for size in sizes:
        d = dbs[size]
        out.append(
            {
                "finished_rows": size,
                "load_s": d["load_s"],
                "claims_per_s": common.median(d["claims_per_s"]),
                "claims_runs": [round(x) for x in d["claims_per_s"]],
                "worker_jobs_per_s": common.median(d["worker_jobs_per_s"]),
                "worker_runs": [round(x) for x in d["worker_jobs_per_s"]],
                "claims_ratio": common.median([a / b for a, b in zip(d["claims_per_s"], base["claims_per_s"])]),
                "worker_ratio": common.median(
                    [a / b for a, b in zip(d["worker_jobs_per_s"], base["worker_jobs_per_s"])]
                ),
                "plan": d["plan"],
                "table_bytes": d["plan"]["table_bytes"],
            }
        )
    return {"jobs": jobs, "claims": claims, "rounds": ctx.rounds, "sizes": out, "target": 0.8}
