"""The workers page: each process, alive or silent, its slots and the jobs it holds."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from flask import render_template

from ...core import repository
from ...core.models import Job
from ..auth import login_required
from ..state import read_db
from .common import bp

ALIVE_SECONDS = 45  # a process whose heartbeat (every 15 s) is older than this is shown as silent


def process_state(p: dict[str, Any], now: datetime) -> str:
    """alive, silent (heartbeat stopped without a clean stop) or stopped."""
    if p["stopped_at"] is not None:
        return "stopped"
    return "alive" if (now - p["last_heartbeat"]).total_seconds() <= ALIVE_SECONDS else "silent"


def with_liveness(p: dict[str, Any], now: datetime) -> dict[str, Any]:
    """A worker process as the pages show it: `liveness` (alive, silent, stopped), what it says it
    is doing (`state`: claiming, not_primary, ...) and its slots, their times moved on to now (the
    heartbeat wrote them up to 15 s ago)."""
    liveness = process_state(p, now)
    age = max(0.0, (now - p["last_heartbeat"]).total_seconds()) if liveness == "alive" else 0.0
    slots = []
    for slot in p.get("slots") or []:
        slot = dict(slot)
        for key in ("running_seconds", "held_seconds", "lost_seconds_ago"):
            if isinstance(slot.get(key), (int, float)):
                slot[key] = slot[key] + age
        if isinstance(slot.get("lease_left_seconds"), (int, float)):
            slot["lease_left_seconds"] = slot["lease_left_seconds"] - age
        slots.append(slot)
    state = p.get("state") if isinstance(p.get("state"), dict) else {}
    return dict(
        p, liveness=liveness, slots=slots, doing=state.get("state"), doing_detail=state.get("detail"), heartbeat_age=age
    )


def current_attempt(job, attempts: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The attempt the job row itself describes (running now, or the one that finished it), when
    job_attempt has no row for it (successful attempts are not written there)."""
    if job.attempts == 0 or any(a["attempt"] == job.attempts for a in attempts):
        return None
    outcome = {"running": "running", "done": "done", "failed": "failed"}.get(job.status.value)
    if outcome is None:
        return None
    return {
        "attempt": job.attempts,
        "worker": job.lease_owner,
        "started_at": job.started_at,
        "finished_at": job.finished_at,
        "outcome": outcome,
        "error": job.last_error if outcome == "failed" else None,
    }


def held_by_process(running: list[Job]) -> dict[str, list[Job]]:
    """Running jobs by the process whose lease they are under (lease owner host:pid[:name]:slot)."""
    held: dict[str, list[Job]] = {}
    for job in running:
        prefix = (job.lease_owner or "").rsplit(":", 1)[0]
        held.setdefault(prefix, []).append(job)
    return held


def merge_slots(p: dict[str, Any], held: list[Job], now: datetime) -> list[dict[str, Any]]:
    """What each slot of a process holds: its heartbeat's account (which alone knows a lease lost
    while the handler still runs), with the job rows' own lease times, plus jobs it claimed since
    that heartbeat."""
    rows = {(j.id, j.attempts): j for j in held}
    slots = []
    for slot in p["slots"]:
        job = rows.pop((slot.get("job_id"), slot.get("attempt")), None)
        if job is not None and slot.get("state") != "lost" and job.lease_until is not None:
            slot = dict(slot, lease_left_seconds=(job.lease_until - now).total_seconds())
        slots.append(slot)
    for job in sorted(rows.values(), key=lambda j: j.lease_owner or ""):
        slots.append(
            {
                "slot": (job.lease_owner or "").rsplit(":", 1)[-1],
                "job_id": job.id,
                "attempt": job.attempts,
                "task": job.task_name,
                "queue": job.queue,
                "state": "running",
                "running_seconds": (now - job.started_at).total_seconds() if job.started_at else None,
                "lease_left_seconds": (job.lease_until - now).total_seconds() if job.lease_until else None,
                "lost_reason": None,
                "lost_seconds_ago": None,
                "handler_running": True,
            }
        )
    return slots


def workers_context() -> dict[str, Any]:
    with read_db() as conn:
        processes, now = repository.processes.list_processes(conn)
        running = repository.reads.running_jobs(conn, limit=500)
    held = held_by_process(running)
    rows = []
    for p in processes:
        p = with_liveness(p, now)
        rows.append(dict(p, slots=merge_slots(p, held.get(p["id"], []), now) if p["liveness"] != "stopped" else []))
    return {"processes": rows, "now": now, "alive_seconds": ALIVE_SECONDS}


@bp.get("/workers")
@login_required
def workers():
    return render_template("jobqueue/dashboard/workers.html", **workers_context())


@bp.get("/workers/panel")
@login_required
def workers_panel():
    return render_template("jobqueue/dashboard/_workers.html", **workers_context())
