"""Dashboard support: worker heartbeats, per-minute activity, the audit log, the task filter index.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

TS = sa.DateTime().with_variant(mysql.DATETIME(fsp=6), "mysql", "mariadb")
ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
TABLE_ARGS = {
    "mysql_engine": "InnoDB",
    "mysql_charset": "utf8mb4",
    "mysql_collate": "utf8mb4_bin",
    "mariadb_engine": "InnoDB",
    "mariadb_charset": "utf8mb4",
    "mariadb_collate": "utf8mb4_bin",
}
STATS = (
    "completed",
    "failed",
    "retried",
    "reclaimed",
    "lease_lost",
    "claims",
    "claimed",
    "empty_idle",
    "empty_contended",
    "empty_waiting",
    "skipped",
    "sql_errors",
)


def upgrade() -> None:
    # task_name never changes after insert, so this index costs nothing on the claim path.
    op.create_index("ix_task", "job_queue", ["task_name", "id"])

    op.create_table(
        "worker_process",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("host", sa.String(255), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("kind", sa.String(20), nullable=False),
        sa.Column("concurrency", sa.Integer(), nullable=False),
        sa.Column("queues", sa.String(1000), nullable=False),
        sa.Column("started_at", TS, nullable=False),
        sa.Column("last_heartbeat", TS, nullable=False),
        sa.Column("stopped_at", TS, nullable=True),
        sa.Column("jobs_in_hand", sa.Integer(), nullable=False),
        sa.Column("processed", sa.BigInteger(), nullable=False),
        **TABLE_ARGS,
    )
    op.create_index("ix_worker_heartbeat", "worker_process", ["last_heartbeat"])

    op.create_table(
        "worker_stats",
        sa.Column("minute", TS, primary_key=True),
        sa.Column("process_id", sa.String(64), primary_key=True),
        *[sa.Column(name, sa.Integer(), nullable=False, server_default="0") for name in STATS],
        **TABLE_ARGS,
    )

    op.create_table(
        "audit_log",
        sa.Column("id", ID, primary_key=True, autoincrement=True),
        sa.Column("at", TS, nullable=False),
        sa.Column("actor", sa.String(100), nullable=False),
        sa.Column("action", sa.String(20), nullable=False),
        sa.Column("job_id", sa.BigInteger(), nullable=True),
        sa.Column("selection", sa.Text(), nullable=True),
        sa.Column("before_status", sa.String(20), nullable=True),
        sa.Column("after_status", sa.String(20), nullable=True),
        sa.Column("count", sa.Integer(), nullable=False),
        sa.Column("detail", sa.Text(), nullable=True),
        **TABLE_ARGS,
    )
    op.create_index("ix_audit_job", "audit_log", ["job_id"])


def downgrade() -> None:
    op.drop_table("audit_log")
    op.drop_table("worker_stats")
    op.drop_table("worker_process")
    op.drop_index("ix_task", table_name="job_queue")
