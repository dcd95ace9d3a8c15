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
from .auth import bearer_token, current_user, login_required
from .state import extension

bp = Blueprint("health", __name__)

CACHE_SECONDS = 60.0
_cache: dict[int, tuple[float, dict[str, Any]]] = {}
_lock = threading.Lock()


def run_health(force: bool = False) -> dict[str, Any]:
    """{"status": ok|warning|problem|error, "checks": [...], "error": str|None}, cached per app."""
    key = id(current_app._get_current_object())
    now = time.monotonic()
    with _lock:
        cached = _cache.get(key)
    if cached and not force and now - cached[0] < CACHE_SECONDS:
        return cached[1]
    try:
        checks = doctor.run_checks(extension().engine)
        verdicts = {c.verdict for c in checks}
        status = ("problem" if doctor.Verdict.PROBLEM in verdicts else
                  "warning" if doctor.Verdict.WARNING in verdicts else "ok")
        result = {"status": status, "checks": [c.as_dict() for c in checks], "error": None}
    except (SQLAlchemyError, TransientDatabaseError) as exc:
        # Not cached: the next look should see the database come back.
        return {"status": "error", "checks": [], "error": f"database unavailable: {getattr(exc, 'orig', None) or exc}"[:300]}
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
            repository.database_now(conn)
    except (SQLAlchemyError, TransientDatabaseError):
        return jsonify({"status": "error", "error": "database unavailable"}), 503
    return jsonify({"status": "ok", "embedded_workers": extension().runtime.started})


@bp.get("/health")
@login_required
def page():
    return render_template("health/health.html", health=run_health(force=request.args.get("refresh") == "1"))


@bp.get("/api/health")
def api_health():
    """Token or session; 200 unless the database is unreachable or a check found a problem (503)."""
    if not _viewer_or_token():
        return jsonify({"error": "missing bearer token"}), 401
    result = run_health()
    return jsonify(result), (200 if result["status"] in ("ok", "warning") else 503)


class QueueCollector:
    """Gauges read from the database when scraped: jobs by queue and status (capped counts, see
    repository.queue_summaries), the oldest ready job's age per queue, and which queues are paused."""

    def __init__(self, engine):
        self.engine = engine

    def collect(self):
        from prometheus_client.core import GaugeMetricFamily

        with self.engine.connect() as conn:
            queues, now = repository.list_queues(conn)
        jobs = GaugeMetricFamily("jobqueue_queue_jobs", "Jobs by queue and status (capped at 100,000 per pair)",
                                 labels=["queue", "status"])
        oldest = GaugeMetricFamily("jobqueue_queue_oldest_ready_age_seconds",
                                   "How long the oldest ready job of each queue has waited", labels=["queue"])
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
        return jsonify({"error": "missing bearer token"}), 401
    try:
        body = metrics.exposition(QueueCollector(extension().engine))
    except (SQLAlchemyError, TransientDatabaseError):
        body = metrics.exposition()  # the counters still tell what happened
    # Response's mimetype adds "; charset=utf-8" by itself: give the parameters once.
    response = Response(body)
    response.headers["Content-Type"] = "text/plain; version=0.0.4; charset=utf-8"
    return response
