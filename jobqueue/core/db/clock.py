"""The database clock: every timestamp that matters for leases comes from the server, so hosts
with skewed clocks still agree on when a lease expires. SQLite's clock is `sqlite_clock`."""

from __future__ import annotations

import time
from datetime import UTC, datetime

import sqlalchemy as sa
from sqlalchemy.engine import Connection
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.expression import FunctionElement

from ..schema import Timestamp


# SQLite has no clock of its own that we can shift, so the database clock is this function; a
# test may replace `clock.sqlite_clock` to move time (the lease state machine's Hypothesis test does).
def sqlite_clock() -> float:
    return time.time()


def sqlite_now() -> str:
    return datetime.fromtimestamp(sqlite_clock(), UTC).strftime("%Y-%m-%d %H:%M:%S.%f")


def sqlite_now_plus(microseconds: int) -> str:
    ts = sqlite_clock() + microseconds / 1e6
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S.%f")


def sqlite_micros_since(stamp: str | None) -> int | None:
    if stamp is None:
        return None
    then = datetime.fromisoformat(stamp).replace(tzinfo=UTC)
    return int((sqlite_clock() - then.timestamp()) * 1_000_000)


class db_now(FunctionElement):
    """The database's current UTC time with microseconds."""

    type = Timestamp
    inherit_cache = True


class db_after(FunctionElement):
    """The database's current UTC time plus a number of seconds."""

    type = Timestamp
    inherit_cache = True

    def __init__(self, seconds: float | None = None, *, micros: sa.BindParameter | None = None):
        # `micros` names a bind parameter instead, for executemany with a delay per row.
        if micros is None:
            micros = sa.bindparam(None, int(round(seconds * 1_000_000)), type_=sa.BigInteger)
        super().__init__(micros)


class db_micros_since(FunctionElement):
    """Microseconds from a timestamp column to the database's current UTC time."""

    type = sa.BigInteger()
    inherit_cache = True


@compiles(db_micros_since, "mysql")
@compiles(db_micros_since, "mariadb")
def _db_micros_since_mysql(element, compiler, **kw):
    return f"TIMESTAMPDIFF(MICROSECOND, {compiler.process(element.clauses, **kw)}, UTC_TIMESTAMP(6))"


@compiles(db_micros_since, "sqlite")
def _db_micros_since_sqlite(element, compiler, **kw):
    return f"jq_micros_since({compiler.process(element.clauses, **kw)})"


@compiles(db_now, "mysql")
@compiles(db_now, "mariadb")
def _db_now_mysql(element, compiler, **kw):
    return "UTC_TIMESTAMP(6)"


@compiles(db_now, "sqlite")
def _db_now_sqlite(element, compiler, **kw):
    return "jq_now()"


@compiles(db_after, "mysql")
@compiles(db_after, "mariadb")
def _db_after_mysql(element, compiler, **kw):
    return f"(UTC_TIMESTAMP(6) + INTERVAL {compiler.process(element.clauses, **kw)} MICROSECOND)"


@compiles(db_after, "sqlite")
def _db_after_sqlite(element, compiler, **kw):
    return f"jq_now_plus({compiler.process(element.clauses, **kw)})"


def reads_committed(conn: Connection) -> bool:
    """Whether this connection's transactions run at READ COMMITTED for certain: the queue's own
    engines do (create_engine), unless a connection was given another level. An application's
    engine runs at whatever its server or its code says (REPEATABLE READ by default)."""
    level = conn.get_execution_options().get("isolation_level")
    return getattr(conn.engine, "read_committed", False) and level in (None, "READ COMMITTED")
