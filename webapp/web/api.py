"""JSON API, bearer-token auth (see auth.token_required).

POST /api/jobs                 enqueue: 201 {id, task_key, duplicate: false, status};
                               200 with duplicate: true for a known task_key;
                               400 malformed JSON / not an object, 413 too large, 422 invalid field
GET  /api/jobs                 ?status, queue, task, key, q, before, after, limit (<= 500): newest first,
                               {jobs, next_before, prev_after, matches, matches_capped, search_window...};
                               400 {error, field} on a bad argument
GET  /api/jobs/<id>            the job, its result and its attempts
GET  /api/stats                counts by queue and status
POST /api/jobs/<id>/requeue    {"force": bool, "again": bool}: 200, 404, 409 (state, lease still valid:
                               needs force, done: needs again), 423 busy
POST /api/jobs/<id>/fail       {"reason": str}: 200, 404, 409, 423 busy
"""

from __future__ import annotations

from typing import Any

from flask import Blueprint, g, jsonify, request

from ..core import repository
from ..core.errors import (InvalidState, JobBusy, JobNotFound, LeaseStillValid, PayloadTooLarge, RunAgainNeeded,
                           ValidationError)
from ..core.models import Job, Status, iso
from ..core.validation import job_query
from .auth import token_required
from .state import db

bp = Blueprint("api", __name__, url_prefix="/api")

ENQUEUE_FIELDS = {"task", "task_key", "payload", "queue", "priority", "delay", "max_attempts"}


def job_json(job: Job) -> dict[str, Any]:
    return job.as_dict()


def error(http_status: int, message: str, **extra: Any):
    response = jsonify({"error": message, **extra})
    response.status_code = http_status
    return response


def _actor() -> str:
    return f"api:{g.api_token.name}"


@bp.post("/jobs")
@token_required(admin=True)
def enqueue():
    if not request.is_json:
        return error(400, "send the job as a JSON object with Content-Type: application/json")
    body = request.get_json(silent=True)
    if body is None:
        return error(400, "the request body is not valid JSON")
    if not isinstance(body, dict):
        return error(400, f"the request body must be a JSON object, got {type(body).__name__}")
    unknown = sorted(set(body) - ENQUEUE_FIELDS)
    if unknown:
        return error(422, f"unknown fields: {', '.join(map(str, unknown))[:200]}", field=unknown[0])
    try:
        with db() as conn:
            res = repository.enqueue(conn, body.get("task"), body.get("task_key"), body.get("payload"),
                                     queue=body.get("queue"), priority=body.get("priority", 0),
                                     delay=body.get("delay", 0), max_attempts=body.get("max_attempts"))
            job = repository.get_job(conn, res.id)
    except PayloadTooLarge as exc:
        return error(413, str(exc), field=exc.field)
    except ValidationError as exc:
        return error(422, str(exc), field=exc.field)
    return jsonify({"id": res.id, "task_key": res.task_key, "duplicate": res.duplicate,
                    "status": job.status.value if job else None}), (200 if res.duplicate else 201)


@bp.get("/jobs")
@token_required()
def list_jobs():
    """Jobs matching the dashboard's filters, newest first, keyset-paged (never OFFSET)."""
    unknown = sorted(set(request.args) - {"status", "queue", "task", "key", "q", "before", "after", "limit"})
    if unknown:
        return error(400, f"unknown arguments: {', '.join(unknown)[:200]}", field=unknown[0])
    try:
        query = job_query(request.args)
    except ValidationError as exc:
        return error(400, str(exc), field=exc.field)
    with db() as conn:
        page = repository.page_jobs(conn, query.job_filter, before=query.before, after=query.after,
                                    limit=query.limit)
    return jsonify(page.as_dict())


@bp.get("/jobs/<int:job_id>")
@token_required()
def get_job(job_id: int):
    with db() as conn:
        job = repository.get_job(conn, job_id)
        if job is None:
            return error(404, f"job {job_id} not found")
        result = repository.get_result(conn, job.task_key)
        attempts = repository.list_attempts(conn, job_id)
    data = job_json(job)
    data["result"] = result["result"] if result else None
    data["attempt_history"] = [{**a, "started_at": iso(a["started_at"]), "finished_at": iso(a["finished_at"])}
                               for a in attempts]
    return jsonify(data)


@bp.get("/stats")
@token_required()
def stats():
    with db() as conn:
        summaries, now = repository.queue_summaries(conn)
    queues = {q.queue: {**q.counts, "oldest_ready_age_seconds":
                        round((now - q.oldest_ready).total_seconds(), 3) if q.oldest_ready else None,
                        "capped": sorted(q.capped)} for q in summaries}
    totals = {s.value: sum(q.counts[s.value] for q in summaries) for s in Status}
    return jsonify({"queues": queues, "totals": totals, "now": iso(now)})


def _operator(job_id: int, action):
    try:
        with db() as conn:
            result = action(conn)
    except JobNotFound as exc:
        return error(404, str(exc))
    except LeaseStillValid as exc:
        return error(409, str(exc), status=exc.status, needs="force")
    except RunAgainNeeded as exc:
        return error(409, str(exc), status=exc.status, needs="again")
    except InvalidState as exc:
        return error(409, str(exc), status=exc.status)
    except JobBusy as exc:
        response = error(423, str(exc))
        response.headers["Retry-After"] = "1"
        return response
    return jsonify({"id": result.job_id, "before": result.before.value, "after": result.after.value,
                    "changed": result.changed})


def _body() -> dict[str, Any]:
    body = request.get_json(silent=True) if request.data else {}
    return body if isinstance(body, dict) else {}


@bp.post("/jobs/<int:job_id>/requeue")
@token_required(admin=True)
def requeue(job_id: int):
    body = _body()
    force, again = body.get("force") is True, body.get("again") is True
    return _operator(job_id, lambda conn: repository.requeue_job(conn, job_id, force=force, again=again,
                                                                 actor=_actor()))


@bp.post("/jobs/<int:job_id>/fail")
@token_required(admin=True)
def fail(job_id: int):
    reason = _body().get("reason")
    if reason is not None and not isinstance(reason, str):
        return error(422, "reason must be a string", field="reason")
    return _operator(job_id, lambda conn: repository.fail_job(conn, job_id, reason, actor=_actor()))
