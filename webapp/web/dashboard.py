"""The operations dashboard: overview, jobs, job detail, workers, audit log, and the requeue and
fail actions. Every read and write goes through webapp.core.repository.

The pages that only read use `read_db()` (a replica when JOBQUEUE_READ_URL is set, its lag in the
page header); the actions, and the row or panel an action answers with, use `db()`, the primary."""

from __future__ import annotations

import json
import time
from datetime import datetime, timedelta
from typing import Any

from flask import Blueprint, abort, flash, g, redirect, render_template, request, url_for

from ..core import repository
from ..core.errors import InvalidState, JobBusy, JobNotFound, LeaseStillValid
from ..core.models import Status
from ..core.repository import JobFilter
from .auth import admin_required, login_required
from .health import health_summary
from .state import db, read_db

bp = Blueprint("dashboard", __name__)

PAGE_SIZE = 50
CHART_MINUTES = 15
ALIVE_SECONDS = 45          # a process whose heartbeat (every 15 s) is older than this is shown as silent
BULK_TIME_BUDGET = 10.0     # seconds of work per bulk request; the page continues where it stopped
MAX_FILTER_CHARS = 100
# Small per-minute charts on the overview: empty claims by kind, skips, reclaims, lost leases, errors.
ACTIVITY_CHARTS = {"empty_idle": "empty claims: idle", "empty_contended": "empty claims: contended",
                   "empty_waiting": "empty claims: waiting on leases", "skipped": "ready rows skipped (locked)",
                   "reclaimed": "reclaimed by the reaper", "lease_lost": "leases lost", "retried": "retries",
                   "sql_errors": "SQL errors"}


def is_htmx() -> bool:
    return request.headers.get("HX-Request") == "true"


def actor() -> str:
    return f"web:{g.user.name}"


# --- request parsing -----------------------------------------------------------------------------

def _text_arg(source, name: str, limit: int = MAX_FILTER_CHARS) -> str | None:
    value = (source.get(name) or "").strip()
    if len(value) > limit:
        abort(400, description=f"{name} is longer than {limit} characters")
    return value or None


def _int_arg(source, name: str) -> int | None:
    raw = (source.get(name) or "").strip()
    if not raw:
        return None
    if not raw.isdigit() or len(raw) > 18:
        abort(400, description=f"{name} must be a positive whole number")
    return int(raw)


def parse_filter(source) -> JobFilter:
    status = _text_arg(source, "status")
    if status is not None and status not in {s.value for s in Status}:
        abort(400, description=f"unknown status {status[:20]!r}")
    return JobFilter(status=Status(status) if status else None, queue=_text_arg(source, "queue"),
                     task=_text_arg(source, "task"), key_prefix=_text_arg(source, "key", 80))


def filter_args(f: JobFilter) -> dict[str, str]:
    return {k: v for k, v in (("status", f.status and Status(f.status).value), ("queue", f.queue),
                              ("task", f.task), ("key", f.key_prefix)) if v}


# --- pages ---------------------------------------------------------------------------------------

@bp.get("/")
@login_required
def overview():
    return render_template("dashboard/overview.html", **overview_context())


@bp.app_template_global()
def activity_labels() -> dict[str, str]:
    return ACTIVITY_CHARTS


@bp.get("/overview/panels")
@login_required
def overview_panels():
    # refreshed: the page header's replica lag comes along, swapped out of band.
    return render_template("dashboard/_overview.html", refreshed=True, **overview_context())


def overview_context() -> dict[str, Any]:
    with read_db() as conn:
        summaries, now = repository.queue_summaries(conn)
        running = repository.running_jobs(conn, limit=20)
        since = now.replace(second=0, microsecond=0) - timedelta(minutes=CHART_MINUTES - 1)
        minutes = repository.activity(conn, since)
        processes, _ = repository.list_processes(conn, limit=20)
        audit = repository.list_audit(conn, limit=5)
    totals = {s.value: sum(q.counts[s.value] for q in summaries) for s in Status}
    return {
        "summaries": summaries, "totals": totals, "now": now, "running": running,
        "chart": bar_chart(minutes, since, ("completed", "failed")), "activity": sum_activity(minutes),
        "activity_charts": {k: bar_chart(minutes, since, (k,), height=30) for k in ACTIVITY_CHARTS},
        "health": health_summary(),
        "processes": [dict(p, state=process_state(p, now)) for p in processes],
        "audit": audit, "statuses": [s.value for s in Status],
    }


