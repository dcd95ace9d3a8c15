"""The fenced writes of a lease holder: renew, start, complete, retry, fail, release, record_result.

Each is guarded by `common.fence(lease)`: the row must still be `running` under exactly this
lease (owner and attempt), and exactly one row must change. A worker whose lease was reaped,
requeued, failed or cancelled changes nothing; the call says LEASE_LOST with what the row holds now.

None of them but record_result waits on another transaction's row lock: rows are locked first
with SKIP LOCKED, and a row held elsewhere this instant comes back BUSY, to be tried again while
the lease keeper goes on renewing. So one row held by a stray `SELECT ... FOR UPDATE` never
stalls the others. record_result, called by the handler itself on its own connection, waits for
its job's row (up to the lock wait timeout, which the worker retries like a lost connection): the
handler has nothing else to do meanwhile, and no other job's write waits with it (the quick
soak once saw one wait 3.2 s on a held row).

A COMMIT whose reply was lost is retried by db.transaction; the retry then finds the write
already made. Each verb recognises its own write (the job done under this lease; this attempt's
row in job_attempt; this attempt's job_result row) and reports success, not a lost lease.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection
from sqlalchemy.exc import IntegrityError

from ..db import db_after, db_now, is_mysql, require_primary, transaction
from ..errors import LeaseLostError, NotPrimary
from ..models import Lease, LeaseLoss, Outcome, Status
from ..schema import job_attempt, job_queue, job_result, queue_state
from .common import (
    NO_ROW,
    by_id,
    execute_fast,
    fence,
    is_duplicate_key,
    jq,
    lease_loss,
    one_more_attempt,
    record_attempts,
    shape,
    truncate_error,
)
from .hooks import settle

_FLAGS = {"mariadb": ("read_only", "innodb_read_only"), "mysql": ("read_only", "innodb_read_only", "super_read_only")}


@functools.lru_cache(maxsize=512)
def _lock_leased(n: int, flavour: str) -> sa.Select:
    """Lock n job rows by primary key without waiting: rows another transaction holds are left
    out (BUSY). PRIMARY is forced because on a small table MariaDB would rather scan it, and a
    locking scan would touch every row. The server's read-only flags come along, so a fenced
    write never lands on a demoted primary (an account with SUPER could still write there)."""
    ids = [sa.bindparam(f"id_{i}", type_=sa.BigInteger) for i in range(n)]
    stmt = sa.select(jq.id, jq.has_dependents, *[sa.literal_column(f"@@global.{f}") for f in _FLAGS[flavour]]).where(
        jq.id.in_(ids)
    )
    stmt = stmt.with_hint(job_queue, "FORCE INDEX (PRIMARY)", "mysql").with_hint(
        job_queue, "FORCE INDEX (PRIMARY)", "mariadb"
    )
    return stmt.with_for_update(skip_locked=True)


def lock_leased(c: Connection, job_ids: Sequence[int]) -> dict[int, bool]:
    """The ids among `job_ids` whose rows this transaction now holds (SKIP LOCKED), each with
    whether something waits for it (has_dependents: read here, where the row is locked anyway)."""
    if not job_ids:
        return {}
    require_primary(c)
    if not is_mysql(c):
        # SQLite: BEGIN IMMEDIATE already holds the whole database
        found = dict(c.execute(sa.select(jq.id, jq.has_dependents).where(jq.id.in_(list(job_ids)))).all())
        return {i: bool(found.get(i)) for i in job_ids}
    flavour = "mariadb" if getattr(c.dialect, "is_mariadb", False) else "mysql"
    size = shape(len(job_ids))
    params = {f"id_{i}": job_ids[i] if i < len(job_ids) else NO_ROW for i in range(size)}
    rows = execute_fast(c, _lock_leased(size, flavour), params).rows
    if rows and any(str(v) in ("1", "ON") for v in rows[0][2:]):
        raise NotPrimary("the server turned read-only; the lease write was not made")
    return {row[0]: bool(row[1]) for row in rows}


# --- renew ---------------------------------------------------------------------------------------


def fence_any(n: int) -> sa.ColumnElement[bool]:
    """The lease fence for n rows at once: each row's (id, lease_owner, attempts) must be one of
    the n leases (parameters id_i, owner_i, attempt_i, see fence_params)."""
    return sa.or_(
        *[
            sa.and_(
                jq.id == sa.bindparam(f"id_{i}", type_=sa.BigInteger),
                jq.lease_owner == sa.bindparam(f"owner_{i}", type_=sa.String),
                jq.attempts == sa.bindparam(f"attempt_{i}", type_=sa.Integer),
            )
            for i in range(n)
        ]
    )


def _ids(n: int) -> list[sa.BindParameter]:
    return [sa.bindparam(f"id_{i}", type_=sa.BigInteger) for i in range(n)]


@functools.lru_cache(maxsize=512)
def _renew(n: int) -> sa.Update:
    return (
        by_id(sa.update(job_queue))
        .where(jq.id.in_(_ids(n)), jq.status == Status.RUNNING.value, fence_any(n))
        .values(lease_until=db_after(micros=sa.bindparam("lease_us", type_=sa.BigInteger)), updated_at=db_now())
    )


def fence_params(leases: Sequence[Lease], size: int = 0) -> dict[str, Any]:
    """id_i, owner_i, attempt_i of each lease, and of `size` places in all (those past the leases
    match no row)."""
    params: dict[str, Any] = {}
    for i, lease in enumerate(leases):
        params[f"id_{i}"], params[f"owner_{i}"], params[f"attempt_{i}"] = lease.job_id, lease.owner, lease.attempt
    for i in range(len(leases), size):
        params[f"id_{i}"], params[f"owner_{i}"], params[f"attempt_{i}"] = NO_ROW, "", 0
    return params


def renew_leases(
    conn: Connection, leases: Sequence[Lease], lease_seconds: float
) -> tuple[dict[Lease, Outcome], list[LeaseLoss]]:
    """Extend every lease still held, in one transaction: OK, LEASE_LOST (with what the row holds
    now), or BUSY (held by another transaction this instant: not renewed this time)."""
    if not leases:
        return {}, []

    def write(c: Connection) -> tuple[dict[Lease, Outcome], list[LeaseLoss]]:
        mine = lock_leased(c, [lease.job_id for lease in leases])
        held = [lease for lease in leases if lease.job_id in mine]
        outcomes = {lease: Outcome.BUSY for lease in leases if lease.job_id not in mine}
        if held:
            size = shape(len(held))
            params = fence_params(held, size)
            params["lease_us"] = int(round(lease_seconds * 1_000_000))
            n = execute_fast(c, _renew(size), params).rowcount
            if n == len(held):
                outcomes.update({lease: Outcome.OK for lease in held})
                return outcomes, []
            now = _current(c, [lease.job_id for lease in held])
            losses = []
            for lease in held:
                r = now.get(lease.job_id)
                if (
                    r is not None
                    and r.status == Status.RUNNING.value
                    and (r.lease_owner, r.attempts) == (lease.owner, lease.attempt)
                ):
                    outcomes[lease] = Outcome.OK
                else:
                    outcomes[lease] = Outcome.LEASE_LOST
                    losses.append(_loss_from(r, lease, "renew"))
            return outcomes, losses
        return outcomes, []

    return transaction(conn, write, what="renew")


# --- start ---------------------------------------------------------------------------------------

_QUEUE_PAUSED = sa.select(queue_state.c.paused).where(queue_state.c.queue == sa.bindparam("queue"))
_QUEUE_PAUSED_SHARED = _QUEUE_PAUSED.with_for_update(read=True)


def start_lease(conn: Connection, lease: Lease, queue: str, lease_seconds: float) -> tuple[Outcome, LeaseLoss | None]:
    """A job that waited in hand for a thread is about to run its handler: renew its lease under
    the fence, in a transaction that share-locks its queue's row (as the claim does, see
    claim._open_queues). OK: start it (the lease runs from now); LEASE_LOST: an operator took it
    back (cancel, fail, forced requeue) or it was reaped; PAUSED: its queue was paused since the
    claim (the lease is still ours, for the caller to release); BUSY: its row is held by another
    transaction this instant. An operator's action and a pause either wait for this transaction
    (the pause) or are refused while it holds the row (NOWAIT), or they committed before it: so
    once one has answered, the job's handler does not start."""
    lease_us = int(round(lease_seconds * 1_000_000))

    def write(c: Connection) -> tuple[Outcome, LeaseLoss | None]:
        if not lock_leased(c, [lease.job_id]):
            return Outcome.BUSY, None
        paused = c.execute(_QUEUE_PAUSED_SHARED if is_mysql(c) else _QUEUE_PAUSED, {"queue": queue}).scalar()
        if paused:
            return Outcome.PAUSED, None
        if execute_fast(c, _renew(1), {**fence_params([lease], 1), "lease_us": lease_us}).rowcount == 1:
            return Outcome.OK, None
        return Outcome.LEASE_LOST, lease_loss(c, lease, "start")

    return transaction(conn, write, what="start")


