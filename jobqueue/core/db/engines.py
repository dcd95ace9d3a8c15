"""Engines: the URLs, the pool, the session settings (READ COMMITTED, lock waits, statement
time limits), SQLite's stand-ins for row locks and the clock."""

from __future__ import annotations

import logging
import os
import sqlite3
import time
from collections.abc import Callable, Sequence

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine import Connection, Engine, make_url

from ..settings import Settings, current
from .clock import sqlite_micros_since, sqlite_now, sqlite_now_plus
from .drivers import DRIVERS
from .primary import Candidates, is_mariadb, watch_roles
from .transactions import REQUEST_TRANSACTION

log = logging.getLogger("jobqueue.db")

DEFAULT_LOCK_WAIT_SECONDS = 5


def default_sqlite_path(settings: Settings | None = None) -> str:
    folder = (settings or current()).instance_path or os.path.join(os.getcwd(), "instance")
    return os.path.join(folder, "jobqueue.sqlite3")


def resolve_urls(url: str | Sequence[str] | None = None, settings: Settings | None = None) -> list[str]:
    """Candidate URLs from the argument (one URL, or several separated by spaces), then the
    settings, then embedded SQLite. `mysql://` means PyMySQL, the default driver;
    `mysql+mysqldb://` means mysqlclient (the optional extra, see drivers.py), for one server only:
    failover across several candidates is tested with PyMySQL alone."""
    if isinstance(url, str):
        urls = url.split()
    elif url:
        urls = list(url)
    else:
        urls = list((settings or current()).database_urls)
    if not urls:
        path = default_sqlite_path(settings)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        return [f"sqlite:///{path}"]
    out = []
    for one in urls:
        for bare in ("mysql", "mariadb"):
            if one.startswith(bare + "://"):
                one = f"{bare}+pymysql://" + one[len(bare) + 3 :]
        out.append(one)
    backends = {make_url(u).get_backend_name() for u in out}
    if len(out) > 1 and backends - {"mysql", "mariadb"}:
        raise ValueError("several database URLs are candidate MySQL/MariaDB primaries; SQLite takes one URL")
    if backends & {"mysql", "mariadb"}:
        drivers = {make_url(u).get_driver_name() for u in out}
        if drivers - set(DRIVERS):
            raise ValueError(
                f"unsupported MySQL driver {sorted(drivers - set(DRIVERS))[0]!r}: use mysql+pymysql:// (the default) "
                "or mysql+mysqldb:// (mysqlclient)"
            )
        if len(out) > 1 and drivers != {"pymysql"}:
            raise ValueError(
                "several candidate primaries need PyMySQL (mysql+pymysql:// in every URL): failover is not "
                "supported with mysql+mysqldb://"
            )
    return out


def resolve_url(url: str | None = None) -> str:
    return resolve_urls(url)[0]


# --- engines -------------------------------------------------------------------------------------


