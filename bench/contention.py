"""4. Contention: 4 workers while another connection holds FOR UPDATE on the 10 oldest ready rows
for the whole run, against the same run with no holder (alternating).

Measured for `jobqueue worker --concurrency 4` (target: holder/no-holder >= 0.95), for the raw
loop with SKIP LOCKED, and, for contrast, for the raw loop with a plain FOR UPDATE claim (what a
queue without SKIP LOCKED does): its claims queue up behind the held rows and each waits out the
5 s innodb_lock_wait_timeout. With a holder the held 10 jobs can never finish, so the run ends when
the other N-10 are done (or, for the plain claim, after a fixed time).
"""

from __future__ import annotations

import signal
import sys
import time
from typing import Any

import pymysql
import sqlalchemy as sa
from sqlalchemy.pool import NullPool

from bench import common
from bench.common import log
from bench.raw_loop import connect_args

HELD = 10
PLAIN_CAP_S = 15.0  # the plain FOR UPDATE loop with a holder is stopped after this long


class Holder:
    """A connection holding FOR UPDATE on the oldest ready rows, in claim order."""

    def __init__(self, url: str, n: int = HELD):
        self.conn = pymysql.connect(**connect_args(url))
        with self.conn.cursor() as cur:
            cur.execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
            cur.execute(
                "SELECT id FROM job_queue WHERE status = 'ready' AND queue = 'default' "
                "ORDER BY priority, id LIMIT %s FOR UPDATE",
                (n,),
            )
            self.ids = [r[0] for r in cur.fetchall()]

    def release(self) -> None:
        self.conn.rollback()
        self.conn.close()


VARIANTS = {
    "ours": lambda url: [common.worker_cmd(url, 4)],
    "raw skip locked": lambda url: [
        [sys.executable, "-m", "bench.raw_loop", "--url", url, "--threads", "4", "--batch", "1"]
    ],
    "raw plain FOR UPDATE": lambda url: [
        [
            sys.executable,
            "-m",
            "bench.raw_loop",
            "--url",
            url,
            "--threads",
            "4",
            "--batch",
            "1",
            "--no-skip-locked",
            "--max-seconds",
            str(PLAIN_CAP_S),
        ]
    ],
}


def run_one(variant: str, holder: bool, jobs: int, log_dir, plain_cap: float = PLAIN_CAP_S) -> dict[str, Any]:
    with common.mysql_db("ct") as url:
        common.enqueue_noops(url, jobs)
        hold = Holder(url) if holder else None
        try:
            cmds = VARIANTS[variant](url)
            if variant.startswith("raw plain"):
                cmds = [[*c[:-1], str(plain_cap)] for c in cmds]  # the --max-seconds value
            run = common.ProcRun(cmds)
            run.start(log_dir)
            target = jobs - (HELD if holder else 0)
            deadline = time.monotonic() + max(120.0, jobs / 50)
            stopped_early = False
            # The same progress polling with and without a holder, so that it costs both alike.
            done_q = sa.create_engine(url, poolclass=NullPool)
            with done_q.connect() as conn:
                while True:
                    if not run.poll():
                        run.wait(10)
                        break
                    done = conn.exec_driver_sql("SELECT COUNT(*) FROM job_queue WHERE status = 'done'").scalar()
                    conn.rollback()
                    plain_over = (
                        holder and variant.startswith("raw plain") and time.perf_counter() - run.t_gate > plain_cap + 7
                    )
                    if holder and (done >= target or plain_over):
                        # A burst worker keeps retrying contended rows; stop it (SIGTERM: graceful).
                        stopped_early = True
                        run.stop(signal.SIGTERM)
                        break
                    if time.monotonic() > deadline:
                        run.stop(signal.SIGKILL)
                        raise RuntimeError(f"contention {variant} holder={holder}: no end\n{run.log_tail()}")
                    time.sleep(0.25)
            done_q.dispose()
            win = common.db_window(url, claimer_parts=2 if variant == "ours" else 3)
        finally:
            if hold:
                hold.release()
    elapsed = run.t_end - run.t_gate
    rate = win.jobs_per_s if win.done > 1 else 0.0
    if variant.startswith("raw plain") and holder:
        # The window of finished jobs is meaningless when (almost) none finish: count over the run.
        rate = win.done / min(elapsed, plain_cap + 7)
    return {
        "variant": variant,
        "holder": holder,
        "done": win.done,
        "expected": target,
        "jobs_per_s": rate,
        "window_s": win.seconds,
        "elapsed_s": elapsed,
        "stopped": stopped_early,
    }


def run(ctx) -> dict[str, Any]:
    variants = list(VARIANTS)
    samples: dict[str, dict[bool, list[dict]]] = {v: {False: [], True: []} for v in variants}
    rounds = ctx.contention_rounds
    for r in range(rounds):
        for v in variants:
            rounds_plain = 1 if v.startswith("raw plain") else rounds
            if r >= rounds_plain:
                continue
            for holder in (False, True) if r % 2 == 0 else (True, False):
                res = run_one(v, holder, ctx.jobs, ctx.log_dir, plain_cap=6.0 if ctx.quick else PLAIN_CAP_S)
                samples[v][holder].append(res)
                log(
                    f"contention round {r + 1} {v} holder={holder}: {res['jobs_per_s']:.0f} jobs/s ({res['done']} done)"
                )
    out = {}
    for v in variants:
        free = [s["jobs_per_s"] for s in samples[v][False]]
        held = [s["jobs_per_s"] for s in samples[v][True]]
        out[v] = {
            "no_holder_jobs_per_s": common.median(free),
            "holder_jobs_per_s": common.median(held),
            "ratio": common.median([h / f for h, f in zip(held, free)]) if free and held else float("nan"),
            "runs_no_holder": [round(x) for x in free],
            "runs_holder": [round(x) for x in held],
            "done_holder": [s["done"] for s in samples[v][True]],
        }
    return {
        "jobs": ctx.jobs,
        "held": HELD,
        "rounds": rounds,
        "variants": out,
        "target": 0.95,
        "plain_cap_s": 6.0 if ctx.quick else PLAIN_CAP_S,
    }
