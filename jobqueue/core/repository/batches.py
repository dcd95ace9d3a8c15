"""Batches: member jobs counted on the batch's row, and callbacks enqueued exactly once.

A member is written in one transaction with its batch's row locked FOR UPDATE (after the job's
insert: the same order as a finishing transaction, job row then batch row); a closed batch
refuses it. The member's row carries has_dependents, so every finishing path (completion,
failure, reap, operator) runs `settle` in its own transaction for it (repository/hooks.py) and
a job outside any batch pays nothing.

Settle locks the batch row FOR UPDATE, moves the member's count from what it was counted as
(job_batch_member.counted) to its status now, and decides: of two transactions finishing a
batch's last two members at the same instant, the second to lock the batch waits for the first's
COMMIT and reads its counters, so exactly one of them sees nothing pending. Close takes the same
lock. A callback is enqueued in the transaction that decided it, its job id kept on the batch
row, and its task_key `batch:<KEY>:<kind>` is unique besides: never lost (it commits with the
decision), never twice.

When each callback fires, once the batch is closed:
- on_failure: at the first member that fails for good (status failed; a cancelled member is not
  a failure), or at the close if one has failed already;
- on_success: when every member is done; on_complete: when every member has finished, whatever
  its outcome (an empty batch: both, at its close).

Retention deletes a finished batch once its members and callbacks are gone or finished and its
keep time has passed (repository/retention.py), and keeps what it was in pruned_batch: opening
its key again, closing it, showing it or enqueueing into it answer as for the finished batch it
was (created: false, no callback again, BatchClosed), until the key's record expires with the
keys of pruned jobs.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from .. import tracing
from ..db import callers_transaction, db_now, is_mysql, transaction
from ..errors import BatchClosed, BatchNotFound, ValidationError
from ..models import Enqueued, Status
from ..schema import job_batch, job_batch_member, job_queue, pruned_batch, pruned_key
from ..validation import CALLBACK_TASK, MAX_TASK_NAME_CHARS, check_payload, check_task_key, new_job
from .common import jq

jb = job_batch.c
jm = job_batch_member.c
KINDS = ("success", "failure", "complete")
COUNTERS = {Status.DONE.value: "done", Status.FAILED.value: "failed", Status.CANCELLED.value: "cancelled"}
MAX_KEY = 64  # batch:<KEY>:complete fits a task_key's 80 characters
# conn.info key: the callbacks this transaction enqueued, for service to report once it commits
# (wake the workers of their queues), whichever finishing path it was.
ENQUEUED = "jobqueue.batch_callbacks"


def check_key(key: Any) -> str:
    key = check_task_key(key)
    if len(key) > MAX_KEY:
        raise ValidationError(f"a batch key must be 1-{MAX_KEY} characters, got {len(key)}", "batch")
    return key


def _known_key(key: Any) -> str:
    """A key to look up: one that no batch could have is simply not found."""
    try:
        return check_key(key)
    except ValidationError:
        raise BatchNotFound(f"no batch has the key {key!r}") from None


def _callback_task(name: Any, field: str) -> str | None:
    if name is None:
        return None
    # Printable ASCII (a subset of what the callback's enqueue at the close takes, so that the
    # close never refuses it: such a batch could never close), the same rule as the API's schema.
    if not isinstance(name, str) or not CALLBACK_TASK.fullmatch(name):
        raise ValidationError(
            f"{field}: a task name of 1-{MAX_TASK_NAME_CHARS} printable ASCII characters, without spaces around it",
            field,
        )
    return name


def open_batch(
    conn: Connection,
    key: str,
    *,
    on_success: str | None = None,
    on_failure: str | None = None,
    on_complete: str | None = None,
    payload: dict | None = None,
) -> tuple[dict, bool]:
    """Open the batch `key`, or find it (idempotent like a task_key: the existing batch is
    returned as it is, callbacks and all). Returns (the batch as `show` gives it, created)."""
    key = check_key(key)
    values = {
        "batch_key": key,
        "state": "open",
        "on_success": _callback_task(on_success, "on_success"),
        "on_failure": _callback_task(on_failure, "on_failure"),
        "on_complete": _callback_task(on_complete, "on_complete"),
        "payload": check_payload(payload if payload is not None else {}),
    }
    trace = tracing.current()
    if trace is not None:  # its callbacks' spans link to this one
        values["trace_context"] = trace

    def write(c: Connection) -> bool:
        insert = sa.insert(job_batch).prefix_with("IGNORE", dialect="mysql").prefix_with("OR IGNORE", dialect="sqlite")
        if c.execute(insert.values(**values, created_at=db_now())).rowcount != 1:
            return False
        # Read after the INSERT, with a lock (the latest committed row, whatever the caller's
        # snapshot): a prune that committed while the INSERT waited on the key is seen.
        if _pruned(c, key, lock=True) is None:
            return True
        c.execute(sa.delete(job_batch).where(jb.batch_key == key))
        return False

    if conn.in_transaction():
        # The caller's transaction: the locking read may be refused (1020: MariaDB 11.6.2+ when
        # a prune changed pruned_batch after the caller's snapshot), which rolled it all back.
        with callers_transaction("batch_open"):
            created = write(conn)
    else:
        created = transaction(conn, write, what="batch_open")
    return show(conn, key), created


def _pruned(c: Connection, key: str, *, lock: bool = False) -> SimpleNamespace | None:
    """The pruned batch `key` as the finished batch it was, or None."""
    stmt = sa.select(pruned_batch).where(pruned_batch.c.batch_key == key)
    row = c.execute(stmt.with_for_update() if lock and is_mysql(c) else stmt).first()
    return None if row is None else SimpleNamespace(**row._mapping, id=row.batch_id, state="finished")


def _lock(c: Connection, key: str):
    stmt = sa.select(job_batch).where(jb.batch_key == key)
    row = c.execute(stmt.with_for_update() if is_mysql(c) else stmt).first() or _pruned(c, key, lock=True)
    if row is None:
        raise BatchNotFound(f"no batch has the key {key}")
    return row


def enqueue_member(conn: Connection, key: str, write_job) -> Enqueued:
    """Write `job` (by `write_job(c)`) as a member of the open batch `key`, in one transaction.
    A task_key already known is answered duplicate and counts nothing."""
    key = _known_key(key)

    def write(c: Connection) -> Enqueued:
        written = write_job(c)
        if written.duplicate:
            return written
        batch = _lock(c, key)
        if batch.state != "open":
            raise BatchClosed(f"batch {key} is {batch.state}: it takes no more jobs", batch.state)
        c.execute(sa.insert(job_batch_member).values(job_id=written.id, batch_id=batch.id))
        c.execute(sa.update(job_queue).where(jq.id == written.id).values(has_dependents=True))
        c.execute(sa.update(job_batch).where(jb.id == batch.id).values(total=jb.total + 1))
        if written.status is not None and written.status.value in COUNTERS:  # cancelled by a failed parent
            settle(c, [written.id])
        return written

    if conn.in_transaction():
        return write(conn)
    return transaction(conn, write, what="enqueue")


def settle(c: Connection, job_ids: Iterable[int]) -> None:
    """In the transaction that finished (or moved) these jobs, holding their rows: count each
    batch member as its status now says, then fire what the batch's counters decide."""
    ids = sorted(set(job_ids))
    if not ids:
        return
    members = c.execute(
        sa.select(jm.job_id, jm.batch_id, jm.counted, jq.status)
        .select_from(job_batch_member.join(job_queue, jq.id == jm.job_id))
        .where(jm.job_id.in_(ids))
    ).all()
    moved = [m for m in members if m.counted != (m.status if m.status in COUNTERS else None)]
    for batch_id in sorted({m.batch_id for m in moved}):
        lock = sa.select(jb.id).where(jb.id == batch_id)
        c.execute(lock.with_for_update() if is_mysql(c) else lock)
        deltas: dict[str, Any] = {}
        for m in moved:
            if m.batch_id != batch_id:
                continue
            now = m.status if m.status in COUNTERS else None
            for counted, step in ((m.counted, -1), (now, 1)):
                if counted is not None:
                    name = COUNTERS[counted]
                    deltas[name] = deltas.get(name, 0) + step
            c.execute(sa.update(job_batch_member).where(jm.job_id == m.job_id).values(counted=now))
        changes = {name: jb[name] + step for name, step in deltas.items() if step}
        if changes:
            c.execute(sa.update(job_batch).where(jb.id == batch_id).values(**changes))
        _decide(c, c.execute(sa.select(job_batch).where(jb.id == batch_id)).one())