def _current(c: Connection, job_ids: Sequence[int]) -> dict[int, Any]:
    return {
        r.id: r
        for r in c.execute(
            sa.select(jq.id, jq.status, jq.lease_owner, jq.attempts, jq.task_key).where(jq.id.in_(list(job_ids)))
        ).all()
    }


def _loss_from(row, lease: Lease, operation: str) -> LeaseLoss:
    if row is None:
        return LeaseLoss(lease, operation, None, "missing", None, None)
    return LeaseLoss(lease, operation, row.task_key, row.status, row.lease_owner, row.attempts)


# --- complete ------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=512)
def _mark_done(n: int) -> sa.Update:
    """running -> done for n leases, each row fenced by its own (id, lease_owner, attempts)."""
    return (
        by_id(sa.update(job_queue))
        .where(jq.id.in_(_ids(n)), jq.status == Status.RUNNING.value, fence_any(n))
        .values(status=Status.DONE.value, finished_at=db_now(), lease_until=None, updated_at=db_now())
    )


def complete_in(c: Connection, leases: Sequence[Lease]) -> tuple[dict[Lease, Outcome], list[LeaseLoss]]:
    """Inside the caller's transaction: running -> done for every lease still held (one fenced
    UPDATE for the lot), leaving rows held elsewhere this instant BUSY."""
    if not leases:
        return {}, []
    mine = lock_leased(c, [lease.job_id for lease in leases])
    held = [lease for lease in leases if lease.job_id in mine]
    outcomes = {lease: Outcome.BUSY for lease in leases if lease.job_id not in mine}
    if not held:
        return outcomes, []
    size = shape(len(held))
    n = execute_fast(c, _mark_done(size), fence_params(held, size)).rowcount
    losses = []
    if n == len(held):
        outcomes.update({lease: Outcome.OK for lease in held})
    else:
        losses = completions_read_back(c, held, outcomes)
    parents = [lease.job_id for lease in held if mine[lease.job_id] and outcomes[lease] is Outcome.OK]
    if parents:
        settle(c, parents)
    return outcomes, losses


