"""The client's side of batch enqueue: `service.enqueue_many` in batches of 1,000 on one
connection, in this process, rows/s and this process's CPU a row (time.process_time), plus the
connection's TLS version. For finding where enqueue time goes on one server against another.

    python -m bench.enqueue_client --server mysql+pymysql://root@127.0.0.1:3307 [--query '?ssl_disabled=true']
"""

from __future__ import annotations

import argparse
import os
import time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--server", default=None, help="server URL without a database (default: $BENCH_MYSQL or :3306)")
    ap.add_argument("--query", default="", help="appended to the database URL, e.g. ?ssl_disabled=true")
    ap.add_argument("--rows", type=int, default=50_000)
    a = ap.parse_args()
    if a.server:
        os.environ["BENCH_MYSQL"] = a.server
    import bench.handler_tasks  # noqa: F401 - registers the task enqueue_many checks
    from bench import common
    from jobqueue.core import service
    from jobqueue.core.db import create_engine

    rows = [{"task": "noop", "task_key": f"k{i}", "payload": {"n": i}} for i in range(a.rows)]
    with common.mysql_db("enqclient") as url:
        engine = create_engine(url + a.query)
        with engine.connect() as conn:
            tls = conn.exec_driver_sql("SHOW SESSION STATUS LIKE 'Ssl_version'").fetchall()
            conn.commit()  # else each batch below runs in that read's transaction, in a savepoint
            service.enqueue_many(conn, rows[:1000])  # warm: the connection's first questions
            t, cpu = time.perf_counter(), time.process_time()
            for lo in range(1000, a.rows, 1000):
                service.enqueue_many(conn, rows[lo : lo + 1000])
            n = a.rows - 1000
            wall, cpu = time.perf_counter() - t, time.process_time() - cpu
        engine.dispose()
    print(f"{common.MYSQL_SERVER}{a.query}: {n / wall:,.0f} rows/s, client CPU {cpu / n * 1e6:.1f} us a row, TLS {tls}")


if __name__ == "__main__":
    main()
