"""No migration may copy the hot table. Every migration in jobqueue/core/migrations/versions/ is run
on a fresh MariaDB database one revision at a time, and each DDL statement it sends is read: an
ALTER TABLE job_queue must name ALGORITHM=INSTANT or ALGORITHM=INPLACE (so that the server
refuses, at deploy time, what it could only do by copying), and must not change what always
forces a copy. A copy of a big job_queue blocks every enqueue, claim and completion until it
ends. See docs/deploy.md, "Upgrades"."""

from __future__ import annotations

import re
import uuid
from pathlib import Path

import pytest
import sqlalchemy as sa
from alembic import command
from alembic.migration import MigrationContext
from alembic.operations import Operations
from alembic.script import ScriptDirectory
from sqlalchemy import event
from sqlalchemy.pool import NullPool

from jobqueue.core import migrate
from jobqueue.core.db import create_engine
from tests.conftest import SERVERS

HOT_TABLE = "job_queue"
# The copies a migration makes on purpose, by revision, each timed in docs/deploy.md ("Upgrades"):
# a column's type change, which no server does in place.
ALLOWED_COPIES = {
    "0008": "MySQL only: the JSON payload column becomes LONGTEXT with a JSON_VALID check (MySQL's JSON "
    "type sorted keys and turned 2**70 into a float); ALGORITHM=COPY, LOCK=SHARED: reads go on",
    "0009": "MySQL only: the status ENUM gains 'blocked' at its end, which MySQL does in place except on a "
    "table with CHECK constraints (0008's JSON_VALID); ALGORITHM=COPY, LOCK=SHARED: reads go on",
}
VERSIONS = Path(migrate.HERE) / "migrations" / "versions"

RULE = f"""
The rule for DDL on {HOT_TABLE} (the queue's hot table; a table copy there stops the queue):
  - every ALTER TABLE {HOT_TABLE} names its algorithm: ALGORITHM=INSTANT (ADD COLUMN at the end,
    nullable or with a constant default; DROP COLUMN; SET/DROP DEFAULT; RENAME) or
    ALGORITHM=INPLACE, LOCK=NONE (ADD/DROP INDEX). With the algorithm named, MySQL/MariaDB refuse
    an ALTER they could only do by copying, instead of silently locking the table;
  - never ALGORITHM=COPY, LOCK=SHARED or LOCK=EXCLUSIVE, and nothing that always rebuilds the
    table: MODIFY / CHANGE of a column, except with ALGORITHM=INSTANT (appending an ENUM value,
    which the server then does in the metadata or refuses; otherwise add a new column and
    backfill it in batches),
    CONVERT TO CHARACTER SET, ENGINE=, FORCE, ORDER BY, PRIMARY KEY, FULLTEXT, SPATIAL,
    PARTITION, OPTIMIZE TABLE;
  - CREATE INDEX ... ON {HOT_TABLE} is fine (InnoDB builds a secondary index in place while writes
    go on); CREATE FULLTEXT/SPATIAL INDEX is not.
How: call jobqueue.core.migrations.online (add_column, drop_column, create_index, drop_index), which
writes the ALTER with its algorithm on MySQL/MariaDB and the plain Alembic operation on SQLite;
or dispatch yourself as 0003_worker_slots.py does:
    if op.get_context().dialect.name in ("mysql", "mariadb"):
        op.execute("ALTER TABLE {HOT_TABLE} ADD COLUMN paused_at DATETIME(6) NULL, ALGORITHM=INSTANT")
    else:
        op.add_column("{HOT_TABLE}", sa.Column("paused_at", TS, nullable=True))
"""

_ALTER = re.compile(rf"^\s*ALTER\s+(?:ONLINE\s+)?(?:IGNORE\s+)?TABLE\s+`?{HOT_TABLE}`?(?=[\s,;]|$)", re.I)
_CREATE_INDEX = re.compile(rf"^\s*CREATE\s+(?:(UNIQUE|FULLTEXT|SPATIAL)\s+)?INDEX\s+\S+\s+ON\s+`?{HOT_TABLE}`?\b", re.I)
_OPTIMIZE = re.compile(rf"^\s*(OPTIMIZE|REPAIR)\s+TABLE\s+.*\b`?{HOT_TABLE}`?\b", re.I)
_ALGORITHM = re.compile(r"\bALGORITHM\s*=?\s*(\w+)", re.I)
_LOCK = re.compile(r"\bLOCK\s*=?\s*(\w+)", re.I)
_REBUILDS = [
    (re.compile(p, re.I), why)
    for p, why in (
        (r"\bMODIFY\b", "MODIFY changes a column's definition (a rebuild, or a copy)"),
        (r"\bCHANGE\b", "CHANGE changes a column's definition (a rebuild, or a copy); rename with RENAME COLUMN"),
        (r"\bCONVERT\s+TO\b", "CONVERT TO CHARACTER SET rewrites every row"),
        (r"\bENGINE\s*=", "ENGINE= rebuilds the table"),
        (r"\bFORCE\b", "FORCE rebuilds the table"),
        (r"\bORDER\s+BY\b", "ORDER BY rebuilds the table"),
        (r"\bPRIMARY\s+KEY\b", "a primary key change rebuilds the table"),
        (r"\bFULLTEXT\b", "a FULLTEXT index rebuilds the table"),
        (r"\bSPATIAL\b", "a SPATIAL index copies the table"),
        (r"\bPARTITION\b", "partitioning rebuilds the table"),
    )
]