def bar_chart(minutes: list[dict[str, Any]], since: datetime, keys: tuple[str, ...], height: int = 60) -> dict[str, Any]:
    """Per-minute bars of `keys` stacked bottom-up, as SVG geometry (no script on the page)."""
    by_minute = {m["minute"]: m for m in minutes}
    slots = [since + timedelta(minutes=i) for i in range(CHART_MINUTES)]
    values = [[by_minute.get(slot, {}).get(k, 0) for k in keys] for slot in slots]
    peak = max([sum(v) for v in values] + [1])
    bar = 14
    bars = []
    for i, (slot, vals) in enumerate(zip(slots, values)):
        y, parts = float(height), []
        for key, value in zip(keys, vals):
            h = round(height * value / peak, 1)
            y -= h
            parts.append({"key": key, "value": value, "y": round(y, 1), "h": h})
        bars.append({"x": i * (bar + 4), "width": bar, "minute": slot, "parts": parts})
    return {"bars": bars, "peak": peak, "height": height, "width": CHART_MINUTES * (bar + 4),
            "totals": {k: sum(v[j] for v in values) for j, k in enumerate(keys)}}


def sum_activity(minutes: list[dict[str, Any]]) -> dict[str, int]:
    keys = ("completed", "failed", "retried", "reclaimed", "lease_lost", "empty_idle", "empty_contended",
            "empty_waiting", "skipped", "sql_errors")
    return {k: sum(m.get(k, 0) for m in minutes) for k in keys}


def process_state(p: dict[str, Any], now: datetime) -> str:
    if p["stopped_at"] is not None:
        return "stopped"
    return "alive" if (now - p["last_heartbeat"]).total_seconds() <= ALIVE_SECONDS else "silent"


@bp.get("/jobs")
@login_required
def jobs():
    job_filter = parse_filter(request.args)
    before = _int_arg(request.args, "before")
    with read_db() as conn:
        page = repository.list_jobs(conn, job_filter, before_id=before, limit=PAGE_SIZE + 1)
        queues, tasks = repository.distinct_values(conn)
        now = repository.database_now(conn)
    more = len(page) > PAGE_SIZE
    page = page[:PAGE_SIZE]
    context = {"jobs": page, "filter": job_filter, "args": filter_args(job_filter), "before": before,
               "next_before": page[-1].id if more else None, "queues": queues, "tasks": tasks,
               "statuses": [s.value for s in Status], "now": now}
    if is_htmx() and request.headers.get("HX-Target") == "jobs-table":
        return render_template("dashboard/_jobs_table.html", **context)
    return render_template("dashboard/jobs.html", **context)


@bp.get("/jobs/<int:job_id>")
@login_required
def job_detail(job_id: int):
    with read_db() as conn:
        job = repository.get_job(conn, job_id)
        if job is None:
            abort(404, description=f"job {job_id} not found")
        result = repository.get_result(conn, job.task_key)
        attempts = repository.list_attempts(conn, job_id)
        audit = repository.list_audit(conn, job_id=job_id, limit=20)
        now = repository.database_now(conn)
    return render_template("dashboard/job.html", job=job, result=result, attempts=attempts, audit=audit, now=now,
                           payload=json.dumps(job.payload, indent=2, sort_keys=True, ensure_ascii=False),
                           result_json=json.dumps(result["result"], indent=2, sort_keys=True, ensure_ascii=False)
                           if result else None,
                           current_attempt=current_attempt(job, attempts))


@bp.get("/jobs/<int:job_id>/row")
@login_required
def job_row(job_id: int):
    """One row of the jobs table; it polls itself while the job is in motion."""
    return _job_partial(job_id, "dashboard/_job_row.html")


@bp.get("/jobs/<int:job_id>/summary")
@login_required
def job_summary(job_id: int):
    """The detail page's status and actions panel; it polls itself while the job is in motion."""
    return _job_partial(job_id, "dashboard/_job_actions.html")


def _job_partial(job_id: int, template: str):
    with read_db() as conn:
        job = repository.get_job(conn, job_id)
        now = repository.database_now(conn)
    if job is None:
        abort(404, description=f"job {job_id} not found")
    return render_template(template, job=job, now=now)


