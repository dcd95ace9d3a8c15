"""Engines, the database clock, and transactions that survive deadlocks and lost connections.

Two kinds of server are supported:
- MySQL >= 8.0.1 / MariaDB >= 10.6 through PyMySQL: the production path, with row locks and
  SKIP LOCKED. Sessions run at READ COMMITTED: locking reads take no gap locks there, so claims,
  enqueues and the reaper do not deadlock on index gaps the way they do under REPEATABLE READ.
- SQLite (the embedded default for one host): no row locks, so every transaction starts with
  BEGIN IMMEDIATE and claims are serialised by the database file's write lock.

All timestamps that matter for leases come from the database clock, so hosts with skewed clocks
still agree on when a lease expires.
"""

from __future__ import annotations

import logging
import os
import random
import sqlite3
import time
from collections.abc import Callable
from datetime import datetime, timezone
from typing import TypeVar

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine import Connection, Engine, make_url
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.expression import FunctionElement

from . import metrics
from .errors import TransientDatabaseError
from .schema import Timestamp

log = logging.getLogger("jobqueue.db")

T = TypeVar("T")

ENV_URL = "JOBQUEUE_DATABASE_URL"
ENV_INSTANCE = "JOBQUEUE_INSTANCE_PATH"
DEFAULT_LOCK_WAIT_SECONDS = 5

# MySQL / MariaDB error codes we act on.
ER_LOCK_WAIT_TIMEOUT = 1205   # also MariaDB's answer to NOWAIT on a locked row
ER_LOCK_DEADLOCK = 1213
ER_LOCK_NOWAIT = 3572         # MySQL 8.0's answer to NOWAIT on a locked row
ER_CONNECTION_KILLED = 1927   # MariaDB
ER_SERVER_SHUTDOWN = 1053
CR_CONNECTION_ERRORS = {2002, 2003, 2006, 2013, 2055}


def default_sqlite_path() -> str:
    folder = os.environ.get(ENV_INSTANCE) or os.path.join(os.getcwd(), "instance")
    return os.path.join(folder, "jobqueue.sqlite3")


def resolve_url(url: str | None = None) -> str:
    """The database URL from the argument, then JOBQUEUE_DATABASE_URL, then embedded SQLite."""
    url = url or os.environ.get(ENV_URL)
    if not url:
        path = default_sqlite_path()
        os.makedirs(os.path.dirname(path), exist_ok=True)
        return f"sqlite:///{path}"
    # Operators write mysql://; PyMySQL is the driver we ship and test.
    for bare in ("mysql", "mariadb"):
        if url.startswith(bare + "://"):
            return f"{bare}+pymysql://" + url[len(bare) + 3:]
    return url


def is_mysql(engine_or_conn: Engine | Connection) -> bool:
    return engine_or_conn.dialect.name in ("mysql", "mariadb")


def create_engine(url: str | None = None, *, pool_size: int = 10, lock_wait_seconds: int | None = None) -> Engine:
    url = resolve_url(url)
    if lock_wait_seconds is None:
        lock_wait_seconds = int(os.environ.get("JOBQUEUE_LOCK_WAIT_SECONDS", DEFAULT_LOCK_WAIT_SECONDS))
    backend = make_url(url).get_backend_name()
    if backend in ("mysql", "mariadb"):
        return sa.create_engine(
            url,
            isolation_level="READ COMMITTED",
            pool_size=pool_size,
            max_overflow=pool_size,
            pool_recycle=1800,
            # Every use ends its own transaction (db.transaction commits or rolls back; closing a
            # Connection with one open rolls it back), so the pool's extra ROLLBACK on check-in
            # would be a wasted round trip on every claim and completion.
            pool_reset_on_return=None,
            connect_args={
                "charset": "utf8mb4",
                "connect_timeout": 10,
                # Our own row-lock waits (fenced completions, operator actions) give up in
                # seconds, not the server's default 50 s; claims never wait at all.
                "init_command": f"SET SESSION innodb_lock_wait_timeout = {int(lock_wait_seconds)}",
            },
        )
    if backend == "sqlite":
        in_memory = make_url(url).database in (None, "", ":memory:")
        engine = sa.create_engine(
            url, connect_args={"timeout": 30, "check_same_thread": False},
            **({} if in_memory else {"pool_size": pool_size, "max_overflow": pool_size}),
        )
        _configure_sqlite(engine)
        return engine
    raise ValueError(f"unsupported database URL {url!r}: use mysql+pymysql://, mariadb+pymysql:// or sqlite:///")


