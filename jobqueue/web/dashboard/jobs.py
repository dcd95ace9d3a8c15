"""The jobs page (filters, search, live rows), a job's detail page, its row and its explanation."""

from __future__ import annotations

import json
import re
from typing import Any

from flask import abort, g, render_template, request

from ...core import repository
from ...core.errors import JobNotFound
from ...core.models import Status
from ...core.validation import JobQuery
from ..auth import login_required
from ..state import db, read_db
from .common import MATCH_COUNT_CAP, PAGE_SIZE, bp, filter_args, is_htmx, moving, parse_query, row_version
from .workers import current_attempt


@bp.get("/jobs")
@login_required
def jobs():
    query = parse_query(request.args)
    with read_db() as conn:
        page = repository.reads.page_jobs(
            conn, query.job_filter, before=query.before, after=query.after, limit=PAGE_SIZE, cap=MATCH_COUNT_CAP
        )
        queues, tasks = repository.reads.distinct_values(conn)
        now = repository.reads.database_now(conn)
    context = {
        "jobs": page.jobs,
        "page": page,
        "filter": query.job_filter,
        "args": filter_args(query.job_filter),
        "before": query.before,
        "after": query.after,
        "next_before": page.older,
        "queues": queues,
        "tasks": tasks,
        "statuses": [s.value for s in Status],
        "now": now,
        "live": any(moving(j) for j in page.jobs),
        "search_window": repository.operator.SEARCH_WINDOW,
        "sparse_search_window": repository.operator.SPARSE_SEARCH_WINDOW,
        "bulk_window": bulk_window(query, page),
    }
    if is_htmx() and request.headers.get("HX-Target") == "jobs-table":
        return render_template("jobqueue/dashboard/_jobs_table.html", **context)
    return render_template("jobqueue/dashboard/jobs.html", **context)


def bulk_window(query: JobQuery, page: repository.reads.JobPage) -> tuple[int, int | None] | None:
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
    for raw in request.args.getlist("live")[: PAGE_SIZE * 2]:
        m = LIVE_VERSION.fullmatch(raw)
        if m is None:
            abort(400, description="live must be <id>:<version>")
        given[int(m.group(1))] = m.group(2)
    with db() as conn:
        rows = repository.reads.jobs_by_id(conn, list(given))
        now = repository.reads.database_now(conn)
    changed = sorted((j for j in rows if row_version(j) != given.get(j.id)), key=lambda j: -j.id)
    return render_template(
        "jobqueue/dashboard/_jobs_live.html", live=any(moving(j) for j in rows), changed=changed, now=now
    )


@bp.get("/jobs/<bigint:job_id>")
@login_required
def job_detail(job_id: int):
    with read_db() as conn:
        job = repository.reads.get_job(conn, job_id)
        if job is None:
            abort(404, description=f"job {job_id} not found")
        result = repository.reads.get_result(conn, job.task_key)
        attempts = repository.reads.list_attempts(conn, job_id)
        audit = repository.operator.list_audit(conn, job_id=job_id, limit=20)
        parents = repository.dependencies.parents_of(conn, job_id)
        children = repository.dependencies.children_of(conn, job_id)
        now = repository.reads.database_now(conn)
    explanation = explain_for_page(job_id)
    return render_template(
        "jobqueue/dashboard/job.html",
        job=job,
        result=result,
        attempts=attempts,
        audit=audit,
        now=now,
        explanation=explanation,
        parents=parents,
        children=children,
        payload=json.dumps(job.payload, indent=2, sort_keys=True, ensure_ascii=False),
        result_json=json.dumps(result["result"], indent=2, sort_keys=True, ensure_ascii=False) if result else None,
        current_attempt=current_attempt(job, attempts),
    )


def explain_for_page(job_id: int) -> dict[str, Any] | None:
    """The job's explanation as the panel shows it (on the primary: row locks live there); the SQL
    text of another connection only for admins. None when the job is gone."""
    try:
        with db() as conn:
            data = repository.explain.explain(conn, job_id).as_dict()
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
        job = repository.reads.get_job(conn, job_id)
        now = repository.reads.database_now(conn)
    if job is None:
        abort(404, description=f"job {job_id} not found")
    if request.args.get("v") == row_version(job):
        return "", 204
    return render_template("jobqueue/dashboard/_job_actions.html", job=job, now=now)


def _job_partial(job_id: int, template: str):
    with read_db() as conn:
        job = repository.reads.get_job(conn, job_id)
        now = repository.reads.database_now(conn)
    if job is None:
        abort(404, description=f"job {job_id} not found")
    return render_template(template, job=job, now=now)