def copying_ddl(statement: str) -> str | None:
    """Why this statement may copy (or lock) job_queue, or None when it cannot."""
    text = " ".join(statement.split())
    if _OPTIMIZE.match(text):
        return "OPTIMIZE/REPAIR TABLE rebuilds the table"
    created = _CREATE_INDEX.match(text)
    if created:
        kind = (created.group(1) or "").upper()
        return f"a {kind} index copies or rebuilds the table" if kind in ("FULLTEXT", "SPATIAL") else None
    if not _ALTER.match(text):
        return None
    algorithms = {a.upper() for a in _ALGORITHM.findall(text)}
    for pattern, why in _REBUILDS:
        if pattern.search(text):
            # A column change the server promises to do in the metadata (INSTANT), or refuses.
            if algorithms == {"INSTANT"} and pattern.pattern in (r"\bMODIFY\b", r"\bCHANGE\b"):
                continue
            return why
    if not algorithms or not algorithms <= {"INSTANT", "INPLACE", "NOCOPY"}:
        return (
            "no ALGORITHM=INSTANT or ALGORITHM=INPLACE: the server may choose COPY"
            if not algorithms
            else f"ALGORITHM={'/'.join(sorted(algorithms))} copies the table"
        )
    locks = {lock.upper() for lock in _LOCK.findall(text)}
    if locks - {"NONE", "DEFAULT"}:
        return f"LOCK={'/'.join(sorted(locks))} blocks writes while it runs"
    return None


@pytest.mark.parametrize(
    "statement, refused",
    [
        ("ALTER TABLE job_queue ADD COLUMN paused_at DATETIME(6) NULL, ALGORITHM=INSTANT", False),
        ("ALTER TABLE `job_queue` ADD INDEX ix_c (c, status), ALGORITHM=INPLACE, LOCK=NONE", False),
        ("ALTER TABLE job_queue DROP COLUMN x, ALGORITHM = INSTANT", False),
        ("ALTER TABLE job_queue ALTER COLUMN priority SET DEFAULT 0, ALGORITHM=INSTANT", False),
        ("CREATE INDEX ix_task ON job_queue (task_name, id)", False),
        ("ALTER TABLE job_attempt ADD COLUMN x INT", False),  # another table: not this rule
        ("ALTER TABLE job_queue_archive ENGINE=InnoDB", False),
        ("ALTER TABLE job_queue ADD COLUMN paused_at DATETIME(6) NULL", True),
        ("ALTER TABLE job_queue ADD COLUMN x INT, ALGORITHM=COPY", True),
        ("ALTER TABLE job_queue ADD INDEX ix (a), ALGORITHM=INPLACE, LOCK=SHARED", True),
        ("ALTER TABLE job_queue MODIFY payload LONGTEXT NOT NULL, ALGORITHM=INPLACE", True),
        ("ALTER TABLE job_queue MODIFY COLUMN status ENUM('a','b','c') NOT NULL, ALGORITHM=INSTANT", False),
        ("ALTER TABLE job_queue CHANGE COLUMN queue queue VARCHAR(128) NOT NULL, ALGORITHM=INPLACE", True),
        ("ALTER TABLE job_queue CONVERT TO CHARACTER SET utf8mb4, ALGORITHM=INPLACE", True),
        ("ALTER TABLE job_queue ENGINE=InnoDB", True),
        ("ALTER TABLE job_queue FORCE, ALGORITHM=INPLACE", True),
        ("ALTER TABLE job_queue DROP PRIMARY KEY, ADD PRIMARY KEY (id, queue), ALGORITHM=INPLACE", True),
        ("CREATE FULLTEXT INDEX ft_error ON job_queue (last_error)", True),
        ("OPTIMIZE TABLE job_queue", True),
    ],
)
def test_the_rule(statement, refused):
    assert (copying_ddl(statement) is not None) is refused, copying_ddl(statement)


