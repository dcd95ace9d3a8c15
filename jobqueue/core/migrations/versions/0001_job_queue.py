"""The queue: job_queue, job_result (one result per task_key), job_attempt (attempt history).

Revision ID: 0001
Revises:
Create Date: 2026-11-30
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

TS = sa.DateTime().with_variant(mysql.DATETIME(fsp=6), "mysql", "mariadb")
ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
STATUS = sa.Enum(
    "scheduled", "ready", "running", "done", "failed", name="job_status", native_enum=True, create_constraint=False
)
TABLE_ARGS = {
    "mysql_engine": "InnoDB",
    "mysql_charset": "utf8mb4",
    "mysql_collate": "utf8mb4_bin",
    "mariadb_engine": "InnoDB",
    "mariadb_charset": "utf8mb4",
    "mariadb_collate": "utf8mb4_bin",
}


def upgrade() -> None:
    op.create_table(
        "job_queue",
        sa.Column("id", ID, primary_key=True, autoincrement=True),
        sa.Column("task_key", sa.String(80), nullable=False),
        sa.Column("task_name", sa.String(100), nullable=False),
        sa.Column("queue", sa.String(64), nullable=False),
        sa.Column("priority", sa.SmallInteger(), nullable=False),
        sa.Column("payload", sa.JSON(), nullable=False),
        sa.Column("status", STATUS, nullable=False),
        sa.Column("run_at", TS, nullable=False),
        sa.Column("lease_owner", sa.String(64), nullable=True),
        sa.Column("lease_until", TS, nullable=True),
        sa.Column("attempts", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("max_attempts", sa.Integer(), nullable=False),
        sa.Column("started_at", TS, nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("updated_at", TS, nullable=False),
        sa.Column("finished_at", TS, nullable=True),
        sa.UniqueConstraint("task_key", name="uk_task_key"),
        **TABLE_ARGS,
    )
    # Serves the claim's WHERE status='ready' AND queue=? ORDER BY priority, id with no filesort.
    op.create_index("ix_ready_pick", "job_queue", ["status", "queue", "priority", "id"])
    # Serves promotion of due scheduled jobs, and (covering, with queue) the oldest ready job's
    # age per queue without touching the rows.
    op.create_index("ix_due", "job_queue", ["status", "run_at", "queue"])

    op.create_table(
        "job_result",
        sa.Column("id", ID, primary_key=True, autoincrement=True),
        sa.Column("task_key", sa.String(80), nullable=False),
        sa.Column("job_id", sa.BigInteger(), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("worker", sa.String(64), nullable=False),
        sa.Column("result", sa.JSON(), nullable=False),
        sa.Column("created_at", TS, nullable=False),
        sa.UniqueConstraint("task_key", name="uk_result_task_key"),
        **TABLE_ARGS,
    )

    op.create_table(
        "job_attempt",
        sa.Column("id", ID, primary_key=True, autoincrement=True),
        sa.Column("job_id", sa.BigInteger(), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("worker", sa.String(64), nullable=True),
        sa.Column("started_at", TS, nullable=True),
        sa.Column("finished_at", TS, nullable=False),
        sa.Column("outcome", sa.String(20), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        **TABLE_ARGS,
    )
    op.create_index("ix_attempt_job", "job_attempt", ["job_id", "attempt"])


def downgrade() -> None:
    op.drop_table("job_attempt")
    op.drop_table("job_result")
    op.drop_table("job_queue")
