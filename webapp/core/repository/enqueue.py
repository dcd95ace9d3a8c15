"""enqueue: new jobs, idempotent by task_key.

A task_key is taken while its job is in job_queue and, once the job has been pruned, while its
record in pruned_key lasts (JOBQUEUE_KEEP_KEYS_DAYS): a replay of a pruned job's key answers
duplicate: true with the old job's id and status, and writes nothing."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection
from sqlalchemy.exc import IntegrityError

from .. import retry
from ..db import db_after, db_now, require_primary, transaction
from ..errors import ValidationError
from ..models import Enqueued, Status
from ..schema import Timestamp, job_queue, pruned_key
from ..tasks import TASKS, Registry
from ..validation import NewJob, new_job
from .claim import ensure_keys
from .common import database_now, is_duplicate_key, jq

pk = pruned_key.c


def _insert_values(job: NewJob, now: datetime | None = None) -> dict[str, Any]:
    values = {
        "task_key": job.task_key, "task_name": job.task_name, "queue": job.queue,
        "priority": job.priority, "payload": job.payload,
        "status": (Status.SCHEDULED if job.delay_seconds > 0 else Status.READY).value,
        "max_attempts": job.max_attempts, "concurrency_key": job.concurrency_key,
    }
    if now is None:
        values["delay_us"] = int(round(job.delay_seconds * 1_000_000))
    else:
        values.update(run_at=now + timedelta(seconds=job.delay_seconds), created_at=now, updated_at=now)
    return values


_JOB_COLUMNS = dict(task_key=sa.bindparam("task_key"), task_name=sa.bindparam("task_name"),
                    queue=sa.bindparam("queue"), priority=sa.bindparam("priority"),
                    payload=sa.bindparam("payload", type_=sa.JSON), status=sa.bindparam("status"),
                    attempts=0, max_attempts=sa.bindparam("max_attempts"),
                    concurrency_key=sa.bindparam("concurrency_key"))
# One job: created_at, updated_at and run_at (now + delay) straight from the database clock.
_INSERT_ONE = sa.insert(job_queue).values(
    **_JOB_COLUMNS, run_at=db_after(micros=sa.bindparam("delay_us", type_=sa.BigInteger)),
    created_at=db_now(), updated_at=db_now())
# Many jobs: plain values only (the database's now, read once in the same transaction), so the
# driver sends one multi-row INSERT instead of a statement per row.
_INSERT_MANY = sa.insert(job_queue).values(
    **_JOB_COLUMNS, run_at=sa.bindparam("run_at", type_=Timestamp),
    created_at=sa.bindparam("created_at", type_=Timestamp), updated_at=sa.bindparam("updated_at", type_=Timestamp))

# Another transaction inserted one of our task_keys between our read and our insert: the next
# pass sees it as existing. No pause: the row is already there.
_KEY_RACE = retry.RetryPolicy(attempts=3, first_delay=0.0, max_delay=0.0)


def validate_jobs(jobs: Iterable[NewJob | Mapping[str, Any]], *, registry: Registry = TASKS) -> list[NewJob]:
    """Every job checked before anything is written; the error names the job's position."""
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
    return validated


