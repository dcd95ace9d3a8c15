"""Reads of jobs, results and attempts (all bounded: no OFFSET, no full-table COUNT)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from ..db import transaction
from ..models import Job, Status
from ..schema import job_attempt, job_queue, job_result
from .common import database_now as _now, jq, job_from_row
from .operator import JobFilter


def get_job(conn: Connection, job_id: int) -> Job | None:
    row = transaction(conn, lambda c: c.execute(sa.select(job_queue).where(jq.id == job_id)).first(), what="get_job")
    return job_from_row(row) if row else None


def get_job_by_key(conn: Connection, task_key: str) -> Job | None:
    row = transaction(conn, lambda c: c.execute(sa.select(job_queue).where(jq.task_key == task_key)).first(),
                      what="get_job")
    return job_from_row(row) if row else None


def get_result(conn: Connection, task_key: str) -> dict[str, Any] | None:
    row = transaction(conn, lambda c: c.execute(sa.select(job_result).where(job_result.c.task_key == task_key)).first(),
                      what="get_result")
    return dict(row._mapping) if row else None


def list_attempts(conn: Connection, job_id: int) -> list[dict[str, Any]]:
    rows = transaction(conn, lambda c: c.execute(sa.select(job_attempt).where(job_attempt.c.job_id == job_id)
                                                 .order_by(job_attempt.c.attempt, job_attempt.c.id)).all(),
                       what="list_attempts")
    return [dict(r._mapping) for r in rows]


def running_jobs(conn: Connection, *, limit: int = 50) -> list[Job]:
    """Running jobs, soonest lease expiry first."""
    stmt = sa.select(job_queue).where(jq.status == Status.RUNNING.value).order_by(jq.lease_until).limit(limit)
    return [job_from_row(r) for r in transaction(conn, lambda c: c.execute(stmt).all(), what="running_jobs")]


def list_jobs(conn: Connection, job_filter: JobFilter | None = None, *, before_id: int | None = None,
              limit: int = 50) -> list[Job]:
    """A page of jobs, newest first, continuing below `before_id` (keyset paging)."""
    stmt = sa.select(job_queue).order_by(jq.id.desc()).limit(limit)
    if job_filter is not None:
        stmt = stmt.where(*job_filter.where())
    if before_id is not None:
        stmt = stmt.where(jq.id < before_id)
    return [job_from_row(r) for r in transaction(conn, lambda c: c.execute(stmt).all(), what="list_jobs")]


def distinct_values(conn: Connection) -> tuple[list[str], list[str]]:
    """Known queue and task names, for the filter menus (loose index scans)."""
    def read(c: Connection):
        queues = c.execute(sa.select(jq.queue).group_by(jq.status, jq.queue)).scalars().all()
        tasks = c.execute(sa.select(jq.task_name).group_by(jq.task_name)).scalars().all()
        return sorted(set(queues)), sorted(set(tasks))
    return transaction(conn, read, what="distinct_values")


def database_now(conn: Connection) -> datetime:
    return transaction(conn, _now, what="now")
