"""JSON API, bearer-token auth (see auth.token_required).

POST /api/jobs                 enqueue: 201 {id, task_key, duplicate: false, status};
                               200 with duplicate: true for a known task_key;
                               400 malformed JSON / not an object, 413 too large, 422 invalid field.
                               A JSON array of up to 1,000 jobs: one transaction, an array of
                               results in order; 201 if any was created, else 200; 413 over 1,000
                               jobs; 422 {error, index, field} for an invalid job, nothing written
GET  /api/jobs                 ?status, queue, task, key, q, batch, before, limit (<= 500): newest first,
                               {jobs, next_before, matches, matches_capped, search_window...};
                               400 {error, field} on a bad argument
GET  /api/jobs/<id>            the job, its result and its attempts
GET  /api/jobs/<id>/result     ?wait=SECONDS (0..30, long poll): 200 {id, task_key, status, result, error,
                               finished_at} once done, failed or cancelled (branch on status); 202, the
                               same fields, while it has not finished; 400 bad wait; 404
GET  /api/jobs/<id>/explain    why it is (not) running: {job_id, status, reasons: [{code, detail, ...}]};
                               404; SQL statement text (locked_by_transaction) only for admin tokens
GET  /api/stats                counts by queue and status
POST /api/jobs/<id>/requeue    {"force": bool, "again": bool}: 200, 404, 409 (state, lease still valid:
                               needs force, done: needs again), 423 busy
POST /api/jobs/<id>/fail       {"reason": str}: 200, 404, 409, 423 busy
GET  /api/openapi.json         the contract (jobqueue/web/openapi.py; keep it in step with the routes)
POST /api/jobs/<id>/cancel     {"reason": str}: 200, 404, 409 (already done), 423 busy
GET  /api/queues               every known queue, paused or not, with counts
POST /api/queues/<q>/pause     200 {queue, paused: true}; /resume: {queue, paused: false}; 422 bad name
GET  /api/queues/<q>/scale     for autoscalers: {queue, ready, running, oldest_ready_age_seconds, capped,
                               cap, now}, fresh; zeros for a queue with no jobs; 422 bad name
GET  /api/recurring            the recurring jobs
POST /api/recurring            {name, cron, task, payload, queue}: 201 added, 200 replaced, 422 invalid
POST /api/recurring/<n>/enable, /disable; DELETE /api/recurring/<n>: 200, 404
POST /api/batches              {key, on_success, on_failure, on_complete, payload}: 201 opened, 200 known
POST /api/batches/<k>/close    200 the batch; 404. GET /api/batches/<k>: {key, state, total, done, failed,
                               cancelled, pending, callbacks, ...}; 404. POST /api/jobs {"batch": key}:
                               a member; 404 unknown batch, 409 closed
GET  /api/retention            the keep times and the last prune
POST /api/prune                {done_older_than, failed_older_than, dry_run}: counts; works at most
                               10 s per request ("finished": false: call again)
"""

from __future__ import annotations

import json
import time
from typing import Any

from flask import Blueprint, current_app, g, jsonify, request
from werkzeug.exceptions import RequestEntityTooLarge

from ..core import repository, service
from ..core.errors import (
    BatchClosed,
    BatchNotFound,
    JobBusy,
    JobQueueError,
    NotFound,
    PayloadTooLarge,
    ValidationError,
    answer_for,
)
from ..core.models import Job, Status, iso
from ..core.repository import stats as stats_sql
from ..core.results import wait_for
from ..core.tasks import TASKS
from ..core.validation import (
    MAX_BATCH_JOBS,
    SINGLE_ENQUEUE_FIELDS,
    check_reason,
    job_query,
    job_spec,
    max_payload_bytes,
)
from . import openapi
from .auth import token_required
from .state import db, extension

bp = Blueprint("api", __name__, url_prefix="/api")

LIST_ARGS = {"status", "queue", "task", "key", "q", "batch", "before", "limit"}
MAX_RESULT_WAIT = openapi.MAX_RESULT_WAIT  # a long poll holds one of the web process's threads


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
            raise BadBody(400, "send a JSON object with Content-Type: application/json")
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


