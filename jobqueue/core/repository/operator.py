"""Operator actions: requeue, fail and cancel one job (NOWAIT: an answer now, never a wait) or
many (bounded batches with SKIP LOCKED), each recorded in the audit log in the same transaction;
the filter the dashboard, the API and the CLI select jobs with.

Failing or cancelling a running job changes its status, which is what every write of its worker
is fenced on: that worker's completion changes nothing, and its next renewal tells it the lease
is gone (ctx.lease_lost). A job its worker holds in hand without having started its handler
(prefetched) is confirmed under the same fence before the handler starts (leases.start_lease):
once the action has answered, that handler never starts. While the confirmation holds the row,
the action answers JobBusy (NOWAIT) and may be tried again at once."""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
import sqlalchemy.ext.compiler
from sqlalchemy.engine import Connection, Row
from sqlalchemy.exc import DBAPIError
from sqlalchemy.sql.visitors import InternalTraversal

from ..db import ER_LOCK_NOWAIT, ER_LOCK_WAIT_TIMEOUT, db_now, error_code, require_primary, transaction
from ..errors import InvalidState, JobBusy, JobNotFound, LeaseStillValid, RunAgainNeeded
from ..models import Status
from ..schema import audit_log, job_batch, job_batch_member, job_queue
from ..validation import check_reason
from .common import audit, audited_once, jq, one_more_attempt, record_attempts, truncate_error
from .hooks import settle_finished

if TYPE_CHECKING:
    from .replicas import Pause

AUDIT_IDS_SHOWN = 200
jb = job_batch.c
jbm = job_batch_member.c


@dataclass(frozen=True)
class ActionResult:
    job_id: int
    before: Status
    after: Status
    changed: bool


def _lock_nowait(c: Connection, job_id: int) -> Row:
    try:
        row = c.execute(
            sa.select(
                jq.id,
                jq.status,
                jq.lease_owner,
                jq.lease_until,
                jq.attempts,
                jq.task_key,
                (jq.lease_until > db_now()).label("lease_valid"),
            )
            .where(jq.id == job_id)
            .with_for_update(nowait=True)
        ).first()
    except DBAPIError as exc:
        # MariaDB answers NOWAIT on a locked row with 1205, MySQL 8.0 with 3572.
        if error_code(exc) in (ER_LOCK_WAIT_TIMEOUT, ER_LOCK_NOWAIT):
            raise JobBusy(f"job {job_id} is locked by another transaction right now; try again") from None
        raise
    if row is None:
        raise JobNotFound(f"job {job_id} not found")
    return row


def _job_once(
    conn: Connection, act: Callable[[Connection], ActionResult], job_id: int, action: str, actor: str
) -> ActionResult:
    """audited_once for an action on one job: its audit row says the job's status before and after."""
    return audited_once(
        conn,
        act,
        what=action,
        action=action,
        actor=actor,
        job_id=job_id,
        answer=lambda c, row: ActionResult(job_id, Status(row.before_status), Status(row.after_status), True),
    )


