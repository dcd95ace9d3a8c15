"""The tests' databases on a shared server: each test gets one that is exactly what init_db builds,
made without running every migration again, and renewed for the next test instead of dropped.

What a test database cost, per test (created, migrated, dropped; measured under a suite's load):
MySQL 9.7 2.6-3.3 s (binlog and two fsyncs behind every DDL statement), MariaDB 0.8-1.7 s, about
half of the MySQL share of the suite. Now:

- once per process and server, one database is migrated by init_db and read back as statements
  (`schema_statements`: each table's SHOW CREATE TABLE and the rows the migrations seeded);
  tests/integration/test_schema_drift.py holds a database built from them to one init_db built;
- a test's database is built from those statements (one CREATE TABLE a table), or is one an
  earlier test gave back and `renew` made new again: the same shape (tables, columns, indexes,
  nothing else), no connection left in it, its seeded rows as seeded, and every table that was
  written (a row, or an AUTO_INCREMENT moved) truncated. Anything else is dropped as before.

The spare databases are dropped when the process exits.
"""

from __future__ import annotations

import atexit
import re
import uuid
from collections.abc import Callable

import sqlalchemy as sa
from sqlalchemy.pool import NullPool

# What a database is made of, as four numbers (compared to a new one's: equal means the same
# tables with the same engine and options, columns and indexes, and no other objects), and the
# connections still using it.
_SHAPE = """
SELECT
  (SELECT COALESCE(SUM(CRC32(CONCAT_WS('|', TABLE_NAME, TABLE_TYPE, ENGINE, TABLE_COLLATION, CREATE_OPTIONS,
          TABLE_COMMENT))), 0)
     FROM information_schema.TABLES WHERE TABLE_SCHEMA = %(db)s),
  (SELECT COALESCE(SUM(CRC32(CONCAT_WS('|', TABLE_NAME, COLUMN_NAME, ORDINAL_POSITION, COLUMN_TYPE, IS_NULLABLE,
          COALESCE(COLUMN_DEFAULT, '-'), COALESCE(COLLATION_NAME, '-'), EXTRA))), 0)
     FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = %(db)s),
  (SELECT COALESCE(SUM(CRC32(CONCAT_WS('|', TABLE_NAME, INDEX_NAME, SEQ_IN_INDEX, COLUMN_NAME, NON_UNIQUE,
          COALESCE(SUB_PART, 0)))), 0)
     FROM information_schema.STATISTICS WHERE TABLE_SCHEMA = %(db)s),
  (SELECT COUNT(*) FROM information_schema.TRIGGERS WHERE TRIGGER_SCHEMA = %(db)s)
  + (SELECT COUNT(*) FROM information_schema.ROUTINES WHERE ROUTINE_SCHEMA = %(db)s)
  + (SELECT COUNT(*) FROM information_schema.EVENTS WHERE EVENT_SCHEMA = %(db)s)
  + (SELECT COUNT(*) FROM information_schema.VIEWS WHERE TABLE_SCHEMA = %(db)s)
  + (SELECT COUNT(*) FROM information_schema.CHECK_CONSTRAINTS WHERE CONSTRAINT_SCHEMA = %(db)s)
  + (SELECT COUNT(*) FROM information_schema.REFERENTIAL_CONSTRAINTS WHERE CONSTRAINT_SCHEMA = %(db)s),
  (SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE DB = %(db)s AND ID <> CONNECTION_ID())
"""


def schema_statements(conn) -> tuple[list[str], dict[str, list[tuple]]]:
    """CREATE TABLE and INSERT statements that rebuild the tables of `conn`'s database, and the
    rows of each table that has any (sorted)."""
    statements, rows = [], {}
    for (table,) in conn.exec_driver_sql("SHOW TABLES").all():
        create = conn.exec_driver_sql(f"SHOW CREATE TABLE `{table}`").one()[1]
        statements.append(re.sub(r" AUTO_INCREMENT=\d+", "", create))
        for row in conn.exec_driver_sql(f"SELECT * FROM `{table}`").mappings():
            columns = ", ".join(f"`{c}`" for c in row)
            values = ", ".join(_literal(v) for v in row.values())
            statements.append(f"INSERT INTO `{table}` ({columns}) VALUES ({values})")
            rows.setdefault(table, []).append(tuple(row.values()))
    return statements, {table: sorted(found) for table, found in rows.items()}


