"""docs/benchmarks.md and the PNG plots under docs/bench/, from docs/bench/results.json.

`python -m bench.report [--out docs]` re-renders without measuring anything. Hand-written notes in
<out>/bench/notes.md (if present) are appended as they are, so they survive a re-render.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from bench.report_format import _fmt, meta_line, table, verdict
from bench.report_queue import _claim_cost, _contention, _idle, _memory, _peers, _profile, _throughput
from bench.report_web import _dashboard, _dashboard_at_scale, _enqueue, _startup

SCENARIOS = [
    "throughput",
    "peers",
    "claim_cost",
    "contention",
    "idle",
    "dashboard",
    "memory",
    "startup",
    "enqueue",
    "profile",
]


def render(results: dict, out_dir: Path, command: str) -> Path:
    plots = out_dir / "bench"
    plots.mkdir(parents=True, exist_ok=True)
    targets: list[tuple[str, str, bool | None]] = []
    best: dict = {}
    sections = []
    titles = {
        "throughput": "1. Worker throughput vs the ceiling (raw PyMySQL loop)",
        "peers": "2. Against peers (procrastinate, pgqueuer, RQ), same machine, same run",
        "claim_cost": "3. Claim cost as finished rows pile up",
        "contention": "4. Contention: 10 ready rows held FOR UPDATE by another connection",
        "idle": "5. Idle cost and wake-up latency",
        "dashboard": "6. Dashboard",
        "memory": "7. Memory",
        "startup": "8. Start-up",
        "enqueue": "9. Batch enqueue against a hand-written INSERT and pgqueuer",
        "profile": "Profile: where our worker's time goes (py-spy, 4 threads)",
    }
    for name in SCENARIOS:
        res = results.get(name)
        if res is None:
            sections.append(f"## {titles[name]}\n\nNot measured in this run.")
            continue
        if "error" in res:
            sections.append(f"## {titles[name]}\n\nThe scenario failed: `{res['error']}`")
            continue
        body = {
            "throughput": lambda: _throughput(res, plots, targets),
            "peers": lambda: _peers(res, plots, targets, best),
            "claim_cost": lambda: _claim_cost(res, plots, targets),
            "contention": lambda: _contention(res, plots, targets),
            "idle": lambda: _idle(res, plots, targets),
            "dashboard": lambda: _dashboard(res, targets),
            "memory": lambda: _memory(res, plots, targets),
            "startup": lambda: _startup(res, targets),
            "enqueue": lambda: _enqueue(res, targets),
            "profile": lambda: _profile(res),
        }[name]()
        sections.append(f"## {titles[name]}\n\n{meta_line(res)}\n\n{body}")
    sections.append(_dashboard_at_scale(out_dir, targets))
    info = results.get("_machine", {})
    summary = table(["target", "measured", "result"], [[t, m, verdict(ok)] for t, m, ok in targets])
    passed = sum(1 for *_, ok in targets if ok)
    failed = sum(1 for *_, ok in targets if ok is False)
    header = [
        "# Benchmarks",
        f"Last updated by `{command}` ({results.get('_run', {}).get('mode', '?')} mode), "
        f"{results.get('_run', {}).get('finished', '?')}; each section says which run measured it. Re-render "
        "without measuring: `python -m bench.report`. Raw numbers: [bench/results.json](bench/results.json).",
        "**How to read this.** The machine has 2 cores and is shared with other sessions' work (tests and servers "
        "of other worktrees run on it, on the same MariaDB), so absolute numbers drift from minute to minute. Every "
        "comparison is therefore a ratio of runs made side by side in the same run, alternating, and every figure "
        "is a median over rounds. The conditions of each scenario are noted under its heading.",
        "Machine: "
        + ", ".join(f"{k} {_fmt(v)}" for k, v in info.items() if k not in ("packages",))
        + ". Packages: "
        + ", ".join(f"{k} {v}" for k, v in info.get("packages", {}).items())
        + ".",
        f"## Targets\n\n{passed} pass, {failed} fail.\n\n{summary}",
    ]
    notes = plots / "notes.md"
    tail = [notes.read_text().strip()] if notes.exists() else []
    path = out_dir / "benchmarks.md"
    path.write_text("\n\n".join(header + sections + tail) + "\n")
    return path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Re-render the benchmark report from results.json")
    p.add_argument("--out", default="docs")
    a = p.parse_args(argv)
    out = Path(a.out)
    results = json.loads((out / "bench" / "results.json").read_text())
    print(render(results, out, results.get("_run", {}).get("command", "scripts/bench")))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