def requeue_job(
    conn: Connection, job_id: int, *, force: bool = False, again: bool = False, actor: str = "operator"
) -> ActionResult:
    """Put a job back to ready now. `attempts` is kept; max_attempts grows if needed so that the
    job gets at least one more try. A running job with a valid lease needs `force`, and then its
    old lease is fenced: that worker's completion will change nothing. A done job needs `again`:
    its handler runs again, while record_result still keeps the one result row its task_key has,
    so the downstream effect stays idempotent; the attempt that finished it is kept in
    job_attempt."""

    def act(c: Connection) -> ActionResult:
        require_primary(c)
        row = _lock_nowait(c, job_id)
        before = Status(row.status)
        if before is Status.DONE and not again:
            raise RunAgainNeeded(
                f"job {job_id} is done; running it again needs a second confirmation (its handler "
                "runs again; record_result keeps the one result row of its task_key)",
                before.value,
            )
        if before is Status.DONE:
            record_attempts(c, jq.id == job_id, "done", None, finished_at=jq.finished_at)
        if before is Status.READY:
            return ActionResult(job_id, before, before, False)
        if before is Status.BLOCKED:
            raise InvalidState(
                f"job {job_id} is blocked: it runs when its parents are done (cancel it instead)", before.value
            )
        if before is Status.RUNNING:
            if row.lease_valid and not force:
                raise LeaseStillValid(
                    f"job {job_id} is running and its lease (held by {row.lease_owner}) is still "
                    "valid; confirm to requeue it anyway",
                    before.value,
                )
            record_attempts(c, jq.id == job_id, "requeued", f"requeued by {actor} while running")
        c.execute(
            sa.update(job_queue)
            .where(jq.id == job_id)
            .values(
                status=Status.READY.value,
                run_at=db_now(),
                lease_owner=None,
                lease_until=None,
                finished_at=None,
                max_attempts=one_more_attempt(),
                updated_at=db_now(),
            )
        )
        settle_finished(c, [job_id])  # a batch counts a requeued member as pending again
        audit(
            c,
            actor,
            "requeue",
            job_id=job_id,
            before=before.value,
            after=Status.READY.value,
            detail="run again" if before is Status.DONE else None,
        )
        return ActionResult(job_id, before, Status.READY, True)

    return _job_once(conn, act, job_id, "requeue", actor)


def fail_job(conn: Connection, job_id: int, reason: str | None = None, *, actor: str = "operator") -> ActionResult:
    """Mark a job failed now, with the reason kept. A running job's lease is fenced."""
    reason = truncate_error(check_reason(reason) or f"failed by {actor}")

    def act(c: Connection) -> ActionResult:
        require_primary(c)
        row = _lock_nowait(c, job_id)
        before = Status(row.status)
        if before in (Status.DONE, Status.FAILED, Status.CANCELLED):
            raise InvalidState(f"job {job_id} is already {before.value}", before.value)
        if before is Status.RUNNING:
            record_attempts(c, jq.id == job_id, "failed_by_operator", reason)
        c.execute(
            sa.update(job_queue)
            .where(jq.id == job_id)
            .values(
                status=Status.FAILED.value,
                lease_until=None,
                finished_at=db_now(),
                last_error=reason,
                updated_at=db_now(),
            )
        )
        settle_finished(c, [job_id])
        audit(c, actor, "fail", job_id=job_id, before=before.value, after=Status.FAILED.value, detail=reason)
        return ActionResult(job_id, before, Status.FAILED, True)

    return _job_once(conn, act, job_id, "fail", actor)


def cancel_job(conn: Connection, job_id: int, reason: str | None = None, *, actor: str = "operator") -> ActionResult:
    """Cancel a job now: from ready, scheduled or failed at once; a running job's lease is fenced
    (its completion changes nothing, its handler hears of it at its next renewal). A done job is
    refused; an already cancelled one is left as it is. Its task_key stays taken."""
    reason = truncate_error(reason or f"cancelled by {actor}")

    def act(c: Connection) -> ActionResult:
        require_primary(c)
        row = _lock_nowait(c, job_id)
        before = Status(row.status)
        if before is Status.DONE:
            raise InvalidState(f"job {job_id} is already done; a finished job is not cancelled", before.value)
        if before is Status.CANCELLED:
            return ActionResult(job_id, before, before, False)
        if before is Status.RUNNING:
            record_attempts(c, jq.id == job_id, "cancelled", reason)
        c.execute(
            sa.update(job_queue)
            .where(jq.id == job_id)
            .values(status=Status.CANCELLED.value, lease_until=None, finished_at=db_now(), updated_at=db_now())
        )
        settle_finished(c, [job_id])
        audit(c, actor, "cancel", job_id=job_id, before=before.value, after=Status.CANCELLED.value, detail=reason)
        return ActionResult(job_id, before, Status.CANCELLED, True)

    return _job_once(conn, act, job_id, "cancel", actor)