def _sqlite_now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M:%S.%f")


def _sqlite_now_plus(microseconds: int) -> str:
    ts = datetime.now(timezone.utc).timestamp() + microseconds / 1e6
    return datetime.fromtimestamp(ts, timezone.utc).strftime("%Y-%m-%d %H:%M:%S.%f")


def _configure_sqlite(engine: Engine) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: sqlite3.Connection, _record) -> None:
        # Take transaction control away from the sqlite3 module so that BEGIN IMMEDIATE below is
        # the only BEGIN: it grabs the write lock up front, which is SQLite's stand-in for the
        # row locks a claim needs.
        dbapi_conn.isolation_level = None
        dbapi_conn.execute("PRAGMA journal_mode=WAL")
        dbapi_conn.execute("PRAGMA synchronous=NORMAL")
        dbapi_conn.execute("PRAGMA busy_timeout=30000")
        dbapi_conn.create_function("jq_now", 0, _sqlite_now)
        dbapi_conn.create_function("jq_now_plus", 1, _sqlite_now_plus)

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        conn.exec_driver_sql("BEGIN IMMEDIATE")


# --- the database clock ------------------------------------------------------------------------

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


# --- transactions --------------------------------------------------------------------------------

def error_code(exc: BaseException) -> int | None:
    orig = getattr(exc, "orig", None)
    args = getattr(orig, "args", None)
    if args and isinstance(args[0], int):
        return args[0]
    return None


def transient_kind(exc: DBAPIError) -> str | None:
    """'deadlock', 'lock_timeout' or 'disconnect' for errors worth retrying, else None."""
    if exc.connection_invalidated:
        return "disconnect"
    code = error_code(exc)
    if code == ER_LOCK_DEADLOCK:
        return "deadlock"
    if code == ER_LOCK_WAIT_TIMEOUT:
        return "lock_timeout"
    if code in CR_CONNECTION_ERRORS or code in (ER_CONNECTION_KILLED, ER_SERVER_SHUTDOWN):
        return "disconnect"
    if isinstance(exc.orig, sqlite3.OperationalError) and "locked" in str(exc.orig):
        return "lock_timeout"
    return None


def transaction(conn: Connection, fn: Callable[[Connection], T], *, what: str,
                attempts: int = 6, base_delay: float = 0.01) -> T:
    """Run `fn(conn)` in its own short transaction; retry deadlocks, lock-wait timeouts and lost
    connections with jittered exponential backoff.

    InnoDB resolves a deadlock by rolling back one transaction, and a connection can drop between
    two statements; both are normal for a queue under load. They are counted and retried, and
    only when they persist does the caller see TransientDatabaseError.
    """
    if conn.in_transaction():
        # The caller owns the transaction (say, an enqueue next to its own business rows); it
        # also owns commit and retry.
        return fn(conn)
    for attempt in range(1, attempts + 1):
        try:
            with conn.begin():
                return fn(conn)
        except DBAPIError as exc:
            kind = transient_kind(exc)
            if kind is None:
                raise
            metrics.TRANSIENT_RETRIES.labels(kind=kind, operation=what).inc()
            # A deadlock is resolved at once and worth retrying; each lock-wait timeout already
            # cost a full innodb_lock_wait_timeout, so give up on the second.
            if attempt == attempts or (kind == "lock_timeout" and attempt >= 2):
                raise TransientDatabaseError(f"{what}: {kind} persisted after {attempt} attempts: {exc.orig}") from exc
            delay = base_delay * (2 ** (attempt - 1)) * random.uniform(0.5, 1.5)
            log.warning("event=db_retry operation=%s kind=%s attempt=%d delay_ms=%.0f error=%r",
                        what, kind, attempt, delay * 1000, str(exc.orig)[:200])
            time.sleep(delay)
    raise AssertionError("unreachable")
