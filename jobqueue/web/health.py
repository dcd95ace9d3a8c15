"""Health: `jobqueue doctor`'s checks on the dashboard and as JSON, and /metrics.

The checks run EXPLAIN and read server variables, so each web process caches their result for a
minute; a database that cannot be reached is reported at once, never as a stack trace.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from flask import Blueprint, Response, current_app, g, jsonify, render_template, request
from sqlalchemy.exc import SQLAlchemyError

from ..core import doctor, metrics, repository
from ..core.errors import TransientDatabaseError
from ..core.worker.state import NOT_CLAIMING
from .auth import bearer_token, current_user, login_required, token_refusal
from .state import extension

bp = Blueprint("health", __name__)

CACHE_SECONDS = 60.0
_cache: dict[int, tuple[float, dict[str, Any]]] = {}
_lock = threading.Lock()


ALIVE_SECONDS = 45  # a heartbeat every 15 s: three missed ones make a process silent


def workers_report() -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
    """Every worker process heard from lately, with what each slot holds, read fresh (not
    cached: a worker that stopped claiming must show at once), and a check when a live one is
    not claiming because its server is not a writable primary, or because two are."""
    with extension().engine.connect() as conn:
        processes, now = repository.processes.list_processes(conn, limit=100)
    workers = []
    for p in processes:
        alive = p["stopped_at"] is None and (now - p["last_heartbeat"]).total_seconds() <= ALIVE_SECONDS
        if p["stopped_at"] is not None and (now - p["stopped_at"]).total_seconds() > 3600:
            continue
        workers.append(
            {
                "id": p["id"],
                "host": p["host"],
                "pid": p["pid"],
                "kind": p["kind"],
                "queues": p["queues"],
                "alive": alive,
                "state": p["state"].get("state"),
                "detail": p["state"].get("detail"),
                "jobs_in_hand": p["jobs_in_hand"],
                "slots": p["slots"],
                "last_heartbeat_seconds_ago": round((now - p["last_heartbeat"]).total_seconds(), 1),
            }
        )
    paused = [w for w in workers if w["alive"] and w["state"] in NOT_CLAIMING]
    return workers, (_not_claiming_check(paused) if paused else None)


def _not_claiming_check(paused: list[dict[str, Any]]) -> dict[str, Any]:
    if any(w["state"] == "split_brain" for w in paused):
        advice = (
            "two candidate primaries are writable (split brain): make the old primary read-only "
            "(read_only=ON, and super_read_only=ON on MySQL); the workers resume on their own"
        )
    else:
        advice = (
            "point the workers at the writable primary (JOBQUEUE_DATABASE_URL may list several "
            "candidates); they resume on their own once one answers"
        )
    return {
        "name": "workers",
        "verdict": "problem",
        "detail": "; ".join(f"{w['id']} is not claiming ({w['state']}: {w['detail']})" for w in paused)[:2000],
        "advice": advice,
    }


def run_health(force: bool = False) -> dict[str, Any]:
    """{"status": ok|warning|problem|error, "checks": [...], "workers": [...], "replicas": [...],
    "error": str|None}; the doctor's checks cached per app, the workers and replicas read fresh."""
    result = _doctor_checks(force)
    # The replicas are read fresh (one SHOW SLAVE STATUS each: a lag a minute old says little),
    # and shown even while the primary is down.
    replicas = extension().replicas
    reports = replicas.read() if replicas is not None else []
    if result["status"] == "error":
        return {**result, "replicas": [r.as_dict() for r in reports]}
    try:
        workers, check = workers_report()
    except (SQLAlchemyError, TransientDatabaseError):
        workers, check = [], None
    # This process's own embedded worker, from memory: right even when the database refuses its
    # heartbeat (a read-only server takes no writes, bookkeeping included).
    runtime = extension().runtime
    if runtime.worker is not None:
        mine = runtime.worker.status()
        workers = [w for w in workers if w["id"] != runtime.worker.id]
        workers.insert(0, {"id": runtime.worker.id, "kind": "embedded", "alive": True, "this_process": True, **mine})
        if mine["state"] in NOT_CLAIMING and check is None:
            check = _not_claiming_check([{"id": runtime.worker.id, **mine}])
    checks = result["checks"] + ([check] if check else [])
    if replicas is not None:
        checks += [doctor.check_replica(r, replicas.lag_limit).as_dict() for r in reports]
    verdicts = {c["verdict"] for c in checks}
    status = "problem" if "problem" in verdicts else "warning" if "warning" in verdicts else "ok"
    return {
        **result,
        "status": status,
        "checks": checks,
        "workers": workers,
        "replicas": [r.as_dict() for r in reports],
    }