# --- bulk ----------------------------------------------------------------------------------------

SEARCH_WINDOW = 50_000  # rows a search reads at most: the newest matching the other filters
SPARSE_SEARCH_WINDOW = 5_000  # ... when they are read by id one by one (reads.search_window)


class searchable(sa.sql.expression.ColumnElement):
    """`column` as text compared without regard to case, whatever its collation (an install may
    use utf8mb4_bin): COLLATE utf8mb4_general_ci on MySQL and MariaDB; SQLite's LIKE ignores
    ASCII case."""

    type = sa.Text()
    inherit_cache = True
    # In the statement cache's key: a compiled search names its own columns.
    _traverse_internals = [("column", InternalTraversal.dp_clauseelement)]

    def __init__(self, column):
        self.column = column


@sa.ext.compiler.compiles(searchable)
def _searchable_sqlite(element, compiler, **kw):
    return compiler.process(element.column, **kw)


@sa.ext.compiler.compiles(searchable, "mysql")
@sa.ext.compiler.compiles(searchable, "mariadb")
def _searchable_mysql(element, compiler, **kw):
    return f"{compiler.process(element.column, **kw)} COLLATE utf8mb4_general_ci"


def like_escaped(text: str) -> str:
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


@dataclass(frozen=True)
class JobFilter:
    """The dashboard's job filters; every field optional. `key_prefix` matches task_key prefixes
    (an index range on uk_task_key, never a scan). `search` is a substring of the payload, the
    last error or the task_key: no index serves it, so a search never reads more than
    SEARCH_WINDOW rows (SPARSE_SEARCH_WINDOW inside a status, a task or a prefix: see
    reads.search_window), and a bulk action over a search is bounded to the
    window it was shown, `min_id` and up. `batch` (a batch's key) keeps its members: their ids
    come from ix_batch_member (reads.page_jobs reads a page of them through it)."""

    status: Status | None = None
    queue: str | None = None
    task: str | None = None
    key_prefix: str | None = None
    search: str | None = None
    min_id: int | None = None
    batch: str | None = None

    def where(self, *, search: bool = True) -> list[Any]:
        clauses = []
        if self.status is not None:
            clauses.append(jq.status == Status(self.status).value)
        if self.queue:
            clauses.append(jq.queue == self.queue)
        if self.task:
            clauses.append(jq.task_name == self.task)
        if self.key_prefix:
            clauses.append(jq.task_key.like(like_escaped(self.key_prefix) + "%", escape="\\"))
        if self.min_id is not None:
            clauses.append(jq.id >= self.min_id)
        if self.batch:
            clauses.append(jq.id.in_(self.member_ids()))
        if search and self.search:
            clauses.append(self.search_clause())
        return clauses

    def member_ids(self) -> sa.Select:
        """The batch's members (SQLite, and a search's window; batch_members on the servers)."""
        batch_id = sa.select(jb.id).where(jb.batch_key == self.batch).scalar_subquery()
        return sa.select(jbm.job_id).where(jbm.batch_id == batch_id)

    def search_clause(self) -> Any:
        """The search alone: `search` in the payload, the last error or the task_key."""
        pattern = "%" + like_escaped(self.search or "") + "%"
        # The payload as the text it was written (json.dumps': non-ASCII as \\u escapes).
        return sa.or_(
            *(searchable(column).like(pattern, escape="\\") for column in (jq.payload, jq.last_error, jq.task_key))
        )

    def args(self) -> dict[str, str]:
        """The filter as the dashboard's query arguments (status, queue, task, key, q, min_id, batch)."""
        return {
            k: str(v)
            for k, v in (
                ("status", self.status and Status(self.status).value),
                ("queue", self.queue),
                ("task", self.task),
                ("key", self.key_prefix),
                ("q", self.search),
                ("min_id", self.min_id),
                ("batch", self.batch),
            )
            if v is not None and v != ""
        }

    def describe(self) -> str:
        return "filter: " + self.terms()

    def terms(self) -> str:
        """status=failed queue=mail q='timeout' (or "all jobs"), as the pages and the audit log say it."""
        parts = [
            f"{k}={v}"
            for k, v in (
                ("status", self.status and Status(self.status).value),
                ("queue", self.queue),
                ("task", self.task),
                ("key_prefix", self.key_prefix),
                ("batch", self.batch),
            )
            if v
        ]
        if self.search:
            parts.append(f"q={self.search!r}")
        if self.min_id is not None:
            parts.append(f"id>={self.min_id}")
        return " ".join(parts) if parts else "all jobs"