BATCH_BODY_BYTES = 16 * 1024 * 1024  # an array's body at most (or the single job's limit, if larger)


@bp.post("/jobs")
@token_required(admin=True)
def enqueue():
    # An array of jobs needs more room than one job's body; the body is read after this.
    request.max_content_length = max(BATCH_BODY_BYTES, current_app.config["MAX_CONTENT_LENGTH"] or 0)
    body = _json_body()
    if isinstance(body, list):
        return _enqueue_batch(body)
    single_limit = current_app.config["MAX_CONTENT_LENGTH"]
    if single_limit is not None and len(request.get_data(cache=True)) > single_limit:
        raise RequestEntityTooLarge()
    body = json_object(fields=SINGLE_ENQUEUE_FIELDS, required=True)
    for name in ("after", "on_parent_failure", "batch"):
        if name in body and body[name] is None:  # left out means none; null is not a value of theirs
            return error(422, f"{name}: leave it out rather than null", field=name)
    try:
        with db() as conn:
            res = service.enqueue(
                conn,
                body.get("task"),
                body.get("task_key"),
                body.get("payload"),
                queue=body.get("queue"),
                priority=body.get("priority", 0),
                delay=body.get("delay", 0),
                max_attempts=body.get("max_attempts"),
                allow_unregistered=body.get("allow_unregistered", False),
                after=body.get("after"),
                on_parent_failure=body.get("on_parent_failure"),
                batch=body.get("batch"),
            )
    except (ValidationError, BatchNotFound, BatchClosed) as exc:
        answer = answer_for(exc)
        return error(answer.http_status, answer.message, **answer.extra)
    # The status is the job's (a pruned job's key: the status its record kept).
    return jsonify({"id": res.id, "task_key": res.task_key, "duplicate": res.duplicate, "status": res.status.value}), (
        200 if res.duplicate else 201
    )


def _json_body() -> Any:
    """The body parsed, when it is a JSON array; anything else is left to json_object."""
    data = request.get_data(cache=True)
    if not request.is_json or not data.lstrip()[:1] == b"[":
        return None
    try:
        return json.loads(data)
    except RecursionError:
        raise BadBody(400, "the request body is nested too deeply to be read") from None
    except ValueError:
        raise BadBody(400, "the request body is not valid JSON") from None


def _enqueue_batch(items: list[Any]):
    """An array of jobs, all or nothing: 201 with one result per job, in order, if any job was
    created (200 if all were known); 413 over MAX_BATCH_JOBS jobs; an item that is not an object:
    400; an invalid job: 422 (413 for a payload too large) naming its `index` and `field`. On any
    error nothing is written."""
    if len(items) > MAX_BATCH_JOBS:
        return error(413, f"at most {MAX_BATCH_JOBS} jobs per request, got {len(items)}")
    jobs = repository.enqueue.Validated()
    limit = max_payload_bytes()
    with db() as conn:
        known = repository.task_definitions.KnownTasks(conn)
        for index, item in enumerate(items):
            if not isinstance(item, dict):  # as for a body that is not an object
                return error(400, f"job {index}: a job must be a JSON object, got {type(item).__name__}", index=index)
            try:
                jobs.append(repository.enqueue.validate_job(job_spec(item), limit=limit, registry=known))
            except ValidationError as exc:
                answer = answer_for(exc)
                return error(
                    answer.http_status, f"job {index}: {answer.message}", index=index, **{"field": None, **answer.extra}
                )
        results = service.enqueue_many(conn, jobs)
    body = [{"id": r.id, "task_key": r.task_key, "duplicate": r.duplicate, "status": r.status.value} for r in results]
    return jsonify(body), (201 if any(not r.duplicate for r in results) else 200)


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
        page = repository.reads.page_jobs(conn, query.job_filter, before=query.before, limit=query.limit)
    return jsonify(page.as_dict())


