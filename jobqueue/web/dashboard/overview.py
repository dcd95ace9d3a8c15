"""The overview (counts by queue, the per-minute charts, the processes, the latest audit entries)
and the audit log."""

from __future__ import annotations

import threading
from datetime import datetime, timedelta
from typing import Any

from flask import render_template, request

from ...core import repository
from ...core.models import Status
from ..auth import login_required
from ..health import health_summary
from ..state import db, extension, read_db
from .common import PAGE_SIZE, bp, int_arg, is_htmx
from .workers import held_by_process, merge_slots, with_liveness

CHART_MINUTES = 15
# Small per-minute charts on the overview: empty claims by kind, skips, reclaims, lost leases, errors.
ACTIVITY_CHARTS = {
    "empty_idle": "empty claims: idle",
    "empty_contended": "empty claims: contended",
    "empty_waiting": "empty claims: waiting on leases",
    "skipped": "ready rows skipped (locked)",
    "reclaimed": "reclaimed by the reaper",
    "lease_lost": "leases lost",
    "retried": "retries",
    "sql_errors": "SQL errors",
    "deadlocks": "deadlocks (server)",
    "lock_timeouts": "lock-wait timeouts (server)",
}


class LockCounterMinutes:
    """Per-minute deadlocks and lock-wait timeouts, from the server's running totals (InnoDB's
    counters, every client's) as this web process samples them at each overview refresh. Each
    process keeps its own samples, so a process that just started shows only the minutes since;
    a minute with no sample adds its count to the next one sampled."""

    def __init__(self, minutes: int = CHART_MINUTES):
        self.minutes = minutes
        self.last: dict[datetime, dict[str, int]] = {}  # minute -> the totals last seen in it
        self.before: dict[str, int] | None = None  # the totals before the oldest minute kept
        self._lock = threading.Lock()

    def record(self, now: datetime, totals: dict[str, int] | None) -> list[dict[str, Any]]:
        """Add a sample; the per-minute counts of the minutes kept, as the activity rows."""
        minute = now.replace(second=0, microsecond=0)
        with self._lock:
            if totals is not None:
                if self.before is None:
                    self.before = dict(totals)  # the first sample: counts start from here
                self.last[minute] = dict(totals)
            for old in sorted(m for m in self.last if m <= minute - timedelta(minutes=self.minutes)):
                self.before = self.last.pop(old)
            out, previous = [], self.before
            for m in sorted(self.last):
                out.append(
                    {"minute": m, **{k: max(0, v - (previous or {}).get(k, v)) for k, v in self.last[m].items()}}
                )
                previous = self.last[m]
            return out


LOCK_MINUTES = LockCounterMinutes()


@bp.get("/")
@login_required
def overview():
    return render_template("jobqueue/dashboard/overview.html", **overview_context())


@bp.app_template_global()
def activity_labels() -> dict[str, str]:
    return ACTIVITY_CHARTS


@bp.get("/overview/panels")
@login_required
def overview_panels():
    # refreshed: the page header's replica lag comes along, swapped out of band.
    return render_template("jobqueue/dashboard/_overview.html", refreshed=True, **overview_context())


def overview_context() -> dict[str, Any]:
    with read_db() as conn:
        # Every known queue, with its paused state: dicts with the QueueSummary fields.
        summaries, now = repository.stats.list_queues(conn, counts=extension().counts_for(conn))
        last_prune = repository.retention.last_prune(conn)
        running = repository.reads.running_jobs(conn, limit=20)
        since = now.replace(second=0, microsecond=0) - timedelta(minutes=CHART_MINUTES - 1)
        minutes = repository.stats.activity(conn, since)
        by_operator = repository.stats.operator_failures(conn, since)
        processes, _ = repository.processes.list_processes(conn, limit=20)
        audit = repository.operator.list_audit(conn, limit=5)
        rate_limits = repository.limits.rate_limits(conn)
    with db() as conn:
        # The primary's own counters: a replica's would not count the primary's deadlocks.
        lock_minutes = LOCK_MINUTES.record(now, repository.locks.lock_counters(conn))
    minutes = add_lock_counts(add_operator_failures(minutes, by_operator), lock_minutes)
    held = held_by_process(running)
    totals = {s.value: sum(q["counts"][s.value] for q in summaries) for s in Status}
    return {
        "summaries": summaries,
        "rate_limits": rate_limits,
        "totals": totals,
        "now": now,
        "running": running,
        "retention": {"settings": extension().settings.core, "last": last_prune},
        "chart": bar_chart(minutes, since, ("completed", "failed")),
        "activity": sum_activity(minutes),
        "activity_charts": {k: bar_chart(minutes, since, (k,), height=30) for k in ACTIVITY_CHARTS},
        "operator_failed": sum(by_operator.values()),
        "health": health_summary(),
        "processes": [
            dict(p, slots=merge_slots(p, held.get(p["id"], []), now))
            for p in (with_liveness(p, now) for p in processes)
        ],
        "audit": audit,
        "statuses": [s.value for s in Status],
        "queue_actions": QUEUE_ACTIONS,
    }


