"""What keeping payloads as text costs the dashboard's search, and how long migration 0008 takes
(issue 24). `python -m bench.payload_column --rows 300000` on each server of the test suite.

For each server: a fresh database migrated to 0007 (MySQL: a JSON payload column), `rows` jobs
(done, 1 in 19 failed, the payload of bench/dashboard.py: `{"order": N, "customer": "cust-M",
"note": "ok"}`, a rare `needle-…` in 1 in 100,000), then:
- search: `repository.reads.page_jobs(conn, JobFilter(search=term))`, the dashboard's /jobs?q=term
  (a LIKE over payload, last_error and task_key, newest first, at most the newest 50,000 rows, a
  capped count), 2 warm-ups then `rounds` calls, for a rare term (the whole window is read) and a
  common one (the page fills early, the count reads the window);
- the upgrade 0007 -> 0008 (`alembic upgrade`), timed: on MySQL the ALTER ... ALGORITHM=COPY of
  job_queue, job_result and recurring_job; nothing on MariaDB;
- the same searches again.
"""

from __future__ import annotations

import argparse
import time
import uuid

import sqlalchemy as sa
from alembic import command
from sqlalchemy.pool import NullPool

from bench.common import median, percentile
from jobqueue.core import migrate, repository
from jobqueue.core.db import create_engine
from jobqueue.core.repository.operator import JobFilter
from testkit.sql import seq_rows
from tests.conftest import SERVERS

TERMS = {"rare": "needle-77", "common": "cust-42"}
CHUNK = 100_000


def fill(engine, rows: int) -> float:
    t0 = time.perf_counter()
    with engine.begin() as conn:
        for lo in range(0, rows, CHUNK):
            n = min(CHUNK, rows - lo)
            conn.exec_driver_sql(
                "INSERT INTO job_queue (task_key, task_name, queue, priority, payload, status, run_at, attempts, "
                "max_attempts, last_error, created_at, updated_at, finished_at) "
                f"SELECT CONCAT('k:', seq + {lo}), 'noop', 'default', 0, "
                f'CONCAT(\'{{"order": \', seq + {lo}, \', "customer": "cust-\', MOD(seq + {lo}, 5000), '
                f"'\", \"note\": \"', IF(MOD(seq + {lo}, 100000) = 77, CONCAT('needle-', seq + {lo}), 'ok'), '\"}}'), "
                f"IF(MOD(seq + {lo}, 19) = 0, 'failed', 'done'), UTC_TIMESTAMP(6), 1, 5, "
                f"IF(MOD(seq + {lo}, 19) = 0, 'RuntimeError: upstream said 503', NULL), "
                f"UTC_TIMESTAMP(6), UTC_TIMESTAMP(6), UTC_TIMESTAMP(6) FROM {seq_rows(n)}"
            )
    return time.perf_counter() - t0


def time_searches(engine, rounds: int) -> dict[str, tuple[float, float]]:
    out = {}
    with engine.connect() as conn:
        for name, term in TERMS.items():
            times = []
            for i in range(rounds + 2):
                t0 = time.perf_counter()
                repository.reads.page_jobs(conn, JobFilter(search=term))
                conn.rollback()
                if i >= 2:
                    times.append((time.perf_counter() - t0) * 1000)
            out[name] = (median(times), percentile(times, 95))
    return out


def upgrade(engine, revision: str) -> float:
    t0 = time.perf_counter()
    with engine.connect() as conn:
        command.upgrade(migrate._config(conn), revision)
        conn.commit()
    return time.perf_counter() - t0


def run(server: str, rows: int, rounds: int) -> dict:
    base = SERVERS[server]
    name = f"jqb_payload_{uuid.uuid4().hex[:8]}"
    admin = sa.create_engine(base + "/", poolclass=NullPool)
    with admin.connect() as conn:
        conn.exec_driver_sql(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4 COLLATE utf8mb4_bin")
    engine = create_engine(f"{base}/{name}", pool_size=1)
    try:
        upgrade(engine, "0007")
        loaded = fill(engine, rows)
        with engine.connect() as conn:
            kind = conn.exec_driver_sql(
                "SELECT DATA_TYPE FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = "
                "DATABASE() AND TABLE_NAME = 'job_queue' AND COLUMN_NAME = 'payload'"
            ).scalar()
            version = conn.exec_driver_sql("SELECT VERSION()").scalar()
        before = time_searches(engine, rounds)
        migration = upgrade(engine, "0008")
        after = time_searches(engine, rounds)
        return {
            "server": server,
            "version": version,
            "rows": rows,
            "load_s": loaded,
            "column_before": kind,
            "before": before,
            "migration_s": migration,
            "after": after,
        }
    finally:
        engine.dispose()
        with admin.connect() as conn:
            conn.exec_driver_sql(f"DROP DATABASE IF EXISTS `{name}`")
        admin.dispose()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rows", type=int, default=300_000)
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--servers", default="mariadb,mysql,mariadb11")
    args = p.parse_args()
    print(
        "| server | rows | payload column before | search rare p50 / p95 ms before | after | "
        "search common p50 / p95 ms before | after | upgrade 0007 -> 0008 |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for server in args.servers.split(","):
        r = run(server, args.rows, args.rounds)
        b, a = r["before"], r["after"]
        print(
            f"| {server} ({r['version']}) | {r['rows']:,} | {r['column_before']} | "
            f"{b['rare'][0]:.0f} / {b['rare'][1]:.0f} | {a['rare'][0]:.0f} / {a['rare'][1]:.0f} | "
            f"{b['common'][0]:.0f} / {b['common'][1]:.0f} | {a['common'][0]:.0f} / {a['common'][1]:.0f} | "
            f"{r['migration_s']:.1f} s |",
            flush=True,
        )


if __name__ == "__main__":
    main()
