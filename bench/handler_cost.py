"""What a small handler costs the worker: `jobqueue worker --concurrency 4` over N jobs of a no-op,
of a handler that appends a line to a file (`append_line`, ~3 us, releases the GIL around its
I/O) and of 3 us of pure Python (`spin3`), alternating, R rounds, each on a fresh database.

    python -m bench.handler_cost --jobs 5000 --rounds 3 [--server mysql+pymysql://root@127.0.0.1:3307]

Per run: jobs/s from the jobs' own timestamps (bench/throughput.py's window), COMMITs per job
(counted in the worker), jobs per claim and the worker's CPU per job from the gate to its exit.
Every append_line execution is a line in its file: the run fails if one is missing or doubled.
Prints a table of medians and each handler's ratio to the no-op (issue 29: >= 0.9x).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from bench import common
from bench.common import log

HANDLERS = ("noop", "append_line", "spin3")


def one_run(task: str, jobs: int, threads: int, log_dir: Path) -> dict[str, float]:
    with common.mysql_db("handler") as url, tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "lines"
        out.touch()
        # handler_tasks registers the tasks: enqueue_many checks the task is known.
        import bench.handler_tasks  # noqa: F401

        common.enqueue_noops(url, jobs, task=task)
        run = common.ProcRun(
            [common.worker_cmd(url, threads, tasks="bench.handler_tasks")], env={"BENCH_APPEND_FILE": str(out)}
        )
        run.start(log_dir)
        run.wait(600)
        run.check()
        window = common.db_window(url)
        if task == "append_line":
            lines = [line.split()[0] for line in out.read_text().splitlines()]
            if len(lines) != jobs or len(set(lines)) != jobs:
                raise RuntimeError(f"append_line: {len(lines)} lines, {len(set(lines))} distinct, {jobs} jobs")
        return {
            "jobs_per_s": window.jobs_per_s,
            "commits_per_job": (run.commits or 0) / jobs,
            "jobs_per_claim": window.mean_batch,
            "cpu_us_per_job": run.cpu / jobs * 1e6,
        }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--jobs", type=int, default=5000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=4)
    ap.add_argument(
        "--server", default=None, help="server URL without a database (default: $BENCH_MYSQL or MariaDB :3306)"
    )
    args = ap.parse_args()
    if args.server:
        common.MYSQL_SERVER = args.server.rstrip("/")
    results: dict[str, list[dict[str, float]]] = {h: [] for h in HANDLERS}
    with tempfile.TemporaryDirectory() as log_dir:
        try:
            for r in range(args.rounds):
                order = HANDLERS if r % 2 == 0 else tuple(reversed(HANDLERS))
                for task in order:
                    res = one_run(task, args.jobs, args.threads, Path(log_dir))
                    results[task].append(res)
                    log(f"round {r + 1} {task}: " + ", ".join(f"{k} {v:.2f}" for k, v in res.items()))
        finally:
            common.drop_leftovers()
    med = {h: {k: statistics.median(x[k] for x in rs) for k in rs[0]} for h, rs in results.items()}
    print(f"\n{args.jobs} jobs, 1 worker x {args.threads} threads, {args.rounds} rounds, server {common.MYSQL_SERVER}")
    print("| handler | jobs/s | vs no-op | COMMITs/job | jobs/claim | worker CPU us/job |")
    print("|---|---|---|---|---|---|")
    for h in HANDLERS:
        m = med[h]
        print(
            f"| {h} | {m['jobs_per_s']:,.0f} | {m['jobs_per_s'] / med['noop']['jobs_per_s']:.2f}x "
            f"| {m['commits_per_job']:.3f} | {m['jobs_per_claim']:.1f} | {m['cpu_us_per_job']:.0f} |"
        )


if __name__ == "__main__":
    main()
