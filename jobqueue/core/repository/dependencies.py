"""Dependencies: a job that waits (status `blocked`) until every job named in its `after` is done.

Enqueue, in one transaction: lock the parents' rows (FOR UPDATE, by task_key), insert the child,
one job_dependency row per parent, set has_dependents on the parents still pending, and make the
child blocked (a parent pending), cancelled (a parent failed or cancelled, on_parent_failure
"cancel") or leave it ready / scheduled. A parent finishing meanwhile either committed before our
lock (we read its final state) or waits for our COMMIT and then sees has_dependents.

Settle, in the transaction that finishes a parent (completion, failure, reap, operator): only for
a parent whose row said has_dependents when the finishing transaction locked it, so a job that
nothing waits for pays nothing. Each blocked child is locked (FOR UPDATE) before its parents'
states are read: of two transactions finishing a child's last two parents at the same instant,
the second to lock the child waits for the first's COMMIT and then (READ COMMITTED: each
statement reads what is committed) sees both parents finished, so the child is unblocked exactly
once and never left blocked. Parents' states are read without a lock: locking a parent that the
other transaction is finishing would deadlock the two.

A cycle cannot be written: parents must exist when the child is enqueued, so a parent is always
older than its child; a re-enqueue of an existing key writes nothing (idempotent), and one that
names as a parent a job waiting (transitively) for it is refused rather than answered duplicate.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from ..db import db_now, is_mysql, transaction
from ..errors import ValidationError
from ..models import Enqueued, Status
from ..schema import job_dependency, job_queue, pruned_key
from ..validation import NewJob
from .common import jq

jd = job_dependency.c
MODES = ("cancel", "run")
_PARENT_FAILED = (Status.FAILED.value, Status.CANCELLED.value)
_FINISHED = (Status.DONE.value, *_PARENT_FAILED)


class UnknownParent(ValidationError):
    """A key named in `after` is no job's: nothing was written."""


class DependencyCycle(ValidationError):
    """The job would wait, directly or not, for itself: nothing was written."""


def check_after(after: Iterable[str] | None, on_parent_failure: str | None) -> tuple[list[str], str]:
    """`after` as a list of distinct task_keys and the mode; ValidationError for anything else."""
    if isinstance(after, (str, bytes, dict)) or (after is not None and not isinstance(after, Iterable)):
        raise ValidationError("after: a list of task_keys", "after")
    given = list(after or ())
    if not all(isinstance(k, str) and k for k in given):  # before dict.fromkeys: a list in it is unhashable
        raise ValidationError("after: a list of task_keys", "after")
    keys = list(dict.fromkeys(given))
    mode = "cancel" if on_parent_failure is None else on_parent_failure
    if not isinstance(mode, str) or mode not in MODES:
        raise ValidationError("on_parent_failure: 'cancel' or 'run'", "on_parent_failure")
    return keys, mode


def enqueue_after(conn: Connection, job: NewJob, after: Sequence[str], on_parent_failure: str) -> Enqueued:
    """Enqueue `job` to wait for the jobs whose task_keys are `after` (see the module's doc)."""
    from .enqueue import _write  # enqueue imports nothing from here

    def write(c: Connection) -> Enqueued:
        if job.task_key in after:
            raise DependencyCycle(f"{job.task_key} cannot wait for itself", "after")
        parents = {
            r.task_key: r
            for r in c.execute(
                sa.select(jq.id, jq.task_key, jq.status)
                .where(jq.task_key.in_(list(after)))
                .order_by(jq.id)
                .with_for_update()
            ).all()
        }
        missing = [k for k in after if k not in parents]
        pruned = (
            {
                r.task_key: r.status
                for r in c.execute(
                    sa.select(pruned_key.c.task_key, pruned_key.c.status).where(pruned_key.c.task_key.in_(missing))
                ).all()
            }
            if missing
            else {}
        )
        unknown = [k for k in missing if k not in pruned]
        if unknown:
            raise UnknownParent(f"after: no job has the task_key {', '.join(unknown)}", "after")
        existing = c.execute(sa.select(jq.id).where(jq.task_key == job.task_key)).scalar()
        if existing is not None and existing in _ancestors(c, [p.id for p in parents.values()]):
            raise DependencyCycle(f"{job.task_key} would wait for itself through {', '.join(after)}", "after")
        written = _write(c, [job])[0]
        if written.duplicate:
            return written
        c.execute(
            sa.insert(job_dependency),
            [
                {"parent_id": p.id, "child_id": written.id, "on_parent_failure": on_parent_failure}
                for p in parents.values()
            ],
        )
        states = {k: p.status for k, p in parents.items()} | pruned
        pending = [p.id for p in parents.values() if p.status not in _FINISHED]
        if pending:
            c.execute(
                sa.update(job_queue).where(jq.id.in_(pending), jq.has_dependents.is_(False)).values(has_dependents=True)
            )
        failed = [(k, s) for k, s in states.items() if s in _PARENT_FAILED]
        if failed and on_parent_failure == "cancel":
            _cancel(c, written.id, *failed[0])
            status = Status.CANCELLED
        elif pending:
            c.execute(sa.update(job_queue).where(jq.id == written.id).values(status=Status.BLOCKED.value))
            status = Status.BLOCKED
        else:
            status = written.status
        return Enqueued(written.id, written.task_key, False, status, written.queue)

    if conn.in_transaction():
        return write(conn)
    return transaction(conn, write, what="enqueue")


