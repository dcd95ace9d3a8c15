"""Maintenance: reap expired leases, promote due jobs, prune history. Any number of processes may
run these at once: they lock with SKIP LOCKED and repeat their conditions in the UPDATE."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import timedelta

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from ..db import db_now, require_primary, transaction
from ..models import Status
from ..schema import job_queue, worker_process, worker_stats
from .common import as_datetime, by_id, jq, record_attempts
from .hooks import settle_finished

REAP_BATCH = 500
PROMOTE_BATCH = 1000


@dataclass(frozen=True)
class Reclaimed:
    job_id: int
    task_key: str
    attempt: int
    owner: str | None
    to: str  # ready | failed


@dataclass(frozen=True)
class ReapResult:
    reclaimed: int = 0  # back to ready
    failed: int = 0  # attempts used up
    batches: int = 0
    jobs: tuple[Reclaimed, ...] = field(default=(), repr=False)


def reap(
    conn: Connection, *, batch_size: int = REAP_BATCH, max_batches: int = 100, keep: Sequence[tuple[int, int]] = ()
) -> ReapResult:
    """Return running jobs whose lease expired to ready (or failed when attempts are used up).

    `keep`: (job id, attempt) of leases the calling process still holds with their handler
    finished and the final write pending (a row held by a stray transaction kept it from
    renewing and completing): that process's own reaper leaves them to the write, which lands as
    soon as the row is free. Another process's reaper may still take them; the fence then refuses
    the late write, as for any expired lease.

    Each batch is its own short transaction. The rows are locked with SKIP LOCKED, so a worker
    renewing a lease at this instant is not waited on, and the UPDATE repeats the expiry test so a
    lease renewed since the SELECT is never overwritten. `attempts` is left as it is.
    """
    reclaimed = failed = batches = 0
    jobs: list[Reclaimed] = []
    while batches < max_batches:

        def write(c: Connection) -> tuple[int, int, int, list[Reclaimed]]:
            require_primary(c)
            # Find candidates with a plain read, then lock just those by primary key: a locking
            # scan over all running rows would hold the rows of healthy workers too, and their
            # completions would queue up behind the reaper.
            expired_rows = sa.select(jq.id).where(jq.status == Status.RUNNING.value, jq.lease_until < db_now())
            if keep:
                expired_rows = expired_rows.where(
                    sa.not_(sa.or_(*(sa.and_(jq.id == job_id, jq.attempts == attempt) for job_id, attempt in keep)))
                )
            candidates = c.execute(expired_rows.limit(batch_size)).scalars().all()
            if not candidates:
                return 0, 0, 0, []
            rows = c.execute(
                sa.select(jq.id, jq.task_key, jq.attempts, jq.max_attempts, jq.lease_owner)
                .where(jq.id.in_(candidates), jq.status == Status.RUNNING.value, jq.lease_until < db_now())
                .with_for_update(skip_locked=True)
            ).all()
            if not rows:
                return 0, 0, len(candidates), []
            expired = sa.and_(
                jq.id.in_([r.id for r in rows]), jq.status == Status.RUNNING.value, jq.lease_until < db_now()
            )
            record_attempts(
                c,
                expired,
                "lease_expired",
                sa.literal("lease expired; held by ") + sa.func.coalesce(jq.lease_owner, "?"),
            )
            used_up = jq.attempts >= jq.max_attempts
            n_failed = c.execute(
                sa.update(job_queue)
                .where(expired, used_up)
                .values(
                    status=Status.FAILED.value,
                    lease_until=None,
                    finished_at=db_now(),
                    updated_at=db_now(),
                    last_error=sa.literal("lease expired after attempt ")
                    + sa.cast(jq.attempts, sa.String)
                    + " of "
                    + sa.cast(jq.max_attempts, sa.String)
                    + "; no attempts left",
                )
            ).rowcount
            n_ready = c.execute(
                sa.update(job_queue)
                .where(expired, sa.not_(used_up))
                .values(
                    status=Status.READY.value, lease_owner=None, lease_until=None, run_at=db_now(), updated_at=db_now()
                )
            ).rowcount
            if n_failed:
                settle_finished(c, [r.id for r in rows if r.attempts >= r.max_attempts])
            done = [
                Reclaimed(
                    r.id, r.task_key, r.attempts, r.lease_owner, "failed" if r.attempts >= r.max_attempts else "ready"
                )
                for r in rows
            ]
            return n_ready, n_failed, len(rows), done

        n_ready, n_failed, seen, done = transaction(conn, write, what="reap")
        if seen == 0 or n_ready + n_failed == 0:
            break
        batches += 1
        reclaimed += n_ready
        failed += n_failed
        jobs.extend(done)
        if seen < batch_size:
            break
    return ReapResult(reclaimed, failed, batches, tuple(jobs))


def promote_due(conn: Connection, *, batch_size: int = PROMOTE_BATCH, max_batches: int = 20) -> int:
    """scheduled -> ready for delayed jobs and retries whose time has come."""
    total = 0
    for _ in range(max_batches):

        def write(c: Connection) -> int:
            require_primary(c)
            # As the reaper does: find the due jobs with a plain read, then lock just those by
            # primary key. A locking range scan of ix_due also locks the first row past the due
            # ones, often a running job, whose completion then came back BUSY (and an operator's
            # action on it 423) every time this found nothing to do.
            due = sa.and_(jq.status == Status.SCHEDULED.value, jq.run_at <= db_now())
            candidates = c.execute(sa.select(jq.id).where(due).order_by(jq.run_at).limit(batch_size)).scalars().all()
            if not candidates:
                return 0
            ids = (
                c.execute(sa.select(jq.id).where(jq.id.in_(candidates), due).with_for_update(skip_locked=True))
                .scalars()
                .all()
            )
            if not ids:
                return 0
            return c.execute(
                by_id(sa.update(job_queue))
                .where(jq.id.in_(ids), jq.status == Status.SCHEDULED.value)
                .values(status=Status.READY.value, updated_at=db_now())
            ).rowcount

        n = transaction(conn, write, what="promote")
        total += n
        if n < batch_size:
            break
    return total


STATS_RETENTION = timedelta(days=7)
PROCESS_RETENTION = timedelta(days=1)


def prune_history(
    conn: Connection, *, stats_retention: timedelta = STATS_RETENTION, process_retention: timedelta = PROCESS_RETENTION
) -> int:
    """Drop per-minute activity and dead process rows past their retention, judged by the
    database clock (as leases are), not this host's."""

    def write(c: Connection) -> int:
        now = as_datetime(c.execute(sa.select(db_now())).scalar())
        n = c.execute(sa.delete(worker_stats).where(worker_stats.c.minute < now - stats_retention)).rowcount
        n += c.execute(
            sa.delete(worker_process).where(worker_process.c.last_heartbeat < now - process_retention)
        ).rowcount
        return n

    return transaction(conn, write, what="prune_history")
