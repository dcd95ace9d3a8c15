"""The Batches pages: the list (state, progress, times; filtered by state, keyset pages) and a
batch's page (its counts, its callbacks and the jobs they enqueued, its payload, its newest
members; every member through the jobs list's `batch` filter, with its filters and bulk actions)."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from flask import abort, render_template, request

from ...core import repository
from ...core.repository.operator import JobFilter
from ..auth import login_required
from ..state import read_db
from .common import PAGE_SIZE, bp, int_arg

MEMBERS_SHOWN = 20
SEGMENTS = ("done", "failed", "cancelled", "pending")


def progress(batch: dict[str, Any], width: int = 200) -> dict[str, Any]:
    """A batch's progress bar as SVG geometry (no inline style: the CSP forbids it), each segment
    with its count; the text beside it says the same, so colour is never the only sign."""
    total = batch["total"]
    x, segments = 0.0, []
    for name in SEGMENTS:
        n = batch[name]
        w = round(width * n / total, 1) if total else 0
        segments.append({"name": name, "count": n, "x": round(x, 1), "width": w})
        x += w
    label = ", ".join(f"{s['count']:,} {s['name']}" for s in segments)
    return {"width": width, "segments": segments, "label": f"{label} of {total:,}"}


@bp.get("/batches")
@login_required
def batches():
    state = request.args.get("state") or None
    if state is not None and state not in repository.batches.STATES:
        abort(400, description=f"state must be one of {', '.join(repository.batches.STATES)}")
    before = int_arg(request.args, "before")
    with read_db() as conn:
        page = repository.batches.page_batches(conn, state=state, before=before, limit=PAGE_SIZE)
        now = repository.reads.database_now(conn)
    return render_template(
        "jobqueue/dashboard/batches.html",
        page=page,
        rows=[dict(b, progress=progress(b)) for b in page.batches],
        state=state,
        states=repository.batches.STATES,
        before=before,
        now=now,
        state_window=repository.batches.STATE_WINDOW,
    )


@bp.get("/batches/<path:key>")
@login_required
def batch_detail(key: str):
    with read_db() as conn:
        batch = repository.batches.show(conn, key)  # BatchNotFound: 404
        members = repository.reads.page_jobs(conn, JobFilter(batch=batch["key"]), limit=MEMBERS_SHOWN, cap=PAGE_SIZE)
        now = repository.reads.database_now(conn)
    for name in ("created_at", "closed_at", "finished_at"):
        batch[name] = datetime.fromisoformat(batch[name]) if batch[name] else None
    return render_template(
        "jobqueue/dashboard/batch.html",
        batch=batch,
        progress=progress(batch, width=400),
        members=members,
        payload=json.dumps(batch["payload"], indent=2, sort_keys=True, ensure_ascii=False),
        now=now,
    )