def add_operator_failures(minutes: list[dict[str, Any]], by_operator: dict[datetime, int]) -> list[dict[str, Any]]:
    """Jobs failed by an operator count as failed on the chart: no worker's heartbeat counted them."""
    out = {m["minute"]: dict(m) for m in minutes}
    for minute, n in by_operator.items():
        out.setdefault(minute, {"minute": minute})
        out[minute]["failed"] = out[minute].get("failed", 0) + n
    return [out[k] for k in sorted(out)]


def add_lock_counts(minutes: list[dict[str, Any]], lock_minutes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = {m["minute"]: dict(m) for m in minutes}
    for row in lock_minutes:
        out.setdefault(row["minute"], {"minute": row["minute"]}).update({k: v for k, v in row.items() if k != "minute"})
    return [out[k] for k in sorted(out)]


def bar_chart(
    minutes: list[dict[str, Any]], since: datetime, keys: tuple[str, ...], height: int = 60
) -> dict[str, Any]:
    """Per-minute bars of `keys` stacked bottom-up, as SVG geometry (no script on the page), with
    a value axis (0 and the peak) and time labels every 5 minutes for the tall chart."""
    by_minute = {m["minute"]: m for m in minutes}
    slots = [since + timedelta(minutes=i) for i in range(CHART_MINUTES)]
    values = [[by_minute.get(slot, {}).get(k, 0) for k in keys] for slot in slots]
    peak = max([sum(v) for v in values] + [1])
    axis = 34 if height > 40 else 0  # room on the left for the value labels, below for times
    bottom = 14 if height > 40 else 0
    bar, gap = (40, 8) if axis else (14, 4)
    bars = []
    for i, (slot, vals) in enumerate(zip(slots, values)):
        y, parts = float(height), []
        for key, value in zip(keys, vals):
            h = round(height * value / peak, 1)
            y -= h
            parts.append({"key": key, "value": value, "y": round(y, 1), "h": h})
        bars.append(
            {
                "x": axis + i * (bar + gap),
                "width": bar,
                "minute": slot,
                "parts": parts,
                "label": slot.strftime("%H:%M") if axis and (i % 5 == 0 or i == CHART_MINUTES - 1) else None,
            }
        )
    return {
        "bars": bars,
        "peak": peak,
        "height": height,
        "axis": axis,
        "bottom": bottom,
        "width": axis + CHART_MINUTES * (bar + gap),
        "totals": {k: sum(v[j] for v in values) for j, k in enumerate(keys)},
    }


def sum_activity(minutes: list[dict[str, Any]]) -> dict[str, int]:
    keys = (
        "completed",
        "failed",
        "retried",
        "reclaimed",
        "lease_lost",
        "empty_idle",
        "empty_contended",
        "empty_waiting",
        "skipped",
        "sql_errors",
    )
    return {k: sum(m.get(k, 0) for m in minutes) for k in keys}


# Per-queue actions on the overview: (bulk action, the status it is applied to, button label), each
# through the same bounded bulk mechanism and confirmation as the jobs page.
QUEUE_ACTIONS = (("requeue", "failed", "Retry all failed"), ("cancel", "failed", "Discard all failed"))


@bp.get("/audit")
@login_required
def audit():
    before = int_arg(request.args, "before")
    with read_db() as conn:
        entries = repository.operator.list_audit(conn, before_id=before, limit=PAGE_SIZE + 1)
        now = repository.reads.database_now(conn)
    more = len(entries) > PAGE_SIZE
    entries = entries[:PAGE_SIZE]
    template = (
        "jobqueue/dashboard/_audit_page.html"
        if is_htmx() and request.headers.get("HX-Target") == "audit-page"
        else "jobqueue/dashboard/audit.html"
    )
    return render_template(
        template, entries=entries, next_before=entries[-1]["id"] if more else None, before=before, now=now
    )