def _decide(c: Connection, batch) -> None:
    """Under the batch's row lock: enqueue each callback its counters call for, once."""
    if batch.state == "open":
        return
    pending = batch.total - batch.done - batch.failed - batch.cancelled
    due = []
    if batch.failed and batch.failure_job_id is None:
        due.append("failure")
    if pending == 0:
        if batch.done == batch.total and batch.success_job_id is None:
            due.append("success")
        if batch.complete_job_id is None:
            due.append("complete")
    changes: dict[str, Any] = {}
    for kind in due:
        task = getattr(batch, f"on_{kind}")
        if task is not None:
            changes[f"{kind}_job_id"] = _enqueue_callback(c, batch, kind, task)
    if pending == 0 and batch.state != "finished":
        changes.update(state="finished", finished_at=db_now())
    if changes:
        c.execute(sa.update(job_batch).where(jb.id == batch.id).values(**changes))


def _enqueue_callback(c: Connection, batch, kind: str, task: str) -> int:
    from .enqueue import _write  # enqueue imports this module
    from .task_definitions import KnownTasks

    payload = {
        "batch": batch.batch_key,
        "kind": kind,
        "total": batch.total,
        "done": batch.done,
        "failed": batch.failed,
        "cancelled": batch.cancelled,
        "payload": batch.payload,
    }
    job = new_job(task, f"batch:{batch.batch_key}:{kind}", payload, registry=KnownTasks(c), allow_unregistered=True)
    # Enqueued in the transaction of whichever member settled the batch: linked to the span that
    # opened the batch, not a child of any member's.
    written = _write(c, [job], tracing.link(batch.trace_context))[0]
    c.info.setdefault(ENQUEUED, []).append(written)
    return written.id


