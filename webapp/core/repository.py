"""Every SQL statement the queue runs, one function per verb.

The worker loop, the reaper, the dashboard, the CLI and the HTTP API all come through here. Each
function takes the Connection it runs on and opens its own short transaction (see
`db.transaction`), retried on deadlocks, lock-wait timeouts and lost connections.

State machine of a row in `job_queue`:

    enqueue ──> ready ──claim──> running ──complete──> done
         │        ^                 │ │ └──fail──────> failed
         v        │                 │ └──retry──> scheduled ──promote_due──> ready
     scheduled ───┘                 └──reap (lease expired) / release ──> ready (or failed)

Writes on behalf of a worker (renew, complete, retry, fail, release, record_result) are fenced by
the lease: `id`, `status='running'`, `lease_owner` and `attempts` must all still match, and exactly
one row must change. A worker that lost its lease changes nothing.
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, NamedTuple

import pymysql
import sqlalchemy as sa
from sqlalchemy.engine import Connection, Row
from sqlalchemy.exc import DBAPIError, IntegrityError

from . import metrics, wakeup
from .db import ER_LOCK_NOWAIT, ER_LOCK_WAIT_TIMEOUT, db_after, db_now, error_code, transaction
from .errors import InvalidState, JobBusy, JobNotFound, LeaseStillValid, ValidationError
from .logs import event
from .models import (ClaimedJob, EmptyClaim, EmptyClaimReport, Enqueued, Job, Lease, Outcome,
                     Status)
from .schema import (STAT_COLUMNS, Timestamp, audit_log, job_attempt, job_queue, job_result, worker_process,
                     worker_stats)
from .tasks import TASKS, Registry
from .validation import NewJob, new_job

log = logging.getLogger("jobqueue.repository")

jq = job_queue.c
MAX_ERROR_CHARS = 4000
REAP_BATCH = 500
PROMOTE_BATCH = 1000

# What a claim reads: every column the handler and the fence need, and no more (each column's
# metadata is parsed again on every result set). The queue is the one the claim asked for.
_CLAIM_COLUMNS = (jq.id, jq.task_key, jq.task_name, jq.priority, jq.payload, jq.attempts, jq.max_attempts)


def _job(row: Row | Mapping[str, Any]) -> Job:
    m = row._mapping if isinstance(row, Row) else row
    return Job(
        id=m["id"], task_key=m["task_key"], task_name=m["task_name"], queue=m["queue"],
        priority=m["priority"], payload=m["payload"], status=Status(m["status"]),
        attempts=m["attempts"], max_attempts=m["max_attempts"], lease_owner=m.get("lease_owner"),
        lease_until=m.get("lease_until"), run_at=m.get("run_at"), started_at=m.get("started_at"),
        last_error=m.get("last_error"), created_at=m.get("created_at"), updated_at=m.get("updated_at"),
        finished_at=m.get("finished_at"),
    )


def _is_duplicate_key(exc: IntegrityError) -> bool:
    return error_code(exc) == 1062 or "UNIQUE constraint failed" in str(exc.orig)


def _short(error: str | None) -> str | None:
    if error is None:
        return None
    return error if len(error) <= MAX_ERROR_CHARS else error[: MAX_ERROR_CHARS - 15] + "... [truncated]"


# --- enqueue -------------------------------------------------------------------------------------

def _insert_values(job: NewJob, now: datetime | None = None) -> dict[str, Any]:
    values = {
        "task_key": job.task_key, "task_name": job.task_name, "queue": job.queue,
        "priority": job.priority, "payload": job.payload,
        "status": (Status.SCHEDULED if job.delay_seconds > 0 else Status.READY).value,
        "max_attempts": job.max_attempts,
    }
    if now is None:
        values["delay_us"] = int(round(job.delay_seconds * 1_000_000))
    else:
        values.update(run_at=now + timedelta(seconds=job.delay_seconds), created_at=now, updated_at=now)
    return values


_JOB_COLUMNS = dict(task_key=sa.bindparam("task_key"), task_name=sa.bindparam("task_name"),
                    queue=sa.bindparam("queue"), priority=sa.bindparam("priority"),
                    payload=sa.bindparam("payload", type_=sa.JSON), status=sa.bindparam("status"),
                    attempts=0, max_attempts=sa.bindparam("max_attempts"))
# One job: created_at, updated_at and run_at (now + delay) straight from the database clock.
_INSERT_ONE = sa.insert(job_queue).values(
    **_JOB_COLUMNS, run_at=db_after(micros=sa.bindparam("delay_us", type_=sa.BigInteger)),
    created_at=db_now(), updated_at=db_now())
# Many jobs: plain values only (the database's now, read once in the same transaction), so the
# driver sends one multi-row INSERT instead of a statement per row.
_INSERT_MANY = sa.insert(job_queue).values(
    **_JOB_COLUMNS, run_at=sa.bindparam("run_at", type_=Timestamp),
    created_at=sa.bindparam("created_at", type_=Timestamp), updated_at=sa.bindparam("updated_at", type_=Timestamp))


def enqueue(conn: Connection, task_name: str, task_key: str, payload: dict | None = None, *,
            queue: str | None = None, priority: int = 0, delay: float = 0,
            max_attempts: int | None = None, registry: Registry = TASKS) -> Enqueued:
    """Add one job. A known task_key writes nothing and returns the existing id, duplicate=True."""
    job = new_job(task_name, task_key, payload, queue=queue, priority=priority, delay=delay,
                  max_attempts=max_attempts, registry=registry)
    return enqueue_many(conn, [job])[0]


def enqueue_many(conn: Connection, jobs: Iterable[NewJob | Mapping[str, Any]], *,
                 registry: Registry = TASKS) -> list[Enqueued]:
    """Add many jobs in one transaction (multi-row INSERT). All are validated before anything is
    written; task_keys already in the table (or repeated in the batch) come back duplicate=True."""
    validated: list[NewJob] = []
    for i, item in enumerate(jobs):
        if isinstance(item, NewJob):
            validated.append(item)
            continue
        spec = dict(item)
        try:
            validated.append(new_job(spec.pop("task", spec.pop("task_name", None)), spec.pop("task_key", None),
                                     spec.pop("payload", None), registry=registry, **spec))
        except TypeError as exc:
            raise ValidationError(f"job {i}: {exc}") from None
        except ValidationError as exc:
            raise type(exc)(f"job {i}: {exc}", exc.field) from None
    if not validated:
        return []

    def _do(c: Connection) -> tuple[list[Enqueued], list[NewJob]]:
        keys = list({job.task_key: None for job in validated})
        existing = dict(c.execute(sa.select(jq.task_key, jq.id).where(jq.task_key.in_(keys))).all())
        fresh: dict[str, NewJob] = {}
        for job in validated:
            if job.task_key not in existing and job.task_key not in fresh:
                fresh[job.task_key] = job
        if len(fresh) == 1:
            (job,) = fresh.values()
            ids = {job.task_key: c.execute(_INSERT_ONE, _insert_values(job)).inserted_primary_key[0]}
        elif fresh:
            now = _dt(c.execute(sa.select(db_now())).scalar())
            c.execute(_INSERT_MANY, [_insert_values(job, now) for job in fresh.values()])
            ids = dict(c.execute(sa.select(jq.task_key, jq.id).where(jq.task_key.in_(list(fresh)))).all())
        else:
            ids = {}
        out, seen = [], set()
        for job in validated:
            if job.task_key in ids and job.task_key not in seen:
                seen.add(job.task_key)
                status = Status.SCHEDULED if job.delay_seconds > 0 else Status.READY
                out.append(Enqueued(ids[job.task_key], job.task_key, False, status))
            else:
                out.append(Enqueued(existing.get(job.task_key) or ids[job.task_key], job.task_key, True))
        return out, list(fresh.values())

    for attempt in (1, 2, 3):
        try:
            results, inserted = transaction(conn, _do, what="enqueue")
            break
        except IntegrityError as exc:
            # Another transaction inserted one of our task_keys between our read and our insert;
            # the next pass sees it as existing.
            if not _is_duplicate_key(exc) or attempt == 3 or conn.in_transaction():
                raise
    for job in inserted:
        metrics.ENQUEUED.labels(queue=job.queue).inc()
    for res in results:
        if res.duplicate:
            metrics.DUPLICATE_ENQUEUES.inc()
            event(log, logging.INFO, "duplicate_enqueue", job_id=res.id, task_key=res.task_key,
                  detail="task_key already known; nothing written")
    if inserted:
        wakeup.notify()
    return results


# --- the hot path's executor ---------------------------------------------------------------------

@dataclass
class _Result:
    rows: list[tuple]
    rowcount: int


_compiled: dict[tuple[str, Any], tuple[str, dict[str, Any]]] = {}


def _hot(c: Connection, stmt: sa.Executable, params: dict[str, Any]) -> _Result:
    """Run one of the claim/complete statements. On MySQL the statement is compiled once to SQL
    text and sent on the DBAPI cursor: SQLAlchemy's per-execution work (cache key, parameter
    processing, result objects) was about 40 us of CPU per statement, a third of the worker's
    CPU per job. Errors are wrapped as SQLAlchemy's own (and a lost connection invalidated), so
    db.transaction retries them as usual. Elsewhere (SQLite) it is a plain execute."""
    if c.dialect.name not in ("mysql", "mariadb"):
        result = c.execute(stmt, params)
        return _Result([tuple(r) for r in result.all()] if result.returns_rows else [], result.rowcount)
    key = (c.dialect.name, stmt)
    if key not in _compiled:
        compiled = stmt.compile(dialect=c.dialect)
        _compiled[key] = (compiled.string, dict(compiled.params))
    sql, defaults = _compiled[key]
    dbapi_conn = c.connection.dbapi_connection
    cursor = dbapi_conn.cursor()
    try:
        cursor.execute(sql, {**defaults, **params})
        return _Result(list(cursor.fetchall()) if cursor.description else [], cursor.rowcount)
    except pymysql.err.Error as exc:
        lost = c.dialect.is_disconnect(exc, dbapi_conn, cursor)
        if lost:
            c.invalidate(exc)
        raise sa.exc.DBAPIError.instance(sql, params, exc, pymysql.err.Error, connection_invalidated=lost,
                                         dialect=c.dialect) from exc
    finally:
        cursor.close()


# --- claim ---------------------------------------------------------------------------------------

# WHERE status = 'ready' AND queue = ? ORDER BY priority, id is exactly the order of
# ix_ready_pick, so InnoDB walks the index from the first claimable row and stops after `limit`
# rows it could lock: no filesort, and rows other workers hold are skipped, not waited for.
# Built once: the claim is the hot path.
_PICK = (sa.select(*_CLAIM_COLUMNS)
         .where(jq.status == Status.READY.value, jq.queue == sa.bindparam("queue"))
         .order_by(jq.priority, jq.id)
         .limit(sa.bindparam("limit", type_=sa.Integer))
         .with_for_update(skip_locked=True))


class _Picked(NamedTuple):
    id: int
    task_key: str
    task_name: str
    priority: int
    payload: dict[str, Any]
    attempts: int
    max_attempts: int
    queue: str

    @classmethod
    def of(cls, row: tuple, queue: str) -> "_Picked":
        # The DBAPI cursor hands back the JSON column as text.
        payload = row[4]
        return cls(*row[:4], json.loads(payload) if isinstance(payload, (str, bytes)) else payload, *row[5:7], queue)


@functools.lru_cache(maxsize=512)
def _take(n: int) -> sa.Update:
    """The claim's guarded UPDATE for n picked rows, each with its slot's lease owner. Built once
    per batch size (statement building was a third of the worker's CPU)."""
    ids = [sa.bindparam(f"id_{i}", type_=sa.BigInteger) for i in range(n)]
    owner = sa.case({ids[i]: sa.bindparam(f"owner_{i}", type_=sa.String) for i in range(n)}, value=jq.id)
    return (sa.update(job_queue)
            .where(jq.id.in_(ids), jq.status == Status.READY.value)
            .values(status=Status.RUNNING.value, lease_owner=owner,
                    lease_until=db_after(micros=sa.bindparam("lease_us", type_=sa.BigInteger)),
                    attempts=jq.attempts + 1, started_at=db_now(), updated_at=db_now()))


def _pick(queue: str, limit: int) -> sa.Select:
    """The claim's SELECT with its values inlined (for EXPLAIN)."""
    return _PICK.params(queue=queue, limit=limit)


def claim(conn: Connection, worker_id: str | Sequence[str], limit: int, queues: Sequence[str], *,
          lease_seconds: float) -> list[ClaimedJob]:
    """Take up to `limit` ready jobs from `queues` (in that order) in one short transaction.

    `worker_id` is the lease owner, or one owner per slot (job i goes to worker_id[i]). Returns
    only the jobs the guarded UPDATE really took. No other work happens in this transaction: the
    handler runs after the commit.
    """
    if limit <= 0 or not queues:
        return []
    owners = [worker_id] * limit if isinstance(worker_id, str) else list(worker_id)[:limit]
    if len(owners) < limit:
        raise ValueError("need one worker id per slot")

    lease_us = int(round(lease_seconds * 1_000_000))

    def _do(c: Connection) -> list[ClaimedJob]:
        picked: list[_Picked] = []
        for queue in queues:
            metrics.CLAIMS.labels(queue=queue).inc()
            rows = _hot(c, _PICK, {"queue": queue, "limit": limit - len(picked)}).rows
            picked.extend(_Picked.of(row, queue) for row in rows)
            if len(picked) >= limit:
                break
        if not picked:
            return []
        ids = [row.id for row in picked]
        owner_of = dict(zip(ids, owners))
        params: dict[str, Any] = {"lease_us": lease_us}
        for i, job_id in enumerate(ids):
            params[f"id_{i}"] = job_id
            params[f"owner_{i}"] = owner_of[job_id]
        taken = _hot(c, _take(len(ids)), params).rowcount
        if taken != len(ids):
            # We hold these rows' locks, so this should not happen; if it does, trust only the
            # rows that now carry our lease.
            event(log, logging.WARNING, "claim_mismatch", selected=len(ids), updated=taken)
            mine = {row.id: row.attempts for row in c.execute(
                sa.select(jq.id, jq.attempts, jq.lease_owner)
                .where(jq.id.in_(ids), jq.status == Status.RUNNING.value)).all()
                if row.lease_owner == owner_of[row.id]}
            picked = [row for row in picked if mine.get(row.id) == row.attempts + 1]
        return [
            ClaimedJob(
                job=Job(id=row.id, task_key=row.task_key, task_name=row.task_name, queue=row.queue,
                        priority=row.priority, payload=row.payload, status=Status.RUNNING,
                        attempts=row.attempts + 1, max_attempts=row.max_attempts,
                        lease_owner=owner_of[row.id]),
                lease=Lease(row.id, owner_of[row.id], row.attempts + 1),
            )
            for row in picked
        ]

    claimed = transaction(conn, _do, what="claim")
    for item in claimed:
        metrics.CLAIMED.labels(queue=item.job.queue).inc()
    return claimed


def ready_queues(conn: Connection) -> list[str]:
    """Queues that have ready jobs right now (a loose scan of ix_ready_pick, no locks)."""
    return list(transaction(conn, lambda c: c.execute(
        sa.select(jq.queue).where(jq.status == Status.READY.value).distinct()).scalars().all(),
        what="ready_queues"))


def explain_claim(conn: Connection, queue: str = "default", limit: int = 1) -> list[dict[str, Any]]:
    """The server's plan for the claim's SELECT (MySQL/MariaDB EXPLAIN rows)."""
    stmt = _pick(queue, limit)
    compiled = stmt.compile(dialect=conn.dialect, compile_kwargs={"literal_binds": True})
    return [dict(row._mapping) for row in conn.exec_driver_sql(f"EXPLAIN {compiled}").all()]


def classify_statement(queues: Sequence[str] | None) -> sa.Select:
    """The plain read behind classify_empty: ready rows (up to 1000), the next lease expiry and
    the next scheduled job, for these queues, and the database's now."""
    in_queues = (lambda q: q) if queues is None else (lambda q: q.where(jq.queue.in_(list(queues))))
    ready_sample = in_queues(sa.select(sa.literal(1)).where(jq.status == Status.READY.value)).limit(1000).subquery()
    return sa.select(
        sa.select(sa.func.count()).select_from(ready_sample).scalar_subquery().label("ready"),
        in_queues(sa.select(sa.func.min(jq.lease_until)).where(jq.status == Status.RUNNING.value))
        .scalar_subquery().label("next_lease_expiry"),
        in_queues(sa.select(sa.func.min(jq.run_at)).where(jq.status == Status.SCHEDULED.value))
        .scalar_subquery().label("next_scheduled"),
        db_now().label("now"),
    )


def classify_row(row: Sequence[Any]) -> EmptyClaimReport:
    """(ready, next_lease_expiry, next_scheduled, now) -> why a claim would find nothing."""
    ready, next_lease_expiry, next_scheduled, now = row
    if ready:
        kind = EmptyClaim.CONTENDED
    elif next_lease_expiry is not None:
        kind = EmptyClaim.WAITING
    else:
        kind = EmptyClaim.IDLE
    return EmptyClaimReport(kind, skipped=int(ready or 0), next_lease_expiry=_dt(next_lease_expiry),
                            next_scheduled=_dt(next_scheduled), db_now=_dt(now))


def classify_empty(conn: Connection, queues: Sequence[str] | None) -> EmptyClaimReport:
    """Why a claim found nothing: one plain, non-locking read.

    A plain read still sees rows other transactions hold locked, so ready rows here after an
    empty SKIP LOCKED claim mean they were all taken by someone else's transaction (contended).
    """
    stmt = classify_statement(queues)
    return classify_row(tuple(transaction(conn, lambda c: c.execute(stmt).one(), what="classify_empty")))


def _dt(value: Any) -> datetime | None:
    # Aggregates over DATETIME columns come back as strings from SQLite.
    if value is None or isinstance(value, datetime):
        return value
    return datetime.fromisoformat(str(value))


# --- fenced writes on behalf of a lease holder ---------------------------------------------------

def _fenced(lease: Lease):
    return sa.and_(jq.id == lease.job_id, jq.status == Status.RUNNING.value,
                   jq.lease_owner == lease.owner, jq.attempts == lease.attempt)


def _lease_lost(c: Connection, lease: Lease, operation: str) -> None:
    now = c.execute(sa.select(jq.status, jq.lease_owner, jq.attempts, jq.task_key)
                    .where(jq.id == lease.job_id)).first()
    metrics.LEASES_LOST.labels(operation=operation).inc()
    event(log, logging.WARNING, "lease_lost", operation=operation, job_id=lease.job_id,
          task_key=now.task_key if now else None, attempt=lease.attempt, worker=lease.owner,
          now_status=now.status if now else "missing", now_owner=now.lease_owner if now else None,
          now_attempt=now.attempts if now else None)


def _record_attempts(c: Connection, where: Any, outcome: str, error: Any) -> None:
    """Keep a row in job_attempt for attempts that did not succeed. Runs before the state change,
    while the job row still carries the attempt's owner and start."""
    c.execute(sa.insert(job_attempt).from_select(
        ["job_id", "attempt", "worker", "started_at", "finished_at", "outcome", "error"],
        sa.select(jq.id, jq.attempts, jq.lease_owner, jq.started_at, db_now(), sa.literal(outcome),
                  error if isinstance(error, sa.ColumnElement) else sa.literal(_short(error), sa.Text))
        .where(where)))


def renew_leases(conn: Connection, leases: Sequence[Lease], lease_seconds: float) -> dict[int, Outcome]:
    """Extend each lease still held; a lease that is gone comes back LEASE_LOST."""
    if not leases:
        return {}

    def _do(c: Connection) -> dict[int, Outcome]:
        out = {}
        for lease in leases:
            n = c.execute(sa.update(job_queue).where(_fenced(lease))
                          .values(lease_until=db_after(lease_seconds), updated_at=db_now())).rowcount
            out[lease.job_id] = Outcome.OK if n == 1 else Outcome.LEASE_LOST
            if n != 1:
                _lease_lost(c, lease, "renew")
        return out

    outcomes = transaction(conn, _do, what="renew")
    metrics.RENEWALS.inc(sum(1 for o in outcomes.values() if o is Outcome.OK))
    return outcomes


def complete(conn: Connection, lease: Lease) -> Outcome:
    """running -> done, only for the holder of this lease."""
    return complete_many(conn, [lease])[lease.job_id]


@functools.lru_cache(maxsize=512)
def _mark_done(n: int) -> sa.Update:
    """running -> done for n leases, each row fenced by its own (id, lease_owner, attempts)."""
    ids = [sa.bindparam(f"id_{i}", type_=sa.BigInteger) for i in range(n)]
    fence = sa.or_(*[sa.and_(jq.id == ids[i], jq.lease_owner == sa.bindparam(f"owner_{i}", type_=sa.String),
                             jq.attempts == sa.bindparam(f"attempt_{i}", type_=sa.Integer)) for i in range(n)])
    return (sa.update(job_queue).where(jq.id.in_(ids), jq.status == Status.RUNNING.value, fence)
            .values(status=Status.DONE.value, finished_at=db_now(), lease_until=None, updated_at=db_now()))


def complete_many(conn: Connection, leases: Sequence[Lease]) -> dict[int, Outcome]:
    """running -> done for every lease still held: one fenced UPDATE and one COMMIT for the lot.

    Each row is fenced on its own (id, lease_owner, attempts), so a lost lease in the batch
    changes nothing for that job and nothing for the others. When fewer rows changed than asked,
    one read tells which jobs are now done under our lease (ours, including a retried COMMIT
    that had landed) and which were lost.
    """
    if not leases:
        return {}
    ids = [lease.job_id for lease in leases]
    params: dict[str, Any] = {}
    for i, lease in enumerate(leases):
        params[f"id_{i}"], params[f"owner_{i}"], params[f"attempt_{i}"] = lease.job_id, lease.owner, lease.attempt

    def _do(c: Connection) -> dict[int, Outcome]:
        n = _hot(c, _mark_done(len(leases)), params).rowcount
        if n == len(leases):
            return {job_id: Outcome.OK for job_id in ids}
        now = {r.id: r for r in c.execute(sa.select(jq.id, jq.status, jq.lease_owner, jq.attempts)
                                          .where(jq.id.in_(ids))).all()}
        return {lease.job_id: Outcome.OK if (r := now.get(lease.job_id)) is not None and r.status == Status.DONE.value
                and r.lease_owner == lease.owner and r.attempts == lease.attempt else Outcome.LEASE_LOST
                for lease in leases}

    outcomes = transaction(conn, _do, what="complete")
    lost = [lease for lease in leases if outcomes[lease.job_id] is Outcome.LEASE_LOST]
    if lost:
        with conn.begin():
            for lease in lost:
                _lease_lost(conn, lease, "complete")
    return outcomes


def retry(conn: Connection, lease: Lease, error: str, delay_seconds: float) -> Outcome:
    """running -> scheduled, to be promoted to ready after `delay_seconds` of backoff."""
    return _finish(conn, lease, "retry", {"status": Status.SCHEDULED.value, "run_at": db_after(delay_seconds),
                                           "lease_owner": None, "last_error": _short(error)}, error)


def fail(conn: Connection, lease: Lease, error: str) -> Outcome:
    """running -> failed for good, with the error kept."""
    return _finish(conn, lease, "fail", {"status": Status.FAILED.value, "finished_at": db_now(),
                                          "last_error": _short(error)}, error)


def _one_more_attempt():
    """max_attempts raised, if needed, so that attempts + 1 still fits (attempts never go back)."""
    return sa.case((jq.attempts + 1 > jq.max_attempts, jq.attempts + 1), else_=jq.max_attempts)


def release(conn: Connection, lease: Lease, reason: str = "worker shutting down") -> Outcome:
    """running -> ready without waiting for the lease to expire; attempts are kept. A shutdown
    is not the job's fault: if this was its last attempt, it gets one more."""
    return _finish(conn, lease, "release", {"status": Status.READY.value, "run_at": db_now(),
                                             "lease_owner": None, "max_attempts": _one_more_attempt()}, reason)


def _finish(conn: Connection, lease: Lease, operation: str, values: dict[str, Any], error: str | None) -> Outcome:
    """retry, fail or release under the fence, keeping the attempt in job_attempt."""
    def _do(c: Connection) -> Outcome:
        _record_attempts(c, _fenced(lease), operation, error)
        n = c.execute(sa.update(job_queue).where(_fenced(lease))
                      .values(lease_until=None, updated_at=db_now(), **values)).rowcount
        if n == 1:
            return Outcome.OK
        raise _Rollback(Outcome.LEASE_LOST)

    try:
        return transaction(conn, _do, what=operation)
    except _Rollback as stop:
        with conn.begin():
            _lease_lost(conn, lease, operation)
        return stop.outcome


class _Rollback(Exception):
    def __init__(self, outcome: Outcome):
        self.outcome = outcome


def record_result(conn: Connection, lease: Lease, task_key: str, result: Any) -> bool:
    """Store the downstream result of `task_key`, at most once, only while `lease` is held.

    Returns True when written, False for a duplicate (a result for this task_key exists). Raises
    LeaseLostError when the lease is gone: a worker that lost its job records nothing.
    """
    from .tasks import LeaseLostError

    def _do(c: Connection) -> bool:
        # Touching the row under the fence both checks the lease and locks the row, so the job
        # cannot be reaped or requeued between the check and the insert.
        if c.execute(sa.update(job_queue).where(_fenced(lease)).values(updated_at=db_now())).rowcount != 1:
            raise _Rollback(Outcome.LEASE_LOST)
        if c.execute(sa.select(job_result.c.id).where(job_result.c.task_key == task_key)).first():
            return False
        c.execute(sa.insert(job_result).values(task_key=task_key, job_id=lease.job_id, attempt=lease.attempt,
                                               worker=lease.owner, result=result, created_at=db_now()))
        return True

    try:
        written = transaction(conn, _do, what="record_result")
    except _Rollback:
        with conn.begin():
            _lease_lost(conn, lease, "record_result")
        raise LeaseLostError(f"job {lease.job_id} attempt {lease.attempt}: lease lost; result not recorded") from None
    except IntegrityError as exc:
        if not _is_duplicate_key(exc):
            raise
        written = False
    if not written:
        metrics.DUPLICATE_RESULTS.inc()
        event(log, logging.WARNING, "duplicate_result", job_id=lease.job_id, task_key=task_key,
              attempt=lease.attempt, worker=lease.owner, detail="result already recorded for this task_key; nothing written")
    return written


# --- the reaper's statements ---------------------------------------------------------------------

@dataclass(frozen=True)
class ReapResult:
    reclaimed: int = 0   # back to ready
    failed: int = 0      # attempts used up
    batches: int = 0


def reap(conn: Connection, *, batch_size: int = REAP_BATCH, max_batches: int = 100) -> ReapResult:
    """Return running jobs whose lease expired to ready (or failed when attempts are used up).

    Each batch is its own short transaction. The rows are locked with SKIP LOCKED, so a worker
    renewing a lease at this instant is not waited on, and the UPDATE repeats the expiry test so a
    lease renewed since the SELECT is never overwritten. `attempts` is left as it is.
    """
    reclaimed = failed = batches = 0
    while batches < max_batches:
        def _do(c: Connection) -> tuple[int, int, int]:
            # Find candidates with a plain read, then lock just those by primary key: a locking
            # scan over all running rows would hold the rows of healthy workers too, and their
            # completions would queue up behind the reaper.
            candidates = c.execute(
                sa.select(jq.id).where(jq.status == Status.RUNNING.value, jq.lease_until < db_now())
                .limit(batch_size)).scalars().all()
            if not candidates:
                return 0, 0, 0
            rows = c.execute(
                sa.select(jq.id, jq.task_key, jq.attempts, jq.max_attempts, jq.lease_owner)
                .where(jq.id.in_(candidates), jq.status == Status.RUNNING.value, jq.lease_until < db_now())
                .with_for_update(skip_locked=True)).all()
            if not rows:
                return 0, 0, len(candidates)
            expired = sa.and_(jq.id.in_([r.id for r in rows]), jq.status == Status.RUNNING.value,
                              jq.lease_until < db_now())
            _record_attempts(c, expired, "lease_expired",
                             sa.literal("lease expired; held by ") + sa.func.coalesce(jq.lease_owner, "?"))
            used_up = jq.attempts >= jq.max_attempts
            n_failed = c.execute(sa.update(job_queue).where(expired, used_up).values(
                status=Status.FAILED.value, lease_until=None, finished_at=db_now(), updated_at=db_now(),
                last_error=sa.literal("lease expired after attempt ") + sa.cast(jq.attempts, sa.String)
                + " of " + sa.cast(jq.max_attempts, sa.String) + "; no attempts left")).rowcount
            n_ready = c.execute(sa.update(job_queue).where(expired, sa.not_(used_up)).values(
                status=Status.READY.value, lease_owner=None, lease_until=None, run_at=db_now(),
                updated_at=db_now())).rowcount
            for row in rows:
                event(log, logging.WARNING, "reclaimed", job_id=row.id, task_key=row.task_key,
                      attempt=row.attempts, worker=row.lease_owner,
                      to="failed" if row.attempts >= row.max_attempts else "ready")
            return n_ready, n_failed, len(rows)

        n_ready, n_failed, seen = transaction(conn, _do, what="reap")
        if seen == 0 or n_ready + n_failed == 0:
            break
        batches += 1
        reclaimed += n_ready
        failed += n_failed
        metrics.RECLAIMED.labels(to_status="ready").inc(n_ready)
        metrics.RECLAIMED.labels(to_status="failed").inc(n_failed)
        if seen < batch_size:
            break
    if reclaimed:
        wakeup.notify()
    return ReapResult(reclaimed, failed, batches)


def promote_due(conn: Connection, *, batch_size: int = PROMOTE_BATCH, max_batches: int = 20) -> int:
    """scheduled -> ready for delayed jobs and retries whose time has come."""
    total = 0
    for _ in range(max_batches):
        def _do(c: Connection) -> int:
            ids = c.execute(sa.select(jq.id).where(jq.status == Status.SCHEDULED.value, jq.run_at <= db_now())
                            .order_by(jq.run_at).limit(batch_size).with_for_update(skip_locked=True)).scalars().all()
            if not ids:
                return 0
            return c.execute(sa.update(job_queue).where(jq.id.in_(ids), jq.status == Status.SCHEDULED.value)
                             .values(status=Status.READY.value, updated_at=db_now())).rowcount

        n = transaction(conn, _do, what="promote")
        total += n
        if n < batch_size:
            break
    if total:
        metrics.PROMOTED.inc(total)
        wakeup.notify()
    return total


# --- operator actions (NOWAIT: an answer now, never a wait) --------------------------------------

@dataclass(frozen=True)
class ActionResult:
    job_id: int
    before: Status
    after: Status
    changed: bool


def _lock_nowait(c: Connection, job_id: int) -> Row:
    try:
        row = c.execute(sa.select(jq.id, jq.status, jq.lease_owner, jq.lease_until, jq.attempts,
                                  jq.task_key, (jq.lease_until > db_now()).label("lease_valid"))
                        .where(jq.id == job_id).with_for_update(nowait=True)).first()
    except DBAPIError as exc:
        # MariaDB answers NOWAIT on a locked row with 1205, MySQL 8.0 with 3572.
        if error_code(exc) in (ER_LOCK_WAIT_TIMEOUT, ER_LOCK_NOWAIT):
            raise JobBusy(f"job {job_id} is locked by another transaction right now; try again") from None
        raise
    if row is None:
        raise JobNotFound(f"job {job_id} not found")
    return row


def requeue_job(conn: Connection, job_id: int, *, force: bool = False, actor: str = "operator") -> ActionResult:
    """Put a job back to ready now. `attempts` is kept; max_attempts grows if needed so that the
    job gets at least one more try. A running job with a valid lease needs `force`, and then its
    old lease is fenced: that worker's completion will change nothing."""

    def _do(c: Connection) -> ActionResult:
        row = _lock_nowait(c, job_id)
        before = Status(row.status)
        if before is Status.DONE:
            raise InvalidState(f"job {job_id} is done; a finished job is not requeued", before.value)
        if before is Status.READY:
            return ActionResult(job_id, before, before, False)
        if before is Status.RUNNING:
            if row.lease_valid and not force:
                raise LeaseStillValid(f"job {job_id} is running and its lease (held by {row.lease_owner}) is still "
                                      "valid; confirm to requeue it anyway", before.value)
            _record_attempts(c, jq.id == job_id, "requeued", f"requeued by {actor} while running")
        c.execute(sa.update(job_queue).where(jq.id == job_id).values(
            status=Status.READY.value, run_at=db_now(), lease_owner=None, lease_until=None, finished_at=None,
            max_attempts=_one_more_attempt(),
            updated_at=db_now()))
        return ActionResult(job_id, before, Status.READY, True)

    result = _operator_action(conn, _do, "requeue", job_id, actor)
    if result.changed:
        wakeup.notify()
    return result


def fail_job(conn: Connection, job_id: int, reason: str | None = None, *, actor: str = "operator") -> ActionResult:
    """Mark a job failed now, with the reason kept. A running job's lease is fenced."""
    reason = _short(reason or f"failed by {actor}")

    def _do(c: Connection) -> ActionResult:
        row = _lock_nowait(c, job_id)
        before = Status(row.status)
        if before in (Status.DONE, Status.FAILED):
            raise InvalidState(f"job {job_id} is already {before.value}", before.value)
        if before is Status.RUNNING:
            _record_attempts(c, jq.id == job_id, "failed_by_operator", reason)
        c.execute(sa.update(job_queue).where(jq.id == job_id).values(
            status=Status.FAILED.value, lease_until=None, finished_at=db_now(), last_error=reason,
            updated_at=db_now()))
        return ActionResult(job_id, before, Status.FAILED, True)

    return _operator_action(conn, _do, "fail", job_id, actor)


def _operator_action(conn: Connection, fn, action: str, job_id: int, actor: str) -> ActionResult:
    def _do(c: Connection) -> ActionResult:
        result = fn(c)
        if result.changed:
            _audit(c, actor, action, job_id=job_id, before=result.before.value, after=result.after.value)
        return result

    try:
        result = transaction(conn, _do, what=action)
    except JobBusy:
        metrics.OPERATOR_ACTIONS.labels(action=action, outcome="busy").inc()
        event(log, logging.INFO, "operator_busy", action=action, job_id=job_id, actor=actor)
        raise
    except (JobNotFound, InvalidState) as exc:
        metrics.OPERATOR_ACTIONS.labels(action=action, outcome="refused").inc()
        event(log, logging.INFO, "operator_refused", action=action, job_id=job_id, actor=actor, reason=str(exc))
        raise
    metrics.OPERATOR_ACTIONS.labels(action=action, outcome="ok" if result.changed else "noop").inc()
    event(log, logging.INFO, "operator_" + action, job_id=job_id, actor=actor, before=result.before.value,
          after=result.after.value, changed=result.changed)
    return result


# --- reads ---------------------------------------------------------------------------------------

def get_job(conn: Connection, job_id: int) -> Job | None:
    row = transaction(conn, lambda c: c.execute(sa.select(job_queue).where(jq.id == job_id)).first(), what="get_job")
    return _job(row) if row else None


def get_job_by_key(conn: Connection, task_key: str) -> Job | None:
    row = transaction(conn, lambda c: c.execute(sa.select(job_queue).where(jq.task_key == task_key)).first(),
                      what="get_job")
    return _job(row) if row else None


def get_result(conn: Connection, task_key: str) -> dict[str, Any] | None:
    row = transaction(conn, lambda c: c.execute(sa.select(job_result).where(job_result.c.task_key == task_key)).first(),
                      what="get_result")
    return dict(row._mapping) if row else None


def list_attempts(conn: Connection, job_id: int) -> list[dict[str, Any]]:
    rows = transaction(conn, lambda c: c.execute(sa.select(job_attempt).where(job_attempt.c.job_id == job_id)
                                                 .order_by(job_attempt.c.attempt, job_attempt.c.id)).all(),
                       what="list_attempts")
    return [dict(r._mapping) for r in rows]


def count_by_status(conn: Connection) -> list[tuple[str, str, int]]:
    """(queue, status, count) for every pair present: index-only on ix_ready_pick."""
    rows = transaction(conn, lambda c: c.execute(
        sa.select(jq.queue, jq.status, sa.func.count()).group_by(jq.status, jq.queue)).all(), what="stats")
    return sorted((queue, str(status), n) for queue, status, n in rows)


# --- the audit log -------------------------------------------------------------------------------

def _audit(c: Connection, actor: str, action: str, *, job_id: int | None = None, selection: str | None = None,
           before: str | None = None, after: str | None = None, count: int = 1, detail: str | None = None) -> None:
    c.execute(sa.insert(audit_log).values(at=db_now(), actor=actor[:100], action=action, job_id=job_id,
                                          selection=selection, before_status=before, after_status=after,
                                          count=count, detail=_short(detail)))


def list_audit(conn: Connection, *, before_id: int | None = None, job_id: int | None = None,
               limit: int = 50) -> list[dict[str, Any]]:
    """Newest first, keyset-paged by id."""
    stmt = sa.select(audit_log).order_by(audit_log.c.id.desc()).limit(limit)
    if before_id is not None:
        stmt = stmt.where(audit_log.c.id < before_id)
    if job_id is not None:
        stmt = stmt.where(audit_log.c.job_id == job_id)
    return [dict(r._mapping) for r in transaction(conn, lambda c: c.execute(stmt).all(), what="list_audit")]


# --- bulk operator actions -----------------------------------------------------------------------

@dataclass(frozen=True)
class JobFilter:
    """The dashboard's job filters; every field optional. `key_prefix` matches task_key prefixes
    (an index range on uk_task_key, never a scan)."""

    status: Status | None = None
    queue: str | None = None
    task: str | None = None
    key_prefix: str | None = None

    def where(self) -> list[Any]:
        clauses = []
        if self.status is not None:
            clauses.append(jq.status == Status(self.status).value)
        if self.queue:
            clauses.append(jq.queue == self.queue)
        if self.task:
            clauses.append(jq.task_name == self.task)
        if self.key_prefix:
            escaped = self.key_prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
            clauses.append(jq.task_key.like(escaped + "%", escape="\\"))
        return clauses

    def describe(self) -> str:
        parts = [f"{k}={v}" for k, v in (("status", self.status and Status(self.status).value), ("queue", self.queue),
                                          ("task", self.task), ("key_prefix", self.key_prefix)) if v]
        return "filter: " + (" ".join(parts) if parts else "all jobs")


@dataclass(frozen=True)
class BulkResult:
    changed: int            # jobs moved to the new status
    busy: int               # held by another transaction this instant (skipped, not waited on)
    skipped: int            # in a state the action does not apply to
    last_id: int | None     # where to continue (filter mode, newest-first order)
    finished: bool


BULK_ELIGIBLE = {
    "requeue": (Status.FAILED, Status.SCHEDULED, Status.RUNNING),
    "fail": (Status.READY, Status.SCHEDULED, Status.RUNNING),
}


def bulk_action(conn: Connection, action: str, *, actor: str, ids: Sequence[int] | None = None,
                job_filter: JobFilter | None = None, after_id: int | None = None, reason: str | None = None,
                force: bool = False, batch_size: int = 500, deadline: float | None = None) -> BulkResult:
    """Requeue or fail many jobs: the given ids, or every job matching a filter (newest first).

    Each batch is its own short transaction that locks its rows with SKIP LOCKED, so a bulk action
    over 100,000 jobs never holds many locks at once and never waits on a worker's claim: rows held
    this instant are counted as busy and left alone. Running jobs whose lease is still valid are
    skipped unless `force`. Stops at `deadline` (time.monotonic()) and reports where to continue.
    """
    import time as _time

    if action not in BULK_ELIGIBLE:
        raise ValueError(f"unknown bulk action {action!r}")
    if (ids is None) == (job_filter is None):
        raise ValueError("give either ids or a filter")
    eligible = [s.value for s in BULK_ELIGIBLE[action]]
    reason = _short(reason or f"failed by {actor}")
    selection = (f"ids: {','.join(map(str, ids[:50]))}{'...' if len(ids) > 50 else ''}" if ids is not None
                 else job_filter.describe())
    changed = busy = skipped = 0
    cursor = after_id
    pending = list(ids) if ids is not None else None

    while True:
        if pending is not None:
            batch, pending = pending[:batch_size], pending[batch_size:]
            batch_ids = [int(i) for i in batch]
        else:
            page = sa.select(jq.id).where(*job_filter.where()).order_by(jq.id.desc()).limit(batch_size)
            if cursor is not None:
                page = page.where(jq.id < cursor)
            batch_ids = transaction(conn, lambda c: c.execute(page).scalars().all(), what="bulk_page")
        if not batch_ids:
            return BulkResult(changed, busy, skipped, cursor, True)

        def _do(c: Connection) -> tuple[int, int, int]:
            seen = c.execute(sa.select(jq.id, jq.status).where(jq.id.in_(batch_ids))).all()
            wanted = [r.id for r in seen if r.status in eligible]
            locked = c.execute(sa.select(jq.id, jq.status, (jq.lease_until > db_now()).label("lease_valid"))
                               .where(jq.id.in_(wanted), jq.status.in_(eligible))
                               .with_for_update(skip_locked=True)).all() if wanted else []
            targets = [r for r in locked if not (r.status == Status.RUNNING.value and r.lease_valid and not force)]
            n_busy = len(wanted) - len(locked)
            n_skipped = len(batch_ids) - len(wanted) + (len(locked) - len(targets))
            if not targets:
                return 0, n_busy, n_skipped
            target_ids = [r.id for r in targets]
            running = [r.id for r in targets if r.status == Status.RUNNING.value]
            if running:
                _record_attempts(c, jq.id.in_(running), "requeued" if action == "requeue" else "failed_by_operator",
                                 f"{action} by {actor} (bulk) while running")
            guard = sa.and_(jq.id.in_(target_ids), jq.status.in_(eligible))
            if action == "requeue":
                n = c.execute(sa.update(job_queue).where(guard).values(
                    status=Status.READY.value, run_at=db_now(), lease_owner=None, lease_until=None, finished_at=None,
                    max_attempts=_one_more_attempt(),
                    updated_at=db_now())).rowcount
            else:
                n = c.execute(sa.update(job_queue).where(guard).values(
                    status=Status.FAILED.value, lease_until=None, finished_at=db_now(), last_error=reason,
                    updated_at=db_now())).rowcount
            before = ",".join(sorted({r.status for r in targets}))
            _audit(c, actor, f"bulk_{action}", selection=selection, before=before,
                   after=Status.READY.value if action == "requeue" else Status.FAILED.value, count=n,
                   detail=f"ids {min(target_ids)}..{max(target_ids)}")
            return n, n_busy, n_skipped

        n, n_busy, n_skipped = transaction(conn, _do, what=f"bulk_{action}")
        changed, busy, skipped = changed + n, busy + n_busy, skipped + n_skipped
        cursor = min(batch_ids)
        metrics.OPERATOR_ACTIONS.labels(action=f"bulk_{action}", outcome="ok").inc(n)
        if (pending is not None and not pending) or (pending is None and len(batch_ids) < batch_size):
            break
        if deadline is not None and _time.monotonic() > deadline:
            event(log, logging.INFO, f"operator_bulk_{action}", actor=actor, selection=selection, changed=changed,
                  busy=busy, skipped=skipped, finished=False)
            if changed and action == "requeue":
                wakeup.notify()
            return BulkResult(changed, busy, skipped, cursor, False)
    event(log, logging.INFO, f"operator_bulk_{action}", actor=actor, selection=selection, changed=changed,
          busy=busy, skipped=skipped, finished=True)
    if changed and action == "requeue":
        wakeup.notify()
    return BulkResult(changed, busy, skipped, cursor, True)


# --- worker processes: registration, heartbeats, per-minute activity ------------------------------

def _upsert(c: Connection, table: sa.Table, keys: Sequence[str], values: dict[str, Any],
            update: dict[str, Any]) -> None:
    """INSERT, or on a key clash UPDATE `update` (column -> expression over the existing row and
    the `new` row, given as a function)."""
    if c.dialect.name in ("mysql", "mariadb"):
        from sqlalchemy.dialects.mysql import insert as mysql_insert
        stmt = mysql_insert(table).values(**values)
        c.execute(stmt.on_duplicate_key_update({k: fn(stmt.inserted) for k, fn in update.items()}))
    else:
        from sqlalchemy.dialects.sqlite import insert as sqlite_insert
        stmt = sqlite_insert(table).values(**values)
        c.execute(stmt.on_conflict_do_update(index_elements=list(keys),
                                             set_={k: fn(stmt.excluded) for k, fn in update.items()}))


def register_process(conn: Connection, *, process_id: str, host: str, pid: int, kind: str, concurrency: int,
                     queues: str) -> None:
    values = dict(id=process_id, host=host[:255], pid=pid, kind=kind, concurrency=concurrency, queues=queues[:1000],
                  started_at=db_now(), last_heartbeat=db_now(), stopped_at=None, jobs_in_hand=0, processed=0)
    transaction(conn, lambda c: _upsert(c, worker_process, ["id"], values, {
        k: (lambda new, k=k: getattr(new, k)) for k in values if k != "id"}), what="register_process")


def heartbeat(conn: Connection, process_id: str, *, jobs_in_hand: int, processed: int, minute: datetime,
              stats: Mapping[str, int]) -> None:
    """Mark the process alive and add its activity counts since the last heartbeat to its row for
    `minute` (each process writes only its own rows: no contention between processes)."""
    stats = {k: int(v) for k, v in stats.items() if v}

    def _do(c: Connection) -> None:
        c.execute(sa.update(worker_process).where(worker_process.c.id == process_id).values(
            last_heartbeat=db_now(), jobs_in_hand=jobs_in_hand, processed=processed, stopped_at=None))
        if stats:
            _upsert(c, worker_stats, ["minute", "process_id"], {"minute": minute, "process_id": process_id, **stats},
                    {k: (lambda new, k=k: worker_stats.c[k] + getattr(new, k)) for k in stats})

    transaction(conn, _do, what="heartbeat")


def mark_stopped(conn: Connection, process_id: str) -> None:
    transaction(conn, lambda c: c.execute(sa.update(worker_process).where(worker_process.c.id == process_id)
                                          .values(stopped_at=db_now(), jobs_in_hand=0)), what="mark_stopped")


def list_processes(conn: Connection, *, limit: int = 200) -> tuple[list[dict[str, Any]], datetime]:
    """Worker processes, most recently heard from first, and the database's now."""
    def _do(c: Connection):
        rows = c.execute(sa.select(worker_process).order_by(worker_process.c.last_heartbeat.desc()).limit(limit)).all()
        return [dict(r._mapping) for r in rows], _dt(c.execute(sa.select(db_now())).scalar())
    return transaction(conn, _do, what="list_processes")


def activity(conn: Connection, since: datetime) -> list[dict[str, Any]]:
    """Per-minute sums of every process's activity since `since` (a few rows per minute)."""
    cols = [sa.func.sum(worker_stats.c[k]).label(k) for k in STAT_COLUMNS]
    stmt = (sa.select(worker_stats.c.minute, *cols).where(worker_stats.c.minute >= since)
            .group_by(worker_stats.c.minute).order_by(worker_stats.c.minute))
    rows = transaction(conn, lambda c: c.execute(stmt).all(), what="activity")
    return [{**{k: int(v or 0) for k, v in r._mapping.items() if k != "minute"}, "minute": _dt(r.minute)} for r in rows]


def prune_history(conn: Connection, *, stats_older_than: datetime, processes_silent_since: datetime) -> int:
    """Drop per-minute activity and dead process rows past their retention."""
    def _do(c: Connection) -> int:
        n = c.execute(sa.delete(worker_stats).where(worker_stats.c.minute < stats_older_than)).rowcount
        n += c.execute(sa.delete(worker_process).where(worker_process.c.last_heartbeat < processes_silent_since)).rowcount
        return n
    return transaction(conn, _do, what="prune_history")


# --- dashboard reads (all bounded: no OFFSET, no full-table COUNT) -------------------------------

@dataclass(frozen=True)
class QueueSummary:
    queue: str
    counts: dict[str, int]
    capped: frozenset[str]           # statuses whose count reached the cap ("N+")
    oldest_ready: datetime | None


def queue_summaries(conn: Connection, *, cap: int = 100_000, oldest_window: int = 5000
                    ) -> tuple[list[QueueSummary], datetime]:
    """Counts by status for each queue, each capped at `cap` rows read, and the oldest ready job's
    run_at per queue. Cost is bounded by the caps, not by the table size."""
    def _do(c: Connection):
        # (status, queue) pairs: a loose scan of ix_ready_pick's prefix, not a read of every row.
        pairs = c.execute(sa.select(jq.status, jq.queue).group_by(jq.status, jq.queue)).all()
        counts: dict[str, dict[str, int]] = {}
        if pairs:
            parts = [sa.select(sa.literal(status).label("status"), sa.literal(queue).label("queue"),
                               sa.select(sa.func.count()).select_from(
                                   sa.select(sa.literal(1)).where(jq.status == status, jq.queue == queue)
                                   .limit(cap + 1).subquery()).scalar_subquery().label("n"))
                     for status, queue in pairs]
            for status, queue, n in c.execute(sa.union_all(*parts)).all():
                counts.setdefault(queue, {})[str(status)] = int(n)
        window = (sa.select(jq.queue, jq.run_at).where(jq.status == Status.READY.value)
                  .order_by(jq.run_at).limit(oldest_window).subquery())
        oldest = dict(c.execute(sa.select(window.c.queue, sa.func.min(window.c.run_at)).group_by(window.c.queue)).all())
        now = _dt(c.execute(sa.select(db_now())).scalar())
        return counts, oldest, now

    counts, oldest, now = transaction(conn, _do, what="queue_summaries")
    out = []
    for queue in sorted(counts):
        by_status = {s.value: min(counts[queue].get(s.value, 0), cap) for s in Status}
        capped = frozenset(s for s, n in counts[queue].items() if n > cap)
        out.append(QueueSummary(queue, by_status, capped, _dt(oldest.get(queue))))
    return out, now


def running_jobs(conn: Connection, *, limit: int = 50) -> list[Job]:
    """Running jobs, soonest lease expiry first."""
    stmt = sa.select(job_queue).where(jq.status == Status.RUNNING.value).order_by(jq.lease_until).limit(limit)
    return [_job(r) for r in transaction(conn, lambda c: c.execute(stmt).all(), what="running_jobs")]


def list_jobs(conn: Connection, job_filter: JobFilter | None = None, *, before_id: int | None = None,
              limit: int = 50) -> list[Job]:
    """A page of jobs, newest first, continuing below `before_id` (keyset paging: the cost of a
    deep page is the cost of the first)."""
    stmt = sa.select(job_queue).order_by(jq.id.desc()).limit(limit)
    if job_filter is not None:
        stmt = stmt.where(*job_filter.where())
    if before_id is not None:
        stmt = stmt.where(jq.id < before_id)
    return [_job(r) for r in transaction(conn, lambda c: c.execute(stmt).all(), what="list_jobs")]


def distinct_values(conn: Connection) -> tuple[list[str], list[str]]:
    """Known queue and task names, for the filter menus (loose index scans)."""
    def _do(c: Connection):
        queues = c.execute(sa.select(jq.queue).group_by(jq.status, jq.queue)).scalars().all()
        tasks = c.execute(sa.select(jq.task_name).group_by(jq.task_name)).scalars().all()
        return sorted(set(queues)), sorted(set(tasks))
    return transaction(conn, _do, what="distinct_values")


def database_now(conn: Connection) -> datetime:
    return _dt(transaction(conn, lambda c: c.execute(sa.select(db_now())).scalar(), what="now"))