@bp.get("/openapi.json")
def openapi_document():
    """This API's contract (OpenAPI 3.1); public, like any API's documentation."""
    keyed = {
        name: spec.concurrency_key
        for name in TASKS.names()
        if (spec := TASKS.get(name)) is not None and spec.concurrency_key is not None
    }
    document = openapi.document(TASKS.names(), keyed)
    if extension().url_prefix:
        # Mounted in a host app (init_dashboard): the paths are relative to its prefix.
        document["servers"] = [{"url": extension().url_prefix}]
    return jsonify(document)


@bp.get("/jobs/<bigint:job_id>")
@token_required()
def get_job(job_id: int):
    with db() as conn:
        job = repository.reads.get_job(conn, job_id)
        if job is None:
            return error(404, f"job {job_id} not found")
        result = repository.reads.get_result(conn, job.task_key)
        attempts = repository.reads.list_attempts(conn, job_id)
    data = job_json(job)
    data["result"] = result["result"] if result else None
    data["attempt_history"] = [
        {**a, "started_at": iso(a["started_at"]), "finished_at": iso(a["finished_at"])} for a in attempts
    ]
    return jsonify(data)


@bp.get("/jobs/<bigint:job_id>/result")
@token_required()
def job_result(job_id: int):
    """200 once the job finished (done, failed or cancelled: branch on `status`), 202 while it has
    not; ?wait=SECONDS (at most MAX_RESULT_WAIT) holds the answer until it finishes."""
    raw = request.args.get("wait", "0")
    try:
        wait = float(raw)
    except ValueError:
        wait = -1.0
    if not 0 <= wait <= MAX_RESULT_WAIT:
        return error(400, f"wait must be a number of seconds from 0 to {MAX_RESULT_WAIT:g}", field="wait")
    try:
        outcome = wait_for(extension().engine, job_id=job_id, timeout=wait)
    except NotFound as exc:
        return error(404, str(exc))
    return jsonify(outcome.as_dict()), 200 if outcome.finished else 202


@bp.get("/jobs/<int:job_id>/explain")
@token_required()
def explain(job_id: int):
    # On the primary, never a replica: row locks live there. Waits at most about a second.
    with db() as conn:
        try:
            data = repository.explain.explain(conn, job_id).as_dict()
        except NotFound as exc:
            return error(404, str(exc))
    return jsonify(hide_statements(data) if g.api_token.role != "admin" else data)


def hide_statements(explanation: dict[str, Any]) -> dict[str, Any]:
    """An explanation without other connections' SQL text (it may carry data): for viewers."""
    return {
        **explanation,
        "reasons": [{**r, "statement": None} if "statement" in r else r for r in explanation["reasons"]],
    }


@bp.get("/stats")
@token_required()
def stats():
    with db() as conn:
        summaries, now = extension().counts.summaries(conn)
    queues = {
        q.queue: {
            **q.counts,
            "oldest_ready_age_seconds": round((now - q.oldest_ready).total_seconds(), 3) if q.oldest_ready else None,
            "capped": sorted(q.capped),
        }
        for q in summaries
    }
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
    return jsonify(
        {"id": result.job_id, "before": result.before.value, "after": result.after.value, "changed": result.changed}
    )


@bp.post("/jobs/<bigint:job_id>/requeue")
@token_required(admin=True)
def requeue(job_id: int):
    body = json_object(fields={"force", "again"}, required=False)
    force, again = body.get("force", False), body.get("again", False)
    for name, value in (("force", force), ("again", again)):
        if not isinstance(value, bool):
            return error(422, f"{name} must be true or false", field=name)
    return _operator(job_id, lambda conn: service.requeue_job(conn, job_id, force=force, again=again, actor=_actor()))


@bp.post("/jobs/<bigint:job_id>/fail")
@token_required(admin=True)
def fail(job_id: int):
    try:
        reason = check_reason(json_object(fields={"reason"}, required=False).get("reason"))
    except ValidationError as exc:
        return error(422, str(exc), field=exc.field)
    return _operator(job_id, lambda conn: service.fail_job(conn, job_id, reason, actor=_actor()))


@bp.post("/jobs/<bigint:job_id>/cancel")
@token_required(admin=True)
def cancel(job_id: int):
    try:
        reason = check_reason(json_object(fields={"reason"}, required=False).get("reason"))
    except ValidationError as exc:
        return error(422, str(exc), field=exc.field)
    return _operator(job_id, lambda conn: service.cancel_job(conn, job_id, reason, actor=_actor()))