def _ancestors(c: Connection, ids: list[int]) -> set[int]:
    seen: set[int] = set(ids)
    while ids:
        ids = [i for i in c.execute(sa.select(jd.parent_id).where(jd.child_id.in_(ids))).scalars() if i not in seen]
        seen.update(ids)
    return seen


def _cancel(c: Connection, child_id: int, parent_key: str, parent_status: str) -> None:
    c.execute(
        sa.update(job_queue)
        .where(jq.id == child_id)
        .values(
            status=Status.CANCELLED.value,
            finished_at=db_now(),
            updated_at=db_now(),
            last_error=f"parent {parent_key} {parent_status}",
        )
    )


def settle(c: Connection, parent_ids: Iterable[int]) -> list[int]:
    """In the transaction that finished these parents (each had has_dependents): unblock each
    blocked child whose parents are all finished, cancel those a failed parent cancels, and so on
    down the children of the cancelled. Returns the children cancelled (finished here too)."""
    cancelled: list[int] = []
    todo = sorted(set(parent_ids))
    while todo:
        children = sorted(set(c.execute(sa.select(jd.child_id).where(jd.parent_id.in_(todo))).scalars()))
        todo = []
        for child_id in children:
            lock = sa.select(jq.status, jq.has_dependents).where(jq.id == child_id)
            row = c.execute(lock.with_for_update() if is_mysql(c) else lock).first()
            if row is None or row.status != Status.BLOCKED.value:
                continue
            parents = c.execute(
                sa.select(jd.on_parent_failure, jq.task_key, jq.status)
                .select_from(job_dependency.outerjoin(job_queue, jq.id == jd.parent_id))
                .where(jd.child_id == child_id)
                .order_by(jd.parent_id)
            ).all()
            failed = [
                (p.task_key, p.status)
                for p in parents
                if p.status in _PARENT_FAILED and p.on_parent_failure == "cancel"
            ]
            if failed:
                _cancel(c, child_id, *failed[0])
                cancelled.append(child_id)
                if row.has_dependents:
                    todo.append(child_id)
            elif all(p.status is None or p.status in _FINISHED for p in parents):
                # A parent's row gone (pruned) was finished: retention keeps a parent while a
                # child of it is blocked.
                c.execute(
                    sa.update(job_queue)
                    .where(jq.id == child_id)
                    .values(
                        status=sa.case((jq.run_at > db_now(), Status.SCHEDULED.value), else_=Status.READY.value),
                        updated_at=db_now(),
                    )
                )
    return cancelled


def parents_of(c: Connection, child_id: int) -> list[dict]:
    return [
        dict(r._mapping)
        for r in c.execute(
            sa.select(jq.id, jq.task_key, jq.status, jd.on_parent_failure)
            .select_from(job_dependency.join(job_queue, jq.id == jd.parent_id))
            .where(jd.child_id == child_id)
            .order_by(jq.id)
        ).all()
    ]


def children_of(c: Connection, parent_id: int) -> list[dict]:
    return [
        dict(r._mapping)
        for r in c.execute(
            sa.select(jq.id, jq.task_key, jq.status)
            .select_from(job_dependency.join(job_queue, jq.id == jd.child_id))
            .where(jd.parent_id == parent_id)
            .order_by(jq.id)
        ).all()
    ]
