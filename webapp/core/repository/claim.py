"""claim: take ready jobs in one short transaction, and say why a claim found nothing.

The claim (the source document's rule 2):

    SELECT ... FROM job_queue FORCE INDEX (ix_ready_pick)
     WHERE status = 'ready' AND queue = ? ORDER BY priority, id LIMIT n FOR UPDATE SKIP LOCKED
    UPDATE job_queue SET status = 'running', lease_owner = ..., lease_until = now + lease,
           attempts = attempts + 1 WHERE id IN (...) AND status = 'ready'
    COMMIT

WHERE status = 'ready' AND queue = ? ORDER BY priority, id is exactly the order of ix_ready_pick,
so InnoDB walks the index from the first claimable row and stops after `n` rows it could lock:
no filesort, and rows other workers hold are skipped, not waited for. The index is forced so
that MySQL and MariaDB take the same plan whatever their statistics say (Solid Queue needed the
same hint, its issue 694). Only rows the guarded UPDATE really took are returned; the handler
runs after the COMMIT, never inside it.

A claim is not sent at all on a connection whose server was not writable when last checked
(db.require_primary), and its locking SELECT also reads the server's read-only flags, so a claim
that reaches a demoted primary (or a replica) rolls back before its UPDATE: no claim is ever
written on a read-only server.

A claim may first complete the jobs that finished since the last one (`completions`), in the
same transaction: one COMMIT per cycle of the worker instead of two.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError

from ..db import db_after, db_now, error_code, is_mysql, require_primary, transaction
from ..errors import NotPrimary
from ..models import ClaimCycle, ClaimedJob, EmptyClaim, EmptyClaimReport, Job, Lease, Outcome, Status
from ..schema import job_queue
from .common import as_datetime, execute_fast, jq
from .leases import complete_in

PICK_INDEX = "ix_ready_pick"
_FLAGS = {True: ("read_only", "innodb_read_only"), False: ("read_only", "innodb_read_only", "super_read_only")}


ER_NO_SUCH_KEY = 1176
# Set when the server said ix_ready_pick does not exist (error 1176): claims then go without the
# hint, slower but working, and `jobqueue doctor` says what is wrong.
_index_missing = False


@functools.lru_cache(maxsize=8)
def pick_statement(flavour: str, hinted: bool = True) -> sa.Select:
    """The claim's locking SELECT for 'mariadb', 'mysql' or 'sqlite'. Built once: the claim is
    the hot path."""
    columns = [jq.id, jq.task_key, jq.task_name, jq.priority, jq.payload, jq.attempts, jq.max_attempts,
               jq.run_at, db_now()]
    if flavour != "sqlite":
        columns += [sa.literal_column(f"@@global.{flag}") for flag in _FLAGS[flavour == "mariadb"]]
    stmt = (sa.select(*columns)
            .where(jq.status == Status.READY.value, jq.queue == sa.bindparam("queue"))
            .order_by(jq.priority, jq.id)
            .limit(sa.bindparam("limit", type_=sa.Integer)))
    if flavour != "sqlite" and hinted:
        hint = f"FORCE INDEX ({PICK_INDEX})"
        stmt = stmt.with_hint(job_queue, hint, "mysql").with_hint(job_queue, hint, "mariadb")
    return stmt.with_for_update(skip_locked=True)


def flavour(conn: Connection) -> str:
    if not is_mysql(conn):
        return "sqlite"
    return "mariadb" if getattr(conn.dialect, "is_mariadb", False) else "mysql"


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


def claim_cycle(conn: Connection, owners: Sequence[str], queues: Sequence[str], *, lease_seconds: float,
                completions: Sequence[Lease] = (), classify_queues: Sequence[str] | None = None,
                refill: bool = True) -> ClaimCycle:
    """One cycle in one short transaction: complete `completions` (fenced, rows held elsewhere
    left BUSY), then claim up to one job per owner in `owners` plus (with `refill`) one per
    completed job, which takes over that job's owner, i.e. its slot, from `queues` in that order.

    Whenever it took fewer jobs than it asked for, one plain read in the same transaction says
    why (`report`, see classify_row, over `classify_queues`, None for all): ready rows it still
    sees were held by other transactions (a plain read after the UPDATE sees them as ready), and
    are counted as skipped.
    """
    lease_us = int(round(lease_seconds * 1_000_000))

    def write(c: Connection) -> ClaimCycle:
        # Known not to be the primary (checked on this connection at most a second or a few ago):
        # send it nothing; the flags in the locking SELECT below catch a demotion since.
        require_primary(c)
        completed, losses = complete_in(c, completions)
        # A finished job's slot takes new work unless its row was held elsewhere (BUSY: the lease
        # is still ours, and its completion is tried again next cycle).
        slots = list(owners) + [lease.owner for lease in completions
                                if refill and completed.get(lease) is not Outcome.BUSY]
        limit = len(slots)
        picked: list[tuple[tuple, str]] = []
        tried: list[str] = []
        kind = flavour(c)
        if limit and queues:
            for queue in queues:
                tried.append(queue)
                rows = _pick(c, kind, {"queue": queue, "limit": limit - len(picked)})
                if rows and kind != "sqlite" and any(str(v) in ("1", "ON") for v in rows[0][9:]):
                    flags = [f for f, v in zip(_FLAGS[kind == "mariadb"], rows[0][9:]) if str(v) in ("1", "ON")]
                    raise NotPrimary(f"the server turned read-only ({', '.join(flags)} is ON); nothing claimed")
                picked.extend((row, queue) for row in rows)
                if len(picked) >= limit:
                    break
        claimed: list[ClaimedJob] = []
        if picked:
            owner_of = {row[0]: slots[i] for i, (row, _) in enumerate(picked)}
            params: dict[str, Any] = {"lease_us": lease_us}
            for i, (row, _) in enumerate(picked):
                params[f"id_{i}"], params[f"owner_{i}"] = row[0], owner_of[row[0]]
            taken = execute_fast(c, _take(len(picked)), params).rowcount
            if taken != len(picked):
                # We hold these rows' locks, so this should not happen; if it does, trust only
                # the rows that now carry our lease.
                mine = {r.id: r.attempts for r in c.execute(
                    sa.select(jq.id, jq.attempts, jq.lease_owner)
                    .where(jq.id.in_(list(owner_of)), jq.status == Status.RUNNING.value)).all()
                    if r.lease_owner == owner_of[r.id]}
                picked = [(row, q) for row, q in picked if mine.get(row[0]) == row[5] + 1]
            for row, queue in picked:
                job_id, task_key, task_name, priority, payload, attempts, max_attempts, run_at, now = row[:9]
                payload = json.loads(payload) if isinstance(payload, (str, bytes)) else payload
                owner = owner_of[job_id]
                claimed.append(ClaimedJob(
                    job=Job(id=job_id, task_key=task_key, task_name=task_name, queue=queue, priority=priority,
                            payload=payload, status=Status.RUNNING, attempts=attempts + 1,
                            max_attempts=max_attempts, lease_owner=owner, run_at=as_datetime(run_at)),
                    lease=Lease(job_id, owner, attempts + 1), claimed_at=as_datetime(now)))
        report = None
        if limit and len(claimed) < limit:
            report = classify_row(tuple(c.execute(classify_statement(classify_queues)).one()))
        return ClaimCycle(claimed, {(lease.job_id, lease.attempt): o for lease, o in completed.items()}, losses,
                          report.skipped if report else 0, tried, limit, report)

    return transaction(conn, write, what="claim")


def _pick(c: Connection, kind: str, params: dict[str, Any]) -> list[tuple]:
    global _index_missing
    if not _index_missing:
        try:
            return execute_fast(c, pick_statement(kind), params).rows
        except DBAPIError as exc:
            if error_code(exc) != ER_NO_SUCH_KEY:
                raise
            _index_missing = True   # a statement error; the transaction goes on
    return execute_fast(c, pick_statement(kind, hinted=False), params).rows


def claim(conn: Connection, worker_id: str | Sequence[str], limit: int, queues: Sequence[str], *,
          lease_seconds: float) -> ClaimCycle:
    """Take up to `limit` ready jobs from `queues` (in that order) in one short transaction.
    `worker_id` is the lease owner, or one owner per slot (job i goes to worker_id[i])."""
    if limit <= 0 or not queues:
        return ClaimCycle([], {}, [], 0, [], 0, None)
    owners = [worker_id] * limit if isinstance(worker_id, str) else list(worker_id)[:limit]
    if len(owners) < limit:
        raise ValueError("need one worker id per slot")
    return claim_cycle(conn, owners, queues, lease_seconds=lease_seconds)


def ready_queues(conn: Connection) -> list[str]:
    """Queues that have ready jobs right now (a loose scan of ix_ready_pick, no locks)."""
    return list(transaction(conn, lambda c: c.execute(
        sa.select(jq.queue).where(jq.status == Status.READY.value).distinct()).scalars().all(),
        what="ready_queues"))


def explain_claim(conn: Connection, queue: str = "default", limit: int = 1) -> list[dict[str, Any]]:
    """The server's plan for the claim's SELECT, as EXPLAIN's traditional rows. On MySQL 8.0.32+
    `explain_format` may make a bare EXPLAIN answer JSON or TREE, so the format is named."""
    kind = flavour(conn)
    prefix = "EXPLAIN FORMAT=TRADITIONAL" if kind == "mysql" else "EXPLAIN"

    def explain(hinted: bool) -> list[dict[str, Any]]:
        stmt = pick_statement(kind, hinted).params(queue=queue, limit=limit)
        compiled = stmt.compile(dialect=conn.dialect, compile_kwargs={"literal_binds": True})
        return [dict(row._mapping) for row in conn.exec_driver_sql(f"{prefix} {compiled}").all()]

    try:
        return explain(True)
    except DBAPIError as exc:
        if error_code(exc) != ER_NO_SUCH_KEY:
            raise
        return explain(False)   # the index is missing: what the server does without it


# --- why a claim found nothing ----------------------------------------------------------------

def classify_statement(queues: Sequence[str] | None, flavour_name: str | None = None) -> sa.Select:
    """The plain read behind classify_empty: ready rows (up to 1000), the next lease expiry and
    the next scheduled job, for these queues, and the database's now. With a server flavour
    ('mariadb' / 'mysql') it also reads the read-only flags, for the idle worker's probe."""
    in_queues = (lambda q: q) if queues is None else (lambda q: q.where(jq.queue.in_(list(queues))))
    ready_sample = in_queues(sa.select(sa.literal(1)).where(jq.status == Status.READY.value)).limit(1000).subquery()
    columns = [
        sa.select(sa.func.count()).select_from(ready_sample).scalar_subquery().label("ready"),
        in_queues(sa.select(sa.func.min(jq.lease_until)).where(jq.status == Status.RUNNING.value))
        .scalar_subquery().label("next_lease_expiry"),
        in_queues(sa.select(sa.func.min(jq.run_at)).where(jq.status == Status.SCHEDULED.value))
        .scalar_subquery().label("next_scheduled"),
        db_now().label("now"),
    ]
    if flavour_name in ("mariadb", "mysql"):
        columns += [sa.literal_column(f"@@global.{flag}") for flag in _FLAGS[flavour_name == "mariadb"]]
    return sa.select(*columns)


