"""What the repository's modules share: row mapping, the lease fence, the fast executor for the
hot statements, and the attempt history and audit writes several verbs make."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Row
from sqlalchemy.exc import IntegrityError

from ..db import db_now, error_code, is_mysql, transaction
from ..db.drivers import bind, warning_count
from ..models import Job, Lease, LeaseLoss, Status
from ..schema import audit_log, job_attempt, job_queue

jq = job_queue.c
al = audit_log.c
T = TypeVar("T")


def through_index(c: Connection, stmt: sa.Select, index: str | None, table: sa.Table = job_queue) -> sa.Select:
    """`stmt` reading `table` through `index` (FORCE INDEX) on MySQL and MariaDB, where the planner
    goes wrong; SQLite plans alone."""
    if index is None or c.dialect.name not in ("mysql", "mariadb"):
        return stmt
    return stmt.with_hint(table, f"FORCE INDEX ({index})", c.dialect.name)


def by_id(stmt: sa.Update) -> sa.Update:
    """An UPDATE of listed job ids that reads only those rows, through the primary key. On a small
    table the planner scans the whole key instead (EXPLAIN type `index`), and the UPDATE then
    reads, and on MariaDB 11.8 waits for, every row another transaction holds: a claim stood 2 s
    behind 5 rows a paused transaction held, then failed with 1205 (MariaDB 10.11 passed them by)."""
    for dialect in ("mysql", "mariadb"):
        stmt = stmt.with_hint("FORCE INDEX (PRIMARY)", dialect_name=dialect)
    return stmt


MAX_ERROR_CHARS = 4000


def job_from_row(row: Row | Mapping[str, Any]) -> Job:
    m = row._mapping if isinstance(row, Row) else row
    payload = m["payload"]
    return Job(
        id=m["id"],
        task_key=m["task_key"],
        task_name=m["task_name"],
        queue=m["queue"],
        priority=m["priority"],
        payload=json.loads(payload) if isinstance(payload, (str, bytes)) else payload,
        status=Status(m["status"]),
        attempts=m["attempts"],
        max_attempts=m["max_attempts"],
        lease_owner=m.get("lease_owner"),
        lease_until=m.get("lease_until"),
        run_at=m.get("run_at"),
        started_at=m.get("started_at"),
        last_error=m.get("last_error"),
        created_at=m.get("created_at"),
        updated_at=m.get("updated_at"),
        finished_at=m.get("finished_at"),
        concurrency_key=m.get("concurrency_key"),
    )


def as_datetime(value: Any) -> datetime | None:
    # Aggregates over DATETIME columns come back as strings from SQLite.
    if value is None or isinstance(value, datetime):
        return value
    return datetime.fromisoformat(str(value))


def is_duplicate_key(exc: IntegrityError) -> bool:
    return error_code(exc) == 1062 or "UNIQUE constraint failed" in str(exc.orig)


def truncate_error(error: str | None) -> str | None:
    if error is None:
        return None
    return error if len(error) <= MAX_ERROR_CHARS else error[: MAX_ERROR_CHARS - 15] + "... [truncated]"


def database_now(c: Connection) -> datetime:
    return as_datetime(c.execute(sa.select(db_now())).scalar())


# --- the lease fence ----------------------------------------------------------------------------


def fence(lease: Lease):
    """The guard of every write on behalf of a lease holder: the row must still be running under
    exactly this lease (owner and attempt). A reaped, requeued, failed or cancelled job fails it."""
    return sa.and_(
        jq.id == lease.job_id,
        jq.status == Status.RUNNING.value,
        jq.lease_owner == lease.owner,
        jq.attempts == lease.attempt,
    )


def lease_loss(c: Connection, lease: Lease, operation: str) -> LeaseLoss:
    """What the row says now, for a fenced write that changed nothing."""
    now = c.execute(sa.select(jq.status, jq.lease_owner, jq.attempts, jq.task_key).where(jq.id == lease.job_id)).first()
    return LeaseLoss(
        lease,
        operation,
        now.task_key if now else None,
        now.status if now else "missing",
        now.lease_owner if now else None,
        now.attempts if now else None,
    )


def record_attempts(c: Connection, where: Any, outcome: str, error: Any, *, finished_at: Any = None) -> None:
    """Keep a row in job_attempt for attempts that did not succeed (or, for a finished job run
    again, the attempt that finished it: `finished_at=jq.finished_at`). Runs before the state
    change, while the job row still carries the attempt's owner and start."""
    c.execute(
        sa.insert(job_attempt).from_select(
            ["job_id", "attempt", "worker", "started_at", "finished_at", "outcome", "error"],
            sa.select(
                jq.id,
                jq.attempts,
                jq.lease_owner,
                jq.started_at,
                db_now() if finished_at is None else sa.func.coalesce(finished_at, db_now()),
                sa.literal(outcome),
                error if isinstance(error, sa.ColumnElement) else sa.literal(truncate_error(error), sa.Text),
            ).where(where),
        )
    )


def one_more_attempt():
    """max_attempts raised, if needed, so that attempts + 1 still fits (attempts never go back)."""
    return sa.case((jq.attempts + 1 > jq.max_attempts, jq.attempts + 1), else_=jq.max_attempts)


def audit(
    c: Connection,
    actor: str,
    action: str,
    *,
    job_id: int | None = None,
    selection: str | None = None,
    before: str | None = None,
    after: str | None = None,
    count: int = 1,
    detail: str | None = None,
) -> None:
    c.execute(
        sa.insert(audit_log).values(
            at=db_now(),
            actor=actor[:100],
            action=action,
            job_id=job_id,
            selection=selection,
            before_status=before,
            after_status=after,
            count=count,
            detail=truncate_error(detail),
        )
    )


