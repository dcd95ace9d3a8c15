"""Dependencies: the `blocked` status, job_dependency, and job_queue.has_dependents.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-04

`blocked` goes at the END of the enum so that MariaDB changes it in place (INSTANT). MySQL
refuses INSTANT and INPLACE for any MODIFY of a table with a CHECK constraint (0008's JSON_VALID
checks): there it is a table copy (ALGORITHM=COPY, LOCK=SHARED: reads go on, writes wait), like
0008's, so plan it as 0008 (docs/deploy.md: it is skipped when an online schema change tool
appended the value beforehand). has_dependents is an INSTANT ADD COLUMN on both.
has_dependents is read by the locks a completion already takes, so a job that nothing waits for
pays no statement to find out.
"""

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
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
OLD_STATUSES = "'scheduled','ready','running','done','failed','cancelled'"
NEW_STATUSES = OLD_STATUSES + ",'blocked'"


def _mysql() -> bool:
    return op.get_context().dialect.name in ("mysql", "mariadb")


def _on_mysql_proper() -> bool:
    dialect = op.get_context().dialect
    return _mysql() and not getattr(dialect, "is_mariadb", False)


def _has_blocked() -> bool:
    column_type = (
        op.get_bind()
        .exec_driver_sql(
            "SELECT COLUMN_TYPE FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = DATABASE() "
            "AND TABLE_NAME = 'job_queue' AND COLUMN_NAME = 'status'"
        )
        .scalar()
    )
    return "'blocked'" in column_type


def upgrade() -> None:
    if _mysql():
        # Already there: appended beforehand with an online schema change tool (docs/deploy.md).
        if not _has_blocked():
            how = "ALGORITHM=COPY, LOCK=SHARED" if _on_mysql_proper() else "ALGORITHM=INSTANT"
            op.execute(f"ALTER TABLE job_queue MODIFY COLUMN status ENUM({NEW_STATUSES}) NOT NULL, {how}")
        op.execute("ALTER TABLE job_queue ADD COLUMN has_dependents BOOL NOT NULL DEFAULT 0, ALGORITHM=INSTANT")
    else:
        # SQLite stores the status as text: nothing to change for a new value.
        op.add_column("job_queue", sa.Column("has_dependents", sa.Boolean(), nullable=False, server_default="0"))
    op.create_table(
        "job_dependency",
        sa.Column("parent_id", ID, primary_key=True, autoincrement=False),
        sa.Column("child_id", ID, primary_key=True, autoincrement=False),
        sa.Column("on_parent_failure", sa.String(10), nullable=False),
        sa.Index("ix_dependency_child", "child_id"),
        **TABLE_ARGS,
    )


def downgrade() -> None:
    op.drop_table("job_dependency")
    op.drop_column("job_queue", "has_dependents")
    # A blocked job becomes cancelled: the old schema cannot wait for its parents.
    op.execute("UPDATE job_queue SET status = 'cancelled' WHERE status = 'blocked'")
    if _mysql():
        op.execute(f"ALTER TABLE job_queue MODIFY COLUMN status ENUM({OLD_STATUSES}) NOT NULL")
