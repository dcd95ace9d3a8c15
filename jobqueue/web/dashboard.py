"""The operations dashboard: overview, jobs, job detail, workers, recurring jobs, audit log, and
the actions (requeue, fail, cancel; pause and resume a queue; add, enable, disable and remove a
recurring job). Every read and write goes through jobqueue.core.repository.

The pages that only read use `read_db()` (a replica when JOBQUEUE_READ_URL is set, its lag in the
page header); the actions, and the row or panel an action answers with, use `db()`, the primary."""

from __future__ import annotations

import json
import re
import threading
import time
from datetime import datetime, timedelta
from typing import Any

from flask import Blueprint, abort, flash, g, redirect, render_template, request, url_for

from ..core import repository
from ..core.errors import InvalidState, JobBusy, JobNotFound, LeaseStillValid, NotFound, RunAgainNeeded, ValidationError
from ..core.models import Job, Status
from ..core.repository import JobFilter
from ..core.repository.locks import MYSQL_LOCK_ROWS
from ..core.tasks import TASKS
from ..core.validation import JobQuery, job_query
from .auth import admin_required, login_required
from .health import health_summary
from .state import db, extension, read_db

bp = Blueprint("dashboard", __name__)

PAGE_SIZE = 50
CHART_MINUTES = 15
ALIVE_SECONDS = 45          # a process whose heartbeat (every 15 s) is older than this is shown as silent
BULK_TIME_BUDGET = 10.0     # seconds of work per bulk request; the page continues where it stopped
MATCH_COUNT_CAP = 10_000    # counts of matches stop here ("10,000+"): bounded reads at any table size
MOVING = ("ready", "scheduled", "running")   # rows in these states are refreshed live
EPOCH = datetime(1970, 1, 1)
# Small per-minute charts on the overview: empty claims by kind, skips, reclaims, lost leases, errors.
ACTIVITY_CHARTS = {"empty_idle": "empty claims: idle", "empty_contended": "empty claims: contended",
                   "empty_waiting": "empty claims: waiting on leases", "skipped": "ready rows skipped (locked)",
                   "reclaimed": "reclaimed by the reaper", "lease_lost": "leases lost", "retried": "retries",
                   "sql_errors": "SQL errors", "deadlocks": "deadlocks (server)",
                   "lock_timeouts": "lock-wait timeouts (server)"}


class LockCounterMinutes:
    """Per-minute deadlocks and lock-wait timeouts, from the server's running totals (InnoDB's
    counters, every client's) as this web process samples them at each overview refresh. Each
    process keeps its own samples, so a process that just started shows only the minutes since;
    a minute with no sample adds its count to the next one sampled."""

    def __init__(self, minutes: int = CHART_MINUTES):
        self.minutes = minutes
        self.last: dict[datetime, dict[str, int]] = {}    # minute -> the totals last seen in it
        self.before: dict[str, int] | None = None          # the totals before the oldest minute kept
        self._lock = threading.Lock()

    def record(self, now: datetime, totals: dict[str, int] | None) -> list[dict[str, Any]]:
        """Add a sample; the per-minute counts of the minutes kept, as the activity rows."""
        minute = now.replace(second=0, microsecond=0)
        with self._lock:
            if totals is not None:
                if self.before is None:
                    self.before = dict(totals)      # the first sample: counts start from here
                self.last[minute] = dict(totals)
            for old in sorted(m for m in self.last if m <= minute - timedelta(minutes=self.minutes)):
                self.before = self.last.pop(old)
            out, previous = [], self.before
            for m in sorted(self.last):
                out.append({"minute": m, **{k: max(0, v - (previous or {}).get(k, v)) for k, v in self.last[m].items()}})
                previous = self.last[m]
            return out


LOCK_MINUTES = LockCounterMinutes()


def is_htmx() -> bool:
    return request.headers.get("HX-Request") == "true"


def actor() -> str:
    return f"web:{g.user.name}"


# --- request parsing -----------------------------------------------------------------------------

def _whole_number(raw: str) -> int | None:
    # ASCII digits only: str.isdigit() also says yes to "²" and "١", which int() refuses (or, for
    # other scripts, reads as a number nobody typed). At most 18 digits: a BIGINT always holds it.
    return int(raw) if raw.isascii() and raw.isdigit() and len(raw) <= 18 else None