# --- queues ----------------------------------------------------------------------------------------


def queue_json(row: dict[str, Any]) -> dict[str, Any]:
    return {
        "queue": row["queue"],
        "paused": row["paused"],
        "changed_at": iso(row["changed_at"]),
        "changed_by": row["changed_by"],
        "counts": row["counts"],
        "capped": row["capped"],
    }


@bp.get("/queues")
@token_required()
def queues():
    with db() as conn:
        rows, now = repository.stats.list_queues(conn, counts=extension().counts)
    return jsonify({"queues": [queue_json(r) for r in rows], "now": iso(now)})


def _pause(queue: str, paused: bool):
    try:
        with db() as conn:
            verb = service.pause_queue if paused else service.resume_queue
            state = verb(conn, queue, actor=_actor())
    except ValidationError as exc:
        return error(422, str(exc), field=exc.field)
    return jsonify({"queue": state.queue, "paused": state.paused, "changed": state.changed})


@bp.post("/queues/<queue>/pause")
@token_required(admin=True)
def pause_queue(queue: str):
    return _pause(queue, True)


@bp.post("/queues/<queue>/resume")
@token_required(admin=True)
def resume_queue(queue: str):
    return _pause(queue, False)


@bp.get("/queues/<queue>/scale")
@token_required()
def queue_scale(queue: str):
    """Read fresh, not from the shared counts cache: an autoscaler polls one queue, and this
    costs three short index reads (repository/stats.py, scale_signal)."""
    try:
        with db() as conn:
            signal = stats_sql.scale_signal(conn, queue)
    except ValidationError as exc:
        return error(422, str(exc), field=exc.field)
    return jsonify(
        {
            "queue": signal.queue,
            "ready": signal.ready,
            "running": signal.running,
            "oldest_ready_age_seconds": signal.oldest_ready_age_seconds,
            "capped": sorted(signal.capped),
            "cap": stats_sql.SCALE_CAP,
            "now": iso(signal.now),
        }
    )


# --- batches -------------------------------------------------------------------------------------

BATCH_FIELDS = {"key", "on_success", "on_failure", "on_complete", "payload"}


def _batch_answer(action):
    try:
        with db() as conn:
            return action(conn)
    except (ValidationError, NotFound) as exc:
        answer = answer_for(exc)
        return error(answer.http_status, answer.message, **answer.extra)


@bp.post("/batches")
@token_required(admin=True)
def open_batch():
    body = json_object(fields=BATCH_FIELDS, required=True)

    def act(conn):
        shown, created = repository.batches.open_batch(
            conn,
            body.get("key"),
            on_success=body.get("on_success"),
            on_failure=body.get("on_failure"),
            on_complete=body.get("on_complete"),
            payload=body.get("payload"),
        )
        return jsonify({**shown, "created": created}), (201 if created else 200)

    return _batch_answer(act)


@bp.post("/batches/<key>/close")
@token_required(admin=True)
def close_batch(key: str):
    return _batch_answer(lambda conn: jsonify(service.close_batch(conn, key)))


@bp.get("/batches/<key>")
@token_required()
def show_batch(key: str):
    return _batch_answer(lambda conn: jsonify(repository.batches.show(conn, key)))


# --- recurring jobs ------------------------------------------------------------------------------

RECURRING_FIELDS = {"name", "cron", "task", "payload", "queue"}


def schedule_json(row: dict[str, Any]) -> dict[str, Any]:
    return {
        "name": row["name"],
        "cron": row["cron"],
        "task": row["task_name"],
        "payload": row["payload"],
        "queue": row["queue"],
        "enabled": row["enabled"],
        "source": row["source"],
        "next_run_at": iso(row["next_run_at"]),
        "last_run_at": iso(row["last_run_at"]),
        "last_job_id": row["last_job_id"],
        "updated_by": row["updated_by"],
        "updated_at": iso(row["updated_at"]),
    }