def enqueue_many(conn: Connection, jobs: Iterable[NewJob | Mapping[str, Any]], *,
                 registry: Registry = TASKS) -> list[Enqueued]:
    """Add many jobs in one transaction (multi-row INSERT). All are validated before anything is
    written; task_keys already in the table (or repeated in the batch) come back duplicate=True.

    A COMMIT whose reply was lost is retried by db.transaction; the retry then finds our own rows.
    A key that the first pass saw absent and that now holds this call's job (same task, queue,
    priority and payload) is reported as written by us, not as a duplicate.
    """
    validated = validate_jobs(jobs, registry=registry)
    if not validated:
        return []
    seen_absent: set[str] = set()
    inserting: set[str] = set()   # the keys the current pass tries to insert

    def write(c: Connection) -> list[Enqueued]:
        require_primary(c)
        keys = list({job.task_key: None for job in validated})
        # Known keys: jobs in the table, and the records of pruned ones (one statement).
        existing = {row.task_key: row for row in c.execute(sa.union_all(
            sa.select(jq.task_key, jq.id, sa.cast(jq.status, sa.String).label("status")).where(jq.task_key.in_(keys)),
            sa.select(pk.task_key, pk.job_id.label("id"), pk.status).where(pk.task_key.in_(keys)))).all()}
        ours = {}
        maybe_ours = [key for key in existing if key in seen_absent]
        if maybe_ours:   # a retry, and keys that were absent before are there now
            ours = {row.task_key: row for row in c.execute(
                sa.select(jq.task_key, jq.id, jq.task_name, jq.queue, jq.priority, jq.payload)
                .where(jq.task_key.in_(maybe_ours))).all() if _same_job(row, validated, row.task_key)}
            existing = {key: row for key, row in existing.items() if key not in ours}
        seen_absent.update(k for k in keys if k not in existing)
        fresh: dict[str, NewJob] = {}
        for job in validated:
            if job.task_key not in existing and job.task_key not in ours and job.task_key not in fresh:
                fresh[job.task_key] = job
        inserting.clear()
        inserting.update(fresh)
        ensure_keys(c, {job.concurrency_key: job.concurrency_limit for job in fresh.values()
                        if job.concurrency_key is not None})
        if len(fresh) == 1:
            (job,) = fresh.values()
            ids = {job.task_key: c.execute(_INSERT_ONE, _insert_values(job)).inserted_primary_key[0]}
        elif fresh:
            now = database_now(c)
            c.execute(_INSERT_MANY, [_insert_values(job, now) for job in fresh.values()])
            ids = dict(c.execute(sa.select(jq.task_key, jq.id).where(jq.task_key.in_(list(fresh)))).all())
        else:
            ids = {}
        ids.update({key: row.id for key, row in ours.items()})
        out, reported = [], set()
        for job in validated:
            if job.task_key in ids and job.task_key not in reported:
                reported.add(job.task_key)
                status = Status.SCHEDULED if job.delay_seconds > 0 else Status.READY
                out.append(Enqueued(ids[job.task_key], job.task_key, False, status, job.queue))
            else:
                row = existing.get(job.task_key)
                out.append(Enqueued(row.id if row is not None else ids[job.task_key], job.task_key, True,
                                    Status(row.status) if row is not None else None))
        return out

    def classify(exc: BaseException) -> str | None:
        if isinstance(exc, IntegrityError) and is_duplicate_key(exc) and not conn.in_transaction():
            # Our insert was refused and rolled back: whoever holds those keys now is another
            # enqueue of the same job (two processes enqueueing one recurring tick), not a
            # COMMIT of ours whose reply was lost.
            seen_absent.difference_update(inserting)
            return "duplicate_key"
        return None

    try:
        return retry.call(lambda: transaction(conn, write, what="enqueue"), _KEY_RACE, classify)
    except retry.RetriesExhausted as exc:
        raise exc.last from None


def _same_job(row, validated: list[NewJob], key: str) -> bool:
    job = next(j for j in validated if j.task_key == key)
    payload = json.loads(row.payload) if isinstance(row.payload, (str, bytes)) else row.payload
    return (row.task_name, row.queue, row.priority, payload) == (job.task_name, job.queue, job.priority, job.payload)


def enqueue(conn: Connection, task_name: str, task_key: str, payload: dict | None = None, *,
            queue: str | None = None, priority: int = 0, delay: float = 0,
            max_attempts: int | None = None, registry: Registry = TASKS) -> Enqueued:
    """Add one job. A known task_key writes nothing and returns the existing id, duplicate=True."""
    job = new_job(task_name, task_key, payload, queue=queue, priority=priority, delay=delay,
                  max_attempts=max_attempts, registry=registry)
    return enqueue_many(conn, [job])[0]
