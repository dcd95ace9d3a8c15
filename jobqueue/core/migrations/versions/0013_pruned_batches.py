"""Retention prunes finished batches: pruned_batch, job_batch's ix_batch_finished, prune_run.batch_rows.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-04

pruned_batch is new (what is left of a pruned batch, so that its key stays idempotent); the index
on job_batch and the column on prune_run touch small tables, never job_queue.
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None

ID = sa.BigInteger()
TABLE_ARGS = {
    "mysql_engine": "InnoDB",
    "mysql_charset": "utf8mb4",
    "mysql_collate": "utf8mb4_bin",
    "mariadb_engine": "InnoDB",
    "mariadb_charset": "utf8mb4",
    "mariadb_collate": "utf8mb4_bin",
}
Timestamp = sa.DateTime().with_variant(mysql.DATETIME(fsp=6), "mysql", "mariadb")


def _payload() -> sa.types.TypeEngine:
    if op.get_context().dialect.name in ("mysql", "mariadb"):
        return mysql.LONGTEXT()
    return sa.JSON()


def upgrade() -> None:
    op.create_table(
        "pruned_batch",
        sa.Column("batch_key", sa.String(64), primary_key=True),
        sa.Column("batch_id", ID, nullable=False),
        sa.Column("on_success", sa.String(100), nullable=True),
        sa.Column("on_failure", sa.String(100), nullable=True),
        sa.Column("on_complete", sa.String(100), nullable=True),
        sa.Column("payload", _payload(), nullable=True),
        sa.Column("total", sa.Integer(), nullable=False),
        sa.Column("done", sa.Integer(), nullable=False),
        sa.Column("failed", sa.Integer(), nullable=False),
        sa.Column("cancelled", sa.Integer(), nullable=False),
        sa.Column("success_job_id", ID, nullable=True),
        sa.Column("failure_job_id", ID, nullable=True),
        sa.Column("complete_job_id", ID, nullable=True),
        sa.Column("created_at", Timestamp, nullable=False),
        sa.Column("closed_at", Timestamp, nullable=True),
        sa.Column("finished_at", Timestamp, nullable=True),
        sa.Column("pruned_at", Timestamp, nullable=False),
        sa.Index("ix_pruned_batch_at", "pruned_at"),
        **TABLE_ARGS,
    )
    op.create_index("ix_batch_finished", "job_batch", ["state", "finished_at"])
    op.add_column("prune_run", sa.Column("batch_rows", sa.Integer(), nullable=False, server_default="0"))


def downgrade() -> None:
    op.drop_column("prune_run", "batch_rows")
    op.drop_index("ix_batch_finished", "job_batch")
    op.drop_table("pruned_batch")
