"""What a job costs each server: the same worker configurations on MariaDB 10.11, MySQL 9.7 (binlog
on, `sync_binlog=1`, as Debian's package starts it) and MariaDB 11.8, alternating, with what each
commit makes the server do.

    python -m bench.server_cost --jobs 5000 --rounds 3 [--configs 1x4,2x64] [--servers mariadb,mysql,mariadb11]

Per run (fresh database, N no-op jobs, `jobqueue worker --burst` at the default log level behind the
start gate): jobs/s from the jobs' own timestamps; COMMITs a job counted in the workers; from
`SHOW GLOBAL STATUS` deltas over the run, InnoDB's fsyncs a COMMIT (Innodb_data_fsyncs: every
InnoDB fsync on MariaDB, the redo log's included; on MySQL the redo log's are Innodb_os_log_fsyncs,
which MariaDB does not have), and on MySQL the binary log's syncs
(performance_schema.file_summary_by_event_name, 'wait/io/file/sql/binlog', COUNT_MISC) a COMMIT;
CPU a job, of the workers (os.wait4) and of the server process (found by its listening port, from
/proc): CPU seconds, not wall time. The status counters are global: other clients of the same
server during the run are counted too (the table says the load average).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.pool import NullPool

from bench import common
from bench.common import log

SERVERS = {
    "mariadb": "mysql+pymysql://root@127.0.0.1:3306",
    "mysql": "mysql+pymysql://root@127.0.0.1:3307",
    "mariadb11": "mysql+pymysql://root@127.0.0.1:3308",
}


def server_pid(server_url: str) -> int | None:
    import psutil

    port = sa.engine.make_url(server_url).port or 3306
    for conn in psutil.net_connections(kind="tcp"):
        if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == port and conn.pid:
            return conn.pid
    return None


def counters(server_url: str) -> dict[str, float]:
    engine = sa.create_engine(server_url + "/", poolclass=NullPool)
    try:
        with engine.connect() as conn:
            status = dict(
                conn.exec_driver_sql(
                    "SHOW GLOBAL STATUS WHERE Variable_name IN ('Innodb_os_log_fsyncs', 'Innodb_data_fsyncs')"
                ).all()
            )
            out = {k: float(v) for k, v in status.items()}
            try:
                out["binlog_syncs"] = float(
                    conn.exec_driver_sql(
                        "SELECT COALESCE(SUM(COUNT_MISC), 0) FROM performance_schema.file_summary_by_event_name "
                        "WHERE EVENT_NAME = 'wait/io/file/sql/binlog'"
                    ).scalar()
                )
            except sa.exc.DBAPIError:
                out["binlog_syncs"] = float("nan")  # no performance_schema (MariaDB's default)
            return out
    finally:
        engine.dispose()


def one_run(server: str, procs: int, threads: int, jobs: int, log_dir: Path) -> dict[str, float]:
    base = SERVERS[server]
    common.MYSQL_SERVER = base
    pid = server_pid(base)
    with common.mysql_db(f"cost_{server}") as url:
        common.enqueue_noops(url, jobs)
        run = common.ProcRun([common.worker_cmd(url, threads)] * procs)
        run.start(log_dir)
        before, cpu0 = counters(base), common.cpu_seconds(pid) if pid else float("nan")
        run.wait(900)
        after, cpu1 = counters(base), common.cpu_seconds(pid) if pid else float("nan")
        run.check()
        window = common.db_window(url)
        commits = run.commits or float("nan")

        def delta(name: str) -> float:
            return after.get(name, float("nan")) - before.get(name, float("nan"))

        return {
            "jobs_per_s": window.jobs_per_s,
            "commits_per_job": commits / jobs,
            "redo_fsyncs_per_commit": delta("Innodb_os_log_fsyncs") / commits,
            "data_fsyncs_per_commit": delta("Innodb_data_fsyncs") / commits,
            "binlog_syncs_per_commit": delta("binlog_syncs") / commits,
            "worker_cpu_us_per_job": run.cpu / jobs * 1e6,
            "server_cpu_us_per_job": (cpu1 - cpu0) / jobs * 1e6,
        }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--jobs", type=int, default=5000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--configs", default="1x4,2x64", help="PROCESSESxTHREADS, comma-separated")
    ap.add_argument("--servers", default="mariadb,mysql,mariadb11")
    args = ap.parse_args()
    configs = [tuple(int(x) for x in c.split("x")) for c in args.configs.split(",")]
    servers = args.servers.split(",")
    results: dict[tuple[str, int, int], list[dict[str, float]]] = {}
    load = os.getloadavg()
    with tempfile.TemporaryDirectory() as log_dir:
        try:
            for r in range(args.rounds):
                for procs, threads in configs:
                    for server in servers if r % 2 == 0 else list(reversed(servers)):
                        res = one_run(server, procs, threads, args.jobs, Path(log_dir))
                        results.setdefault((server, procs, threads), []).append(res)
                        log(f"round {r + 1} {server} {procs}x{threads}: {res['jobs_per_s']:,.0f} jobs/s")
        finally:
            common.drop_leftovers()
    print(f"\n{args.jobs} no-op jobs, {args.rounds} rounds, medians; load average at start {load[0]:.2f}")
    print(
        "| server | workers | jobs/s | vs MariaDB 10.11 | COMMITs/job | redo-log fsyncs/COMMIT (MySQL) | InnoDB fsyncs/COMMIT "
        "| binlog syncs/COMMIT | worker CPU us/job | server CPU us/job |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for (server, procs, threads), rs in results.items():
        m = {k: statistics.median(x[k] for x in rs) for k in rs[0]}
        ref = results.get(("mariadb", procs, threads))
        vs = m["jobs_per_s"] / statistics.median(x["jobs_per_s"] for x in ref) if ref else float("nan")
        print(
            f"| {server} | {procs} x {threads} | {m['jobs_per_s']:,.0f} | {vs:.2f}x | {m['commits_per_job']:.3f} "
            f"| {m['redo_fsyncs_per_commit']:.2f} | {m['data_fsyncs_per_commit']:.2f} | {m['binlog_syncs_per_commit']:.2f} "
            f"| {m['worker_cpu_us_per_job']:.0f} | {m['server_cpu_us_per_job']:.0f} |"
        )


if __name__ == "__main__":
    main()
