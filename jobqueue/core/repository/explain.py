"""Why a job is not running (or is): the ordered reasons of `jobqueue explain`, GET
/api/jobs/<id>/explain and the job page's panel.

Reads only. The job's row is tried once with FOR UPDATE NOWAIT in a transaction that is rolled
back (see locks.row_lock), and when another transaction holds it, a probe waits for it at most
about a second to name the holder; nothing is ever written.

Order of the reasons, the main one first: what the row's status says (scheduled, retry_backoff,
lease_held, lease_expired, a terminal state), then what keeps a ready job from every claim, most
specific first (a transaction holding its row, its paused queue, its full concurrency key), and
last a queue no live process serves (that holds back every job of the queue alike). `runnable`
comes alone: nothing in the way.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from ..db import transaction
from ..errors import JobNotFound
from ..models import Explanation, Job, Reason, Status, iso
from ..schema import concurrency_key, job_queue, queue_state, rate_window, worker_process
from .common import as_datetime, database_now, job_from_row, jq
from .dependencies import parents_of
from .limits import window_start
from .locks import RowLock, row_lock

CODES = (
    "runnable",
    "scheduled",
    "retry_backoff",
    "queue_paused",
    "no_live_worker",
    "concurrency_limit",
    "locked_by_transaction",
    "lease_held",
    "lease_expired",
    "attempts_exhausted",
    "cancelled",
    "done",
    "failed",
    "blocked_by",
    "rate_limited",
)
AHEAD_CAP = 1000  # ready jobs counted ahead of a runnable one, at most
ALIVE_SECONDS = 45  # a heartbeat every 15 s: a process silent longer is not counted as live
REAP_EVERY_MAX = 15  # every live process reaps at least this often (a quarter of its lease, 1..15 s)
HOLDERS_SHOWN = 20
PROCESSES_READ = 200


def explain(conn: Connection, job_id: int) -> Explanation:
    """The reasons job `job_id` is where it is; JobNotFound when there is no such job."""
    facts = transaction(conn, lambda c: _read(c, job_id), what="explain")
    if facts is None:
        raise JobNotFound(f"job {job_id} not found")
    job: Job = facts["job"]
    lock = row_lock(conn, job_id) if job.status in (Status.READY, Status.SCHEDULED, Status.RUNNING) else RowLock(False)
    return Explanation(job.id, job.status, _reasons(job, facts, lock))


def _read(c: Connection, job_id: int) -> dict[str, Any] | None:
    """Everything the reasons need, in one read-only transaction (no locks)."""
    row = c.execute(sa.select(job_queue).where(jq.id == job_id)).first()
    if row is None:
        return None
    job = job_from_row(row)
    now = database_now(c)
    wp = worker_process.c
    processes = [
        dict(r._mapping)
        for r in c.execute(
            sa.select(wp.id, wp.kind, wp.queues, wp.last_heartbeat, wp.stopped_at, wp.state)
            .order_by(wp.last_heartbeat.desc())
            .limit(PROCESSES_READ)
        ).all()
    ]
    facts: dict[str, Any] = {"job": job, "now": now, "processes": processes, "paused": None, "ahead": None, "key": None}
    if job.status is Status.BLOCKED:
        facts["parents"] = parents_of(c, job_id)
    if job.status in (Status.READY, Status.SCHEDULED):
        facts["paused"] = c.execute(
            sa.select(queue_state).where(queue_state.c.queue == job.queue, queue_state.c.paused == sa.true())
        ).first()
    if job.status is Status.READY:
        # Ahead in claim order: ix_ready_pick read from the queue's first ready row up to this one.
        ahead = (
            sa.select(sa.literal(1))
            .where(
                jq.status == Status.READY.value,
                jq.queue == job.queue,
                sa.or_(jq.priority < job.priority, sa.and_(jq.priority == job.priority, jq.id < job.id)),
            )
            .limit(AHEAD_CAP + 1)
            .subquery()
        )
        facts["ahead"] = int(c.execute(sa.select(sa.func.count()).select_from(ahead)).scalar() or 0)
        if job.concurrency_key is not None:
            limit = c.execute(
                sa.select(concurrency_key.c.max_running).where(concurrency_key.c.name == job.concurrency_key)
            ).scalar()
            holders = c.execute(
                sa.select(jq.id, jq.lease_owner, jq.lease_until)
                .where(jq.concurrency_key == job.concurrency_key, jq.status == Status.RUNNING.value)
                .order_by(jq.id)
                .limit(max(HOLDERS_SHOWN, int(limit or 0)) + 1)
            ).all()
            facts["key"] = {"limit": limit, "holders": holders}
        if row.rate_bucket is not None:
            facts["rate"] = _spent_window(c, row.rate_bucket, as_datetime(now))
    return facts


def _spent_window(c: Connection, bucket: str, now: datetime) -> dict[str, Any] | None:
    """The bucket's current window when it has no start left (as the claim counts it), else None."""
    rw = rate_window.c
    window = c.execute(sa.select(rate_window).where(rw.bucket == bucket)).first()
    if window is None:
        return None
    start = window_start(now, int(window.period_seconds))
    used = int(window.starts) if as_datetime(window.window_start) == start else 0
    if used < int(window.max_starts):
        return None
    return {
        "bucket": bucket,
        "limit": int(window.max_starts),
        "period_seconds": int(window.period_seconds),
        "starts": used,
        "next_start_at": start + timedelta(seconds=int(window.period_seconds)),
    }


