"""Payloads and results kept as the text they were written, on MySQL too.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-04

MySQL's JSON type stores a binary document: it sorts an object's keys (by length, then bytes),
drops escapes, and stores an integer outside -2^63..2^64-1 as a double without a warning, so a
handler got {"b": 1, "a": 2} back as {"a": 2, "b": 1} and 2**70 as 1.1805916207174113e+21.
MariaDB's JSON type is LONGTEXT with a JSON_VALID check, which keeps the text; this makes MySQL's
columns the same. Nothing to do on MariaDB and SQLite.

A column's type change is a table copy on MySQL (no server does it in place): ALGORITHM=COPY,
LOCK=SHARED, so reads (the dashboard) go on and writes (enqueue, claim, completion) wait until it
ends. Timed in docs/deploy.md ("Upgrading to 0008 on MySQL"): plan it for a quiet moment on a
big queue, or change the columns beforehand with an online schema change tool (then they are
skipped here). Rows written before keep MySQL's form of
their document (keys sorted, as they read before the upgrade).
"""

from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

# (table, column): the JSON documents the queue stores.
DOCUMENTS = (("job_queue", "payload"), ("job_result", "result"), ("recurring_job", "payload"))


def _on_mysql() -> bool:
    dialect = op.get_context().dialect
    return dialect.name in ("mysql", "mariadb") and not getattr(dialect, "is_mariadb", False)


def _data_type(table: str, column: str) -> str:
    return (
        op.get_bind()
        .exec_driver_sql(
            "SELECT DATA_TYPE FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = DATABASE() "
            f"AND TABLE_NAME = '{table}' AND COLUMN_NAME = '{column}'"
        )
        .scalar()
        .lower()
    )


def upgrade() -> None:
    if not _on_mysql():
        return
    for table, column in DOCUMENTS:
        # Already text: changed beforehand with an online schema change tool (docs/deploy.md).
        if _data_type(table, column) != "json":
            continue
        op.execute(
            f"ALTER TABLE {table} MODIFY {column} LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin "
            f"NOT NULL, ADD CONSTRAINT ck_{table}_{column}_json CHECK (JSON_VALID({column})), "
            "ALGORITHM=COPY, LOCK=SHARED"
        )


def downgrade() -> None:
    if not _on_mysql():
        return
    for table, column in DOCUMENTS:
        op.execute(
            f"ALTER TABLE {table} DROP CHECK ck_{table}_{column}_json, MODIFY {column} JSON NOT NULL, "
            "ALGORITHM=COPY, LOCK=SHARED"
        )
