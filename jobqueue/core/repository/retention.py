"""Retention: delete finished jobs past their keep time, keeping their task_keys in pruned_key.

Candidates are found with a plain read of ix_due (status, run_at, ...): a finished job's run_at
is never later than its finished_at, so `run_at < cutoff` narrows the scan to old rows and
`finished_at < cutoff` decides. Each batch (at most 1,000 jobs) is one short transaction that
locks its rows by primary key with SKIP LOCKED (a row an operator holds this instant is left for
the next pass), records their keys, deletes their attempts and results, then the jobs, by
primary key. Between batches the caller pauses, so neither locks nor the binlog see a burst.

Then finished batches (job_batch), in the same style: a batch goes once it is `finished`, its
finished_at is past the cutoff its members' outcomes call for (all done: the `done` cutoff; any
failed or cancelled: the `failed` one, as its failed members are kept), no member is left (its
members were pruned as jobs, by their own cutoffs, earlier in the pass or in an earlier one) and
none of its callbacks is still pending (callbacks are ordinary jobs, pruned as jobs). What it
was goes to pruned_batch, so that opening its key again answers the finished batch (created:
false) and fires nothing (repository/batches.py). Each batch's row is locked FOR UPDATE SKIP
LOCKED (the lock a member's settle or a close takes) and the conditions read again under it: no
member can join a batch that is not open, so none appears meanwhile.
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
from ..schema import (
    job_attempt,
    job_batch,
    job_batch_member,
    job_dependency,
    job_queue,
    job_result,
    prune_run,
    pruned_batch,
    pruned_key,
)
from .common import as_datetime, database_now, jq

PRUNE_BATCH = 1000
PRUNE_PAUSE_SECONDS = 0.05  # at least this long between batches, and at least as long as the batch took
pk, pr, jb, pb = pruned_key.c, prune_run.c, job_batch.c, pruned_batch.c
FAILED_LIKE = (Status.FAILED.value, Status.CANCELLED.value)
FINISHED = (Status.DONE.value, *FAILED_LIKE)


@dataclass
class PruneCounts:
    done: int = 0
    failed: int = 0
    cancelled: int = 0
    attempts: int = 0
    results: int = 0
    keys_expired: int = 0  # keys of pruned jobs and of pruned batches forgotten
    job_batches: int = 0  # finished batches (job_batch rows) pruned
    batches: int = 0  # transactions that deleted something
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
            "job_batches": self.job_batches,
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


def _batch_prunable(done_cutoff: datetime | None, failed_cutoff: datetime | None, *, members_go: bool = False):
    """The WHERE of a finished batch retention may delete, or None when both cutoffs keep
    everything. `members_go` (a dry run, which deletes no member first): members that this pass
    would prune count as gone."""
    by_outcome = []
    if done_cutoff is not None:
        by_outcome.append(sa.and_(jb.done == jb.total, jb.finished_at < done_cutoff))
    if failed_cutoff is not None:
        by_outcome.append(sa.and_(jb.done != jb.total, jb.finished_at < failed_cutoff))
    if not by_outcome:
        return None
    member = sa.select(job_batch_member.c.job_id).where(job_batch_member.c.batch_id == jb.id)
    if members_go:
        stays = sa.true()
        for statuses, cutoff in (((Status.DONE.value,), done_cutoff), (FAILED_LIKE, failed_cutoff)):
            if cutoff is not None:
                stays = sa.and_(stays, sa.not_(sa.and_(jq.status.in_(statuses), jq.finished_at < cutoff)))
        member = member.join(job_queue, jq.id == job_batch_member.c.job_id).where(stays)
    pending_callback = sa.select(jq.id).where(
        jq.id.in_([jb.success_job_id, jb.failure_job_id, jb.complete_job_id]), jq.status.not_in(FINISHED)
    )
    latest = max(t for t in (done_cutoff, failed_cutoff) if t is not None)
    return sa.and_(
        jb.state == "finished",
        jb.finished_at < latest,  # ix_batch_finished
        sa.or_(*by_outcome),
        ~sa.exists(member),
        ~sa.exists(pending_callback),
    )


def _record_batches(c: Connection, rows: list[Any], now: datetime) -> None:
    names = [col.name for col in pruned_batch.columns if col.name not in ("batch_id", "pruned_at")]
    values = [{**{n: getattr(r, n) for n in names}, "batch_id": r.id, "pruned_at": now} for r in rows]
    if is_mysql(c):
        from sqlalchemy.dialects.mysql import insert as mysql_insert

        stmt = mysql_insert(pruned_batch)
        # A key recorded before whose record expired, then used again: the newer batch counts.
        c.execute(
            stmt.on_duplicate_key_update({n: stmt.inserted[n] for n in [*names[1:], "batch_id", "pruned_at"]}), values
        )
    else:
        c.execute(sa.insert(pruned_batch).prefix_with("OR REPLACE"), values)


def prune_batch_rows(
    conn: Connection, ids: Sequence[int], done_cutoff: datetime | None, failed_cutoff: datetime | None
) -> int:
    """One transaction: of the batches `ids`, those not held elsewhere and still prunable under
    their row lock are recorded in pruned_batch and deleted. Returns how many."""

    def write(c: Connection) -> int:
        require_primary(c)
        lock = sa.select(jb.id).where(jb.id.in_(list(ids)))
        mine = list(c.execute(lock.with_for_update(skip_locked=True) if is_mysql(c) else lock).scalars())
        where = _batch_prunable(done_cutoff, failed_cutoff)
        if not mine or where is None:
            return 0
        rows = c.execute(sa.select(job_batch).where(jb.id.in_(mine), where)).all()
        if not rows:
            return 0
        _record_batches(c, rows, database_now(c))
        return c.execute(sa.delete(job_batch).where(jb.id.in_([r.id for r in rows]))).rowcount

    return transaction(conn, write, what="prune")


def expire_keys_batch(conn: Connection, cutoff: datetime, limit: int = PRUNE_BATCH) -> int:
    """Forget up to `limit` keys of jobs, then of batches, pruned before `cutoff` (their keys
    may be used again)."""

    def write(c: Connection) -> int:
        require_primary(c)
        n = 0
        for table, key in ((pruned_key, pk.task_key), (pruned_batch, pb.batch_key)):
            keys = c.execute(sa.select(key).where(table.c.pruned_at < cutoff).limit(limit - n)).scalars().all()
            if keys:
                n += c.execute(sa.delete(table).where(key.in_(list(keys)), table.c.pruned_at < cutoff)).rowcount
            if n >= limit:
                break
        return n

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
        batches_go = _batch_prunable(plans[0][1], plans[1][1], members_go=True)
        if batches_go is not None:
            counts.job_batches = transaction(
                conn,
                lambda c: c.execute(sa.select(sa.func.count()).select_from(job_batch).where(batches_go)).scalar(),
                what="prune",
            )
        if keys_cutoff is not None:
            counts.keys_expired = transaction(
                conn,
                lambda c: sum(
                    c.execute(sa.select(sa.func.count()).select_from(t).where(t.c.pruned_at < keys_cutoff)).scalar()
                    for t in (pruned_key, pruned_batch)
                ),
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
        batches_go = _batch_prunable(plans[0][1], plans[1][1])
        while batches_go is not None and not stopped():
            batch_started = time.monotonic()
            ids = transaction(
                conn,
                lambda c: list(c.execute(sa.select(jb.id).where(batches_go).limit(batch_size)).scalars()),
                what="prune",
            )
            if not ids:
                break
            n = prune_batch_rows(conn, ids, plans[0][1], plans[1][1])
            counts.batches += 1
            counts.job_batches += n
            if not n:
                break  # held elsewhere this instant: the next pass
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
                    batch_rows=counts.job_batches,
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