def close(conn: Connection, key: str) -> dict:
    """Close the batch: it takes no more members, and its callbacks may fire (now, if its
    members have all finished). Closing a closed batch changes nothing."""
    key = _known_key(key)

    def write(c: Connection) -> None:
        batch = _lock(c, key)
        if batch.state == "open":
            c.execute(sa.update(job_batch).where(jb.id == batch.id).values(state="closed", closed_at=db_now()))
            _decide(c, c.execute(sa.select(job_batch).where(jb.id == batch.id)).one())

    if conn.in_transaction():
        write(conn)
    else:
        transaction(conn, write, what="batch_close")
    return show(conn, key)


def show(conn: Connection, key: str) -> dict:
    """{"key", "state", "total", "done", "failed", "cancelled", "pending", "callbacks", ...}."""
    key = _known_key(key)
    b = conn.execute(sa.select(job_batch).where(jb.batch_key == key)).first() or _pruned(conn, key)
    if b is None:
        raise BatchNotFound(f"no batch has the key {key}")
    return _shape(conn, b)


def _counts(b) -> dict:
    return {
        "key": b.batch_key,
        "state": b.state,
        "total": b.total,
        "done": b.done,
        "failed": b.failed,
        "cancelled": b.cancelled,
        "pending": b.total - b.done - b.failed - b.cancelled,
    }


