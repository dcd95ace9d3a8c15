"""DDL for the hot table that never copies it, for migrations to call instead of op.add_column /
op.create_index on `job_queue` (tests/integration/test_migration_ddl.py refuses anything else).

On MySQL / MariaDB an ALTER TABLE without an ALGORITHM clause lets the server pick, and for some
changes it picks COPY: a new table is written row by row while writes to the old one wait, i.e.
no enqueue, claim or completion for as long as the copy of a large queue takes. Naming the
algorithm turns that into an error at deploy time instead (the server refuses an ALTER it cannot
do that way), so every ALTER TABLE job_queue here says ALGORITHM=INSTANT (metadata only: ADD
COLUMN, DROP COLUMN on MariaDB 10.4+ / MySQL 8.0.29+, defaults, renames) or ALGORITHM=INPLACE,
LOCK=NONE (indexes: built while reads and writes go on). SQLite gets the plain Alembic operation.

    from jobqueue.core.migrations import online

    def upgrade() -> None:
        online.add_column("job_queue", sa.Column("paused_at", TS, nullable=True))
        online.create_index("ix_concurrency", "job_queue", ["concurrency_key", "status"])
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.schema import CreateColumn


def _on_mysql() -> bool:
    return op.get_context().dialect.name in ("mysql", "mariadb")


def add_column(table: str, column: sa.Column, *, algorithm: str = "INSTANT") -> None:
    """A new column, nullable or with a constant default, at the end of the table."""
    if not _on_mysql():
        op.add_column(table, column)
        return
    ddl = CreateColumn(column).compile(dialect=op.get_context().dialect)
    op.execute(f"ALTER TABLE {table} ADD COLUMN {ddl}, ALGORITHM={algorithm}")


def drop_column(table: str, name: str, *, algorithm: str = "INSTANT") -> None:
    if not _on_mysql():
        op.drop_column(table, name)
        return
    op.execute(f"ALTER TABLE {table} DROP COLUMN {name}, ALGORITHM={algorithm}")


def create_index(name: str, table: str, columns: Sequence[str], *, unique: bool = False) -> None:
    """A secondary index built in place while the table takes reads and writes."""
    if not _on_mysql():
        op.create_index(name, table, list(columns), unique=unique)
        return
    op.execute(
        f"ALTER TABLE {table} ADD {'UNIQUE ' if unique else ''}INDEX {name} ({', '.join(columns)}), "
        "ALGORITHM=INPLACE, LOCK=NONE"
    )


def drop_index(name: str, table: str) -> None:
    if not _on_mysql():
        op.drop_index(name, table_name=table)
        return
    op.execute(f"ALTER TABLE {table} DROP INDEX {name}, ALGORITHM=INPLACE, LOCK=NONE")
