"""JSON API, bearer-token auth (see auth.token_required).

POST /api/jobs                 enqueue: 201 {id, task_key, duplicate: false, status};
                               200 with duplicate: true for a known task_key;
                               400 malformed JSON / not an object, 413 too large, 422 invalid field
GET  /api/jobs                 ?status, queue, task, key, q, before, limit (<= 500): newest first,
                               {jobs, next_before, matches, matches_capped, search_window...};
                               400 {error, field} on a bad argument
GET  /api/jobs/<id>            the job, its result and its attempts
GET  /api/stats                counts by queue and status
POST /api/jobs/<id>/requeue    {"force": bool, "again": bool}: 200, 404, 409 (state, lease still valid:
                               needs force, done: needs again), 423 busy
POST /api/jobs/<id>/fail       {"reason": str}: 200, 404, 409, 423 busy
GET  /api/openapi.json         the contract (webapp/web/openapi.py; keep it in step with the routes)
"""

from __future__ import annotations

import json
from typing import Any

from flask import Blueprint, g, jsonify, request

from ..core import repository
from ..core.errors import JobBusy, JobQueueError, ValidationError, answer_for
from ..core.models import Job, Status, iso
from ..core.tasks import TASKS
from ..core.validation import check_reason, job_query
from . import openapi
from .auth import token_required
from .state import db

bp = Blueprint("api", __name__, url_prefix="/api")

ENQUEUE_FIELDS = {"task", "task_key", "payload", "queue", "priority", "delay", "max_attempts"}
LIST_ARGS = {"status", "queue", "task", "key", "q", "before", "limit"}


def job_json(job: Job) -> dict[str, Any]:
    return job.as_dict()


def error(http_status: int, message: str, **extra: Any):
    response = jsonify({"error": message, **extra})
    response.status_code = http_status
    return response


def _actor() -> str:
    return f"api:{g.api_token.name}"


class BadBody(Exception):
    """The request body is not what the endpoint takes: answered 400 (or 422 for a field) before
    anything is done."""

    def __init__(self, status: int, message: str, field: str | None = None):
        super().__init__(message)
        self.status, self.message, self.field = status, message, field


def json_object(*, fields: set[str], required: bool) -> dict[str, Any]:
    """The body as a JSON object with only `fields` in it. An empty body is {} unless `required`.
    A body nested deeper than the JSON parser recurses (thousands of levels) is refused here, not
    answered with a RecursionError."""
    if not request.get_data(cache=True):
        if required:
            raise BadBody(400, "send the job as a JSON object with Content-Type: application/json")
        return {}
    if not request.is_json:
        raise BadBody(400, "send a JSON object with Content-Type: application/json")
    try:
        body = json.loads(request.get_data(cache=True))
    except RecursionError:
        raise BadBody(400, "the request body is nested too deeply to be read") from None
    except ValueError:
        raise BadBody(400, "the request body is not valid JSON") from None
    if not isinstance(body, dict):
        raise BadBody(400, f"the request body must be a JSON object, got {type(body).__name__}")
    unknown = sorted(set(body) - fields)
    if unknown:
        raise BadBody(422, f"unknown fields: {', '.join(map(repr, unknown))[:200]}", unknown[0])
    return body


@bp.errorhandler(BadBody)
def _bad_body(exc: BadBody):
    extra = {"field": exc.field} if exc.field is not None else {}
    return error(exc.status, exc.message, **extra)


@bp.post("/jobs")
@token_required(admin=True)
def enqueue():
    body = json_object(fields=ENQUEUE_FIELDS, required=True)
    try:
        with db() as conn:
            res = repository.enqueue(conn, body.get("task"), body.get("task_key"), body.get("payload"),
                                     queue=body.get("queue"), priority=body.get("priority", 0),
                                     delay=body.get("delay", 0), max_attempts=body.get("max_attempts"))
            job = repository.get_job(conn, res.id)
    except ValidationError as exc:
        answer = answer_for(exc)
        return error(answer.http_status, answer.message, **answer.extra)
    return jsonify({"id": res.id, "task_key": res.task_key, "duplicate": res.duplicate,
                    "status": job.status.value if job else None}), (200 if res.duplicate else 201)


@bp.get("/jobs")
@token_required()
def list_jobs():
    """Jobs matching the dashboard's filters, newest first, keyset-paged (never OFFSET)."""
    unknown = sorted(set(request.args) - LIST_ARGS)
    if unknown:
        return error(400, f"unknown arguments: {', '.join(unknown)[:200]}", field=unknown[0])
    repeated = sorted(k for k in request.args if len(request.args.getlist(k)) > 1)
    if repeated:
        return error(400, f"{repeated[0]} is given more than once", field=repeated[0])
    try:
        query = job_query(request.args, strict=True)
    except ValidationError as exc:
        return error(400, str(exc), field=exc.field)
    with db() as conn:
        page = repository.page_jobs(conn, query.job_filter, before=query.before, limit=query.limit)
    return jsonify(page.as_dict())


@bp.get("/openapi.json")
def openapi_document():
    """This API's contract (OpenAPI 3.1); public, like any API's documentation."""
    return jsonify(openapi.document(TASKS.names()))


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
    except JobQueueError as exc:
        answer = answer_for(exc)
        response = error(answer.http_status, answer.message, **answer.extra)
        if isinstance(exc, JobBusy):
            response.headers["Retry-After"] = "1"
        return response
    return jsonify({"id": result.job_id, "before": result.before.value, "after": result.after.value,
                    "changed": result.changed})


@bp.post("/jobs/<int:job_id>/requeue")
@token_required(admin=True)
def requeue(job_id: int):
    body = json_object(fields={"force", "again"}, required=False)
    force, again = body.get("force", False), body.get("again", False)
    for name, value in (("force", force), ("again", again)):
        if not isinstance(value, bool):
            return error(422, f"{name} must be true or false", field=name)
    return _operator(job_id, lambda conn: repository.requeue_job(conn, job_id, force=force, again=again,
                                                                 actor=_actor()))


@bp.post("/jobs/<int:job_id>/fail")
@token_required(admin=True)
def fail(job_id: int):
    try:
        reason = check_reason(json_object(fields={"reason"}, required=False).get("reason"))
    except ValidationError as exc:
        return error(422, str(exc), field=exc.field)
    return _operator(job_id, lambda conn: repository.fail_job(conn, job_id, reason, actor=_actor()))
