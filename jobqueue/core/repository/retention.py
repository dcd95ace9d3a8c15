"""Retention: delete finished jobs past their keep time, keeping their task_keys in pruned_key.

Candidates are found with a plain read of ix_due (status, run_at, ...): a finished job's run_at
is never later than its finished_at, so `run_at < cutoff` narrows the scan to old rows and
`finished_at < cutoff` decides. Each batch (at most 1,000 jobs) is one short transaction that
locks its rows by primary key with SKIP LOCKED (a row an operator holds this instant is left for
the next pass), records their keys, deletes their attempts and results, then the jobs, by
primary key. Between batches the caller pauses, so neither locks nor the binlog see a burst.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from ..db import db_now, is_mysql, require_primary, transaction
from ..models import Status
from ..schema import job_attempt, job_batch_member, job_dependency, job_queue, job_result, prune_run, pruned_key
from .common import as_datetime, database_now, jq

PRUNE_BATCH = 1000
PRUNE_PAUSE_SECONDS = 0.05  # at least this long between batches, and at least as long as the batch took
pk, pr = pruned_key.c, prune_run.c
FAILED_LIKE = (Status.FAILED.value, Status.CANCELLED.value)


@dataclass
class PruneCounts:
    done: int = 0
    failed: int = 0
    cancelled: int = 0
    attempts: int = 0
    results: int = 0
    keys_expired: int = 0
    batches: int = 0
    seconds: float = 0.0
    dry_run: bool = False
    finished: bool = True  # False when stopped (shutdown, deadline) before the end
    cutoffs: dict[str, str | None] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {
            "done": self.done,
            "failed": self.failed,
            "cancelled": self.cancelled,
            "attempts": self.attempts,
            "results": self.results,
            "keys_expired": self.keys_expired,
            "batches": self.batches,
            "seconds": round(self.seconds, 3),
            "dry_run": self.dry_run,
            "finished": self.finished,
            "cutoffs": self.cutoffs,
        }


def _candidates(c: Connection, statuses: Sequence[str], cutoff: datetime, limit: int) -> list[int]:
    stmt = (
        sa.select(jq.id).where(jq.status.in_(list(statuses)), jq.run_at < cutoff, jq.finished_at < cutoff).limit(limit)
    )
    if is_mysql(c):
        stmt = stmt.with_hint(job_queue, "FORCE INDEX (ix_due)", "mysql").with_hint(
            job_queue, "FORCE INDEX (ix_due)", "mariadb"
        )
    return list(c.execute(stmt).scalars().all())


def _record_keys(c: Connection, rows: list[Any], now: datetime) -> None:
    values = [
        {
            "task_key": r.task_key,
            "job_id": r.id,
            "status": str(r.status),
            "finished_at": r.finished_at,
            "pruned_at": now,
        }
        for r in rows
    ]
    if is_mysql(c):
        from sqlalchemy.dialects.mysql import insert as mysql_insert

        stmt = mysql_insert(pruned_key)
        # A key recorded before (its job pruned, the key's record expired, the key used again):
        # the newer job is the one a replay should hear about.
        c.execute(
            stmt.on_duplicate_key_update(
                job_id=stmt.inserted.job_id,
                status=stmt.inserted.status,
                finished_at=stmt.inserted.finished_at,
                pruned_at=stmt.inserted.pruned_at,
            ),
            values,
        )
    else:
        c.execute(sa.insert(pruned_key).prefix_with("OR REPLACE"), values)


def prune_batch(
    conn: Connection, ids: Sequence[int], statuses: Sequence[str], cutoff: datetime
) -> tuple[dict[str, int], int, int]:
    """One batch in one transaction: the jobs among `ids` still finished before `cutoff` (rows
    held elsewhere skipped), their keys recorded, their attempts and results deleted, then the
    jobs by primary key. Returns (jobs by status, attempt rows, result rows)."""

    def write(c: Connection) -> tuple[dict[str, int], int, int]:
        require_primary(c)
        stmt = sa.select(jq.id, jq.task_key, jq.status, jq.finished_at).where(
            jq.id.in_(list(ids)), jq.status.in_(list(statuses)), jq.finished_at < cutoff
        )
        if is_mysql(c):
            stmt = (
                stmt.with_hint(job_queue, "FORCE INDEX (PRIMARY)", "mysql")
                .with_hint(job_queue, "FORCE INDEX (PRIMARY)", "mariadb")
                .with_for_update(skip_locked=True)
            )
        rows = c.execute(stmt).all()
        if not rows:
            return {}, 0, 0
        now = database_now(c)
        _record_keys(c, rows, now)
        mine = [r.id for r in rows]
        attempts = c.execute(sa.delete(job_attempt).where(job_attempt.c.job_id.in_(mine))).rowcount
        results = c.execute(sa.delete(job_result).where(job_result.c.task_key.in_([r.task_key for r in rows]))).rowcount
        # A finished parent has settled its children in the transaction that finished it (a
        # blocked job is never pruned: not finished), so its edges go with it, as do a child's.
        c.execute(sa.delete(job_dependency).where(job_dependency.c.parent_id.in_(mine)))
        c.execute(sa.delete(job_dependency).where(job_dependency.c.child_id.in_(mine)))
        # A batch counted its finished member on the batch's row: the count outlives the member.
        c.execute(sa.delete(job_batch_member).where(job_batch_member.c.job_id.in_(mine)))
        c.execute(sa.delete(job_queue).where(jq.id.in_(mine)))
        by_status: dict[str, int] = {}
        for r in rows:
            by_status[str(r.status)] = by_status.get(str(r.status), 0) + 1
        return by_status, attempts, results

    return transaction(conn, write, what="prune")


def expire_keys_batch(conn: Connection, cutoff: datetime, limit: int = PRUNE_BATCH) -> int:
    """Forget up to `limit` keys of jobs pruned before `cutoff` (their task_keys may be used again)."""

    def write(c: Connection) -> int:
        require_primary(c)
        keys = c.execute(sa.select(pk.task_key).where(pk.pruned_at < cutoff).limit(limit)).scalars().all()
        if not keys:
            return 0
        return c.execute(sa.delete(pruned_key).where(pk.task_key.in_(list(keys)), pk.pruned_at < cutoff)).rowcount

    return transaction(conn, write, what="expire_keys")


def _cutoff(now: datetime, days: float | None) -> datetime | None:
    return None if not days or days <= 0 else now - timedelta(days=days)


def prune(
    conn: Connection,
    *,
    done_days: float | None,
    failed_days: float | None,
    keys_days: float | None = None,
    dry_run: bool = False,
    batch_size: int = PRUNE_BATCH,
    pause: float = PRUNE_PAUSE_SECONDS,
    by: str = "operator",
    stop: Callable[[], bool] | None = None,
    sleep: Callable[[float], object] = time.sleep,
) -> PruneCounts:
    """Prune `done` jobs finished more than `done_days` ago and `failed` / `cancelled` ones more
    than `failed_days` ago (0 or None keeps them), then forget pruned keys older than
    `keys_days`. Cutoffs come from the database clock. With `dry_run`, count what would go.
    Between batches it sleeps `pause`, or as long as the batch took if that was longer; `stop()`
    is asked before each batch (a worker shutting down)."""
    batch_size = max(1, min(PRUNE_BATCH, batch_size))
    started = time.monotonic()
    now = transaction(conn, database_now, what="prune")
    plans = [((Status.DONE.value,), _cutoff(now, done_days)), (FAILED_LIKE, _cutoff(now, failed_days))]
    keys_cutoff = _cutoff(now, keys_days)
    counts = PruneCounts(
        dry_run=dry_run,
        cutoffs={
            "done": plans[0][1] and plans[0][1].isoformat(),
            "failed": plans[1][1] and plans[1][1].isoformat(),
            "keys": keys_cutoff and keys_cutoff.isoformat(),
        },
    )
    if dry_run:
        for statuses, cutoff in plans:
            if cutoff is None:
                continue
            rows = transaction(
                conn,
                lambda c, s=statuses, t=cutoff: c.execute(
                    sa.select(jq.status, sa.func.count())
                    .where(jq.status.in_(list(s)), jq.run_at < t, jq.finished_at < t)
                    .group_by(jq.status)
                ).all(),
                what="prune",
            )
            for status, n in rows:
                setattr(counts, str(status), getattr(counts, str(status)) + int(n))
        if keys_cutoff is not None:
            counts.keys_expired = transaction(
                conn,
                lambda c: c.execute(
                    sa.select(sa.func.count()).select_from(pruned_key).where(pk.pruned_at < keys_cutoff)
                ).scalar(),
                what="prune",
            )
        counts.seconds = time.monotonic() - started
        return counts

    run_id = transaction(
        conn,
        lambda c: c.execute(sa.insert(prune_run).values(started_at=db_now(), run_by=by[:100])).inserted_primary_key[0],
        what="prune_log",
    )

    def pause_after(batch_started: float) -> None:
        sleep(max(pause, time.monotonic() - batch_started))

    def stopped() -> bool:
        if stop is not None and stop():
            counts.finished = False
            return True
        return False

    try:
        for statuses, cutoff in plans:
            if cutoff is None:
                continue
            while not stopped():
                batch_started = time.monotonic()
                ids = transaction(conn, lambda c, s=statuses, t=cutoff: _candidates(c, s, t, batch_size), what="prune")
                if not ids:
                    break
                by_status, attempts, results = prune_batch(conn, ids, statuses, cutoff)
                counts.batches += 1
                counts.attempts += attempts
                counts.results += results
                for status, n in by_status.items():
                    setattr(counts, status, getattr(counts, status) + n)
                if not by_status:
                    break  # every candidate held elsewhere this instant: the next pass gets them
                pause_after(batch_started)
        if keys_cutoff is not None:
            while not stopped():
                batch_started = time.monotonic()
                n = expire_keys_batch(conn, keys_cutoff, batch_size)
                counts.keys_expired += n
                if n < batch_size:
                    break
                pause_after(batch_started)
    finally:
        counts.seconds = time.monotonic() - started
        transaction(
            conn,
            lambda c: c.execute(
                sa.update(prune_run)
                .where(pr.id == run_id)
                .values(
                    finished_at=db_now(),
                    done_rows=counts.done,
                    failed_rows=counts.failed,
                    cancelled_rows=counts.cancelled,
                    attempt_rows=counts.attempts,
                    keys_expired=counts.keys_expired,
                    batches=counts.batches,
                    seconds=round(counts.seconds, 3),
                )
            ),
            what="prune_log",
        )
    return counts


def last_prune(conn: Connection) -> dict[str, Any] | None:
    """The latest prune pass (possibly still running: finished_at None)."""
    row = transaction(
        conn, lambda c: c.execute(sa.select(prune_run).order_by(pr.id.desc()).limit(1)).first(), what="last_prune"
    )
    return dict(row._mapping) if row else None


def prune_due_in(conn: Connection, every_seconds: float) -> float:
    """Seconds until a prune pass is due, 0 when it is: `every_seconds` after the last pass any
    process started (database clock). One read."""

    def read(c: Connection) -> float:
        last, now = c.execute(sa.select(sa.func.max(pr.started_at), db_now())).one()
        if last is None:
            return 0.0
        return max(0.0, (as_datetime(last) + timedelta(seconds=every_seconds) - as_datetime(now)).total_seconds())

    return transaction(conn, read, what="prune_due")


def prune_due(conn: Connection, every_seconds: float) -> bool:
    """Whether no process started a prune pass in the last `every_seconds` (database clock)."""
    return prune_due_in(conn, every_seconds) == 0


def forget_prune_runs(conn: Connection, older_than: timedelta) -> int:
    def write(c: Connection) -> int:
        return c.execute(sa.delete(prune_run).where(pr.started_at < database_now(c) - older_than)).rowcount

    return transaction(conn, write, what="prune_log")
