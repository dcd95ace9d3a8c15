"""The operator's actions on jobs (requeue, fail, cancel; one job, or many in bulk within a time
budget) and on queues (pause, resume)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from flask import abort, flash, redirect, render_template, request, url_for
from sqlalchemy.engine import Connection

from ...core import repository, service
from ...core.errors import InvalidState, JobBusy, JobNotFound, LeaseStillValid, RunAgainNeeded, ValidationError
from ...core.models import Status
from ..auth import admin_required
from ..state import db, extension
from .common import (
    MATCH_COUNT_CAP,
    actor,
    bp,
    filter_args,
    int_arg,
    is_htmx,
    moving,
    parse_filter,
    require_confirm,
    whole_number,
    yes_no,
)
from .overview import overview_context

BULK_TIME_BUDGET = 10.0  # seconds of work per bulk request; the page continues where it stopped


def _action_response(job_id: int, message: str, category: str, *, needs: str | None = None):
    """HTMX: the job's row (or the detail page's action panel) swapped in place, with the message
    as an out-of-band flash. Without HTMX: back to where the click came from."""
    if not is_htmx():
        flash(message, category)
        return redirect(
            request.referrer
            if _same_site(request.referrer)
            else url_for("jobqueue.dashboard.job_detail", job_id=job_id)
        )
    with db() as conn:
        job = repository.reads.get_job(conn, job_id)
        now = repository.reads.database_now(conn)
    detail = request.form.get("view") == "detail"
    template = "jobqueue/dashboard/_job_actions.html" if detail else "jobqueue/dashboard/_job_row.html"
    return render_template(
        template,
        job=job,
        now=now,
        flash_message=message,
        flash_category=category,
        needs_force=needs == "force",
        needs_again=needs == "again",
        # A row that moves again restarts the page's live refresh.
        restart_live=not detail and moving(job),
    )


def _same_site(url: str | None) -> bool:
    return bool(url) and url.startswith(request.host_url)


def _reason() -> str | None:
    return (request.form.get("reason") or "").strip()[:1000] or None


def _job_action(
    job_id: int,
    act: Callable[[Connection], repository.operator.ActionResult],
    said: Callable[[repository.operator.ActionResult], str],
):
    """One operator action on one job, confirmed, on the primary: answered with what it did, or
    why it did nothing (a confirmation it needs, a state it does not apply to, a busy row)."""
    require_confirm()
    try:
        with db() as conn:
            result = act(conn)
    except JobNotFound:
        abort(404, description=f"job {job_id} not found")
    except LeaseStillValid as exc:
        return _action_response(job_id, f"{exc}.", "confirm", needs="force")
    except RunAgainNeeded:
        return _action_response(
            job_id,
            f"Job {job_id} is done. Running it again runs its handler again; "
            "record_result still keeps one result row per task_key, so its downstream "
            "result is not written twice. Confirm with \u201cRun again\u201d.",
            "confirm",
            needs="again",
        )
    except InvalidState as exc:
        return _action_response(job_id, str(exc), "error")
    except JobBusy:
        return _action_response(
            job_id, f"Job {job_id} is busy (a worker is claiming it right now); try again.", "warning"
        )
    return _action_response(job_id, said(result), "success")


def _requeued(result: repository.operator.ActionResult) -> str:
    if not result.changed:
        return f"Job {result.job_id} is already ready."
    if result.before is Status.DONE:
        return f"Job {result.job_id} runs again (done → ready); its task_key keeps its one result row."
    return f"Job {result.job_id} requeued ({result.before.value} → ready)."


@bp.post("/jobs/<bigint:job_id>/requeue")
@admin_required
def requeue(job_id: int):
    force, again = request.form.get("force") == "yes", request.form.get("again") == "yes"
    return _job_action(
        job_id, lambda conn: service.requeue_job(conn, job_id, force=force, again=again, actor=actor()), _requeued
    )


@bp.post("/jobs/<bigint:job_id>/fail")
@admin_required
def fail(job_id: int):
    reason = _reason()
    return _job_action(
        job_id,
        lambda conn: service.fail_job(conn, job_id, reason, actor=actor()),
        lambda r: f"Job {job_id} failed ({r.before.value} → failed).",
    )


@bp.post("/jobs/<bigint:job_id>/cancel")
@admin_required
def cancel(job_id: int):
    reason = _reason()
    return _job_action(
        job_id,
        lambda conn: service.cancel_job(conn, job_id, reason, actor=actor()),
        lambda r: (
            f"Job {job_id} cancelled ({r.before.value} → cancelled)."
            if r.changed
            else f"Job {job_id} is already cancelled."
        ),
    )


# Bulk actions: what each does, in the words of its button and its report.
BULK_VERBS = {"requeue": ("Requeue", "requeued"), "fail": ("Fail", "failed"), "cancel": ("Cancel", "cancelled")}


def _bulk_request(*, allow_none: bool = False) -> dict[str, Any]:
    """A bulk form, checked before anything is read or written: action, scope, the ids or the
    filter (with the search window it was shown, `min_id`, and where it starts, `after`)."""
    action = request.form.get("action")
    if action not in repository.operator.BULK_ELIGIBLE or action not in BULK_VERBS:
        abort(400, description="unknown bulk action")
    scope = request.form.get("scope", "selected")
    req: dict[str, Any] = {
        "action": action,
        "scope": scope,
        "force": yes_no(request.form, "force"),
        "reason": _reason(),
        "ids": None,
        "filter": None,
        "after": None,
    }
    if scope == "filter":
        req["filter"] = parse_filter(request.form)
        req["after"] = int_arg(request.form, "after")
        if req["filter"].search and req["filter"].min_id is None:
            abort(400, description="a bulk action over a search needs the window it was shown (min_id)")
    elif scope == "selected":
        raw = request.form.getlist("ids")
        if not raw and allow_none:
            return req  # the confirmation says to tick some rows
        ids = [whole_number(i.strip()) for i in raw]
        if not raw or len(raw) > 1000 or None in ids:
            abort(400, description="select between 1 and 1000 jobs (ids are positive whole numbers)")
        # A continuation (after a pause for replica lag) carries the same ids and where it stopped.
        req["after"] = int_arg(request.form, "after")
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
    eligible = [s.value for s in repository.operator.BULK_ELIGIBLE[req["action"]]]
    if req["scope"] == "selected" and not req["ids"]:
        count, capped, description = 0, False, "no rows ticked"
    elif req["scope"] == "filter":
        with db() as conn:
            count, capped = repository.reads.count_matching(
                conn, req["filter"], statuses=eligible, below=req["after"], cap=MATCH_COUNT_CAP
            )
        description = req["filter"].describe()
    else:
        count, capped = len(req["ids"]), False
        shown = ", ".join(map(str, req["ids"][:20])) + (
            f" and {len(req['ids']) - 20} more" if len(req["ids"]) > 20 else ""
        )
        description = f"the selected {'job' if count == 1 else 'jobs'}: {shown}"
    context = dict(
        req,
        count=count,
        capped=capped,
        description=description,
        eligible=eligible,
        verb=BULK_VERBS[req["action"]][0],
        args=filter_args(req["filter"]) if req["filter"] else {},
    )
    if not is_htmx():
        return render_template("jobqueue/dashboard/bulk_confirm.html", **context)
    return render_template("jobqueue/dashboard/_bulk_confirm.html", **context)


@bp.post("/jobs/bulk")
@admin_required
def bulk():
    # Everything the request says is read and checked first: a bad field answers 400 before any
    # row is touched or audited.
    require_confirm()
    req = _bulk_request()
    previous = {
        k: int_arg(request.form, f"total_{k}") or 0 for k in ("changed", "busy", "skipped", "blocked", "paused_ms")
    }
    deadline = time.monotonic() + BULK_TIME_BUDGET
    action, job_filter = req["action"], req["filter"]
    replicas = extension().replicas
    pace = replicas.wait if replicas is not None else None
    with db() as conn:
        if req["scope"] == "filter":
            result = service.bulk_action(
                conn,
                action,
                actor=actor(),
                job_filter=job_filter,
                after_id=req["after"],
                reason=req["reason"],
                force=req["force"],
                deadline=deadline,
                pace=pace,
            )
        else:
            # At most two batches: only a pause for replica lag makes it stop before the end.
            result = service.bulk_action(
                conn,
                action,
                actor=actor(),
                ids=req["ids"],
                reason=req["reason"],
                force=req["force"],
                deadline=deadline if pace else None,
                pace=pace,
            )
    totals = {k: previous[k] + getattr(result, k) for k in ("changed", "busy", "skipped", "blocked")}
    totals["paused_ms"] = previous["paused_ms"] + round(result.paused_seconds * 1000)
    context = {
        "action": action,
        "result": result,
        "totals": totals,
        "scope": req["scope"],
        "force": req["force"],
        "reason": req["reason"],
        "args": filter_args(job_filter) if job_filter else {},
        "ids": req["ids"] or [],
    }
    message = bulk_message(action, totals, result.finished, result.replica_note)
    if not is_htmx():
        flash(message, "success")
        return redirect(url_for("jobqueue.dashboard.jobs", **context["args"]))
    return render_template("jobqueue/dashboard/_bulk_progress.html", message=message, **context)


# --- queues: pause and resume --------------------------------------------------------------------


def _queue_action(queue: str, paused: bool):
    require_confirm()
    try:
        with db() as conn:
            verb = service.pause_queue if paused else service.resume_queue
            state = verb(conn, queue, actor=actor())
    except ValidationError as exc:
        abort(400, description=str(exc))
    word = "paused" if paused else "resumed"
    message = (
        f"Queue {queue} {word}." if state.changed else f"Queue {queue} was already {'paused' if paused else 'active'}."
    )
    if not is_htmx():
        flash(message, "success")
        return redirect(url_for("jobqueue.dashboard.overview"))
    return render_template(
        "jobqueue/dashboard/_overview.html", **overview_context(), flash_message=message, flash_category="success"
    )


@bp.post("/queues/<queue>/pause")
@admin_required
def pause_queue(queue: str):
    return _queue_action(queue, True)


@bp.post("/queues/<queue>/resume")
@admin_required
def resume_queue(queue: str):
    return _queue_action(queue, False)


def bulk_message(action: str, totals: dict[str, int], finished: bool, replica_note: str | None = None) -> str:
    verb = BULK_VERBS[action][1]
    text = f"{totals['changed']} {'job' if totals['changed'] == 1 else 'jobs'} {verb}"
    if totals["busy"]:
        text += f", {totals['busy']} busy (held by a worker this instant; run it again for those)"
    blocked = totals.get("blocked", 0)
    if blocked:
        # Requeue refuses them (InvalidState for one job): say why rather than "skipped".
        why = (
            "it runs when its parents are done; cancel it instead"
            if blocked == 1
            else "they run when their parents are done; cancel them instead"
        )
        text += f", {blocked} blocked ({why})"
    if totals["skipped"] - blocked:
        text += f", {totals['skipped'] - blocked} skipped (not in a state this applies to)"
    paused = totals.get("paused_ms", 0) / 1000
    if paused or replica_note:
        # Paused so far over the whole bulk (every request of it), then why (the last wait's reading).
        text += f"; paused for replica lag: {paused:.1f} s" if paused else ""
        text += f" ({replica_note})" if replica_note else ""
    return text + ("." if finished else "; continuing…")
