"""Run the benchmarks and write the report.

    python -m bench.run                  # everything (about 20-25 minutes here, and mysql_peers
                                         # about as long again: 11 configurations x 3 servers x 3
                                         # rounds), writes docs/
    python -m bench.run --quick          # small counts, a smoke test of the harness (~2 minutes,
                                         # and about 5 more for mysql_peers at 500 jobs),
                                         # writes build/bench-quick/ unless --out is given
    python -m bench.run --only throughput,peers   # some scenarios; merged into the existing results

Scenarios: throughput (1), peers (2), claim_cost (3), contention (4), idle (5), dashboard (6),
memory (7), profile (py-spy of our worker), startup (8), enqueue (9), mysql_peers (11: dj-queue,
django-tasks-db, firm-queue and django-q2 on every MySQL-family server, from a Python 3.12 venv of
their own that bench/peers_venv.py builds; its servers: bench/mysql_peers.py). Servers: MariaDB at $BENCH_MYSQL
(default mysql+pymysql://root@127.0.0.1:3306), PostgreSQL at $BENCH_PG
(postgresql://postgres@127.0.0.1:5432), Redis at $BENCH_REDIS (redis://127.0.0.1:6379/0). Every
database and key it creates is named after this run ("jqb<hex>_...") and dropped again; no server
setting is changed (the idle scenario starts its own private mariadbd for its counters).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import shlex
import signal
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

from bench import common
from bench.common import log

ORDER = [
    "throughput",
    "profile",
    "peers",
    "claim_cost",
    "contention",
    "idle",
    "dashboard",
    "memory",
    "startup",
    "enqueue",
    "mysql_peers",
]


@dataclass
class Context:
    quick: bool
    out_dir: Path
    log_dir: Path
    jobs: int = 5000
    rounds: int = 3
    contention_rounds: int = 5  # the holder/no-holder ratio is close to 1: more pairs
    claim_sizes: list[int] = field(default_factory=lambda: [0, 100_000, 1_000_000])
    memory_jobs: int = 1_000_000  # issue 17: flat over a million jobs
    wake_trials: int = 25
    wake_idle: tuple[float, float] = (2.0, 4.0)
    # Our multi-process candidates for "best configuration" in the peers comparison.
    best_candidates: list[tuple[int, int]] = field(default_factory=lambda: [(2, 8), (1, 32), (2, 16), (2, 32), (2, 64)])

    @classmethod
    def make(cls, quick: bool, out_dir: Path) -> Context:
        log_dir = Path(os.environ.get("BENCH_LOG_DIR", "/tmp")) / f"{common.RUN_TAG}-logs"
        log_dir.mkdir(parents=True, exist_ok=True)
        if not quick:
            return cls(False, out_dir, log_dir)
        return cls(
            True,
            out_dir,
            log_dir,
            jobs=500,
            rounds=1,
            contention_rounds=1,
            claim_sizes=[0, 20_000],
            memory_jobs=3000,
            wake_trials=3,
            wake_idle=(0.5, 1.5),
            best_candidates=[(2, 4)],
        )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="small counts: a smoke test of the harness")
    p.add_argument("--only", default="", help="comma-separated scenarios: " + ",".join(ORDER))
    p.add_argument("--out", default=None, help="report folder (default docs/, or build/bench-quick/ with --quick)")
    a = p.parse_args(argv)
    only = [s.strip() for s in a.only.split(",") if s.strip()] or ORDER
    unknown = set(only) - set(ORDER)
    if unknown:
        p.error(f"unknown scenarios: {', '.join(sorted(unknown))}")
    out_dir = Path(a.out) if a.out else common.REPO / ("build/bench-quick" if a.quick else "docs")
    ctx = Context.make(a.quick, out_dir)
    results_path = out_dir / "bench" / "results.json"
    results: dict = {}
    if a.only and results_path.exists():
        results = json.loads(results_path.read_text())  # --only: update those scenarios, keep the rest
    command = "scripts/bench " + " ".join(shlex.quote(x) for x in (argv if argv is not None else sys.argv[1:]))
    results["_machine"] = common.machine_info()
    results["_run"] = {
        "mode": "quick" if a.quick else "full",
        "command": command.strip(),
        "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
    }

    # Stop cleanly on SIGTERM, and on SIGINT even when started in the background (where SIGINT
    # is inherited as ignored): the finally below stops our workers and drops our databases.
    def _interrupt(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGINT, _interrupt)
    log(f"bench run {common.RUN_TAG}: {', '.join(s for s in ORDER if s in only)} -> {out_dir} (logs {ctx.log_dir})")
    failed = []
    try:
        for name in ORDER:
            if name not in only:
                continue
            mod = importlib.import_module(f"bench.{name}")
            load = common.other_load()
            t0 = time.time()
            log(f"== {name}")
            try:
                res = getattr(mod, "scenario", mod.run)(ctx)
            except Exception as exc:
                traceback.print_exc()
                failed.append(name)
                res = {"error": f"{type(exc).__name__}: {str(exc)[:2000]}"}
            res["_meta"] = {
                "command": command.strip(),
                "run": common.RUN_TAG,
                "date": time.strftime("%Y-%m-%d", time.localtime(t0)),
                "started": time.strftime("%H:%M:%S", time.localtime(t0)),
                "finished": time.strftime("%H:%M:%S"),
                "seconds": time.time() - t0,
                "loadavg_start": load["loadavg"],
                "loadavg_end": os.getloadavg(),
                "busy_at_start": load.get("busy_processes", []),
            }
            results[name] = res
            common.dump_json(results_path, results)  # keep what we have if a later scenario dies
    finally:
        common.drop_leftovers()
    results["_run"]["finished"] = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    common.dump_json(results_path, results)
    from bench import report

    path = report.render(results, out_dir, results["_run"]["command"])
    log(f"report: {path}" + (f" (failed: {', '.join(failed)})" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
