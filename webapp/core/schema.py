"""Table definitions the repository queries. The DDL itself lives in the Alembic migrations.

Indexes, and which statement each one serves:
- `ix_ready_pick (status, queue, priority, id)`: the claim (`status='ready' AND queue=?
  ORDER BY priority, id`) reads it in order with no filesort, and done rows sit under another
  `status` prefix, so the claim does not slow down as they pile up. Counts per status and queue
  are index-only.
- `ix_due (status, run_at)`: promoting due `scheduled` jobs, the oldest ready job's age.
- `uk_task_key`: idempotent enqueue.
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.dialects import mysql

from .models import Status

metadata = sa.MetaData()

Timestamp = sa.DateTime().with_variant(mysql.DATETIME(fsp=6), "mysql", "mariadb")
BigId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
StatusType = sa.Enum(
    *[s.value for s in Status], name="job_status", native_enum=True, create_constraint=False,
    validate_strings=True,
)

job_queue = sa.Table(
    "job_queue",
    metadata,
    sa.Column("id", BigId, primary_key=True, autoincrement=True),
    sa.Column("task_key", sa.String(80), nullable=False),
    sa.Column("task_name", sa.String(100), nullable=False),
    sa.Column("queue", sa.String(64), nullable=False),
    sa.Column("priority", sa.SmallInteger(), nullable=False),
    sa.Column("payload", sa.JSON(), nullable=False),
    sa.Column("status", StatusType, nullable=False),
    sa.Column("run_at", Timestamp, nullable=False),
    sa.Column("lease_owner", sa.String(64), nullable=True),
    sa.Column("lease_until", Timestamp, nullable=True),
    sa.Column("attempts", sa.Integer(), nullable=False),
    sa.Column("max_attempts", sa.Integer(), nullable=False),
    sa.Column("started_at", Timestamp, nullable=True),
    sa.Column("last_error", sa.Text(), nullable=True),
    sa.Column("created_at", Timestamp, nullable=False),
    sa.Column("updated_at", Timestamp, nullable=False),
    sa.Column("finished_at", Timestamp, nullable=True),
    sa.UniqueConstraint("task_key", name="uk_task_key"),
    sa.Index("ix_ready_pick", "status", "queue", "priority", "id"),
    sa.Index("ix_due", "status", "run_at"),
)

# One downstream result per task_key: a replayed task_key records nothing new.
job_result = sa.Table(
    "job_result",
    metadata,
    sa.Column("id", BigId, primary_key=True, autoincrement=True),
    sa.Column("task_key", sa.String(80), nullable=False),
    sa.Column("job_id", sa.BigInteger(), nullable=False),
    sa.Column("attempt", sa.Integer(), nullable=False),
    sa.Column("worker", sa.String(64), nullable=False),
    sa.Column("result", sa.JSON(), nullable=False),
    sa.Column("created_at", Timestamp, nullable=False),
    sa.UniqueConstraint("task_key", name="uk_result_task_key"),
)

# Attempts that did not end in success (retries, failures, expired leases, releases). A
# successful attempt is the job row itself (lease_owner, started_at, finished_at), so the hot
# path writes nothing here.
job_attempt = sa.Table(
    "job_attempt",
    metadata,
    sa.Column("id", BigId, primary_key=True, autoincrement=True),
    sa.Column("job_id", sa.BigInteger(), nullable=False),
    sa.Column("attempt", sa.Integer(), nullable=False),
    sa.Column("worker", sa.String(64), nullable=True),
    sa.Column("started_at", Timestamp, nullable=True),
    sa.Column("finished_at", Timestamp, nullable=False),
    sa.Column("outcome", sa.String(20), nullable=False),
    sa.Column("error", sa.Text(), nullable=True),
    sa.Index("ix_attempt_job", "job_id", "attempt"),
)
