"""Worker CPU per no-op job with each MySQL driver: PyMySQL (the default) and mysqlclient
(`mysql+mysqldb://`, the optional extra). Counts CPU seconds of the worker process from its start
gate to its exit (os.wait4), not wall time: CPU per job barely moves when other processes load the
machine, where jobs per second do. The drivers alternate within each round, on a fresh database
per run.

    python -m bench.drivers --server mariadb --jobs 10000 --rounds 3
    python -m bench.drivers --server mysql --jobs 10000 --rounds 3

Prints each run, then the median CPU per job of each driver and mysqlclient's ratio to PyMySQL
(of the medians, and round by round: the two runs of a round see about the same load)."""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from bench import common

SERVERS = {"mariadb": "mysql+pymysql://root@127.0.0.1:3306", "mysql": "mysql+pymysql://root@127.0.0.1:3307"}
DRIVERS = ("pymysql", "mysqldb")


def run_one(driver: str, jobs: int, concurrency: int, log_dir: Path) -> float:
    """Worker CPU microseconds per job for one burst over `jobs` ready no-op jobs."""
    with common.mysql_db(f"drv_{driver}") as url:
        common.enqueue_noops(url, jobs)
        worker_url = url.replace("+pymysql://", f"+{driver}://", 1)
        run = common.ProcRun([common.worker_cmd(worker_url, concurrency)])
        run.start(log_dir)
        run.wait(max(120.0, jobs / 20))
        run.check()
        counts = common.count_status(url)
    if counts != {"done": jobs}:
        raise RuntimeError(f"{driver}: expected {jobs} done, got {counts}\n{run.log_tail()}")
    return run.cpu / jobs * 1e6


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--server", choices=sorted(SERVERS), default="mariadb")
    parser.add_argument("--url", help="a server URL without a database (overrides --server)")
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=4)
    args = parser.parse_args(argv)
    common.MYSQL_SERVER = args.url or SERVERS[args.server]
    results: dict[str, list[float]] = {d: [] for d in DRIVERS}
    with tempfile.TemporaryDirectory(prefix="bench-drivers-") as tmp:
        try:
            for r in range(args.rounds):
                order = DRIVERS if r % 2 == 0 else DRIVERS[::-1]
                for driver in order:
                    us = run_one(driver, args.jobs, args.concurrency, Path(tmp))
                    results[driver].append(us)
                    common.log(f"round {r + 1} {driver}: {us:.1f} us CPU/job")
        finally:
            common.drop_leftovers()
    med = {d: common.median(xs) for d, xs in results.items()}
    print(f"server {common.MYSQL_SERVER}, {args.jobs} no-op jobs, worker --concurrency {args.concurrency} --burst")
    for d in DRIVERS:
        runs = ", ".join(f"{x:.1f}" for x in results[d])
        print(f"  {d:8} worker CPU {med[d]:6.1f} us/job (median of {runs})")
    paired = [common.ratio(m, p) for m, p in zip(results["mysqldb"], results["pymysql"])]
    print(
        f"  mysqldb / pymysql = {common.ratio(med['mysqldb'], med['pymysql']):.2f} of the medians; "
        f"round by round {', '.join(f'{r:.2f}' for r in paired)} (median {common.median(paired):.2f})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