def _alive(p: dict[str, Any], now: datetime) -> bool:
    return p["stopped_at"] is None and (now - as_datetime(p["last_heartbeat"])).total_seconds() <= ALIVE_SECONDS


def _serves(p: dict[str, Any], queue: str) -> bool:
    queues = (p["queues"] or "*").split(",")
    return "*" in queues or queue in queues


def _process_state(p: dict[str, Any]) -> str | None:
    try:
        return (json.loads(p["state"]) if p.get("state") else {}).get("state")
    except ValueError:
        return None


def _seconds(later: datetime | None, now: datetime) -> float | None:
    return round((later - now).total_seconds(), 3) if later is not None else None


def _reasons(job: Job, facts: dict[str, Any], lock: RowLock) -> list[Reason]:
    now: datetime = facts["now"]
    processes = facts["processes"]
    live = [p for p in processes if _alive(p, now)]
    out: list[Reason] = []
    status = job.status

    if status is Status.DONE:
        out.append(
            Reason(
                "done",
                f"Finished successfully at {iso(job.finished_at)} after {job.attempts} "
                f"attempt{'s' if job.attempts != 1 else ''}.",
                {"finished_at": iso(job.finished_at), "attempts": job.attempts},
            )
        )
    elif status is Status.BLOCKED:
        pending = [
            p
            for p in facts["parents"]
            if p["status"] not in (Status.DONE.value, Status.FAILED.value, Status.CANCELLED.value)
        ]
        names = ", ".join(f"{p['task_key']} ({p['status']})" for p in pending) or "none (settling)"
        out.append(
            Reason(
                "blocked_by",
                f"Waiting for the jobs it runs after: {names}; it becomes ready when they are done.",
                {
                    "blocked_by": [
                        {"job_id": p["id"], "task_key": p["task_key"], "status": p["status"]} for p in pending
                    ]
                },
            )
        )
    elif status is Status.CANCELLED and (job.last_error or "").startswith("parent "):
        out.append(
            Reason(
                "cancelled",
                f"Cancelled at {iso(job.finished_at)} because its {job.last_error}; it will not run.",
                {"finished_at": iso(job.finished_at), "last_error": job.last_error},
            )
        )
    elif status is Status.CANCELLED:
        out.append(
            Reason(
                "cancelled",
                f"Cancelled by an operator at {iso(job.finished_at)}; it will not run.",
                {"finished_at": iso(job.finished_at), "last_error": job.last_error},
            )
        )
    elif status is Status.FAILED:
        exhausted = job.attempts >= job.max_attempts
        code = "attempts_exhausted" if exhausted else "failed"
        sentence = (
            f"Failed for good: all {job.max_attempts} attempts were used"
            if exhausted
            else "Failed for good (a permanent error or an operator) before its attempts were used"
        )
        out.append(
            Reason(
                code,
                f"{sentence}; last error: {_first_line(job.last_error)}.",
                {
                    "attempts": job.attempts,
                    "max_attempts": job.max_attempts,
                    "last_error": job.last_error,
                    "finished_at": iso(job.finished_at),
                },
            )
        )
    elif status is Status.SCHEDULED:
        due = _seconds(job.run_at, now)
        when = (
            f"in {due:.0f} s, at {iso(job.run_at)}"
            if due is not None and due > 0
            else "now (due; the next promotion pass makes it ready)"
        )
        if job.attempts > 0:
            out.append(
                Reason(
                    "retry_backoff",
                    f"Waiting out its backoff after failed attempt {job.attempts} of "
                    f"{job.max_attempts}; it becomes ready {when}.",
                    {
                        "attempt": job.attempts,
                        "max_attempts": job.max_attempts,
                        "ready_at": iso(job.run_at),
                        "ready_in_seconds": due,
                        "last_error": job.last_error,
                    },
                )
            )
        else:
            out.append(
                Reason(
                    "scheduled",
                    f"Scheduled to run later; it becomes ready {when}.",
                    {"run_at": iso(job.run_at), "ready_in_seconds": due},
                )
            )
    elif status is Status.RUNNING:
        owner = job.lease_owner or "?"
        process = owner.rsplit(":", 1)[0] if owner.rsplit(":", 1)[-1].isdigit() else owner
        proc = next((p for p in processes if p["id"] == process), None)
        owner_alive = proc is not None and _alive(proc, now)
        heard = (
            round((now - as_datetime(proc["last_heartbeat"])).total_seconds(), 1)
            if proc is not None and proc["stopped_at"] is None
            else None
        )
        left = _seconds(job.lease_until, now)
        if left is not None and left > 0:
            heart = "its heartbeat is alive" if owner_alive else "its process is silent or gone"
            out.append(
                Reason(
                    "lease_held",
                    f"Running under {owner}'s lease until {iso(job.lease_until)} ({left:.0f} s left); {heart}.",
                    {
                        "owner": owner,
                        "process": process,
                        "lease_until": iso(job.lease_until),
                        "lease_left_seconds": left,
                        "owner_alive": owner_alive,
                        "owner_heartbeat_seconds_ago": heard,
                    },
                )
            )
        else:
            if live:
                by = iso(job.lease_until + timedelta(seconds=REAP_EVERY_MAX)) if job.lease_until else None
                when = f"the next reaper pass of a live process takes it back, by about {by}"
            else:
                by = None
                when = "no live process runs the reaper, so it stays until one starts"
            back = "ready" if job.attempts < job.max_attempts else "failed (its attempts are used up)"
            # A live owner renews its leases every third of the lease: one that ran out means the
            # owner is gone or stuck, whatever its last heartbeat (every 15 s) still says.
            last = f"last heartbeat {heard:.0f} s ago" if heard is not None else "no heartbeat on record"
            out.append(
                Reason(
                    "lease_expired",
                    f"{owner}'s lease ran out at {iso(job.lease_until)} without a renewal "
                    f"(its process: {last}); {when}, to {back}.",
                    {
                        "owner": owner,
                        "process": process,
                        "lease_until": iso(job.lease_until),
                        "owner_alive": owner_alive,
                        "owner_heartbeat_seconds_ago": heard,
                        "reaped_by": by,
                        "reaped_to": back.split(" ")[0],
                    },
                )
            )

    if lock.held:
        out.append(_locked(lock))
    if status in (Status.READY, Status.SCHEDULED):
        paused = facts["paused"]
        if paused is not None:
            out.append(
                Reason(
                    "queue_paused",
                    f"Its queue {job.queue!r} is paused, since {iso(paused.changed_at)} by "
                    f"{paused.changed_by}; no claim takes its jobs until it is resumed.",
                    {"queue": job.queue, "since": iso(paused.changed_at), "by": paused.changed_by},
                )
            )
        key = facts["key"]
        if key is not None and key["limit"] is not None and len(key["holders"]) >= int(key["limit"]):
            holders = key["holders"][:HOLDERS_SHOWN]
            out.append(
                Reason(
                    "concurrency_limit",
                    f"Its concurrency key {job.concurrency_key!r} is full: "
                    f"{len(key['holders'])} of {key['limit']} places taken by running jobs "
                    f"{', '.join(str(h.id) for h in holders)}.",
                    {
                        "key": job.concurrency_key,
                        "limit": int(key["limit"]),
                        "running": len(key["holders"]),
                        "holders": [
                            {"job_id": h.id, "owner": h.lease_owner, "lease_until": iso(h.lease_until)} for h in holders
                        ],
                    },
                )
            )
        rate = facts.get("rate")
        if rate is not None:
            out.append(
                Reason(
                    "rate_limited",
                    f"Its rate bucket {rate['bucket']!r} has used its {rate['limit']} starts of this "
                    f"{rate['period_seconds']} s window; the next start is allowed at {iso(rate['next_start_at'])}.",
                    {**rate, "next_start_at": iso(rate["next_start_at"])},
                )
            )
        if not any(_serves(p, job.queue) for p in live):
            served = [
                {
                    "process": p["id"],
                    "kind": p["kind"],
                    "queues": (p["queues"] or "*").split(","),
                    "state": _process_state(p),
                }
                for p in live
            ]
            others = "; ".join(f"{s['process']} serves {','.join(s['queues'])}" for s in served) or "none is live"
            out.append(
                Reason(
                    "no_live_worker",
                    f"No live process (heartbeat within {ALIVE_SECONDS} s) serves queue {job.queue!r}: {others}.",
                    {"queue": job.queue, "processes": served},
                )
            )
    if status is Status.READY and not out:
        ahead, capped = min(facts["ahead"], AHEAD_CAP), facts["ahead"] > AHEAD_CAP
        count = f"{ahead:,}{'+' if capped else ''}"
        out.append(
            Reason(
                "runnable",
                f"Ready, and nothing is in its way: {count} ready job"
                f"{'s' if ahead != 1 else ''} of queue {job.queue!r} come first in claim order.",
                {"ahead": ahead, "ahead_capped": capped, "queue": job.queue},
            )
        )
    return out