def audited_once(
    conn: Connection,
    act: Callable[[Connection], T],
    *,
    what: str,
    action: str,
    actor: str,
    answer: Callable[[Connection, Row], T],
    job_id: int | None = None,
    selection: str | None = None,
) -> T:
    """`act` in a transaction of its own, retried as db.transaction does, and done once. `act`
    writes an audit row (`action`, `actor`, and `job_id` or `selection`) in its transaction; a
    retry after a COMMIT whose reply never came (the connection lost after the server committed)
    looks for that row first, after the highest audit id read before the first try, and answers
    from it (`answer(c, row)`) instead of acting again on what the first try left (a requeued job
    may even have been claimed since). In the caller's transaction, which the caller retries,
    `act` alone: a read before its locks would take the snapshot of a REPEATABLE READ transaction
    earlier than the action did before."""
    if conn.in_transaction():
        return transaction(conn, act, what=what)
    which = al.job_id == job_id if job_id is not None else al.selection == selection
    seen: list[int] = []

    def once(c: Connection) -> T:
        if not seen:
            seen.append(c.execute(sa.select(sa.func.max(al.id))).scalar() or 0)
        else:
            mine = c.execute(
                sa.select(audit_log)
                .where(al.id > seen[0], al.action == action, al.actor == actor[:100], which)
                .order_by(al.id)
                .limit(1)
            ).first()
            if mine is not None:
                return answer(c, mine)
        return act(c)

    return transaction(conn, once, what=what)


def upsert(c: Connection, table: sa.Table, keys: list[str], values: dict[str, Any], update: dict[str, Any]) -> None:
    """INSERT, or on a key clash UPDATE `update` (column -> function of the proposed row)."""
    if is_mysql(c):
        from sqlalchemy.dialects.mysql import insert as mysql_insert

        stmt = mysql_insert(table).values(**values)
        c.execute(stmt.on_duplicate_key_update({k: fn(stmt.inserted) for k, fn in update.items()}))
    else:
        from sqlalchemy.dialects.sqlite import insert as sqlite_insert

        stmt = sqlite_insert(table).values(**values)
        c.execute(
            stmt.on_conflict_do_update(index_elements=keys, set_={k: fn(stmt.excluded) for k, fn in update.items()})
        )


# --- the hot path's executor ---------------------------------------------------------------------

NO_ROW = -1  # a job id no row has (ids count up from 1): what a statement's unused places get


def shape(n: int) -> int:
    """The number of rows a statement over n rows is built for: n up to 2, else the next power of
    two. A worker's batches take any size up to its capacity; built per exact size, two sizes (done,
    taken) made thousands of statements, each compiled on first use (15% of a 32-thread worker's
    CPU after 30,000 jobs) and kept. The places past n get parameters that match no row."""
    return n if n <= 2 else 1 << (n - 1).bit_length()


@dataclass
class Result:
    rows: list[tuple]
    rowcount: int
    lastrowid: int | None = None
    warnings: int = 0


_compiled: dict[tuple[str, Any], tuple[str, dict[str, Any]]] = {}


def execute_fast(c: Connection, stmt: sa.Executable, params: dict[str, Any]) -> Result:
    """Run one of the claim/complete statements. On MySQL the statement is compiled once to SQL
    text and sent on the DBAPI cursor: SQLAlchemy's per-execution work (cache key, parameter
    processing, result objects) was about 40 us of CPU per statement, a third of the worker's
    CPU per job. Errors are wrapped as SQLAlchemy's own (and a lost connection invalidated), so
    db.transaction retries them as usual. Elsewhere (SQLite) it is a plain execute."""
    if not is_mysql(c):
        result = c.execute(stmt, params)
        return Result([tuple(r) for r in result.all()] if result.returns_rows else [], result.rowcount)
    sql, defaults = compiled_sql(c, stmt)
    return execute_sql(c, sql, {**defaults, **params})


def compiled_sql(c: Connection, stmt: sa.Executable) -> tuple[str, dict[str, Any]]:
    """A statement's SQL text for this connection's dialect and its default parameters, compiled
    once per statement object."""
    key = (c.dialect.name, stmt)
    if key not in _compiled:
        compiled = stmt.compile(dialect=c.dialect)
        _compiled[key] = (compiled.string, dict(compiled.params))
    return _compiled[key]


def execute_sql(c: Connection, sql: str, params: Any = None) -> Result:
    """SQL text on the MySQL connection's DBAPI cursor, errors wrapped as in execute_fast. With no
    `params` the text is sent as it is (PyMySQL and mysqlclient format it with % only when given
    parameters): for statements whose values are already literals escaped by the driver (see enqueue)."""
    dbapi_conn = c.connection.dbapi_connection
    cursor = dbapi_conn.cursor()
    try:
        cursor.execute(*bind(dbapi_conn, sql, params))
        return Result(
            list(cursor.fetchall()) if cursor.description else [],
            cursor.rowcount,
            cursor.lastrowid,
            warning_count(cursor, dbapi_conn),
        )
    except c.dialect.loaded_dbapi.Error as exc:
        lost = c.dialect.is_disconnect(exc, dbapi_conn, cursor)
        if lost:
            c.invalidate(exc)
        raise sa.exc.DBAPIError.instance(
            sql[:2000], params, exc, c.dialect.loaded_dbapi.Error, connection_invalidated=lost, dialect=c.dialect
        ) from exc
    finally:
        cursor.close()
