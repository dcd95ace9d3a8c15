"""Rate limits: job_queue.rate_bucket, the rate_window table, task_definition.rate_limit / rate_key.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-04

rate_bucket is an INSTANT ADD COLUMN (nullable, at the end) and needs no index: the claim reads
it from the rows it picked anyway. rate_window is new and small (one row per bucket).
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

from jobqueue.core.migrations import online

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None

TS = sa.DateTime().with_variant(mysql.DATETIME(fsp=6), "mysql", "mariadb")
TABLE_ARGS = {
    "mysql_engine": "InnoDB",
    "mysql_charset": "utf8mb4",
    "mysql_collate": "utf8mb4_bin",
    "mariadb_engine": "InnoDB",
    "mariadb_charset": "utf8mb4",
    "mariadb_collate": "utf8mb4_bin",
}


def upgrade() -> None:
    online.add_column("job_queue", sa.Column("rate_bucket", sa.String(200), nullable=True))
    op.add_column("task_definition", sa.Column("rate_limit", sa.String(20), nullable=True))
    op.add_column("task_definition", sa.Column("rate_key", sa.String(100), nullable=True))
    op.create_table(
        "rate_window",
        sa.Column("bucket", sa.String(200), primary_key=True),
        sa.Column("max_starts", sa.Integer(), nullable=False),
        sa.Column("period_seconds", sa.Integer(), nullable=False),
        sa.Column("window_start", TS, nullable=True),
        sa.Column("starts", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("updated_at", TS, nullable=False),
        **TABLE_ARGS,
    )


def downgrade() -> None:
    op.drop_table("rate_window")
    op.drop_column("task_definition", "rate_key")
    op.drop_column("task_definition", "rate_limit")
    online.drop_column("job_queue", "rate_bucket")
