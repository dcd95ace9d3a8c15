"""Batches: job_batch (counters and callbacks) and job_batch_member.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-04

Two new tables and nothing changed in job_queue: a member carries 0009's has_dependents flag
(read by the locks every finishing path already takes), so a job outside any batch pays nothing.
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision = "0010"
down_revision = "0009"
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
        "job_batch",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True, autoincrement=True),
        sa.Column("batch_key", sa.String(64), nullable=False),
        sa.Column("state", sa.String(10), nullable=False),
        sa.Column("on_success", sa.String(100), nullable=True),
        sa.Column("on_failure", sa.String(100), nullable=True),
        sa.Column("on_complete", sa.String(100), nullable=True),
        sa.Column("payload", _payload(), nullable=True),
        sa.Column("total", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("done", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("failed", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("cancelled", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("success_job_id", ID, nullable=True),
        sa.Column("failure_job_id", ID, nullable=True),
        sa.Column("complete_job_id", ID, nullable=True),
        sa.Column("created_at", Timestamp, nullable=False),
        sa.Column("closed_at", Timestamp, nullable=True),
        sa.Column("finished_at", Timestamp, nullable=True),
        sa.UniqueConstraint("batch_key", name="uk_batch_key"),
        **TABLE_ARGS,
    )
    op.create_table(
        "job_batch_member",
        sa.Column("job_id", ID, primary_key=True, autoincrement=False),
        sa.Column("batch_id", ID, nullable=False),
        sa.Column("counted", sa.String(10), nullable=True),
        sa.Index("ix_batch_member", "batch_id", "job_id"),
        **TABLE_ARGS,
    )


def downgrade() -> None:
    op.drop_table("job_batch_member")
    op.drop_table("job_batch")