def batch_members(c: Connection, job_filter: JobFilter) -> sa.Select:
    """The ids of a batch's members that match the filter's other conditions (not its search),
    read from the batch's entries of ix_batch_member (batch_id, job_id) in job_id order, each
    member's row then by primary key (STRAIGHT_JOIN): a page reads the members it shows, and those
    the other conditions leave out, never the table. Left to itself the planner materialised every
    member, or walked the primary key for the newest jobs (0.7 s for a batch of 50,000 among
    200,000 jobs on MySQL). The batch's id is read first (uk_batch_key): an unknown key has none."""
    batch_id = c.execute(sa.select(jb.id).where(jb.batch_key == job_filter.batch)).scalar()
    rest = replace(job_filter, batch=None).where(search=False)
    stmt = (
        sa.select(jbm.job_id)
        .select_from(job_batch_member.join(job_queue, jq.id == jbm.job_id))
        .where(jbm.batch_id == (batch_id if batch_id is not None else -1), *rest)
        .with_hint(job_batch_member, "FORCE INDEX (ix_batch_member)", c.dialect.name)
    )
    return stmt.prefix_with("STRAIGHT_JOIN", dialect=c.dialect.name)


@dataclass(frozen=True)
class BulkResult:
    changed: int  # jobs moved to the new status
    busy: int  # held by another transaction this instant (skipped, not waited on)
    skipped: int  # in a state the action does not apply to
    last_id: int | None  # where to continue (filter mode, newest-first order)
    finished: bool
    action: str = ""
    selection: str = ""
    paused_seconds: float = 0.0  # waited for replica lag (pace), this call
    replica_note: str | None = None  # the last wait's why: who lags, or who could not be read
    blocked: int = 0  # of `skipped`: blocked jobs a requeue leaves (they run when their parents are done)


BULK_ELIGIBLE = {
    "requeue": (Status.FAILED, Status.SCHEDULED, Status.RUNNING, Status.CANCELLED),
    "fail": (Status.READY, Status.SCHEDULED, Status.RUNNING, Status.BLOCKED),
    "cancel": (Status.READY, Status.SCHEDULED, Status.FAILED, Status.RUNNING, Status.BLOCKED),
}
BULK_AFTER = {"requeue": Status.READY, "fail": Status.FAILED, "cancel": Status.CANCELLED}
ATTEMPT_OUTCOME = {"requeue": "requeued", "fail": "failed_by_operator", "cancel": "cancelled"}


def _ids_text(ids: Sequence[int]) -> str:
    shown = ",".join(map(str, sorted(ids)[:AUDIT_IDS_SHOWN]))
    return f"ids {shown}" + (f" and {len(ids) - AUDIT_IDS_SHOWN} more" if len(ids) > AUDIT_IDS_SHOWN else "")


# A bulk batch's audit detail: the ids it changed, then what it passed over unless nothing (read
# back by a retry whose first try's COMMIT reply was lost), then the operator's reason.
_PASSED_OVER_READ = re.compile(r"ids [^;]*; passed over (\d+) busy, (\d+) skipped, (\d+) blocked")


def _passed_over_text(busy: int, skipped: int, blocked: int) -> str:
    return f"; passed over {busy} busy, {skipped} skipped, {blocked} blocked" if busy or skipped or blocked else ""