@bp.get("/recurring")
@token_required()
def list_recurring():
    with db() as conn:
        rows, now = repository.recurring.list_recurring(conn)
    return jsonify({"recurring": [schedule_json(r) for r in rows], "now": iso(now)})


@bp.post("/recurring")
@token_required(admin=True)
def add_recurring():
    body = json_object(fields=RECURRING_FIELDS, required=True)
    try:
        with db() as conn:
            row, created = service.upsert_recurring(
                conn,
                body.get("name"),
                cron=body.get("cron"),
                task=body.get("task"),
                payload=body.get("payload"),
                queue=body.get("queue"),
                actor=_actor(),
            )
    except ValidationError as exc:
        return error(413 if isinstance(exc, PayloadTooLarge) else 422, str(exc), field=exc.field)
    return jsonify({**schedule_json(row), "created": created}), (201 if created else 200)


def _schedule_action(action):
    try:
        with db() as conn:
            return action(conn)
    except NotFound as exc:
        return error(404, str(exc))


@bp.post("/recurring/<name>/enable")
@token_required(admin=True)
def enable_recurring(name: str):
    def act(conn):
        row, changed = service.set_recurring_enabled(conn, name, True, actor=_actor())
        return jsonify({**schedule_json(row), "changed": changed})

    return _schedule_action(act)


@bp.post("/recurring/<name>/disable")
@token_required(admin=True)
def disable_recurring(name: str):
    def act(conn):
        row, changed = service.set_recurring_enabled(conn, name, False, actor=_actor())
        return jsonify({**schedule_json(row), "changed": changed})

    return _schedule_action(act)


@bp.delete("/recurring/<name>")
@token_required(admin=True)
def remove_recurring(name: str):
    def act(conn):
        service.remove_recurring(conn, name, actor=_actor())
        return jsonify({"name": name, "removed": True})

    return _schedule_action(act)


# --- retention -----------------------------------------------------------------------------------

PRUNE_TIME_BUDGET = 10.0


def retention_json(settings, last: dict[str, Any] | None) -> dict[str, Any]:
    return {
        "keep_done_days": settings.keep_done_days,
        "keep_failed_days": settings.keep_failed_days,
        "keep_keys_days": settings.keep_keys_days,
        "last_prune": None
        if last is None
        else {
            "started_at": iso(last["started_at"]),
            "finished_at": iso(last["finished_at"]),
            "by": last["run_by"],
            "done": last["done_rows"],
            "failed": last["failed_rows"],
            "cancelled": last["cancelled_rows"],
            "attempts": last["attempt_rows"],
            "keys_expired": last["keys_expired"],
            "job_batches": last["batch_rows"],
            "batches": last["batches"],
            "seconds": last["seconds"],
        },
    }


@bp.get("/retention")
@token_required()
def retention():
    from .state import extension

    with db() as conn:
        last = repository.retention.last_prune(conn)
    return jsonify(retention_json(extension().settings.core, last))


def _days(body: dict[str, Any], name: str, default: float) -> float:
    value = body.get(name, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 36500:
        raise ValidationError(f"{name} must be a number of days in 0..36500", name)
    return float(value)


@bp.post("/prune")
@token_required(admin=True)
def prune():
    from .state import extension

    settings = extension().settings.core
    body = json_object(fields={"done_older_than", "failed_older_than", "dry_run"}, required=False)
    try:
        done_days = _days(body, "done_older_than", settings.keep_done_days)
        failed_days = _days(body, "failed_older_than", settings.keep_failed_days)
        dry_run = body.get("dry_run", False)
        if not isinstance(dry_run, bool):
            # Not truthiness: "dry_run": 1 taken as false would delete what the caller meant to count.
            raise ValidationError("dry_run must be true or false", "dry_run")
    except ValidationError as exc:
        return error(422, str(exc), field=exc.field)
    deadline = time.monotonic() + PRUNE_TIME_BUDGET
    with db() as conn:
        counts = service.prune(
            conn,
            done_days=done_days,
            failed_days=failed_days,
            keys_days=settings.keep_keys_days,
            dry_run=dry_run,
            by=_actor(),
            stop=lambda: time.monotonic() > deadline,
        )
    return jsonify(counts.as_dict())