def _locked(lock: RowLock) -> Reason:
    if not lock.holders:
        return Reason(
            "locked_by_transaction",
            f"Another transaction holds its row, so every claim passes it by "
            f"(SKIP LOCKED); who holds it is not known: {lock.unknown_why}.",
            {"connection_id": None, "unknown_why": lock.unknown_why},
        )
    h = lock.holders[0]
    age = f"{h.age_seconds:.0f} s" if h.age_seconds is not None else "an unknown time"
    if h.idle or not h.statement:
        doing = "idle in its transaction" + (
            f" (its last statement: {_first_line(h.statement)})" if h.statement else ", running no statement"
        )
    else:
        doing = f"running {_first_line(h.statement)}"
    return Reason(
        "locked_by_transaction",
        f"Connection {h.connection_id} ({h.account or 'unknown account'}) holds its "
        f"row in a transaction open for {age}, so every claim passes it by (SKIP LOCKED); it is {doing}.",
        {
            "connection_id": h.connection_id,
            "account": h.account,
            "user": h.user,
            "host": h.host,
            "transaction_age_seconds": h.age_seconds,
            "transaction_state": h.trx_state,
            "state": h.state or h.command,
            "statement": h.statement,
            "others": [t.connection_id for t in lock.holders[1:]],
        },
    )


def _first_line(text: str | None, limit: int = 200) -> str:
    if not text:
        return "none recorded"
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line if len(line) <= limit else line[: limit - 3] + "..."


__all__ = ["AHEAD_CAP", "CODES", "explain"]