def _doctor_checks(force: bool) -> dict[str, Any]:
    key = id(current_app._get_current_object())
    now = time.monotonic()
    with _lock:
        cached = _cache.get(key)
    if cached and not force and now - cached[0] < CACHE_SECONDS:
        return cached[1]
    try:
        checks = doctor.run_checks(extension().engine)
        verdicts = {c.verdict for c in checks}
        status = (
            "problem"
            if doctor.Verdict.PROBLEM in verdicts
            else "warning"
            if doctor.Verdict.WARNING in verdicts
            else "ok"
        )
        result = {"status": status, "checks": [c.as_dict() for c in checks], "error": None}
    except (SQLAlchemyError, TransientDatabaseError) as exc:
        # Not cached: the next look should see the database come back.
        return {
            "status": "error",
            "checks": [],
            "error": f"database unavailable: {getattr(exc, 'orig', None) or exc}"[:300],
        }
    with _lock:
        _cache[key] = (now, result)
    return result


def health_summary() -> dict[str, Any]:
    result = run_health()
    return {**result, "flagged": [c for c in result["checks"] if c["verdict"] != "ok"]}


def _viewer_or_token() -> bool:
    if bearer_token() is not None:
        return True
    user = current_user()
    if user is not None:
        g.user = user
        return True
    return False


@bp.get("/healthz")
def healthz():
    """For load balancers: no login, no details beyond ok / database unavailable."""
    try:
        with extension().engine.connect() as conn:
            repository.reads.database_now(conn)
    except (SQLAlchemyError, TransientDatabaseError):
        return jsonify({"status": "error", "error": "database unavailable"}), 503
    return jsonify({"status": "ok", "embedded_workers": extension().runtime.started})


@bp.get("/health")
@login_required
def page():
    return render_template("jobqueue/health/health.html", health=run_health(force=request.args.get("refresh") == "1"))


@bp.get("/api/health")
def api_health():
    """Token or session; 200 unless the database is unreachable or a check found a problem (503)."""
    if not _viewer_or_token():
        return jsonify({"error": token_refusal()}), 401
    result = run_health()
    return jsonify(result), (200 if result["status"] in ("ok", "warning") else 503)


class QueueCollector:
    """Gauges read from the database when scraped: jobs by queue and status (capped counts, see
    repository.stats.queue_summaries), the oldest ready job's age per queue, and which queues are paused."""

    def __init__(self, engine, counts=None):
        self.engine = engine
        self.counts = counts

    def collect(self):
        from prometheus_client.core import GaugeMetricFamily

        with self.engine.connect() as conn:
            queues, now = repository.stats.list_queues(conn, counts=self.counts)
        jobs = GaugeMetricFamily(
            "jobqueue_queue_jobs",
            "Jobs by queue and status (capped: ready, running, scheduled "
            "and failed at 100,000 per pair, done and cancelled at 10,000)",
            labels=["queue", "status"],
        )
        oldest = GaugeMetricFamily(
            "jobqueue_queue_oldest_ready_age_seconds",
            "How long the oldest ready job of each queue has waited",
            labels=["queue"],
        )
        paused = GaugeMetricFamily("jobqueue_queue_paused", "1 while a queue is paused", labels=["queue"])
        for q in queues:
            for status, n in q["counts"].items():
                jobs.add_metric([q["queue"], status], n)
            oldest.add_metric([q["queue"]], (now - q["oldest_ready"]).total_seconds() if q["oldest_ready"] else 0.0)
            paused.add_metric([q["queue"]], 1.0 if q["paused"] else 0.0)
        yield jobs
        yield oldest
        yield paused


@bp.get("/metrics")
def metrics_view():
    """Prometheus text format; a bearer token (any role) or a signed-in user."""
    if not _viewer_or_token():
        return jsonify({"error": token_refusal()}), 401
    try:
        body = metrics.exposition(QueueCollector(extension().engine, extension().counts))
    except (SQLAlchemyError, TransientDatabaseError):
        body = metrics.exposition()  # the counters still tell what happened
    # Response's mimetype adds "; charset=utf-8" by itself: give the parameters once.
    response = Response(body)
    response.headers["Content-Type"] = "text/plain; version=0.0.4; charset=utf-8"
    return response