@pytest.fixture
def fresh_database(db_server):
    server = SERVERS[db_server]
    name = f"jqt_ddl_{uuid.uuid4().hex[:12]}"
    admin = sa.create_engine(server + "/", poolclass=NullPool)
    with admin.connect() as conn:
        conn.exec_driver_sql(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4 COLLATE utf8mb4_bin")
    try:
        yield f"{server}/{name}"
    finally:
        with admin.connect() as conn:
            conn.exec_driver_sql(f"DROP DATABASE IF EXISTS `{name}`")
        admin.dispose()


def migration_statements(url: str) -> list[tuple[str, str, str]]:
    """(revision, file, statement) for every statement each migration sent, base to head."""
    engine = create_engine(url, pool_size=1)
    sent: list[str] = []

    @event.listens_for(engine, "before_cursor_execute")
    def capture(conn, cursor, statement, parameters, context, executemany):
        sent.append(statement)

    out = []
    try:
        with engine.connect() as conn:
            script = ScriptDirectory.from_config(migrate._config(conn))
            for rev in reversed(list(script.walk_revisions())):
                start = len(sent)
                command.upgrade(migrate._config(conn), rev.revision)
                conn.commit()
                out += [(rev.revision, Path(rev.path).name, s) for s in sent[start:]]
    finally:
        engine.dispose()
    return out


def test_no_migration_copies_job_queue(fresh_database):
    statements = migration_statements(fresh_database)
    files = {f for _, f, _ in statements}
    assert files == {p.name for p in VERSIONS.glob("*.py")}, "every migration ran"
    assert any(_ALTER.match(s) or _CREATE_INDEX.match(s) for _, _, s in statements), "the reader sees job_queue DDL"
    refused = [
        (rev, f, " ".join(s.split())[:300], why)
        for rev, f, s in statements
        if (why := copying_ddl(s)) and rev not in ALLOWED_COPIES
    ]
    assert not refused, (
        "migrations that may copy job_queue:\n"
        + "\n".join(f"  {rev} ({f}): {why}:\n      {s}" for rev, f, s, why in refused)
        + "\n"
        + RULE
    )


def test_the_allowed_copy_is_mysqls_alone_and_keeps_reads_going(fresh_database, db_server):
    copies = [(rev, s) for rev, _, s in migration_statements(fresh_database) if copying_ddl(s)]
    if db_server != "mysql":
        assert copies == []  # MariaDB's JSON is LONGTEXT with a JSON_VALID check already
        return
    assert {rev for rev, _ in copies} == set(ALLOWED_COPIES)
    assert all("ALGORITHM=COPY, LOCK=SHARED" in s for _, s in copies)
    assert all(("MODIFY payload LONGTEXT" if rev == "0008" else "MODIFY COLUMN status ENUM(") in s for rev, s in copies)


def test_the_online_helpers_follow_the_rule_and_work(db_url, db_backend):
    from jobqueue.core.migrations import online

    url = db_url
    engine = create_engine(url, pool_size=1)
    sent: list[str] = []
    event.listen(engine, "before_cursor_execute", lambda c, cur, statement, *a: sent.append(statement))
    try:
        with engine.connect() as conn:
            with Operations.context(MigrationContext.configure(conn)):
                online.add_column("job_queue", sa.Column("paused_at", sa.DateTime(), nullable=True))
                online.create_index("ix_paused", "job_queue", ["paused_at", "id"])
            conn.commit()
            columns = {c["name"] for c in sa.inspect(conn).get_columns("job_queue")}
            indexes = {i["name"] for i in sa.inspect(conn).get_indexes("job_queue")}
            with Operations.context(MigrationContext.configure(conn)):
                online.drop_index("ix_paused", "job_queue")
                online.drop_column("job_queue", "paused_at")
            conn.commit()
            after = {c["name"] for c in sa.inspect(conn).get_columns("job_queue")}
    finally:
        engine.dispose()
    assert "paused_at" in columns and "ix_paused" in indexes and "paused_at" not in after
    if db_backend != "sqlite":  # the rule is about MySQL/MariaDB (SQLite gets Alembic's plain DDL)
        assert [s for s in sent if copying_ddl(s)] == []
        assert any("ADD COLUMN" in s and "ALGORITHM=INSTANT" in s for s in sent)
        assert any("ALGORITHM=INPLACE" in s for s in sent)
