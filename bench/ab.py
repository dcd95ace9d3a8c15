"""Before and after: the worker of another commit against this checkout's, same run, alternating.

    python -m bench.ab --ref 382a9cc --jobs 5000 --rounds 3 --configs 1x1,1x4,1x32,2x32 [--handler append]

For each round and configuration (PROCESSESxTHREADS) each side gets a fresh database made by its
own code (its schema, its enqueue_many), N no-op jobs (or, with `--handler append`, jobs that
append a line to a file: section 11's handler, bench/append_tasks.py), then `jobqueue worker --burst` at the
default log level, run from that side's tree (the order of the sides alternates every round),
its processes started behind the start gate (bench/gate.py). jobs/s: done jobs /
(MAX(finished_at) - MIN(started_at)), the jobs' own timestamps, as in bench/throughput.py;
worker CPU: the workers' CPU seconds (user + system, os.wait4) from the gate to their exit, per
job, so start-up is not counted. The other commit is checked out into a temporary git worktree and
removed afterwards.

With `--steady M` (M > N) each round also runs M jobs, and a second table splits the worker CPU
into what each further job costs, (CPU of the M-job run - CPU of the N-job run) / (M - N), and
what a process spends once from the gate to its exit whatever the job count (compiling its
statements' shapes on first use, registering, shutting down): the N-job run's CPU less N jobs at
that rate, a process.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.common import REPO, ProcRun, db_window, drop_mysql_db

JOBQUEUE = Path(sys.executable).with_name("jobqueue")


def _py(tree: Path, code: str) -> str:
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=tree,
        env={**os.environ, "PYTHONPATH": str(tree)},
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()


# --handler: the task each job runs, and the modules that register it.
HANDLERS = {"noop": ("noop", "bench.gate_tasks"), "append": ("append", "bench.append_tasks,bench.gate_tasks")}


def run_side(tree: Path, jobs: int, procs: int, threads: int, handler: str = "noop") -> tuple[float, float]:
    """(jobs/s in the jobs' own window, worker CPU microseconds a job) for one run."""
    task, modules = HANDLERS[handler]
    url = _py(
        tree,
        f"import {modules}; from bench import common; u = common.create_mysql_db('ab'); "
        f"common.enqueue_noops(u, {jobs}, task={task!r}); print(u)",
    )
    try:
        cmd = [str(JOBQUEUE), "--database-url", url, "worker", "--concurrency", str(threads), "--burst"]
        with tempfile.TemporaryDirectory() as logs:
            env = {"PYTHONPATH": str(tree), "BENCH_APPEND_FILE": str(Path(logs) / "append.txt")}
            run = ProcRun([[*cmd, "--tasks", modules]] * procs, env=env, cwd=tree)
            run.start(Path(logs))
            run.wait(600)
            run.check()
        window = db_window(url)  # the columns it reads are the same on both sides
        if window.done != jobs:
            raise RuntimeError(f"{tree}: {window.done} of {jobs} jobs done")
        return window.jobs_per_s, run.cpu / jobs * 1e6
    finally:
        drop_mysql_db(url)


def split_cpu(
    small: list[tuple[float, float]], large: list[tuple[float, float]], n: int, m: int, procs: int
) -> tuple[float, float]:
    """(worker CPU us a further job, ms a process spends once), medians over rounds, from each
    round's (jobs/s, CPU us a job) of an n-job and an m-job run."""
    rates = [(lg[1] * m - sm[1] * n) / (m - n) for sm, lg in zip(small, large, strict=True)]
    once = [(sm[1] - rate) * n / procs / 1000 for sm, rate in zip(small, rates, strict=True)]
    return statistics.median(rates), statistics.median(once)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ref", required=True, help="the other commit (before)")
    p.add_argument("--jobs", type=int, default=5000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--configs", default="1x1,1x4,1x32,2x32", help="PROCESSESxTHREADS, comma-separated")
    p.add_argument("--steady", type=int, help="also run this many jobs (more than --jobs): CPU a job in steady state")
    p.add_argument(
        "--handler",
        choices=sorted(HANDLERS),
        default="noop",
        help="what each job runs: noop, or append (a line to a file, section 11's handler)",
    )
    a = p.parse_args(argv)
    if a.steady is not None and a.steady <= a.jobs:
        p.error("--steady must be more than --jobs")
    sizes = [a.jobs] + ([a.steady] if a.steady else [])
    configs = [tuple(int(x) for x in c.split("x")) for c in a.configs.split(",")]
    before = Path(tempfile.mkdtemp(prefix="jobqueue-ab-")) / "tree"
    subprocess.run(["git", "worktree", "add", "--detach", "-q", str(before), a.ref], cwd=REPO, check=True)
    sides = {"before": before, "after": REPO}
    results: dict[tuple[int, int, str, int], list[tuple[float, float]]] = {}
    try:
        for r in range(a.rounds):
            for procs, threads in configs:
                for side in list(sides) if r % 2 == 0 else list(reversed(sides)):
                    for jobs in sizes:
                        results.setdefault((procs, threads, side, jobs), []).append(
                            run_side(sides[side], jobs, procs, threads, a.handler)
                        )
            print(f"round {r + 1} of {a.rounds} done", file=sys.stderr, flush=True)
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(before)], cwd=REPO, check=False)
        shutil.rmtree(before.parent, ignore_errors=True)
    what = "no-op jobs" if a.handler == "noop" else "jobs appending a line to a file"
    print(f"{a.jobs:,} {what}, {a.rounds} rounds alternating, before = {a.ref}, after = this checkout")
    print("| configuration | before jobs/s | after jobs/s | ratio | before, worker CPU us/job | after | ratio |")
    print("|---|---|---|---|---|---|---|")
    for procs, threads in configs:
        b, n = results[(procs, threads, "before", a.jobs)], results[(procs, threads, "after", a.jobs)]
        med = [statistics.median(x[i] for x in side) for side in (b, n) for i in (0, 1)]
        print(
            f"| {procs} x {threads} | {med[0]:,.0f} | {med[2]:,.0f} | {med[2] / med[0]:.2f}x | {med[1]:.0f} | "
            f"{med[3]:.0f} | {med[3] / med[1]:.2f}x |"
        )
    if a.steady:
        print(f"\nSteady state: worker CPU a further job between {a.jobs:,} and {a.steady:,} jobs (medians of rounds)")
        print("| configuration | before us/job | after us/job | ratio | before, once a process (ms) | after |")
        print("|---|---|---|---|---|---|")
        for procs, threads in configs:
            per_job, once = zip(
                *(
                    split_cpu(
                        results[(procs, threads, side, a.jobs)],
                        results[(procs, threads, side, a.steady)],
                        a.jobs,
                        a.steady,
                        procs,
                    )
                    for side in sides
                )
            )
            print(
                f"| {procs} x {threads} | {per_job[0]:.0f} | {per_job[1]:.0f} | {per_job[1] / per_job[0]:.2f}x | "
                f"{once[0]:.0f} | {once[1]:.0f} |"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