def read_only_flags(row: Sequence[Any], flavour_name: str) -> list[str]:
    """The flags that are ON in a classify row read with `flavour_name`."""
    if flavour_name not in ("mariadb", "mysql"):
        return []
    return [f for f, v in zip(_FLAGS[flavour_name == "mariadb"], row[4:]) if str(v) in ("1", "ON")]


def classify_row(row: Sequence[Any]) -> EmptyClaimReport:
    """(ready, next_lease_expiry, next_scheduled, now[, flags]) -> why a claim would find nothing."""
    ready, next_lease_expiry, next_scheduled, now = row[:4]
    if ready:
        kind = EmptyClaim.CONTENDED
    elif next_lease_expiry is not None:
        kind = EmptyClaim.WAITING
    else:
        kind = EmptyClaim.IDLE
    return EmptyClaimReport(kind, skipped=int(ready or 0), next_lease_expiry=as_datetime(next_lease_expiry),
                            next_scheduled=as_datetime(next_scheduled), db_now=as_datetime(now))


def classify_empty(conn: Connection, queues: Sequence[str] | None) -> EmptyClaimReport:
    """Why a claim found nothing: one plain, non-locking read.

    A plain read still sees rows other transactions hold locked, so ready rows here after an
    empty SKIP LOCKED claim mean they were all taken by someone else's transaction (contended).
    """
    stmt = classify_statement(queues)
    return classify_row(tuple(transaction(conn, lambda c: c.execute(stmt).one(), what="classify_empty")))