def current_attempt(job, attempts: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The attempt the job row itself describes (running now, or the one that finished it), when
    job_attempt has no row for it (successful attempts are not written there)."""
    if job.attempts == 0 or any(a["attempt"] == job.attempts for a in attempts):
        return None
    outcome = {"running": "running", "done": "done", "failed": "failed"}.get(job.status.value)
    if outcome is None:
        return None
    return {"attempt": job.attempts, "worker": job.lease_owner, "started_at": job.started_at,
            "finished_at": job.finished_at, "outcome": outcome, "error": job.last_error if outcome == "failed" else None}


@bp.get("/workers")
@login_required
def workers():
    with read_db() as conn:
        processes, now = repository.list_processes(conn)
        running = repository.running_jobs(conn, limit=500)
    held: dict[str, list] = {}
    for job in running:
        prefix = (job.lease_owner or "").rsplit(":", 1)[0]
        held.setdefault(prefix, []).append(job)
    rows = [dict(p, state=process_state(p, now), held=held.get(p["id"], [])) for p in processes]
    return render_template("dashboard/workers.html", processes=rows, now=now, alive_seconds=ALIVE_SECONDS)


@bp.get("/audit")
@login_required
def audit():
    before = _int_arg(request.args, "before")
    with read_db() as conn:
        entries = repository.list_audit(conn, before_id=before, limit=PAGE_SIZE + 1)
    more = len(entries) > PAGE_SIZE
    entries = entries[:PAGE_SIZE]
    return render_template("dashboard/audit.html", entries=entries, next_before=entries[-1]["id"] if more else None)


# --- actions -------------------------------------------------------------------------------------

def _require_confirm() -> None:
    if request.form.get("confirm") != "yes":
        abort(400, description="this action needs confirmation")


def _action_response(job_id: int, message: str, category: str):
    """HTMX: the job's row (or the detail page's action panel) swapped in place, with the message
    as an out-of-band flash. Without HTMX: back to where the click came from."""
    if not is_htmx():
        flash(message, category)
        return redirect(request.referrer if _same_site(request.referrer) else url_for("dashboard.job_detail",
                                                                                       job_id=job_id))
    with db() as conn:
        job = repository.get_job(conn, job_id)
        now = repository.database_now(conn)
    template = "dashboard/_job_actions.html" if request.form.get("view") == "detail" else "dashboard/_job_row.html"
    return render_template(template, job=job, now=now, flash_message=message, flash_category=category,
                           needs_force=category == "confirm")


def _same_site(url: str | None) -> bool:
    return bool(url) and url.startswith(request.host_url)


@bp.post("/jobs/<int:job_id>/requeue")
@admin_required
def requeue(job_id: int):
    _require_confirm()
    force = request.form.get("force") == "yes"
    try:
        with db() as conn:
            result = repository.requeue_job(conn, job_id, force=force, actor=actor())
    except JobNotFound:
        abort(404, description=f"job {job_id} not found")
    except LeaseStillValid as exc:
        return _action_response(job_id, f"{exc}.", "confirm")
    except InvalidState as exc:
        return _action_response(job_id, str(exc), "error")
    except JobBusy:
        return _action_response(job_id, f"Job {job_id} is busy (a worker is claiming it right now); try again.",
                                "warning")
    message = f"Job {job_id} requeued ({result.before.value} → ready)." if result.changed else f"Job {job_id} is already ready."
    return _action_response(job_id, message, "success")


@bp.post("/jobs/<int:job_id>/fail")
@admin_required
def fail(job_id: int):
    _require_confirm()
    reason = (request.form.get("reason") or "").strip()[:1000] or None
    try:
        with db() as conn:
            result = repository.fail_job(conn, job_id, reason, actor=actor())
    except JobNotFound:
        abort(404, description=f"job {job_id} not found")
    except InvalidState as exc:
        return _action_response(job_id, str(exc), "error")
    except JobBusy:
        return _action_response(job_id, f"Job {job_id} is busy (a worker is claiming it right now); try again.",
                                "warning")
    return _action_response(job_id, f"Job {job_id} failed ({result.before.value} → failed).", "success")


@bp.post("/jobs/bulk")
@admin_required
def bulk():
    _require_confirm()
    action = request.form.get("action")
    if action not in repository.BULK_ELIGIBLE:
        abort(400, description="unknown bulk action")
    scope = request.form.get("scope", "selected")
    force = request.form.get("force") == "yes"
    reason = (request.form.get("reason") or "").strip()[:1000] or None
    deadline = time.monotonic() + BULK_TIME_BUDGET
    job_filter = None
    with db() as conn:
        if scope == "filter":
            job_filter = parse_filter(request.form)
            after = _int_arg(request.form, "after")
            result = repository.bulk_action(conn, action, actor=actor(), job_filter=job_filter, after_id=after,
                                            reason=reason, force=force, deadline=deadline)
        elif scope == "selected":
            raw = request.form.getlist("ids")
            if not raw or len(raw) > 1000 or not all(i.isdigit() and len(i) < 19 for i in raw):
                abort(400, description="select between 1 and 1000 jobs")
            result = repository.bulk_action(conn, action, actor=actor(), ids=[int(i) for i in raw], reason=reason,
                                            force=force)
        else:
            abort(400, description="scope must be 'selected' or 'filter'")
    totals = {k: int(request.form.get(f"total_{k}", 0) or 0) + getattr(result, k) for k in ("changed", "busy", "skipped")}
    context = {"action": action, "result": result, "totals": totals, "scope": scope, "force": force,
               "reason": reason, "args": filter_args(job_filter) if job_filter else {}}
    if not is_htmx():
        flash(bulk_message(action, totals, result.finished), "success")
        return redirect(url_for("dashboard.jobs", **context["args"]))
    return render_template("dashboard/_bulk_progress.html", message=bulk_message(action, totals, result.finished),
                           **context)


def bulk_message(action: str, totals: dict[str, int], finished: bool) -> str:
    verb = "requeued" if action == "requeue" else "failed"
    text = f"{totals['changed']} jobs {verb}"
    if totals["busy"]:
        text += f", {totals['busy']} busy (held by a worker this instant; run it again for those)"
    if totals["skipped"]:
        text += f", {totals['skipped']} skipped (not in a state this applies to)"
    return text + ("." if finished else "; continuing…")
