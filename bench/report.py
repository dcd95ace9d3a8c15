"""docs/benchmarks.md and the PNG plots under docs/bench/, from docs/bench/results.json.

`python -m bench.report [--out docs]` re-renders without measuring anything. The hand-written
notes at the end of <out>/benchmarks.md (from NOTES_HEADING on) are kept as they are, so they
survive a re-render: they live in that one file, nowhere else.
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
    "mysql_peers",  # rendered after "10. Dashboard at 5,000,000 rows"
]


NOT_MEASURED = {
    "mysql_peers": (
        "Not measured yet: the numbers come from the next run on a quiet machine (the shared one here is too loaded "
        "to compare queues). Reproduce with `scripts/bench --only mysql_peers` (every server, 5,000 jobs, 3 rounds; "
        "builds the peers' Python 3.12 venv `.venv-peers/` first, which needs "
        "`apt-get install default-libmysqlclient-dev pkg-config` for mysqlclient), or one server at a time with "
        "`PYTHONPATH=. .venv/bin/python -m bench.mysql_peers --server mariadb --jobs 5000 --rounds 3`. How each system "
        "is run and measured: bench/mysql_peers.py."
    )
}


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
        "mysql_peers": "11. Against the Python queues on MySQL (dj-queue, django-tasks-db, firm-queue, django-q2)",
        "profile": "Profile: where our worker's time goes (py-spy, 4 threads)",
    }
    for name in SCENARIOS:
        if name == "mysql_peers":
            sections.append(_dashboard_at_scale(out_dir, targets))
        res = results.get(name)
        if res is None:
            sections.append(f"## {titles[name]}\n\n{NOT_MEASURED.get(name, 'Not measured in this run.')}")
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
            "mysql_peers": lambda: _mysql_peers(res, targets),
            "profile": lambda: _profile(res),
        }[name]()
        sections.append(f"## {titles[name]}\n\n{meta_line(res)}\n\n{body}")
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
    path = out_dir / "benchmarks.md"
    notes = kept_notes(path)
    tail = [notes] if notes else []
    path.write_text("\n\n".join(header + sections + tail) + "\n")
    return path


NOTES_HEADING = "## Notes on these results"


def kept_notes(path: Path) -> str:
    """The hand-written notes section of an existing report: from NOTES_HEADING to the end ("" if
    there is none)."""
    text = path.read_text() if path.exists() else ""
    at = text.find(NOTES_HEADING)
    return text[at:].strip() if at >= 0 else ""


def _mysql_peers(res: dict, targets: list) -> str:
    from bench import mysql_peers

    targets.extend(mysql_peers.targets(res))
    return mysql_peers.markdown(res)


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
