"""What the Locks page costs a busy MySQL (issue 24): `python -m bench.lock_inspector --held 100000`.

A fresh database on the suite's MySQL (tests/conftest.py SERVERS["mysql"]) with `held` done jobs
and 20,000 ready jobs in queue `claims`; one connection holds every done row (`SELECT id FROM
job_queue WHERE status = 'done' FOR UPDATE`, left open: about `held` record locks). Then:
- the lock read itself, 10 times each: the inspector's old statement (every record lock on
  job_queue in performance_schema.data_locks joined to threads, LIMIT 5000) and the new
  `repository.locks.lock_report` (INNODB_TRX first, data_locks by transaction id with LIMIT and
  MAX_EXECUTION_TIME, then the transaction's details), and `repository.locks.row_lock` of a held job;
- a claim loop (one thread: `service.claim` of 1 job from `claims`, then `complete`, each its
  own short transaction) for `seconds` s alone, then while another connection runs the old
  statement back to back, then while it runs `lock_report` back to back: claims per second.
"""

from __future__ import annotations

import argparse
import threading
import time
import uuid

import sqlalchemy as sa
from sqlalchemy.pool import NullPool

from bench.common import median
from bench.payload_column import fill
from jobqueue.core import migrate, repository, service
from jobqueue.core.db import create_engine
from testkit.sql import seq_rows
from tests.conftest import SERVERS

OLD = (
    "SELECT t.PROCESSLIST_ID, l.INDEX_NAME, l.LOCK_DATA, l.LOCK_STATUS FROM performance_schema.data_locks l "
    "JOIN performance_schema.threads t ON t.THREAD_ID = l.THREAD_ID "
    "WHERE l.OBJECT_SCHEMA = DATABASE() AND l.OBJECT_NAME = 'job_queue' AND l.LOCK_TYPE = 'RECORD' "
    "AND t.PROCESSLIST_ID <> CONNECTION_ID() LIMIT 5000"
)


def timed(fn, n: int = 10) -> tuple[float, float]:
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1000)
    return median(times), max(times)


def claim_rate(engine, seconds: float, poll=None) -> float:
    stop = threading.Event()

    def poller():
        with engine.connect() as conn:
            while not stop.is_set():
                poll(conn)
                conn.rollback()

    thread = threading.Thread(target=poller) if poll else None
    if thread:
        thread.start()
    done = 0
    with engine.connect() as conn:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            for job in service.claim(conn, "bench-claimer", 1, ["claims"], lease_seconds=60):
                service.complete(conn, job.lease)
                done += 1
    stop.set()
    if thread:
        thread.join()
    return done / seconds


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--held", type=int, default=100_000)
    p.add_argument("--seconds", type=float, default=10)
    args = p.parse_args()
    base = SERVERS["mysql"]
    name = f"jqb_locks_{uuid.uuid4().hex[:8]}"
    admin = sa.create_engine(base + "/", poolclass=NullPool)
    with admin.connect() as conn:
        conn.exec_driver_sql(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4 COLLATE utf8mb4_bin")
    engine = create_engine(f"{base}/{name}", pool_size=4)
    holder = None
    try:
        migrate.init_db(engine)
        fill(engine, args.held)
        with engine.begin() as conn:
            conn.exec_driver_sql(
                "INSERT INTO job_queue (task_key, task_name, queue, priority, payload, status, run_at, attempts, "
                "max_attempts, created_at, updated_at) SELECT CONCAT('c:', seq), 'noop', 'claims', 0, '{}', 'ready', "
                f"UTC_TIMESTAMP(6), 0, 5, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6) FROM {seq_rows(20_000)}"
            )
        holder = engine.connect()
        holder.exec_driver_sql("SELECT id FROM job_queue WHERE status = 'done' FOR UPDATE").all()
        held_job = holder.exec_driver_sql("SELECT MIN(id) FROM job_queue").scalar()
        with engine.connect() as conn:
            locked = conn.exec_driver_sql("SELECT MAX(trx_rows_locked) FROM information_schema.INNODB_TRX").scalar()
            old = timed(lambda: (conn.exec_driver_sql(OLD).all(), conn.rollback()))
            new = timed(lambda: repository.locks.lock_report(conn))
            one = timed(lambda: repository.locks.row_lock(conn, held_job))
            shown = repository.locks.lock_report(conn)
        print(f"MySQL, one transaction holding {locked:,} row locks on job_queue ({args.held:,} done rows)")
        print(f"- old statement (all of data_locks + threads, LIMIT 5000): median {old[0]:.0f} ms, max {old[1]:.0f} ms")
        print(
            f"- lock_report now: median {new[0]:.0f} ms, max {new[1]:.0f} ms; "
            f"{len(shown.transactions)} transaction(s), {shown.unavailable or 'read'}"
        )
        print(f"- row_lock (explain) of a held job: median {one[0]:.0f} ms, max {one[1]:.0f} ms")
        alone = claim_rate(engine, args.seconds)
        with_old = claim_rate(engine, args.seconds, lambda c: c.exec_driver_sql(OLD).all())
        with_new = claim_rate(engine, args.seconds, repository.locks.lock_report)
        print(
            f"- claim + complete loop: alone {alone:.0f}/s, while the old statement polls {with_old:.0f}/s, "
            f"while lock_report polls {with_new:.0f}/s"
        )
    finally:
        if holder is not None:
            holder.close()
        engine.dispose()
        with admin.connect() as conn:
            conn.exec_driver_sql(f"DROP DATABASE IF EXISTS `{name}`")
        admin.dispose()


if __name__ == "__main__":
    main()
