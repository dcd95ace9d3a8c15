"""Formatting shared by the benchmark report's sections: numbers, verdicts, markdown tables."""

from __future__ import annotations

import math
from typing import Any


def n0(x: Any) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "n/a"
    return f"{x:,.0f}"


def n2(x: Any) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "n/a"
    return f"{x:.2f}"


def pct(x: float) -> str:
    return f"{100 * x:.0f}%"


def verdict(ok: bool | None) -> str:
    return "n/a" if ok is None else ("**PASS**" if ok else "**FAIL**")


def _fmt(v: Any) -> str:
    if isinstance(v, (list, tuple)):
        return "/".join(_fmt(x) for x in v)
    if isinstance(v, float):
        return f"{v:.2f}"
    return str(v)


def table(head: list[str], rows: list[list[Any]]) -> str:
    out = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


def meta_line(res: dict) -> str:
    m = res.get("_meta", {})
    if not m:
        return ""
    busy = m.get("busy_at_start") or []
    busy_s = "; ".join(f"{p:.0f}% {cmd}" for p, cmd in busy[:4]) or "none above 5%"
    by = f" by `{m['command']}`" if m.get("command") else ""
    return (
        f"_Measured {m.get('date', '')} {m.get('started')} to {m.get('finished')} UTC ({m.get('seconds', 0):.0f} s){by}; "
        f"load average at "
        f"start {', '.join(f'{x:.2f}' for x in m.get('loadavg_start', []))}, at end "
        f"{', '.join(f'{x:.2f}' for x in m.get('loadavg_end', []))}; other busy processes at start: {busy_s}._"
    )


def common_median(xs: list[float]) -> float:
    xs = sorted(x for x in xs if x is not None and not math.isnan(x))
    if not xs:
        return float("nan")
    m = len(xs) // 2
    return xs[m] if len(xs) % 2 else (xs[m - 1] + xs[m]) / 2


def _system_label(key: str) -> str:
    if key.startswith("ours"):
        parts = key.split()
        procs, threads = parts[1][1:], parts[2][1:]
        return f"jobqueue (MariaDB), {procs} process{'es' if procs != '1' else ''} x {threads} threads"
    if key.startswith("procrastinate"):
        return f"procrastinate (PostgreSQL), 1 process, concurrency {key.split()[1][1:]}"
    if key.startswith("pgqueuer"):
        parts = key.split()
        procs = parts[1][1:]
        return f"pgqueuer (PostgreSQL), {procs} process{'es' if procs != '1' else ''}, batch {parts[2][1:]}"
    if key.startswith("rq"):
        return f"RQ (Redis), WorkerPool of {key.split()[2]} SimpleWorkers"
    return key
