"""The schema is defined once: the tables the migrations build are the tables jobqueue/core/schema.py
describes, on every server and on SQLite (Alembic's compare_metadata finds no difference); and the
databases the other tests get (built from conftest.migrated_schema, not by running every migration)
are exactly what the migrations build."""

from __future__ import annotations

import contextlib

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext

from jobqueue.core.db import create_engine
from jobqueue.core.migrate import VERSION_TABLE, head_revision, init_db
from jobqueue.core.schema import metadata
from tests.conftest import _sqlite, database_on


@pytest.fixture
def engine(db_backend, tmp_path):
    """A database every migration built (not the other tests' copy of one)."""
    with contextlib.ExitStack() as stack:
        url = (
            _sqlite(tmp_path)
            if db_backend == "sqlite"
            else stack.enter_context(database_on(db_backend, migrations=True))
        )
        eng = create_engine(url, pool_size=2)
        stack.callback(eng.dispose)
        yield eng


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


def described(conn) -> dict:
    """What information_schema says of the database's tables, columns, indexes and other objects,
    and the tables' rows (SHOW CREATE TABLE's text differs on MySQL with how a table was created:
    an explicit CHARACTER SET shows or not)."""
    where = "WHERE {}_SCHEMA = DATABASE() ORDER BY 1, 2, 3"
    queries = {
        "tables": "SELECT TABLE_NAME, ENGINE, TABLE_COLLATION, CREATE_OPTIONS FROM information_schema.TABLES "
        + where.format("TABLE"),
        "columns": "SELECT TABLE_NAME, ORDINAL_POSITION, COLUMN_NAME, COLUMN_DEFAULT, IS_NULLABLE, COLUMN_TYPE, "
        "CHARACTER_SET_NAME, COLLATION_NAME, EXTRA FROM information_schema.COLUMNS " + where.format("TABLE"),
        "indexes": "SELECT TABLE_NAME, INDEX_NAME, SEQ_IN_INDEX, COLUMN_NAME, NON_UNIQUE, SUB_PART, COLLATION "
        "FROM information_schema.STATISTICS " + where.format("TABLE"),
        "triggers": "SELECT TRIGGER_NAME, 1, 1 FROM information_schema.TRIGGERS " + where.format("TRIGGER"),
        "routines": "SELECT ROUTINE_NAME, 1, 1 FROM information_schema.ROUTINES " + where.format("ROUTINE"),
        "events": "SELECT EVENT_NAME, 1, 1 FROM information_schema.EVENTS " + where.format("EVENT"),
    }
    out = {name: [tuple(row) for row in conn.exec_driver_sql(sql)] for name, sql in queries.items()}
    for (table,) in conn.exec_driver_sql("SHOW TABLES").all():
        out[table] = sorted(tuple(row) for row in conn.exec_driver_sql(f"SELECT * FROM `{table}`"))
    return out


def test_the_test_databases_are_what_the_migrations_build(db_server):
    with database_on(db_server, migrations=True) as real_url, database_on(db_server) as copy_url:
        real, copy = (sa.create_engine(url, poolclass=sa.pool.NullPool) for url in (real_url, copy_url))
        with real.connect() as a, copy.connect() as b:
            built = described(a)
            assert built["tables"] and built["columns"] and built["indexes"]
            assert described(b) == built
        for eng in (real, copy):
            eng.dispose()
        # init_db finds the copy at the newest revision: nothing to do
        migrated = create_engine(copy_url, pool_size=1)
        assert init_db(migrated) == (head_revision(), head_revision())
        migrated.dispose()
