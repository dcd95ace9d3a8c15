"""The schema is defined once: the tables the migrations build are the tables jobqueue/core/schema.py
describes, on MariaDB and on SQLite (Alembic's compare_metadata finds no difference)."""

from __future__ import annotations

import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext

from jobqueue.core.migrate import VERSION_TABLE
from jobqueue.core.schema import metadata


def differences(engine, target: sa.MetaData) -> list:
    with engine.connect() as conn:
        context = MigrationContext.configure(
            conn, opts={"version_table": VERSION_TABLE, "compare_type": True, "compare_server_default": True}
        )
        return compare_metadata(context, target)


def test_migrations_build_exactly_the_schema(engine):
    assert differences(engine, metadata) == []


def test_the_comparison_does_notice_a_difference(engine):
    # The check above could pass by comparing nothing: a column the migrations lack must show.
    changed = sa.MetaData()
    for table in metadata.sorted_tables:
        table.to_metadata(changed)
    changed.tables["job_queue"].append_column(sa.Column("drifted", sa.Integer(), nullable=True))
    changed.tables["worker_process"].c.queues.type = sa.String(7)
    found = differences(engine, changed)
    assert any(d[0] == "add_column" and d[3].name == "drifted" for d in found if isinstance(d, tuple)), found
