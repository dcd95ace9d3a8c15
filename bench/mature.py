"""What issue 13's features cost, measured (ratios printed; nothing here asserts a speed):

    python -m bench.mature                     # all three, about 10-15 minutes on 2 busy cores
    python -m bench.mature --quick             # small counts, a smoke run (~3 minutes)
    python -m bench.mature --only pause,limits,prune

- pause: claim throughput with pause support (as shipped: the ready-queue list and the
  empty-claim read leave paused queues out; a worker with --queues reads the paused set every
  second) against the same worker with it switched off (bench/mature_tasks.py, BENCH_NO_PAUSE=1),
  for a worker on every queue and one with --queues; alternating runs, fresh database each.
- limits: throughput of no-op jobs without a concurrency key, and with one (limit 1) over many
  keys (never full: the cost of the key lock and count), 100 keys, and 5 keys (bounded by design
  to 5 at once); also without ix_concurrency, to show unkeyed jobs do not pay for it.
- prune: workers claiming while `jobqueue prune` deletes 200,000 done rows (20,000 with --quick)
  in batches of 1,000 with pauses, against the same run without the prune: jobs/s over the time
  the prune ran (finished_at from the database), ratio target >= 0.8.

Results: docs/bench/mature.json (or --out) and one line per measurement on stderr.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pymysql
import sqlalchemy as sa
from sqlalchemy.pool import NullPool

from bench import common
from bench.common import log
from bench.raw_loop import connect_args
from jobqueue.core import repository, service
from jobqueue.core.db import create_engine
from jobqueue.core.task_modules import load_task_modules

load_task_modules(["bench.mature_tasks"])
TASKS = "bench.mature_tasks,bench.gate_tasks"


def enqueue(url: str, n: int, *, task: str = "noop", keys: int | None = None, prefix: str = "j") -> None:
    engine = create_engine(url, pool_size=1)
    try:
        with engine.connect() as conn:
            for lo in range(0, n, 1000):
                specs = []
                for i in range(lo, min(n, lo + 1000)):
                    spec: dict[str, Any] = {"task": task, "task_key": f"{prefix}{i}"}
                    if keys is not None:
                        spec["payload"] = {"k": i % keys}
                    specs.append(spec)
                service.enqueue_many(conn, specs)
    finally:
        engine.dispose()


def run_workers(
    url: str,
    procs: int,
    threads: int,
    log_dir: Path,
    *,
    env: dict | None = None,
    extra: tuple[str, ...] = (),
    timeout: float = 600,
) -> common.ProcRun:
    run = common.ProcRun([common.worker_cmd(url, threads, *extra, tasks=TASKS)] * procs, env=env or {})
    run.start(log_dir)
    return run


def measure(url: str, procs: int, threads: int, log_dir: Path, jobs: int, **kw) -> dict[str, Any]:
    run = run_workers(url, procs, threads, log_dir, **kw)
    run.wait(max(180.0, jobs / 20))
    run.check()
    win = common.db_window(url)
    if win.done != jobs:
        raise RuntimeError(f"expected {jobs} done, got {win.done}\n{run.log_tail()}")
    return {"jobs_per_s": win.jobs_per_s, "cpu_ms_per_job": run.cpu / jobs * 1000}


# --- pause support ---------------------------------------------------------------------------------


def bench_pause(ctx) -> dict[str, Any]:
    variants = {
        "every queue, pause support": ({}, ()),
        "every queue, no pause support": ({"BENCH_NO_PAUSE": "1"}, ()),
        "--queues default, pause support": ({}, ("--queues", "default")),
        "--queues default, no pause support": ({"BENCH_NO_PAUSE": "1"}, ("--queues", "default")),
    }
    samples: dict[str, list[float]] = {k: [] for k in variants}
    for r in range(ctx.rounds):
        for name in list(variants) if r % 2 == 0 else list(reversed(variants)):
            env, extra = variants[name]
            with common.mysql_db("pause") as url:
                enqueue(url, ctx.jobs)
                res = measure(url, 1, 8, ctx.log_dir, ctx.jobs, env=env, extra=extra)
            samples[name].append(res["jobs_per_s"])
            log(f"pause round {r + 1}/{ctx.rounds} {name}: {res['jobs_per_s']:.0f} jobs/s")
    out = {
        "jobs": ctx.jobs,
        "threads": 8,
        "samples": samples,
        "median_jobs_per_s": {k: common.median(v) for k, v in samples.items()},
        "statement_us": statement_costs(ctx),
    }
    for shape in ("every queue", "--queues default"):
        with_, without = samples[f"{shape}, pause support"], samples[f"{shape}, no pause support"]
        out[f"ratio {shape}"] = common.median([a / b for a, b in zip(with_, without)])
        log(
            f"pause support, {shape}: {common.median(with_):.0f} vs {common.median(without):.0f} jobs/s, "
            f"ratio {out[f'ratio {shape}']:.3f}"
        )
    return out


def statement_costs(ctx) -> dict[str, float]:
    """Median microseconds of the statements pause support changed or added, with and without it,
    in this process (less noisy than whole runs): the ready-queue list and the paused set (each
    read at most once a second per worker) and the empty-claim read (once per empty claim)."""
    import importlib
    import statistics

    from bench import mature_tasks

    claim = importlib.import_module("jobqueue.core.repository.claim")  # the package's `claim` is the verb

    out: dict[str, float] = {}
    n = 300 if ctx.quick else 2000
    names = ("ready_queues", "paused_queues", "classify_statement")
    saved = {(m, k): getattr(m, k) for m in (repository, claim) for k in names}
    with common.mysql_db("stmt") as url:
        enqueue(url, 200)
        repository_engine = create_engine(url, pool_size=1)
        with repository_engine.connect() as conn:
            service.pause_queue(conn, "elsewhere", actor="bench")
        for label in ("pause support", "no pause support"):
            if label == "no pause support":
                mature_tasks._without_pause_support()
            with repository_engine.connect() as conn:
                for name, fn in (
                    ("ready_queues", lambda: claim.ready_queues(conn)),
                    ("paused_queues", lambda: claim.paused_queues(conn)),
                    ("classify", lambda: conn.execute(claim.classify_statement(["default"])).one() and conn.commit()),
                ):
                    times = []
                    for _ in range(n):
                        t = time.perf_counter()
                        fn()
                        times.append((time.perf_counter() - t) * 1e6)
                    out[f"{name}, {label}"] = statistics.median(times)
        for (module, name), fn in saved.items():
            setattr(module, name, fn)
        repository_engine.dispose()
    for name in ("ready_queues", "paused_queues", "classify"):
        log(
            f"statement {name}: {out[f'{name}, pause support']:.0f} us with pause support, "
            f"{out[f'{name}, no pause support']:.0f} us without"
        )
    return out


# --- concurrency limits --------------------------------------------------------------------------


def bench_limits(ctx) -> dict[str, Any]:
    jobs = ctx.jobs
    variants = {
        "no key": {"task": "noop"},
        "no key, without ix_concurrency": {"task": "noop", "drop_index": True},
        f"key per job ({jobs} keys), limit 1": {"task": "keyed_noop", "keys": jobs},
        "100 keys, limit 1": {"task": "keyed_noop", "keys": 100},
        # Bounded by design to 5 jobs at once: fewer jobs, or this one run takes minutes.
        "5 keys, limit 1": {"task": "keyed_noop", "keys": 5, "jobs": min(jobs, 2000)},
    }
    shapes = [(1, 8), (3, 8)]
    samples: dict[str, list[float]] = {f"{p}x{t} {k}": [] for p, t in shapes for k in variants}
    for r in range(ctx.limit_rounds):
        for p, t in shapes:
            names = list(variants) if r % 2 == 0 else list(reversed(variants))
            for name in names:
                v = variants[name]
                with common.mysql_db("limits") as url:
                    if v.get("drop_index"):
                        with pymysql.connect(**{**connect_args(url), "autocommit": True}) as conn, conn.cursor() as cur:
                            cur.execute("ALTER TABLE job_queue DROP INDEX ix_concurrency")
                    n = v.get("jobs", jobs)
                    enqueue(url, n, task=v["task"], keys=v.get("keys"))
                    res = measure(url, p, t, ctx.log_dir, n)
                key = f"{p}x{t} {name}"
                samples[key].append(res["jobs_per_s"])
                log(f"limits round {r + 1}/{ctx.limit_rounds} {key}: {res['jobs_per_s']:.0f} jobs/s")
    med = {k: common.median(v) for k, v in samples.items()}
    out: dict[str, Any] = {
        "jobs": jobs,
        "samples": samples,
        "median_jobs_per_s": med,
        "ratios_to_no_key": {},
        "claim_loop": claim_loop(ctx),
    }
    for p, t in shapes:
        base = f"{p}x{t} no key"
        for name in variants:
            key = f"{p}x{t} {name}"
            out["ratios_to_no_key"][key] = common.ratio(med[key], med[base])
            log(f"limits {key}: {med[key]:.0f} jobs/s, {out['ratios_to_no_key'][key]:.3f}x of no key")
    return out


def claim_loop(ctx) -> dict[str, Any]:
    """The claim path alone, in this process, on one connection: cycles of the worker's shape
    (complete what the last cycle took, claim 8 more, one transaction), no handler, alternating
    variants. Less noisy than whole runs on a shared machine."""
    n = 2000 if ctx.quick else 6000
    variants = {
        "no key": ("noop", None),
        "no key, without ix_concurrency": ("noop", None),
        "key per job, limit 1": ("keyed_noop", n),
        "100 keys, limit 1": ("keyed_noop", 100),
        "5 keys, limit 1": ("keyed_noop", 5),
    }
    samples: dict[str, list[float]] = {k: [] for k in variants}
    for r in range(ctx.rounds):
        for name in list(variants) if r % 2 == 0 else list(reversed(variants)):
            task, keys = variants[name]
            with common.mysql_db("claimloop") as url:
                if "without" in name:
                    with pymysql.connect(**{**connect_args(url), "autocommit": True}) as conn, conn.cursor() as cur:
                        cur.execute("ALTER TABLE job_queue DROP INDEX ix_concurrency")
                enqueue(url, n, task=task, keys=keys)
                engine = create_engine(url, pool_size=1)
                try:
                    with engine.connect() as conn:
                        owners = [f"bench:1:{i}" for i in range(8)]
                        done, held, t0 = 0, [], time.perf_counter()
                        while done < n:
                            cycle = service.claim_cycle(
                                conn, owners if not held else [], ["default"], lease_seconds=60, completions=held
                            )
                            done += sum(1 for o in cycle.completed.values() if o.value == "ok")
                            held = [c.lease for c in cycle.claimed]
                            if not held and done < n and not cycle.completed:
                                raise RuntimeError(f"{name}: nothing claimed with {n - done} jobs left")
                        rate = n / (time.perf_counter() - t0)
                finally:
                    engine.dispose()
            samples[name].append(rate)
            log(f"claim loop round {r + 1}/{ctx.rounds} {name}: {rate:.0f} jobs/s")
    med = {k: common.median(v) for k, v in samples.items()}
    for name in variants:
        log(f"claim loop {name}: {med[name]:.0f} jobs/s, {med[name] / med['no key']:.3f}x of no key")
    return {
        "jobs": n,
        "samples": samples,
        "median_jobs_per_s": med,
        "ratios_to_no_key": {k: med[k] / med["no key"] for k in variants},
    }


# --- pruning while claiming ------------------------------------------------------------------------


def load_done(url: str, n: int, days_ago: float = 10.0) -> None:
    """n done rows finished `days_ago` days ago, each with one attempt row."""
    conn = pymysql.connect(**connect_args(url))
    when = datetime.utcnow() - timedelta(days=days_ago)
    try:
        with conn.cursor() as cur:
            for lo in range(0, n, 20_000):
                rows = [
                    (
                        f"old-{i}",
                        "noop",
                        "default",
                        0,
                        "{}",
                        "done",
                        when,
                        f"old:1:{i % 8}",
                        1,
                        5,
                        when,
                        when,
                        when,
                        when,
                    )
                    for i in range(lo, min(n, lo + 20_000))
                ]
                cur.executemany(
                    "INSERT INTO job_queue (task_key, task_name, queue, priority, payload, status, run_at, lease_owner, "
                    "attempts, max_attempts, started_at, created_at, updated_at, finished_at) "
                    "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
                    rows,
                )
                conn.commit()
            cur.execute(
                "INSERT INTO job_attempt (job_id, attempt, worker, started_at, finished_at, outcome, error) "
                "SELECT id, 1, lease_owner, started_at, finished_at, 'retry', 'old' FROM job_queue"
            )
            conn.commit()
    finally:
        conn.close()


def window_rate(url: str, start: datetime, end: datetime) -> float:
    engine = sa.create_engine(url, poolclass=NullPool)
    try:
        with engine.connect() as conn:
            n = conn.execute(
                sa.text(
                    "SELECT COUNT(*) FROM job_queue WHERE status='done' AND task_key LIKE 'j%' "
                    "AND finished_at >= :a AND finished_at < :b"
                ),
                {"a": start, "b": end},
            ).scalar()
        return n / max(1e-9, (end - start).total_seconds())
    finally:
        engine.dispose()


def bench_prune(ctx) -> dict[str, Any]:
    rows, jobs = ctx.prune_rows, ctx.prune_jobs
    runs: dict[str, list[dict[str, Any]]] = {"with prune": [], "without prune": []}
    for r in range(ctx.prune_rounds):
        for variant in ["with prune", "without prune"] if r % 2 == 0 else ["without prune", "with prune"]:
            with common.mysql_db("prune") as url:
                load_done(url, rows)
                enqueue(url, jobs)
                # The workers' own retention is off (keep forever): only the measured prune deletes.
                work = run_workers(
                    url, 2, 8, ctx.log_dir, env={"JOBQUEUE_KEEP_DONE_DAYS": "0", "JOBQUEUE_KEEP_FAILED_DAYS": "0"}
                )
                t0 = time.monotonic()
                first_claim = None
                prune_result: dict[str, Any] = {}
                if variant == "with prune":
                    time.sleep(1.0)  # the workers are claiming
                    out = subprocess.run(
                        [
                            *common.jobqueue_cmd(),
                            "--database-url",
                            url,
                            "--log-level",
                            "WARNING",
                            "prune",
                            "--done-older-than",
                            "7",
                        ],
                        capture_output=True,
                        text=True,
                        env=common.child_env(),
                        timeout=900,
                    )
                    if out.returncode != 0:
                        raise RuntimeError(f"prune failed: {out.stderr}")
                    prune_result = json.loads(out.stdout)
                work.wait(max(300.0, jobs / 20))
                work.check()
                engine = sa.create_engine(url, poolclass=NullPool)
                with engine.connect() as conn:
                    first_claim = conn.execute(
                        sa.text("SELECT MIN(started_at) FROM job_queue WHERE task_key LIKE 'j%'")
                    ).scalar()
                    last = conn.execute(
                        sa.text("SELECT started_at, finished_at FROM prune_run ORDER BY id DESC LIMIT 1")
                    ).first()
                    left = conn.execute(sa.text("SELECT COUNT(*) FROM job_queue WHERE task_key LIKE 'old-%'")).scalar()
                engine.dispose()
                if variant == "with prune":
                    start, end = last.started_at, last.finished_at
                    if left:
                        raise RuntimeError(f"{left} old rows left after the prune")
                else:
                    # The same stretch of the run as the prune run measured (from 1 s after the first claim).
                    other = runs["with prune"][-1] if runs["with prune"] else None
                    length = other["window_s"] if other else 20.0
                    start = first_claim + timedelta(seconds=1.0)
                    end = start + timedelta(seconds=length)
                rate = window_rate(url, start, end)
                res = {
                    "jobs_per_s": rate,
                    "window_s": (end - start).total_seconds(),
                    "prune": prune_result,
                    "wall_s": time.monotonic() - t0,
                }
                runs[variant].append(res)
                log(
                    f"prune round {r + 1}/{ctx.prune_rounds} {variant}: {rate:.0f} jobs/s over "
                    f"{res['window_s']:.1f} s"
                    + (
                        f" (pruned {prune_result.get('done')} rows in {prune_result.get('seconds')} s)"
                        if prune_result
                        else ""
                    )
                )
    # Pair each with-prune run with the without-prune run of the same round.
    ratios = [a["jobs_per_s"] / b["jobs_per_s"] for a, b in zip(runs["with prune"], runs["without prune"])]
    out = {
        "rows": rows,
        "jobs": jobs,
        "workers": "2 x 8 threads",
        "runs": runs,
        "ratios": ratios,
        "ratio": common.median(ratios),
        "target": 0.8,
    }
    log(f"prune: throughput while pruning {rows} rows is {out['ratio']:.3f}x of the run without (target >= 0.8)")
    return out


class Ctx:
    def __init__(self, quick: bool):
        self.quick = quick
        self.jobs = 1500 if quick else 10000
        self.rounds = 1 if quick else 5
        self.limit_rounds = 1 if quick else 3
        self.prune_rows = 20_000 if quick else 200_000
        self.prune_jobs = 15_000 if quick else 90_000
        self.prune_rounds = 1 if quick else 2
        self.log_dir = Path("/tmp") / f"{common.RUN_TAG}-logs"
        self.log_dir.mkdir(parents=True, exist_ok=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.mature", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--only", default="pause,limits,prune")
    parser.add_argument("--out", default=None, help="results JSON (default docs/bench/mature.json; none with --quick)")
    args = parser.parse_args(argv)
    ctx = Ctx(args.quick)
    out_path = Path(args.out) if args.out else (None if args.quick else common.REPO / "docs" / "bench" / "mature.json")
    results: dict[str, Any] = json.loads(out_path.read_text()) if out_path and out_path.exists() else {}
    results["machine"] = common.machine_info()
    try:
        for name in args.only.split(","):
            results[name] = {"pause": bench_pause, "limits": bench_limits, "prune": bench_prune}[name](ctx)
            results[name]["measured_at"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
            if out_path:
                out_path.write_text(json.dumps(results, indent=1, default=str))
    finally:
        common.drop_leftovers()
    for name in args.only.split(","):
        r = results[name]
        if name == "pause":
            print(
                f"pause support: ratio {r['ratio every queue']:.3f} (every queue), "
                f"{r['ratio --queues default']:.3f} (--queues)"
            )
        elif name == "limits":
            for k, v in r["ratios_to_no_key"].items():
                print(f"limits {k}: {r['median_jobs_per_s'][k]:.0f} jobs/s, {v:.3f}x")
        else:
            print(
                f"prune: {r['ratio']:.3f}x of the throughput without pruning (runs {[round(x, 3) for x in r['ratios']]})"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
