"""What a mature queue has: the `cancelled` status, concurrency keys, paused queues, recurring
jobs, and retention (the keys of pruned jobs, the prune log).

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-02

On MySQL/MariaDB every change to job_queue is metadata only: an ENUM value appended at the end
and nullable columns at the end are INSTANT (MariaDB 10.3+, MySQL 8.0), and the index on the
index on (concurrency_key, status) is built INPLACE with concurrent DML (LOCK=NONE). Nothing
copies the table. (Not an indexed virtual column "the key while running": with one, MariaDB
refuses every later ADD COLUMN on job_queue both INSTANT (1845) and INPLACE, LOCK=NONE (1846), so
each future migration would have to copy the queue's hot table.)
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision = "0005"
down_revision = "0004"
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
OLD_STATUSES = "'scheduled','ready','running','done','failed'"
NEW_STATUSES = OLD_STATUSES + ",'cancelled'"


def _mysql() -> bool:
    return op.get_context().dialect.name in ("mysql", "mariadb")


def upgrade() -> None:
    if _mysql():
        op.execute(f"ALTER TABLE job_queue MODIFY COLUMN status ENUM({NEW_STATUSES}) NOT NULL, ALGORITHM=INSTANT")
        op.execute("ALTER TABLE job_queue ADD COLUMN concurrency_key VARCHAR(200) NULL, ALGORITHM=INSTANT")
        op.execute(
            "ALTER TABLE job_queue ADD INDEX ix_concurrency (concurrency_key, status), ALGORITHM=INPLACE, LOCK=NONE"
        )
    else:
        # SQLite stores the status as text: nothing to change for a new value.
        op.add_column("job_queue", sa.Column("concurrency_key", sa.String(200), nullable=True))
        op.create_index("ix_concurrency", "job_queue", ["concurrency_key", "status"])

    op.create_table(
        "queue_state",
        sa.Column("queue", sa.String(64), primary_key=True),
        sa.Column("paused", sa.Boolean(), nullable=False),
        sa.Column("changed_at", TS, nullable=False),
        sa.Column("changed_by", sa.String(100), nullable=False),
        **TABLE_ARGS,
    )
    op.create_table(
        "recurring_job",
        sa.Column("name", sa.String(50), primary_key=True),
        sa.Column("cron", sa.String(100), nullable=False),
        sa.Column("task_name", sa.String(100), nullable=False),
        sa.Column("payload", sa.JSON(), nullable=False),
        sa.Column("queue", sa.String(64), nullable=True),
        sa.Column("enabled", sa.Boolean(), nullable=False),
        sa.Column("source", sa.String(10), nullable=False),
        sa.Column("next_run_at", TS, nullable=False),
        sa.Column("last_run_at", TS, nullable=True),
        sa.Column("last_job_id", sa.BigInteger(), nullable=True),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("updated_at", TS, nullable=False),
        sa.Column("updated_by", sa.String(100), nullable=False),
        **TABLE_ARGS,
    )
    op.create_table(
        "concurrency_key",
        sa.Column("name", sa.String(200), primary_key=True),
        sa.Column("max_running", sa.Integer(), nullable=False),
        sa.Column("updated_at", TS, nullable=False),
        **TABLE_ARGS,
    )
    op.create_table(
        "pruned_key",
        sa.Column("task_key", sa.String(80), primary_key=True),
        sa.Column("job_id", sa.BigInteger(), nullable=False),
        sa.Column("status", sa.String(10), nullable=False),
        sa.Column("finished_at", TS, nullable=True),
        sa.Column("pruned_at", TS, nullable=False),
        **TABLE_ARGS,
    )
    op.create_index("ix_pruned_at", "pruned_key", ["pruned_at"])
    op.create_table(
        "prune_run",
        sa.Column("id", ID, primary_key=True, autoincrement=True),
        sa.Column("started_at", TS, nullable=False),
        sa.Column("finished_at", TS, nullable=True),
        sa.Column("run_by", sa.String(100), nullable=False),
        sa.Column("done_rows", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("failed_rows", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("cancelled_rows", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("attempt_rows", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("keys_expired", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("batches", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("seconds", sa.Float(), nullable=True),
        **TABLE_ARGS,
    )


def downgrade() -> None:
    op.drop_table("prune_run")
    op.drop_table("pruned_key")
    op.drop_table("concurrency_key")
    op.drop_table("recurring_job")
    op.drop_table("queue_state")
    op.drop_index("ix_concurrency", table_name="job_queue")
    op.drop_column("job_queue", "concurrency_key")
    # A cancelled job becomes failed: the nearest status the old schema has.
    op.execute("UPDATE job_queue SET status = 'failed' WHERE status = 'cancelled'")
    if _mysql():
        op.execute(f"ALTER TABLE job_queue MODIFY COLUMN status ENUM({OLD_STATUSES}) NOT NULL")