def create_engine(
    url: str | Sequence[str] | None = None,
    *,
    pool_size: int = 10,
    lock_wait_seconds: int | None = None,
    statement_timeout_seconds: float | None = None,
    settings: Settings | None = None,
    read_only: bool = False,
    idle_transaction_seconds: int | None = None,
) -> Engine:
    """An engine for the queue. `url` is one URL or several candidate primaries (default: the
    settings). `statement_timeout_seconds` bounds every statement, and makes metadata-lock
    waits as short as row-lock waits and lock-wait timeouts answered without a second try (web
    requests use it, so a table held by LOCK TABLES answers 503 within `lock_wait_seconds`
    instead of tying up a thread); workers leave it off, since their statements are short by
    construction.

    `read_only` makes an engine for reads from a replica (JOBQUEUE_READ_URL): its sessions are
    READ ONLY, so not even an account with SUPER could write through it, and its server's role is
    not watched (a replica is expected to be read-only).

    `idle_transaction_seconds` bounds how long the server keeps a transaction whose client stopped
    sending statements (a worker frozen or cut off mid-claim holds job rows and the queues' share
    locks until its transaction ends): MariaDB's `idle_transaction_timeout`; MySQL has none, so
    its sessions' `wait_timeout`, and a connection idle in the pool for nearly that long (5 s
    short) is replaced before use rather than handed out closed; the pool hands out the connection
    used last, so an idle worker keeps one alive and lets the others go. Worker engines set it;
    an engine whose transactions are the application's (the client's) does not. Connections kept
    open while idle (the doorbell's, the idle probe's) take the server's default again:
    `keep_when_idle`."""
    settings = settings or current()
    urls = resolve_urls(url, settings)
    if lock_wait_seconds is None:
        lock_wait_seconds = settings.lock_wait_seconds
    backend = make_url(urls[0]).get_backend_name()
    if backend in ("mysql", "mariadb"):
        # Our own row-lock waits (fenced completions, operator actions) give up in seconds, not
        # the server's default 50 s; claims never wait at all.
        init = [f"innodb_lock_wait_timeout = {int(lock_wait_seconds)}"]
        connect_args = {"charset": "utf8mb4", "connect_timeout": 5, "read_timeout": 60, "write_timeout": 60}
        if statement_timeout_seconds:
            # A table held by LOCK TABLES (or an ALTER waiting for its metadata lock) makes a
            # statement wait for the metadata lock: as briefly as for a row lock.
            init.append(f"lock_wait_timeout = {max(1, int(lock_wait_seconds))}")
            # A statement the server stops answers within the limit; read_timeout is the client's
            # own backstop for a server that does not answer at all.
            connect_args["read_timeout"] = max(5, int(statement_timeout_seconds * 3))
        candidates = Candidates(urls, connect_args)
        timeout_sql = _statement_timeout_sql(statement_timeout_seconds)

        def connect():
            conn = candidates.connect()
            cursor = conn.cursor()
            try:
                mariadb = is_mariadb(conn)
                sets = init + ([timeout_sql(mariadb)] if timeout_sql else [])
                if not mariadb:
                    # MySQL answers information_schema.TABLES from a cache of up to a day unless
                    # told not to: table_status and job_queue's UPDATE_TIME (stats.py) read it.
                    sets.append("information_schema_stats_expiry = 0")
                if idle_transaction_seconds:
                    variable = "idle_transaction_timeout" if mariadb else "wait_timeout"
                    sets.append(f"{variable} = {int(idle_transaction_seconds)}")
                cursor.execute("SET SESSION " + ", ".join(sets))
                if read_only:
                    # The same syntax on MySQL 8.0 and MariaDB (their variables' names differ).
                    cursor.execute("SET SESSION TRANSACTION READ ONLY")
            finally:
                cursor.close()
            return conn

        engine = sa.create_engine(
            urls[0],
            creator=connect,
            isolation_level="READ COMMITTED",
            pool_size=pool_size,
            max_overflow=pool_size,
            pool_recycle=1800,
            # The connection used last is used next, so that a worker's few statements while idle
            # (heartbeats, sweeps) keep one connection alive rather than go round them all: with
            # a bound on idle sessions (MySQL's wait_timeout) the others are let go instead of
            # reopened at every use.
            pool_use_lifo=bool(idle_transaction_seconds),
            # Every use ends its own transaction (db.transaction commits or rolls back; closing a
            # Connection with one open rolls it back), so the pool's extra ROLLBACK on check-in
            # would be a wasted round trip on every claim and completion.
            pool_reset_on_return=None,
            # mysqlclient's own style is %s; both drivers take %(name)s, PyMySQL's style: one SQL
            # text per statement whichever the driver (repository.common compiles it once).
            paramstyle="pyformat",
        )
        if idle_transaction_seconds:
            engine.idle_transaction_seconds = idle_transaction_seconds
            # Idle time counts from the check-in, a moment after the server's last reply: a
            # margin of 5 s (or half, for a bound under 10 s).
            _replace_idle_connections(engine, max(idle_transaction_seconds / 2, idle_transaction_seconds - 5))
        engine.candidates = candidates
        engine.read_committed = True  # see reads_committed
        if statement_timeout_seconds:
            engine.transaction_policy = REQUEST_TRANSACTION
        if not read_only:
            watch_roles(engine, candidates)
        return engine
    if backend == "sqlite":
        if len(urls) > 1:
            raise ValueError("SQLite takes one database URL")
        in_memory = make_url(urls[0]).database in (None, "", ":memory:")
        engine = sa.create_engine(
            urls[0],
            connect_args={"timeout": 30, "check_same_thread": False},
            **({} if in_memory else {"pool_size": pool_size, "max_overflow": pool_size}),
        )
        _configure_sqlite(engine)
        return engine
    raise ValueError(
        f"unsupported database URL {urls[0]!r}: use mysql+pymysql://, mariadb+pymysql://, mysql+mysqldb:// "
        "or sqlite:///"
    )


def _replace_idle_connections(engine: Engine, after_seconds: float) -> None:
    """MySQL closes a session idle for its `wait_timeout`, in a transaction or not: a connection
    that waited in the pool for `after_seconds` is replaced at checkout instead (the pool
    reconnects on DisconnectionError). MariaDB's bound is on idle transactions only; its
    connections are left alone."""

    @event.listens_for(engine, "connect")
    def _flavour(dbapi_conn, record) -> None:
        record.info["closes_when_idle"] = not is_mariadb(dbapi_conn)

    @event.listens_for(engine, "checkin")
    def _idle_from(dbapi_conn, record) -> None:
        if record.info.get("closes_when_idle"):
            record.info["idle_since"] = time.monotonic()

    @event.listens_for(engine, "checkout")
    def _fresh(dbapi_conn, record, proxy) -> None:
        since = record.info.get("idle_since")  # only where the server closes idle sessions
        if since is not None and time.monotonic() - since > after_seconds:
            raise sa.exc.DisconnectionError("idle for nearly the server's wait_timeout")


def keep_when_idle(engine: Engine, dbapi_conn) -> None:
    """A connection of `engine` this process keeps open through idle spells (autocommit, never
    inside a transaction, never given back to the pool): on MySQL, give it the server's own
    wait_timeout back, so that the bound on idle transactions does not close it between uses.
    Nothing to do on MariaDB, or without the bound."""
    if getattr(engine, "idle_transaction_seconds", None) and not is_mariadb(dbapi_conn):
        cursor = dbapi_conn.cursor()
        try:
            cursor.execute("SET SESSION wait_timeout = @@GLOBAL.wait_timeout")
        finally:
            cursor.close()


def _statement_timeout_sql(seconds: float | None) -> Callable[[bool], str] | None:
    if not seconds:
        return None
    # MariaDB bounds every statement; MySQL's MAX_EXECUTION_TIME bounds read-only SELECTs (the
    # write paths are bounded by the lock waits above).
    return lambda mariadb: (
        f"max_statement_time = {seconds:g}" if mariadb else f"max_execution_time = {int(seconds * 1000)}"
    )


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
        dbapi_conn.create_function("jq_now", 0, lambda: sqlite_now())
        dbapi_conn.create_function("jq_now_plus", 1, lambda us: sqlite_now_plus(us))
        dbapi_conn.create_function("jq_micros_since", 1, sqlite_micros_since)

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        conn.exec_driver_sql("BEGIN IMMEDIATE")
