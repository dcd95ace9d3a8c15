"""The recurring jobs page and its actions: add, enable, disable, remove."""

from __future__ import annotations

import json

from flask import abort, flash, redirect, render_template, request, url_for

from ...core import repository, service
from ...core.errors import NotFound, ValidationError
from ...core.tasks import TASKS
from ..auth import admin_required, login_required
from ..state import db
from .common import actor, bp, require_confirm


@bp.get("/recurring")
@login_required
def recurring():
    with db() as conn:
        schedules, now = repository.recurring.list_recurring(conn)
    return render_template("jobqueue/dashboard/recurring.html", schedules=schedules, now=now, tasks=TASKS.names())


def _recurring_done(message: str, category: str = "success"):
    flash(message, category)
    return redirect(url_for("jobqueue.dashboard.recurring"))


@bp.post("/recurring")
@admin_required
def add_recurring():
    require_confirm()
    form = request.form
    name = (form.get("name") or "").strip()
    try:
        payload = json.loads(form.get("payload") or "{}")
    except ValueError as exc:
        return _recurring_done(f"The payload is not valid JSON: {exc}", "error")
    try:
        with db() as conn:
            row, created = service.upsert_recurring(
                conn,
                name,
                cron=(form.get("cron") or "").strip(),
                task=(form.get("task") or "").strip(),
                payload=payload,
                queue=(form.get("queue") or "").strip() or None,
                actor=actor(),
            )
    except ValidationError as exc:
        return _recurring_done(str(exc), "error")
    return _recurring_done(
        f"Recurring job {name} {'added' if created else 'replaced'}; next run {row['next_run_at']:%Y-%m-%d %H:%M} UTC."
    )


@bp.post("/recurring/<name>/<verb>")
@admin_required
def recurring_action(name: str, verb: str):
    require_confirm()
    if verb not in ("enable", "disable", "remove"):
        abort(404)
    try:
        with db() as conn:
            if verb == "remove":
                service.remove_recurring(conn, name, actor=actor())
            else:
                service.set_recurring_enabled(conn, name, verb == "enable", actor=actor())
    except NotFound as exc:
        return _recurring_done(str(exc), "error")
    return _recurring_done(f"Recurring job {name} {verb}d." if verb != "remove" else f"Recurring job {name} removed.")