def _int_arg(source, name: str) -> int | None:
    raw = (source.get(name) or "").strip()
    if not raw:
        return None
    value = _whole_number(raw)
    if value is None:
        abort(400, description=f"{name} must be a positive whole number")
    return value


def _yes_no(source, name: str) -> bool:
    value = source.get(name, "")
    if value not in ("", "yes", "no"):
        abort(400, description=f"{name} must be 'yes' or 'no'")
    return value == "yes"


def parse_query(source, *, default_limit: int = PAGE_SIZE) -> JobQuery:
    """The job filters and keyset position of a request (query arguments or a form); 400 on bad
    input, before anything is read or written."""
    try:
        return job_query(source, default_limit=default_limit, max_limit=PAGE_SIZE)
    except ValidationError as exc:
        abort(400, description=str(exc))


def parse_filter(source) -> JobFilter:
    return parse_query(source).job_filter


def filter_args(f: JobFilter) -> dict[str, str]:
    return f.args()


# --- pages ---------------------------------------------------------------------------------------

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
        summaries, now = repository.list_queues(conn, counts=extension().counts_for(conn))
        last_prune = repository.last_prune(conn)
        running = repository.running_jobs(conn, limit=20)
        since = now.replace(second=0, microsecond=0) - timedelta(minutes=CHART_MINUTES - 1)
        minutes = repository.activity(conn, since)
        by_operator = repository.operator_failures(conn, since)
        processes, _ = repository.list_processes(conn, limit=20)
        audit = repository.list_audit(conn, limit=5)
    with db() as conn:
        # The primary's own counters: a replica's would not count the primary's deadlocks.
        lock_minutes = LOCK_MINUTES.record(now, repository.lock_counters(conn))
    minutes = add_lock_counts(add_operator_failures(minutes, by_operator), lock_minutes)
    held = held_by_process(running)
    totals = {s.value: sum(q["counts"][s.value] for q in summaries) for s in Status}
    return {
        "summaries": summaries, "totals": totals, "now": now, "running": running,
        "retention": {"settings": extension().settings.core, "last": last_prune},
        "chart": bar_chart(minutes, since, ("completed", "failed")), "activity": sum_activity(minutes),
        "activity_charts": {k: bar_chart(minutes, since, (k,), height=30) for k in ACTIVITY_CHARTS},
        "operator_failed": sum(by_operator.values()),
        "health": health_summary(),
        "processes": [dict(p, slots=merge_slots(p, held.get(p["id"], []), now))
                      for p in (with_liveness(p, now) for p in processes)],
        "audit": audit, "statuses": [s.value for s in Status], "queue_actions": QUEUE_ACTIONS,
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
        out.setdefault(row["minute"], {"minute": row["minute"]}).update(
            {k: v for k, v in row.items() if k != "minute"})
    return [out[k] for k in sorted(out)]


def bar_chart(minutes: list[dict[str, Any]], since: datetime, keys: tuple[str, ...], height: int = 60) -> dict[str, Any]:
    """Per-minute bars of `keys` stacked bottom-up, as SVG geometry (no script on the page), with
    a value axis (0 and the peak) and time labels every 5 minutes for the tall chart."""
    by_minute = {m["minute"]: m for m in minutes}
    slots = [since + timedelta(minutes=i) for i in range(CHART_MINUTES)]
    values = [[by_minute.get(slot, {}).get(k, 0) for k in keys] for slot in slots]
    peak = max([sum(v) for v in values] + [1])
    axis = 34 if height > 40 else 0          # room on the left for the value labels, below for times
    bottom = 14 if height > 40 else 0
    bar, gap = (40, 8) if axis else (14, 4)
    bars = []
    for i, (slot, vals) in enumerate(zip(slots, values)):
        y, parts = float(height), []
        for key, value in zip(keys, vals):
            h = round(height * value / peak, 1)
            y -= h
            parts.append({"key": key, "value": value, "y": round(y, 1), "h": h})
        bars.append({"x": axis + i * (bar + gap), "width": bar, "minute": slot, "parts": parts,
                     "label": slot.strftime("%H:%M") if axis and (i % 5 == 0 or i == CHART_MINUTES - 1) else None})
    return {"bars": bars, "peak": peak, "height": height, "axis": axis, "bottom": bottom,
            "width": axis + CHART_MINUTES * (bar + gap), "totals": {k: sum(v[j] for v in values) for j, k in enumerate(keys)}}


def sum_activity(minutes: list[dict[str, Any]]) -> dict[str, int]:
    keys = ("completed", "failed", "retried", "reclaimed", "lease_lost", "empty_idle", "empty_contended",
            "empty_waiting", "skipped", "sql_errors")
    return {k: sum(m.get(k, 0) for m in minutes) for k in keys}


def process_state(p: dict[str, Any], now: datetime) -> str:
    """alive, silent (heartbeat stopped without a clean stop) or stopped."""
    if p["stopped_at"] is not None:
        return "stopped"
    return "alive" if (now - p["last_heartbeat"]).total_seconds() <= ALIVE_SECONDS else "silent"


def with_liveness(p: dict[str, Any], now: datetime) -> dict[str, Any]:
    """A worker process as the pages show it: `liveness` (alive, silent, stopped), what it says it
    is doing (`state`: claiming, not_primary, ...) and its slots, their times moved on to now (the
    heartbeat wrote them up to 15 s ago)."""
    liveness = process_state(p, now)
    age = max(0.0, (now - p["last_heartbeat"]).total_seconds()) if liveness == "alive" else 0.0
    slots = []
    for slot in p.get("slots") or []:
        slot = dict(slot)
        for key in ("running_seconds", "held_seconds", "lost_seconds_ago"):
            if isinstance(slot.get(key), (int, float)):
                slot[key] = slot[key] + age
        if isinstance(slot.get("lease_left_seconds"), (int, float)):
            slot["lease_left_seconds"] = slot["lease_left_seconds"] - age
        slots.append(slot)
    state = p.get("state") if isinstance(p.get("state"), dict) else {}
    return dict(p, liveness=liveness, slots=slots, doing=state.get("state"), doing_detail=state.get("detail"),
                heartbeat_age=age)


def moving(job: Job) -> bool:
    return job.status.value in MOVING


def row_version(job: Job) -> str:
    """Changes whenever the row does (every write sets updated_at), for the live refresh."""
    stamp = int((job.updated_at - EPOCH).total_seconds() * 1_000_000) if job.updated_at else 0
    return f"{stamp:x}.{job.status.value[:2]}{job.attempts}"


@bp.app_template_global("row_version")
def _row_version(job: Job) -> str:
    return row_version(job)


@bp.get("/jobs")
@login_required
def jobs():
    query = parse_query(request.args)
    with read_db() as conn:
        page = repository.page_jobs(conn, query.job_filter, before=query.before, after=query.after, limit=PAGE_SIZE,
                                    cap=MATCH_COUNT_CAP)
        queues, tasks = repository.distinct_values(conn)
        now = repository.database_now(conn)
    context = {"jobs": page.jobs, "page": page, "filter": query.job_filter, "args": filter_args(query.job_filter),
               "before": query.before, "after": query.after, "next_before": page.older, "queues": queues,
               "tasks": tasks, "statuses": [s.value for s in Status], "now": now,
               "live": any(moving(j) for j in page.jobs), "search_window": repository.SEARCH_WINDOW,
               "sparse_search_window": repository.SPARSE_SEARCH_WINDOW,
               "bulk_window": bulk_window(query, page)}
    if is_htmx() and request.headers.get("HX-Target") == "jobs-table":
        return render_template("jobqueue/dashboard/_jobs_table.html", **context)
    return render_template("jobqueue/dashboard/jobs.html", **context)


def bulk_window(query: JobQuery, page: repository.JobPage) -> tuple[int, int | None] | None:
    """For a search, the ids a bulk "every job matching the filter" may touch: those the page's
    window searched, (min_id, below), never the whole table."""
    if not query.job_filter.search:
        return None
    if query.after is not None:
        return query.after + 1, (page.window_floor + 1 if page.window_floor is not None else None)
    return page.window_floor or 0, query.before


LIVE_VERSION = re.compile(r"([0-9]{1,18}):([0-9a-z.]{1,40})")


@bp.get("/jobs/live")
@login_required
def jobs_live():
    """The jobs page's one live refresh: the page sends `live=<id>:<version>` for each row in
    motion; the answer swaps in (out of band) the rows that changed and renders the next poll,
    or none once nothing on the page moves. One request per page per interval, whatever the
    number of rows."""
    given: dict[int, str] = {}
    for raw in request.args.getlist("live")[:PAGE_SIZE * 2]:
        m = LIVE_VERSION.fullmatch(raw)
        if m is None:
            abort(400, description="live must be <id>:<version>")
        given[int(m.group(1))] = m.group(2)
    with db() as conn:
        rows = repository.jobs_by_id(conn, list(given))
        now = repository.database_now(conn)
    changed = sorted((j for j in rows if row_version(j) != given.get(j.id)), key=lambda j: -j.id)
    return render_template("jobqueue/dashboard/_jobs_live.html", live=any(moving(j) for j in rows), changed=changed, now=now)


@bp.get("/jobs/<bigint:job_id>")
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
    explanation = explain_for_page(job_id)
    return render_template("jobqueue/dashboard/job.html", job=job, result=result, attempts=attempts, audit=audit, now=now,
                           explanation=explanation,
                           payload=json.dumps(job.payload, indent=2, sort_keys=True, ensure_ascii=False),
                           result_json=json.dumps(result["result"], indent=2, sort_keys=True, ensure_ascii=False)
                           if result else None,
                           current_attempt=current_attempt(job, attempts))


def explain_for_page(job_id: int) -> dict[str, Any] | None:
    """The job's explanation as the panel shows it (on the primary: row locks live there); the SQL
    text of another connection only for admins. None when the job is gone."""
    try:
        with db() as conn:
            data = repository.explain(conn, job_id).as_dict()
    except JobNotFound:
        return None
    if not g.user.can_act:
        data["reasons"] = [{**r, "statement": None} if "statement" in r else r for r in data["reasons"]]
    return data


@bp.get("/jobs/<int:job_id>/explain")
@login_required
def job_explain(job_id: int):
    """The "Why isn't it running?" panel alone, for its Refresh button."""
    explanation = explain_for_page(job_id)
    if explanation is None:
        abort(404, description=f"job {job_id} not found")
    return render_template("jobqueue/dashboard/_explain.html", explanation=explanation)


# --- locks ----------------------------------------------------------------------------------------

def locks_context(*, with_deadlock: bool = True) -> dict[str, Any]:
    """`with_deadlock`: also read SHOW ENGINE INNODB STATUS (the full page; its 5 s poll does not show it)."""
    with db() as conn:
        report = repository.lock_report(conn)
        deadlock, deadlock_unavailable = (repository.latest_deadlock(conn) if with_deadlock and g.user.can_act
                                          else (None, None))
    lease = extension().settings.core.lease_seconds
    return {"report": report, "lease_seconds": lease, "deadlock": deadlock, "lock_rows_read": MYSQL_LOCK_ROWS,
            "deadlock_unavailable": deadlock_unavailable, "show_sql": g.user.can_act,
            "long": {t.connection_id for t in report.transactions if (t.age_seconds or 0) > lease}}


@bp.get("/locks")
@login_required
def locks():
    """Every transaction holding or waiting on job_queue rows (on the primary)."""
    return render_template("jobqueue/dashboard/locks.html", **locks_context())


@bp.get("/locks/panel")
@login_required
def locks_panel():
    return render_template("jobqueue/dashboard/_locks.html", **locks_context(with_deadlock=False))


def _kill_target(connection_id: int):
    with db() as conn:
        report = repository.lock_report(conn)
    return next((t for t in report.transactions if t.connection_id == connection_id and t.jobs), None)


@bp.post("/locks/<int:connection_id>/kill/confirm")
@admin_required
def kill_confirm(connection_id: int):
    """The second confirmation of "Kill connection": what the connection holds, read now. Nothing
    is done here."""
    target = _kill_target(connection_id)
    if target is None:
        flash(f"Connection {connection_id} holds no job_queue rows now; nothing to kill.", "info")
        return redirect(url_for("jobqueue.dashboard.locks"))
    return render_template("jobqueue/dashboard/kill_confirm.html", target=target,
                           lease_seconds=extension().settings.core.lease_seconds)


@bp.post("/locks/<int:connection_id>/kill")
@admin_required
def kill(connection_id: int):
    _require_confirm()
    try:
        with db() as conn:
            found = repository.kill_connection(conn, connection_id, actor=actor())
    except InvalidState as exc:
        flash(str(exc), "error")
    else:
        jobs = ", ".join(map(str, found.jobs))
        flash(f"Connection {connection_id} killed; its transaction rolled back"
              + (f" and job{'s' if len(found.jobs) != 1 else ''} {jobs} can be claimed again." if jobs else "."),
              "success")
    return redirect(url_for("jobqueue.dashboard.locks"))


@bp.get("/jobs/<int:job_id>/row")
@bp.get("/jobs/<bigint:job_id>/row")
@login_required
def job_row(job_id: int):
    """One row of the jobs table (the page refreshes its rows through jobs_live)."""
    return _job_partial(job_id, "jobqueue/dashboard/_job_row.html")


@bp.get("/jobs/<bigint:job_id>/summary")
@login_required
def job_summary(job_id: int):
    """The detail page's status and actions panel; it polls itself while the job is in motion.
    Unchanged since `v`: 204, which HTMX does not swap (a reason being typed stays)."""
    with db() as conn:
        job = repository.get_job(conn, job_id)
        now = repository.database_now(conn)
    if job is None:
        abort(404, description=f"job {job_id} not found")
    if request.args.get("v") == row_version(job):
        return "", 204
    return render_template("jobqueue/dashboard/_job_actions.html", job=job, now=now)


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


def held_by_process(running: list[Job]) -> dict[str, list[Job]]:
    """Running jobs by the process whose lease they are under (lease owner host:pid[:name]:slot)."""
    held: dict[str, list[Job]] = {}
    for job in running:
        prefix = (job.lease_owner or "").rsplit(":", 1)[0]
        held.setdefault(prefix, []).append(job)
    return held


def merge_slots(p: dict[str, Any], held: list[Job], now: datetime) -> list[dict[str, Any]]:
    """What each slot of a process holds: its heartbeat's account (which alone knows a lease lost
    while the handler still runs), with the job rows' own lease times, plus jobs it claimed since
    that heartbeat."""
    rows = {(j.id, j.attempts): j for j in held}
    slots = []
    for slot in p["slots"]:
        job = rows.pop((slot.get("job_id"), slot.get("attempt")), None)
        if job is not None and slot.get("state") != "lost" and job.lease_until is not None:
            slot = dict(slot, lease_left_seconds=(job.lease_until - now).total_seconds())
        slots.append(slot)
    for job in sorted(rows.values(), key=lambda j: j.lease_owner or ""):
        slots.append({"slot": (job.lease_owner or "").rsplit(":", 1)[-1], "job_id": job.id, "attempt": job.attempts,
                      "task": job.task_name, "queue": job.queue, "state": "running",
                      "running_seconds": (now - job.started_at).total_seconds() if job.started_at else None,
                      "lease_left_seconds": (job.lease_until - now).total_seconds() if job.lease_until else None,
                      "lost_reason": None, "lost_seconds_ago": None, "handler_running": True})
    return slots


def workers_context() -> dict[str, Any]:
    with read_db() as conn:
        processes, now = repository.list_processes(conn)
        running = repository.running_jobs(conn, limit=500)
    held = held_by_process(running)
    rows = []
    for p in processes:
        p = with_liveness(p, now)
        rows.append(dict(p, slots=merge_slots(p, held.get(p["id"], []), now) if p["liveness"] != "stopped" else []))
    return {"processes": rows, "now": now, "alive_seconds": ALIVE_SECONDS}


@bp.get("/workers")
@login_required
def workers():
    return render_template("jobqueue/dashboard/workers.html", **workers_context())


@bp.get("/workers/panel")
@login_required
def workers_panel():
    return render_template("jobqueue/dashboard/_workers.html", **workers_context())


@bp.get("/audit")
@login_required
def audit():
    before = _int_arg(request.args, "before")
    with read_db() as conn:
        entries = repository.list_audit(conn, before_id=before, limit=PAGE_SIZE + 1)
        now = repository.database_now(conn)
    more = len(entries) > PAGE_SIZE
    entries = entries[:PAGE_SIZE]
    template = "jobqueue/dashboard/_audit_page.html" if is_htmx() and request.headers.get("HX-Target") == "audit-page" \
        else "jobqueue/dashboard/audit.html"
    return render_template(template, entries=entries, next_before=entries[-1]["id"] if more else None,
                           before=before, now=now)


# --- actions -------------------------------------------------------------------------------------

def _require_confirm() -> None:
    if request.form.get("confirm") != "yes":
        abort(400, description="this action needs confirmation")


def _action_response(job_id: int, message: str, category: str, *, needs: str | None = None):
    """HTMX: the job's row (or the detail page's action panel) swapped in place, with the message
    as an out-of-band flash. Without HTMX: back to where the click came from."""
    if not is_htmx():
        flash(message, category)
        return redirect(request.referrer if _same_site(request.referrer) else url_for("jobqueue.dashboard.job_detail",
                                                                                       job_id=job_id))
    with db() as conn:
        job = repository.get_job(conn, job_id)
        now = repository.database_now(conn)
    detail = request.form.get("view") == "detail"
    template = "jobqueue/dashboard/_job_actions.html" if detail else "jobqueue/dashboard/_job_row.html"
    return render_template(template, job=job, now=now, flash_message=message, flash_category=category,
                           needs_force=needs == "force", needs_again=needs == "again",
                           # A row that moves again restarts the page's live refresh.
                           restart_live=not detail and moving(job))


def _same_site(url: str | None) -> bool:
    return bool(url) and url.startswith(request.host_url)


@bp.post("/jobs/<bigint:job_id>/requeue")
@admin_required
def requeue(job_id: int):
    _require_confirm()
    force = request.form.get("force") == "yes"
    again = request.form.get("again") == "yes"
    try:
        with db() as conn:
            result = repository.requeue_job(conn, job_id, force=force, again=again, actor=actor())
    except JobNotFound:
        abort(404, description=f"job {job_id} not found")
    except LeaseStillValid as exc:
        return _action_response(job_id, f"{exc}.", "confirm", needs="force")
    except RunAgainNeeded:
        return _action_response(job_id, f"Job {job_id} is done. Running it again runs its handler again; "
                                        "record_result still keeps one result row per task_key, so its downstream "
                                        "result is not written twice. Confirm with \u201cRun again\u201d.",
                                "confirm", needs="again")
    except InvalidState as exc:
        return _action_response(job_id, str(exc), "error")
    except JobBusy:
        return _action_response(job_id, f"Job {job_id} is busy (a worker is claiming it right now); try again.",
                                "warning")
    if not result.changed:
        message = f"Job {job_id} is already ready."
    elif result.before is Status.DONE:
        message = f"Job {job_id} runs again (done → ready); its task_key keeps its one result row."
    else:
        message = f"Job {job_id} requeued ({result.before.value} → ready)."
    return _action_response(job_id, message, "success")


@bp.post("/jobs/<bigint:job_id>/fail")
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


# Bulk actions: what each does, in the words of its button and its report.
BULK_VERBS = {"requeue": ("Requeue", "requeued"), "fail": ("Fail", "failed"), "cancel": ("Cancel", "cancelled")}
# Per-queue actions on the overview: (bulk action, the status it is applied to, button label), each
# through the same bounded bulk mechanism and confirmation as the jobs page. When cancellation
# lands (status `cancelled`, a "cancel" entry in repository.BULK_ELIGIBLE and BULK_VERBS), its
# "discard all failed" is one more line here: ("cancel", "failed", "Discard all failed").
QUEUE_ACTIONS = (("requeue", "failed", "Retry all failed"), ("cancel", "failed", "Discard all failed"))


def _bulk_request(*, allow_none: bool = False) -> dict[str, Any]:
    """A bulk form, checked before anything is read or written: action, scope, the ids or the
    filter (with the search window it was shown, `min_id`, and where it starts, `after`)."""
    action = request.form.get("action")
    if action not in repository.BULK_ELIGIBLE or action not in BULK_VERBS:
        abort(400, description="unknown bulk action")
    scope = request.form.get("scope", "selected")
    req: dict[str, Any] = {"action": action, "scope": scope, "force": _yes_no(request.form, "force"),
                           "reason": (request.form.get("reason") or "").strip()[:1000] or None,
                           "ids": None, "filter": None, "after": None}
    if scope == "filter":
        req["filter"] = parse_filter(request.form)
        req["after"] = _int_arg(request.form, "after")
        if req["filter"].search and req["filter"].min_id is None:
            abort(400, description="a bulk action over a search needs the window it was shown (min_id)")
    elif scope == "selected":
        raw = request.form.getlist("ids")
        if not raw and allow_none:
            return req              # the confirmation says to tick some rows
        ids = [_whole_number(i.strip()) for i in raw]
        if not raw or len(raw) > 1000 or None in ids:
            abort(400, description="select between 1 and 1000 jobs (ids are positive whole numbers)")
        # A continuation (after a pause for replica lag) carries the same ids and where it stopped.
        req["after"] = _int_arg(request.form, "after")
        req["ids"] = [i for i in sorted(set(ids), reverse=True) if req["after"] is None or i < req["after"]]
    else:
        abort(400, description="scope must be 'selected' or 'filter'")
    return req


@bp.post("/jobs/bulk/confirm")
@admin_required
def bulk_confirm():
    """The confirmation of a bulk action, from the server: it names the filter (or the ids) it
    will apply to and how many jobs that is (capped), and carries exactly that selection to
    /jobs/bulk. Nothing is written here."""
    req = _bulk_request(allow_none=True)
    eligible = [s.value for s in repository.BULK_ELIGIBLE[req["action"]]]
    if req["scope"] == "selected" and not req["ids"]:
        count, capped, description = 0, False, "no rows ticked"
    elif req["scope"] == "filter":
        with db() as conn:
            count, capped = repository.count_matching(conn, req["filter"], statuses=eligible,
                                                      below=req["after"], cap=MATCH_COUNT_CAP)
        description = req["filter"].describe()
    else:
        count, capped = len(req["ids"]), False
        shown = ", ".join(map(str, req["ids"][:20])) + (f" and {len(req['ids']) - 20} more" if len(req["ids"]) > 20
                                                         else "")
        description = f"the selected {'job' if count == 1 else 'jobs'}: {shown}"
    context = dict(req, count=count, capped=capped, description=description, eligible=eligible,
                   verb=BULK_VERBS[req["action"]][0], args=filter_args(req["filter"]) if req["filter"] else {})
    if not is_htmx():
        return render_template("jobqueue/dashboard/bulk_confirm.html", **context)
    return render_template("jobqueue/dashboard/_bulk_confirm.html", **context)


@bp.post("/jobs/bulk")
@admin_required
def bulk():
    # Everything the request says is read and checked first: a bad field answers 400 before any
    # row is touched or audited.
    _require_confirm()
    req = _bulk_request()
    previous = {k: _int_arg(request.form, f"total_{k}") or 0 for k in ("changed", "busy", "skipped", "paused_ms")}
    deadline = time.monotonic() + BULK_TIME_BUDGET
    action, job_filter = req["action"], req["filter"]
    replicas = extension().replicas
    pace = replicas.wait if replicas is not None else None
    with db() as conn:
        if req["scope"] == "filter":
            result = repository.bulk_action(conn, action, actor=actor(), job_filter=job_filter, after_id=req["after"],
                                            reason=req["reason"], force=req["force"], deadline=deadline, pace=pace)
        else:
            # At most two batches: only a pause for replica lag makes it stop before the end.
            result = repository.bulk_action(conn, action, actor=actor(), ids=req["ids"], reason=req["reason"],
                                            force=req["force"], deadline=deadline if pace else None, pace=pace)
    totals = {k: previous[k] + getattr(result, k) for k in ("changed", "busy", "skipped")}
    totals["paused_ms"] = previous["paused_ms"] + round(result.paused_seconds * 1000)
    context = {"action": action, "result": result, "totals": totals, "scope": req["scope"], "force": req["force"],
               "reason": req["reason"], "args": filter_args(job_filter) if job_filter else {},
               "ids": req["ids"] or []}
    message = bulk_message(action, totals, result.finished, result.replica_note)
    if not is_htmx():
        flash(message, "success")
        return redirect(url_for("jobqueue.dashboard.jobs", **context["args"]))
    return render_template("jobqueue/dashboard/_bulk_progress.html", message=message, **context)


@bp.post("/jobs/<bigint:job_id>/cancel")
@admin_required
def cancel(job_id: int):
    _require_confirm()
    reason = (request.form.get("reason") or "").strip()[:1000] or None
    try:
        with db() as conn:
            result = repository.cancel_job(conn, job_id, reason, actor=actor())
    except JobNotFound:
        abort(404, description=f"job {job_id} not found")
    except InvalidState as exc:
        return _action_response(job_id, str(exc), "error")
    except JobBusy:
        return _action_response(job_id, f"Job {job_id} is busy (a worker is claiming it right now); try again.",
                                "warning")
    message = (f"Job {job_id} cancelled ({result.before.value} → cancelled)." if result.changed
               else f"Job {job_id} is already cancelled.")
    return _action_response(job_id, message, "success")


# --- queues: pause and resume --------------------------------------------------------------------

def _queue_action(queue: str, paused: bool):
    _require_confirm()
    try:
        with db() as conn:
            verb = repository.pause_queue if paused else repository.resume_queue
            state = verb(conn, queue, actor=actor())
    except ValidationError as exc:
        abort(400, description=str(exc))
    word = "paused" if paused else "resumed"
    message = f"Queue {queue} {word}." if state.changed else f"Queue {queue} was already {'paused' if paused else 'active'}."
    if not is_htmx():
        flash(message, "success")
        return redirect(url_for("jobqueue.dashboard.overview"))
    return render_template("jobqueue/dashboard/_overview.html", **overview_context(), flash_message=message,
                           flash_category="success")


@bp.post("/queues/<queue>/pause")
@admin_required
def pause_queue(queue: str):
    return _queue_action(queue, True)


@bp.post("/queues/<queue>/resume")
@admin_required
def resume_queue(queue: str):
    return _queue_action(queue, False)


# --- recurring jobs ------------------------------------------------------------------------------

@bp.get("/recurring")
@login_required
def recurring():
    with db() as conn:
        schedules, now = repository.list_recurring(conn)
    return render_template("jobqueue/dashboard/recurring.html", schedules=schedules, now=now, tasks=TASKS.names())


def _recurring_done(message: str, category: str = "success"):
    flash(message, category)
    return redirect(url_for("jobqueue.dashboard.recurring"))


@bp.post("/recurring")
@admin_required
def add_recurring():
    _require_confirm()
    form = request.form
    name = (form.get("name") or "").strip()
    try:
        payload = json.loads(form.get("payload") or "{}")
    except ValueError as exc:
        return _recurring_done(f"The payload is not valid JSON: {exc}", "error")
    try:
        with db() as conn:
            row, created = repository.upsert_recurring(
                conn, name, cron=(form.get("cron") or "").strip(), task=(form.get("task") or "").strip(),
                payload=payload, queue=(form.get("queue") or "").strip() or None, actor=actor())
    except ValidationError as exc:
        return _recurring_done(str(exc), "error")
    return _recurring_done(f"Recurring job {name} {'added' if created else 'replaced'}; next run "
                           f"{row['next_run_at']:%Y-%m-%d %H:%M} UTC.")


@bp.post("/recurring/<name>/<verb>")
@admin_required
def recurring_action(name: str, verb: str):
    _require_confirm()
    if verb not in ("enable", "disable", "remove"):
        abort(404)
    try:
        with db() as conn:
            if verb == "remove":
                repository.remove_recurring(conn, name, actor=actor())
            else:
                repository.set_recurring_enabled(conn, name, verb == "enable", actor=actor())
    except NotFound as exc:
        return _recurring_done(str(exc), "error")
    return _recurring_done(f"Recurring job {name} {verb}d." if verb != "remove" else f"Recurring job {name} removed.")


def bulk_message(action: str, totals: dict[str, int], finished: bool, replica_note: str | None = None) -> str:
    verb = BULK_VERBS[action][1]
    text = f"{totals['changed']} {'job' if totals['changed'] == 1 else 'jobs'} {verb}"
    if totals["busy"]:
        text += f", {totals['busy']} busy (held by a worker this instant; run it again for those)"
    if totals["skipped"]:
        text += f", {totals['skipped']} skipped (not in a state this applies to)"
    paused = totals.get("paused_ms", 0) / 1000
    if paused or replica_note:
        # Paused so far over the whole bulk (every request of it), then why (the last wait's reading).
        text += f"; paused for replica lag: {paused:.1f} s" if paused else ""
        text += f" ({replica_note})" if replica_note else ""
    return text + ("." if finished else "; continuing…")