def completions_read_back(c: Connection, held: Sequence[Lease], outcomes: dict[Lease, Outcome]) -> list[LeaseLoss]:
    """After a completion UPDATE changed fewer rows than asked: a row done under our lease is
    ours (a retried COMMIT that had landed), anything else is lost. Fills `outcomes`; returns
    the losses."""
    now = _current(c, [lease.job_id for lease in held])
    losses = []
    for lease in held:
        r = now.get(lease.job_id)
        if (
            r is not None
            and r.status == Status.DONE.value
            and (r.lease_owner, r.attempts) == (lease.owner, lease.attempt)
        ):
            outcomes[lease] = Outcome.OK
        else:
            outcomes[lease] = Outcome.LEASE_LOST
            losses.append(_loss_from(r, lease, "complete"))
    return losses


def complete_with(conn: Connection, lease: Lease) -> tuple[Outcome, LeaseLoss | None]:
    """running -> done inside the caller's open transaction (a handler's `ctx.transaction()`), so
    that the handler's own writes and this attempt's completion commit together or not at all.
    The row is locked and waited for (briefly: the lock wait is the session's), then fenced."""
    require_primary(conn)
    has_dependents = conn.execute(sa.select(jq.has_dependents).where(jq.id == lease.job_id).with_for_update()).scalar()
    n = execute_fast(conn, _mark_done(1), fence_params([lease])).rowcount
    if n == 1:
        if has_dependents:
            settle(conn, [lease.job_id])
        return Outcome.OK, None
    return Outcome.LEASE_LOST, lease_loss(conn, lease, "complete")


def complete_many(conn: Connection, leases: Sequence[Lease]) -> tuple[dict[Lease, Outcome], list[LeaseLoss]]:
    """running -> done for every lease still held: one fenced UPDATE and one COMMIT for the lot."""
    return transaction(conn, lambda c: complete_in(c, leases), what="complete")


# --- retry, fail, release ------------------------------------------------------------------------