def _shape(conn: Connection, b) -> dict:
    ids = [getattr(b, f"{kind}_job_id") for kind in KINDS]
    states = dict(conn.execute(sa.select(jq.id, jq.status).where(jq.id.in_([i for i in ids if i]))).all())
    gone = {f"batch:{b.batch_key}:{kind}": i for kind, i in zip(KINDS, ids, strict=True) if i and i not in states}
    if gone:  # callbacks pruned as jobs: their status is kept with their key
        keys = sa.select(pruned_key.c.task_key, pruned_key.c.status).where(pruned_key.c.task_key.in_(list(gone)))
        states |= {gone[k]: status for k, status in conn.execute(keys).all()}
    return {
        **_counts(b),
        "callbacks": {
            f"on_{kind}": {
                "task": getattr(b, f"on_{kind}"),
                "task_key": f"batch:{b.batch_key}:{kind}",
                "job_id": job_id,
                "status": states.get(job_id),
            }
            for kind, job_id in zip(KINDS, ids, strict=True)
            if getattr(b, f"on_{kind}") is not None
        },
        "payload": b.payload,
        "created_at": b.created_at.isoformat() if b.created_at else None,
        "closed_at": b.closed_at.isoformat() if b.closed_at else None,
        "finished_at": b.finished_at.isoformat() if b.finished_at else None,
    }


STATES = ("open", "closed", "finished")
STATE_WINDOW = 5_000  # batches a page filtered by state reads at most (no index holds the state)


@dataclass(frozen=True)
class BatchPage:
    """One keyset page of batches, newest first. `older`: the `before` of the next page (None:
    no such page); with a state, `window_floor` is the lowest id the page's bounded read reached
    when it stopped short of the oldest batch, and `older` goes on below it even when that
    window held no more of the state."""

    batches: list[dict]
    older: int | None
    window_floor: int | None = None


def page_batches(
    conn: Connection, *, state: str | None = None, before: int | None = None, limit: int = 50
) -> BatchPage:
    """The batches below id `before`, newest first, as the dashboard's list shows them (counts
    and times; no callback jobs). One range read of the primary key: a state (most batches
    are finished, the open ones few and new) is checked on the newest STATE_WINDOW rows below
    `before`, not on the whole table."""
    if state is not None and state not in STATES:
        raise ValidationError(f"unknown batch state {state!r} (one of {', '.join(STATES)})", "state")
    below = [jb.id < before] if before is not None else []

    def read(c: Connection) -> BatchPage:
        if state is None:
            rows = c.execute(sa.select(job_batch).where(*below).order_by(jb.id.desc()).limit(limit + 1)).all()
            floor = None
        else:
            window = sa.select(jb.id).where(*below).order_by(jb.id.desc()).limit(STATE_WINDOW).subquery()
            low, n = c.execute(sa.select(sa.func.min(window.c.id), sa.func.count()).select_from(window)).one()
            floor = low if n >= STATE_WINDOW else None
            rows = (
                c.execute(
                    sa.select(job_batch)
                    .where(*below, jb.id >= (low or 0), jb.state == state)
                    .order_by(jb.id.desc())
                    .limit(limit + 1)
                ).all()
                if n
                else []
            )
        more = len(rows) > limit
        rows = rows[:limit]
        older = rows[-1].id if more else floor
        return BatchPage([_listed(b) for b in rows], older, floor)

    return transaction(conn, read, what="page_batches")


def _listed(b) -> dict:
    return {
        "id": b.id,
        **_counts(b),
        "payload": b.payload,
        "created_at": b.created_at,
        "closed_at": b.closed_at,
        "finished_at": b.finished_at,
    }


def members(conn: Connection, key: str, *, limit: int = 100) -> list[dict]:
    b = show(conn, key)
    batch_id = conn.execute(sa.select(jb.id).where(jb.batch_key == b["key"])).scalar()
    return [
        dict(r._mapping)
        for r in conn.execute(
            sa.select(jq.id, jq.task_key, jq.task_name, jq.status)
            .select_from(job_batch_member.join(job_queue, jq.id == jm.job_id))
            .where(jm.batch_id == batch_id)
            .order_by(jm.job_id)
            .limit(limit)
        ).all()
    ]


def member_ids(c: Connection, ids: Sequence[int]) -> list[int]:
    return list(c.execute(sa.select(jm.job_id).where(jm.job_id.in_(list(ids)))).scalars()) if ids else []