def _literal(value) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str) and re.fullmatch(r"[\w .:-]*", value):
        return f"'{value}'"
    raise TypeError(f"schema_statements: a seeded value it cannot copy: {value!r}")


class Databases:
    """Test databases on one server (`server_url`: no database in it). `migrate(url)` builds
    a database's schema the real way (init_db)."""

    def __init__(self, server_url: str, migrate: Callable[[str], None]):
        self.server_url = server_url
        self.migrate = migrate
        self.admin = sa.create_engine(server_url + "/", poolclass=NullPool)
        self._statements: list[str] | None = None
        self._seeded: dict[str, list[tuple]] = {}  # table -> the rows the migrations put in it
        self._shape: tuple | None = None
        self._mysql = False  # MySQL rather than MariaDB (read with the statements)
        self._spare: list[str] = []
        self.renewed = 0  # how often a database was renewed rather than made (for the note)

    def url(self, name: str) -> str:
        return f"{self.server_url}/{name}"

    def create(self) -> str:
        """A new, empty database's name."""
        name = f"jqt_{uuid.uuid4().hex[:16]}"
        with self.admin.connect() as conn:
            conn.exec_driver_sql(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4 COLLATE utf8mb4_bin")
        return name

    def drop(self, name: str) -> None:
        with self.admin.connect() as conn:
            conn.exec_driver_sql(f"DROP DATABASE IF EXISTS `{name}`")

    def take(self) -> str:
        """A database as init_db would leave a new one: a spare, or one built now."""
        if self._spare:
            return self._spare.pop()
        statements = self.statements()
        name = self.create()
        with self.admin.connect() as conn:
            conn.exec_driver_sql(f"USE `{name}`")
            for statement in statements:
                conn.exec_driver_sql(statement)
            conn.commit()
            if self._shape is None:
                self._shape = tuple(conn.exec_driver_sql(_SHAPE, {"db": name}).one())
        return name

    def give_back(self, name: str) -> None:
        """The test is done with `name`: renewed as a spare, or dropped."""
        if self._renew(name):
            self._spare.append(name)
            self.renewed += 1
        else:
            self.drop(name)

    def statements(self) -> list[str]:
        if self._statements is None:
            name = self.create()
            try:
                self.migrate(self.url(name))
                with self.admin.connect() as conn:
                    conn.exec_driver_sql(f"USE `{name}`")
                    self._statements, self._seeded = schema_statements(conn)
                    self._mysql = "mariadb" not in conn.exec_driver_sql("SELECT VERSION()").scalar().lower()
            finally:
                self.drop(name)
        return self._statements

    def _renew(self, name: str) -> bool:
        with self.admin.connect() as conn:
            if self._mysql:
                # MySQL caches AUTO_INCREMENT in information_schema.TABLES for a day by default
                conn.exec_driver_sql("SET SESSION information_schema_stats_expiry = 0")
            *shape, others = conn.exec_driver_sql(_SHAPE, {"db": name}).one()
            if others or tuple(shape) != self._shape[:-1]:
                return False
            tables = conn.exec_driver_sql(
                "SELECT TABLE_NAME, AUTO_INCREMENT FROM information_schema.TABLES WHERE TABLE_SCHEMA = %(db)s",
                {"db": name},
            ).all()
            written = {
                table
                for (table,) in conn.exec_driver_sql(
                    " UNION ALL ".join(f"(SELECT '{t}' FROM `{name}`.`{t}` LIMIT 1)" for t, _ in tables)
                )
            }
            for table, rows in self._seeded.items():
                now = sorted(tuple(r) for r in conn.exec_driver_sql(f"SELECT * FROM `{name}`.`{table}`"))
                if now != rows:
                    return False
            for table, next_id in tables:
                if table not in self._seeded and (table in written or (next_id or 1) > 1):
                    conn.exec_driver_sql(f"TRUNCATE TABLE `{name}`.`{table}`")
        return True

    def close(self) -> None:
        while self._spare:
            self.drop(self._spare.pop())
        self.admin.dispose()


_all: dict[str, Databases] = {}


def databases(server_url: str, migrate: Callable[[str], None]) -> Databases:
    """The one Databases of this process for `server_url`."""
    if server_url not in _all:
        _all[server_url] = Databases(server_url, migrate)
    return _all[server_url]


@atexit.register
def _close_all() -> None:
    for each in _all.values():
        each.close()