def retry(
    conn: Connection, lease: Lease, error: str, delay_seconds: float, *, outcome: str = "retry"
) -> tuple[Outcome, LeaseLoss | None]:
    """running -> scheduled, to be promoted to ready after `delay_seconds` of backoff (`outcome`
    names the attempt in its history, say `timeout`)."""
    return _finish(
        conn,
        lease,
        outcome,
        {
            "status": Status.SCHEDULED.value,
            "run_at": db_after(delay_seconds),
            "lease_owner": None,
            "last_error": truncate_error(error),
        },
        error,
    )


def fail(conn: Connection, lease: Lease, error: str, *, outcome: str = "fail") -> tuple[Outcome, LeaseLoss | None]:
    """running -> failed for good, with the error kept (`outcome` names it in the attempt history,
    say `timeout`)."""
    return _finish(
        conn,
        lease,
        outcome,
        {"status": Status.FAILED.value, "finished_at": db_now(), "last_error": truncate_error(error)},
        error,
    )


def release(conn: Connection, lease: Lease, reason: str = "worker shutting down") -> tuple[Outcome, LeaseLoss | None]:
    """running -> ready without waiting for the lease to expire; attempts are kept. A shutdown
    is not the job's fault: if this was its last attempt, it gets one more."""
    return _finish(
        conn,
        lease,
        "release",
        {"status": Status.READY.value, "run_at": db_now(), "lease_owner": None, "max_attempts": one_more_attempt()},
        reason,
    )


def _finish(
    conn: Connection, lease: Lease, operation: str, values: dict[str, Any], error: str | None
) -> tuple[Outcome, LeaseLoss | None]:
    """retry, fail or release under the fence, keeping the attempt in job_attempt."""
    passes = 0

    def write(c: Connection) -> tuple[Outcome, LeaseLoss | None]:
        nonlocal passes
        passes += 1
        mine = lock_leased(c, [lease.job_id])
        if not mine:
            return Outcome.BUSY, None
        record_attempts(c, fence(lease), operation, error)
        n = c.execute(
            sa.update(job_queue).where(fence(lease)).values(lease_until=None, updated_at=db_now(), **values)
        ).rowcount
        if n == 1:
            if mine[lease.job_id] and values["status"] == Status.FAILED.value:
                settle(c, [lease.job_id])
            return Outcome.OK, None
        if passes > 1 and _attempt_recorded(c, lease, operation):
            return Outcome.OK, None  # our own write: the COMMIT landed, its reply was lost
        return Outcome.LEASE_LOST, lease_loss(c, lease, operation)

    return transaction(conn, write, what=operation)


def _attempt_recorded(c: Connection, lease: Lease, outcome: str) -> bool:
    ja = job_attempt.c
    return (
        c.execute(
            sa.select(ja.id)
            .where(
                ja.job_id == lease.job_id, ja.attempt == lease.attempt, ja.worker == lease.owner, ja.outcome == outcome
            )
            .limit(1)
        ).first()
        is not None
    )


# --- record_result -------------------------------------------------------------------------------


def record_result(conn: Connection, lease: Lease, task_key: str, result: Any) -> bool:
    """Store the downstream result of `task_key`, at most once, only while `lease` is held.

    True when written (or found written by this very attempt: a retried COMMIT); False for a
    duplicate (another attempt recorded this task_key's result);
    raises LeaseLostError (with the loss as its argument) when the lease is gone.
    """
    rs = job_result.c
    passes = 0

    def write(c: Connection) -> bool:
        nonlocal passes
        passes += 1
        require_primary(c)
        # Touching the row under the fence both checks the lease and locks the row, so the job
        # cannot be reaped or requeued between the check and the insert.
        if c.execute(sa.update(job_queue).where(fence(lease)).values(updated_at=db_now())).rowcount != 1:
            raise LeaseLostError(lease_loss(c, lease, "record_result"))
        existing = c.execute(sa.select(rs.job_id, rs.attempt).where(rs.task_key == task_key)).first()
        if existing is not None:
            # On a retried pass, a row of this very attempt is our own write whose COMMIT reply
            # was lost; otherwise it is a duplicate (another attempt's, or an earlier call's).
            return passes > 1 and (existing.job_id, existing.attempt) == (lease.job_id, lease.attempt)
        c.execute(
            sa.insert(job_result).values(
                task_key=task_key,
                job_id=lease.job_id,
                attempt=lease.attempt,
                worker=lease.owner,
                result=result,
                created_at=db_now(),
            )
        )
        return True

    try:
        return transaction(conn, write, what="record_result")
    except IntegrityError as exc:
        if not is_duplicate_key(exc):
            raise
        return False