def _passed_over(detail: str | None) -> tuple[int, int, int]:
    """(busy, skipped, blocked) from a bulk batch's audit detail: 0s when it says none."""
    found = _PASSED_OVER_READ.match(detail or "")
    return (int(found[1]), int(found[2]), int(found[3])) if found else (0, 0, 0)


def bulk_action(
    conn: Connection,
    action: str,
    *,
    actor: str,
    ids: Sequence[int] | None = None,
    job_filter: JobFilter | None = None,
    after_id: int | None = None,
    reason: str | None = None,
    force: bool = False,
    batch_size: int = 500,
    deadline: float | None = None,
    pace: Callable[[float | None], Pause] | None = None,
) -> BulkResult:
    """Requeue, fail or cancel many jobs: the given ids, or every job matching a filter (newest first).

    Each batch is its own short transaction that locks its rows with SKIP LOCKED, so a bulk action
    over 100,000 jobs never holds many locks at once and never waits on a worker's claim: rows held
    this instant are counted as busy and left alone. Running jobs whose lease is still valid are
    skipped unless `force`. Stops at `deadline` (time.monotonic()) and reports where to continue.

    `pace` (ReplicaWatch.wait) is called before each batch, the first too (a continuation must
    not write while a replica is still behind): it returns once the watched replicas are within
    their lag bound, or holding at the deadline, and then this stops where it is.
    """
    if action not in BULK_ELIGIBLE:
        raise ValueError(f"unknown bulk action {action!r}")
    if (ids is None) == (job_filter is None):
        raise ValueError("give either ids or a filter")
    eligible = [s.value for s in BULK_ELIGIBLE[action]]
    reason = truncate_error(reason or f"{BULK_AFTER[action].value} by {actor}")
    selection = (
        f"ids: {','.join(map(str, ids[:50]))}{'...' if len(ids) > 50 else ''}"
        if ids is not None
        else job_filter.describe()
    )
    changed = busy = skipped = blocked = 0
    paused, replica_note = 0.0, None
    cursor = after_id
    pending = list(ids) if ids is not None else None
    # Checked again under the row locks. A job's batch never changes (written with the job), so
    # not the batch: its member set read again for every 500 rows.
    in_filter = sa.and_(sa.true(), *replace(job_filter, batch=None).where()) if job_filter is not None else sa.true()

    def result(finished: bool) -> BulkResult:
        return BulkResult(changed, busy, skipped, cursor, finished, action, selection, paused, replica_note, blocked)

    while True:
        if pace is not None:
            pause = pace(deadline)
            paused += pause.waited
            replica_note = pause.note or replica_note
            if pause.holding:
                return result(False)
        if pending is not None:
            batch, pending = pending[:batch_size], pending[batch_size:]
            batch_ids = [int(i) for i in batch]
        else:
            if job_filter.search and job_filter.min_id is None:
                raise ValueError("a bulk action over a search needs the window it was shown (min_id)")

            def read_page(c: Connection) -> list[int]:
                if job_filter.batch and not job_filter.search and c.dialect.name in ("mysql", "mariadb"):
                    page = batch_members(c, job_filter).order_by(jbm.job_id.desc())
                    bound = jbm.job_id
                else:
                    page = sa.select(jq.id).where(*job_filter.where()).order_by(jq.id.desc())
                    bound = jq.id
                page = page.limit(batch_size) if cursor is None else page.where(bound < cursor).limit(batch_size)
                return c.execute(page).scalars().all()

            batch_ids = transaction(conn, read_page, what="bulk_page")
        if not batch_ids:
            return result(True)

        def act(c: Connection) -> tuple[int, int, int, int]:
            require_primary(c)
            seen = c.execute(sa.select(jq.id, jq.status).where(jq.id.in_(batch_ids))).all()
            wanted = [r.id for r in seen if r.status in eligible]
            n_blocked = sum(r.status == Status.BLOCKED.value for r in seen) if action == "requeue" else 0
            # The whole filter again, under the lock: a job that left it since the page was read
            # (a failed job requeued meanwhile, under "cancel the failed ones") is skipped.
            locked = (
                c.execute(
                    sa.select(
                        jq.id, jq.status, (jq.lease_until > db_now()).label("lease_valid"), in_filter.label("in_filter")
                    )
                    .where(jq.id.in_(wanted), jq.status.in_(eligible))
                    .with_for_update(skip_locked=True)
                ).all()
                if wanted
                else []
            )
            targets = [
                r
                for r in locked
                if r.in_filter and not (r.status == Status.RUNNING.value and r.lease_valid and not force)
            ]
            n_busy = len(wanted) - len(locked)
            n_skipped = len(batch_ids) - len(wanted) + (len(locked) - len(targets))
            if not targets:
                return 0, n_busy, n_skipped, n_blocked
            target_ids = [r.id for r in targets]
            running = [r.id for r in targets if r.status == Status.RUNNING.value]
            if running:
                record_attempts(
                    c, jq.id.in_(running), ATTEMPT_OUTCOME[action], f"{action} by {actor} (bulk) while running"
                )
            guard = sa.and_(jq.id.in_(target_ids), jq.status.in_(eligible))
            if action == "requeue":
                n = c.execute(
                    sa.update(job_queue)
                    .where(guard)
                    .values(
                        status=Status.READY.value,
                        run_at=db_now(),
                        lease_owner=None,
                        lease_until=None,
                        finished_at=None,
                        max_attempts=one_more_attempt(),
                        updated_at=db_now(),
                    )
                ).rowcount
            elif action == "fail":
                n = c.execute(
                    sa.update(job_queue)
                    .where(guard)
                    .values(
                        status=Status.FAILED.value,
                        lease_until=None,
                        finished_at=db_now(),
                        last_error=reason,
                        updated_at=db_now(),
                    )
                ).rowcount
            else:
                n = c.execute(
                    sa.update(job_queue)
                    .where(guard)
                    .values(status=Status.CANCELLED.value, lease_until=None, finished_at=db_now(), updated_at=db_now())
                ).rowcount
            settle_finished(c, target_ids)
            before = ",".join(sorted({r.status for r in targets}))
            audit(
                c,
                actor,
                f"bulk_{action}",
                selection=selection,
                before=before,
                after=BULK_AFTER[action].value,
                count=n,
                detail=_ids_text(target_ids)
                + _passed_over_text(n_busy, n_skipped, n_blocked)
                + (f"; reason: {reason}" if action != "requeue" else ""),
            )
            return n, n_busy, n_skipped, n_blocked

        # A batch whose COMMIT's reply was lost counts from its audit row.
        n, n_busy, n_skipped, n_blocked = audited_once(
            conn,
            act,
            what=f"bulk_{action}",
            action=f"bulk_{action}",
            actor=actor,
            selection=selection,
            answer=lambda c, row: (row.count, *_passed_over(row.detail)),
        )
        changed, busy, skipped, blocked = changed + n, busy + n_busy, skipped + n_skipped, blocked + n_blocked
        cursor = min(batch_ids)
        if (pending is not None and not pending) or (pending is None and len(batch_ids) < batch_size):
            return result(True)
        if deadline is not None and time.monotonic() > deadline:
            return result(False)


def list_audit(
    conn: Connection, *, before_id: int | None = None, job_id: int | None = None, limit: int = 50
) -> list[dict[str, Any]]:
    """Newest first, keyset-paged by id."""
    stmt = sa.select(audit_log).order_by(audit_log.c.id.desc()).limit(limit)
    if before_id is not None:
        stmt = stmt.where(audit_log.c.id < before_id)
    if job_id is not None:
        stmt = stmt.where(audit_log.c.job_id == job_id)
    return [dict(r._mapping) for r in transaction(conn, lambda c: c.execute(stmt).all(), what="list_audit")]
