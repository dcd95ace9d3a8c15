"""The locks page: who holds what, who waits, the latest deadlock; killing a holder."""

from __future__ import annotations

from typing import Any

from flask import flash, g, redirect, render_template, url_for

from ...core import repository, service
from ...core.errors import InvalidState
from ...core.repository.locks import MYSQL_LOCK_ROWS
from ..auth import admin_required, login_required
from ..state import db, extension
from .common import actor, bp, require_confirm


def locks_context(*, with_deadlock: bool = True) -> dict[str, Any]:
    """`with_deadlock`: also read SHOW ENGINE INNODB STATUS (the full page; its 5 s poll does not show it)."""
    with db() as conn:
        report = repository.locks.lock_report(conn)
        deadlock, deadlock_unavailable = (
            repository.locks.latest_deadlock(conn) if with_deadlock and g.user.can_act else (None, None)
        )
    lease = extension().settings.core.lease_seconds
    return {
        "report": report,
        "lease_seconds": lease,
        "deadlock": deadlock,
        "lock_rows_read": MYSQL_LOCK_ROWS,
        "deadlock_unavailable": deadlock_unavailable,
        "show_sql": g.user.can_act,
        "long": {t.connection_id for t in report.transactions if (t.age_seconds or 0) > lease},
    }


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
        report = repository.locks.lock_report(conn)
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
    return render_template(
        "jobqueue/dashboard/kill_confirm.html", target=target, lease_seconds=extension().settings.core.lease_seconds
    )


@bp.post("/locks/<int:connection_id>/kill")
@admin_required
def kill(connection_id: int):
    require_confirm()
    try:
        with db() as conn:
            found = service.kill_connection(conn, connection_id, actor=actor())
    except InvalidState as exc:
        flash(str(exc), "error")
    else:
        jobs = ", ".join(map(str, found.jobs))
        flash(
            f"Connection {connection_id} killed; its transaction rolled back"
            + (f" and job{'s' if len(found.jobs) != 1 else ''} {jobs} can be claimed again." if jobs else "."),
            "success",
        )
    return redirect(url_for("jobqueue.dashboard.locks"))
