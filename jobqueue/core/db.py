"""Engines, the database clock, which server is the primary, and transactions that survive
deadlocks and lost connections.

Two kinds of server are supported:
- MySQL >= 8.0.1 / MariaDB >= 10.6 through PyMySQL: the production path, with row locks and
  SKIP LOCKED. Sessions run at READ COMMITTED: locking reads take no gap locks there, so claims,
  enqueues and the reaper do not deadlock on index gaps the way they do under REPEATABLE READ.
- SQLite (the embedded default for one host): no row locks, so every transaction starts with
  BEGIN IMMEDIATE and claims are serialised by the database file's write lock.

All timestamps that matter for leases come from the database clock, so hosts with skewed clocks
still agree on when a lease expires.

Where writes go. A setting may name several candidate servers ("A B C"): every new connection
goes to the first one that answers and is writable (not read_only / super_read_only /
innodb_read_only, not a replica, not on statement binlogs), as libpq's
target_session_attrs=read-write does. A pooled connection is checked again when it is checked out
after PRIMARY_CHECK_SECONDS, so a primary demoted under running processes is noticed within that
time, and with several candidates the pool moves on to the new primary by itself (a connection
to a server that was not writable is checked again after NOT_WRITABLE_CHECK_SECONDS, so a newly
promoted primary is found within about a second). When no
candidate is writable, connections still go to one that answers, marked not writable: reads (the
dashboard) keep working, and every write path refuses with NotPrimary before it sends anything
(`require_primary`; the claim too, so nothing is sent to a server known to be read-only). The
claim also re-reads the flags in its own locking SELECT (see repository.claim), so not even a
claim sent between two checks can land on a demoted server.

One server at a time. The candidate a process chose stays its primary while it answers as
writable; a pooled connection to any other candidate is dropped at its next checkout, so that a
failover that left the old primary writable cannot spread one process's claims, renewals and
completions over two servers (issue 25: a worker whose pool held connections to both claimed on
both, and renewed and completed on the wrong one). Whether two candidates are writable at once
(split brain) is only seen by looking at all of them: a worker does so every PEER_CHECK_SECONDS
in a thread of its own (`watch_primaries`), stops claiming while it sees two (`two_primaries`),
and while it does, never moves to the other writable one even when its own stops answering.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TypeVar

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine import Connection, Engine, make_url
from sqlalchemy.exc import DBAPIError, DisconnectionError
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.expression import FunctionElement

from . import retry
from .errors import NotPrimary, TransactionConflict, TransientDatabaseError
from .schema import Timestamp
from .settings import Settings, current
from .logs import event as log_event

log = logging.getLogger("jobqueue.db")

T = TypeVar("T")

DEFAULT_LOCK_WAIT_SECONDS = 5
PRIMARY_CHECK_SECONDS = 5.0
# A connection to a server that was not writable when last checked, with other candidates to try,
# is checked again this soon: during a failover the new primary is found within about a second
# of its promotion, not PRIMARY_CHECK_SECONDS later (by then 5 s leases have run out).
NOT_WRITABLE_CHECK_SECONDS = 1.0
# A worker with several candidates looks at every one this often for a second writable primary
# (every NOT_WRITABLE_CHECK_SECONDS while it sees two), from a thread of its own: a candidate
# that does not answer costs that thread up to PEER_CONNECT_TIMEOUT, never a claim.
PEER_CHECK_SECONDS = PRIMARY_CHECK_SECONDS
PEER_CONNECT_TIMEOUT = 2
# A candidate seen writable that then does not answer a look still counts as writable for this
# many looks: no answer is not read-only, and a loaded host's slow connect must not resume claims.
PEER_MISSED_LOOKS = 3

# MySQL / MariaDB error codes we act on.
ER_LOCK_WAIT_TIMEOUT = 1205   # also MariaDB's answer to NOWAIT on a locked row
ER_LOCK_DEADLOCK = 1213
ER_CHECKREAD = 1020           # MariaDB 11.6.2+ at REPEATABLE READ: a row changed since the snapshot
ER_LOCK_NOWAIT = 3572         # MySQL 8.0's answer to NOWAIT on a locked row
ER_GR_ROLLBACK = 3101         # MySQL group replication rolled the transaction back: retry like a deadlock
ER_CONNECTION_KILLED = 1927   # MariaDB
ER_CLIENT_INTERACTION_TIMEOUT = 4031   # MySQL 8.0.24+: the server closed an idle connection
ER_SERVER_SHUTDOWN = 1053
ER_READ_ONLY = 1290           # --read-only (ER_OPTION_PREVENTS_STATEMENT)
ER_READ_ONLY_TRANSACTION = 1792
ER_INNODB_READ_ONLY = 1836    # innodb_read_only (MySQL) / read-only mode
ER_STATEMENT_TIMEOUT = (1969, 3024)   # MariaDB max_statement_time, MySQL MAX_EXECUTION_TIME
CR_CONNECTION_ERRORS = {2002, 2003, 2006, 2013, 2055}
NOT_PRIMARY_ERRORS = {ER_READ_ONLY, ER_READ_ONLY_TRANSACTION, ER_INNODB_READ_ONLY}
# Errors after which the server has rolled back the whole transaction, not just the statement.
TRANSACTION_ROLLED_BACK = {ER_LOCK_DEADLOCK, ER_CHECKREAD, ER_GR_ROLLBACK}


def default_sqlite_path(settings: Settings | None = None) -> str:
    folder = (settings or current()).instance_path or os.path.join(os.getcwd(), "instance")
    return os.path.join(folder, "jobqueue.sqlite3")


def resolve_urls(url: str | Sequence[str] | None = None, settings: Settings | None = None) -> list[str]:
    """Candidate URLs from the argument (one URL, or several separated by spaces), then the
    settings, then embedded SQLite. `mysql://` means PyMySQL, the driver we ship and test."""
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
                one = f"{bare}+pymysql://" + one[len(bare) + 3:]
        out.append(one)
    backends = {make_url(u).get_backend_name() for u in out}
    if len(out) > 1 and backends - {"mysql", "mariadb"}:
        raise ValueError("several database URLs are candidate MySQL/MariaDB primaries; SQLite takes one URL")
    return out


def resolve_url(url: str | None = None) -> str:
    return resolve_urls(url)[0]


def is_mysql(engine_or_conn: Engine | Connection) -> bool:
    return engine_or_conn.dialect.name in ("mysql", "mariadb")


# --- which server is the primary ---------------------------------------------------------------

@dataclass(frozen=True)
class ServerRole:
    """What a connection's server said about itself when last checked."""

    address: str                    # host:port
    refusal: str | None             # why it must not take writes (None: a writable primary)
    checked_at: float               # time.monotonic()
    candidate: int | None = None    # which of the engine's candidates (Candidates.urls) it is on

    @property
    def writable(self) -> bool:
        return self.refusal is None


def _is_mariadb(dbapi_conn) -> bool:
    return "mariadb" in (dbapi_conn.get_server_info() or "").lower()


def server_refusal(dbapi_conn) -> str | None:
    """Why this server must not take queue writes right now, or None. One SELECT of server
    variables (plus the replica status on a new connection); never a write."""
    mariadb = _is_mariadb(dbapi_conn)
    flags = ["read_only", "innodb_read_only"] + ([] if mariadb else ["super_read_only"])
    cursor = dbapi_conn.cursor()
    try:
        cursor.execute("SELECT " + ", ".join(f"@@global.{f}" for f in flags) + ", @@session.binlog_format, @@global.log_bin")
        row = cursor.fetchone()
    finally:
        cursor.close()
    on = [name for name, value in zip(flags, row) if str(value).upper() in ("1", "ON")]
    if on:
        return f"the server is read-only ({', '.join(on)} is ON): a replica or a demoted primary"
    binlog_format, log_bin = str(row[-2] or "").upper(), str(row[-1]).upper() in ("1", "ON")
    if log_bin and binlog_format == "STATEMENT":
        return "the server writes statement-based binary logs (binlog_format=STATEMENT): SKIP LOCKED is unsafe there"
    return None


def replica_refusal(dbapi_conn) -> str | None:
    """A server that replicates from another is not the primary, read_only or not. Needs the
    REPLICATION CLIENT privilege (or SLAVE MONITOR on MariaDB); without it the check is skipped
    (read_only is what replicas set anyway)."""
    statement = "SHOW SLAVE STATUS" if _is_mariadb(dbapi_conn) else "SHOW REPLICA STATUS"
    cursor = dbapi_conn.cursor()
    try:
        try:
            cursor.execute(statement)
        except Exception as exc:   # a missing privilege (1227) or an older MySQL: skip this check
            if _code(exc) in CR_CONNECTION_ERRORS:
                raise
            return None
        rows = cursor.fetchall()
        names = [d[0] for d in cursor.description or ()]
    finally:
        cursor.close()
    for row in rows:
        status = dict(zip(names, row))
        source = status.get("Master_Host") or status.get("Source_Host")
        running = status.get("Slave_SQL_Running") or status.get("Replica_SQL_Running")
        if source and running == "Yes":
            return f"the server is a replica of {source} (its replication threads are running)"
    return None


def _code(exc: BaseException) -> int | None:
    args = getattr(exc, "args", None)
    return args[0] if args and isinstance(args[0], int) else None


class Candidates:
    """The candidate primaries of one engine: which one is chosen (the last that answered as
    writable), and whether a look at all of them found two writable."""

    def __init__(self, urls: Sequence[str], connect_args: dict):
        self.urls = [make_url(u) for u in urls]
        self.connect_args = connect_args
        self._preferred = 0
        self._lock = threading.Lock()
        self.two_writable: tuple[str, ...] = ()   # addresses, while the last look found several
        self._watchers = 0
        self._watch_stop: threading.Event | None = None
        self._missed: dict[int, int] = {}   # looks a candidate did not answer in a row

    @property
    def chosen(self) -> int:
        return self._preferred

    def address(self, i: int) -> str:
        return f"{self.urls[i].host or 'localhost'}:{self.urls[i].port or 3306}"

    def _open(self, i: int, **overrides):
        u = self.urls[i]
        return _connection_class()(host=u.host or "localhost", port=u.port or 3306, user=u.username,
                                   password=u.password or "", database=u.database,
                                   **{**self.connect_args, **overrides}, **dict(u.query))

    def _refusal(self, conn) -> str | None:
        return server_refusal(conn) or (replica_refusal(conn) if len(self.urls) > 1 else None)

    def connect(self):
        """A PyMySQL connection to the writable primary, or (none writable) to one that answers,
        with its ServerRole attached as `conn._jobqueue_role`. While two candidates are known to
        be writable, only the chosen one is taken as the primary: a process does not move its
        writes to the other side of a split brain because its own side stopped answering."""
        import pymysql

        with self._lock:
            preferred = self._preferred
            order = list(range(preferred, len(self.urls))) + list(range(preferred))
        fallback = None
        errors = []
        for i in order:
            try:
                conn = self._open(i)
            except pymysql.err.Error as exc:
                errors.append(f"{self.address(i)}: {exc}")
                continue
            except RuntimeError as exc:
                # PyMySQL raises RuntimeError when an auth plugin needs a missing package
                # (caching_sha2_password without `cryptography`): a database error, not a crash.
                errors.append(f"{self.address(i)}: {exc}")
                continue
            try:
                refusal = self._refusal(conn)
            except pymysql.err.Error as exc:
                conn.close()
                errors.append(f"{self.address(i)}: {exc}")
                continue
            if i == preferred and refusal is not None:
                self.two_writable = ()   # the chosen one is not writable: no longer two (the next look confirms)
            elif refusal is None and i != preferred and self.two_writable:
                refusal = (f"two candidates are writable ({', '.join(self.two_writable)}): staying with "
                           f"{self.address(preferred)}, which does not answer")
            conn._jobqueue_role = ServerRole(self.address(i), refusal, time.monotonic(), i)
            if refusal is None:
                if fallback is not None:
                    fallback.close()
                with self._lock:
                    if self._preferred != i:
                        log_event(log, logging.WARNING, "primary_found", address=self.address(i))
                    self._preferred = i
                return conn
            if fallback is None:
                fallback = conn
            else:
                conn.close()
            errors.append(f"{self.address(i)}: {refusal}")
        if fallback is not None:
            return fallback
        raise pymysql.err.OperationalError(2003, "no database server answered: " + "; ".join(errors))

    # --- split brain ---------------------------------------------------------------------------

    def look(self) -> tuple[str, ...]:
        """Connect to every candidate and ask whether it is writable; remember (and log) when two
        or more are. Returns the addresses of the writable ones when there are several."""
        writable = []
        for i in range(len(self.urls)):
            try:
                conn = self._open(i, connect_timeout=PEER_CONNECT_TIMEOUT)
                try:
                    refusal = self._refusal(conn)
                finally:
                    conn.close()
            except Exception:
                self._missed[i] = self._missed.get(i, 0) + 1
                if self.address(i) in self.two_writable and self._missed[i] < PEER_MISSED_LOOKS:
                    writable.append(self.address(i))
                continue
            self._missed[i] = 0
            if refusal is None:
                writable.append(self.address(i))
        found = tuple(writable) if len(writable) > 1 else ()
        before, self.two_writable = self.two_writable, found
        if found and found != before:
            log_event(log, logging.ERROR, "two_primaries", writable=",".join(found),
                      chosen=self.address(self._preferred),
                      detail="two candidates are writable (split brain): claims stop until one is read-only")
        elif before and not found:
            log_event(log, logging.WARNING, "two_primaries_resolved", chosen=self.address(self._preferred))
        return found

    def watch(self) -> None:
        """Look now, then every PEER_CHECK_SECONDS (every NOT_WRITABLE_CHECK_SECONDS while two
        are writable) in a thread of its own, until each watch() has had its unwatch()."""
        with self._lock:
            self._watchers += 1
            if self._watchers > 1:
                return
            stop = self._watch_stop = threading.Event()
        self.look()

        def run() -> None:
            while not stop.wait(NOT_WRITABLE_CHECK_SECONDS if self.two_writable else PEER_CHECK_SECONDS):
                try:
                    self.look()
                except Exception as exc:   # never let the watch die silently
                    log_event(log, logging.WARNING, "primaries_look_failed", error=str(exc)[:300])

        threading.Thread(target=run, name="jobqueue-primaries", daemon=True).start()

    def unwatch(self) -> None:
        with self._lock:
            self._watchers -= 1
            if self._watchers > 0 or self._watch_stop is None:
                return
            self._watch_stop.set()
            self._watch_stop = None
        self.two_writable = ()


@functools.lru_cache(maxsize=1)
def _connection_class():
    """PyMySQL's Connection, sharing one "preferred" TLS context across connections.

    Without TLS options PyMySQL (1.2+) tries TLS if the server offers it ("preferred") and builds
    a fresh default context for every connection to do so, even for a server that offers none:
    `ssl.create_default_context()` loads the system's CA store, about 26 ms each time (50-70 ms
    on a busy machine), a tenth of a one-shot command's run. That context verifies nothing
    (CERT_NONE, no host name check: "preferred" encrypts against passive listeners only), so the
    CA store is never read: ours is the same context without loading it, built once per process
    (an SSLContext may be shared). Explicit TLS options (ssl_ca, ssl_verify_cert, ...) still get
    PyMySQL's own verifying context, as before."""
    import pymysql

    class Connection(pymysql.connections.Connection):
        def _create_ssl_ctx(self, sslp):
            if sslp == {}:
                return preferred_tls_context()
            return super()._create_ssl_ctx(sslp)

    return Connection


@functools.lru_cache(maxsize=1)
def preferred_tls_context():
    """The TLS context of a connection without TLS options: what PyMySQL's "preferred" mode
    makes (TLS when the server offers it, nothing verified), minus the CA store it never reads."""
    import ssl

    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


def _watch_roles(engine: Engine, candidates: Candidates) -> None:
    """Re-check a pooled connection's server at checkout once PRIMARY_CHECK_SECONDS have passed.
    A connection to a server that stopped being writable is dropped when another candidate may
    be the primary now, so the pool reconnects through Candidates.connect."""

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn, record) -> None:
        record.info["role"] = getattr(dbapi_conn, "_jobqueue_role", None)

    several = len(candidates.urls) > 1

    @event.listens_for(engine, "checkout")
    def _on_checkout(dbapi_conn, record, proxy) -> None:
        role: ServerRole | None = record.info.get("role")
        if several and role is not None and role.candidate is not None and role.candidate != candidates.chosen:
            # One server at a time: this process moved to another candidate since this connection
            # was made. Were it kept because its server still answers as writable (a failover that
            # left the old primary writable), claims and completions would alternate between them.
            raise DisconnectionError(f"{role.address} is not the chosen primary "
                                     f"({candidates.address(candidates.chosen)}); dropped")
        if role is not None:
            interval = PRIMARY_CHECK_SECONDS if role.writable or not several else NOT_WRITABLE_CHECK_SECONDS
            if time.monotonic() - role.checked_at < interval:
                return
        try:
            refusal = server_refusal(dbapi_conn)
        except Exception as exc:
            raise DisconnectionError(f"primary check failed: {exc}") from exc
        address = role.address if role else "?"
        if refusal is not None and several:
            raise DisconnectionError(f"{address} is no longer writable: {refusal}")
        if (role is None or role.writable) and refusal is not None:
            log_event(log, logging.ERROR, "not_primary", address=address, reason=refusal)
        elif role is not None and not role.writable and refusal is None:
            log_event(log, logging.WARNING, "primary_writable_again", address=address)
        record.info["role"] = ServerRole(address, refusal, time.monotonic(), role.candidate if role else None)


def on_chosen_primary(engine: Engine, info: dict) -> bool:
    """False when a connection (its pool record's `info`) is on a candidate other than the one
    this engine chose: for connections kept checked out (the idle probe, the doorbell), which the
    checkout hook does not see again."""
    candidates = getattr(engine, "candidates", None)
    role = info.get("role")
    return (candidates is None or len(candidates.urls) < 2 or role is None or role.candidate is None
            or role.candidate == candidates.chosen)


def watch_primaries(engine: Engine) -> None:
    """Start looking for a second writable candidate (a worker does, with several candidates)."""
    candidates = getattr(engine, "candidates", None)
    if candidates is not None and len(candidates.urls) > 1:
        candidates.watch()


def unwatch_primaries(engine: Engine) -> None:
    candidates = getattr(engine, "candidates", None)
    if candidates is not None and len(candidates.urls) > 1:
        candidates.unwatch()


def two_primaries(engine: Engine) -> str | None:
    """Why claims must stop (two candidates writable at the last look), or None."""
    candidates = getattr(engine, "candidates", None)
    if candidates is None or not candidates.two_writable:
        return None
    return (f"two writable primaries ({', '.join(candidates.two_writable)}): a failover left the old primary "
            f"writable; claiming stopped on {candidates.address(candidates.chosen)} until one of them is "
            "read-only")


def role_of(conn: Connection) -> ServerRole | None:
    """The server role of this connection as last checked (None on SQLite)."""
    if not is_mysql(conn) or conn.invalidated:
        return None
    return conn.connection.info.get("role")


def require_primary(conn: Connection) -> None:
    """Raise NotPrimary unless this connection's server was writable when last checked (at most
    PRIMARY_CHECK_SECONDS ago). Costs nothing: the check rode on the connection's checkout."""
    role = role_of(conn)
    if role is not None and not role.writable:
        raise NotPrimary(f"{role.address}: {role.refusal}; nothing was written")


def mark_not_primary(conn: Connection, reason: str) -> None:
    """A write was refused as read-only, or a claim read the read-only flags: remember it, so the
    next checkout checks again and writes are refused at once meanwhile. A connection already
    known not to be writable keeps its schedule (NOT_WRITABLE_CHECK_SECONDS)."""
    if is_mysql(conn) and not conn.invalidated:
        role = conn.connection.info.get("role")
        if role is not None and not role.writable:
            return
        conn.connection.info["role"] = ServerRole(role.address if role else "?", reason, 0.0,
                                                  role.candidate if role else None)


# --- engines -------------------------------------------------------------------------------------

def create_engine(url: str | Sequence[str] | None = None, *, pool_size: int = 10,
                  lock_wait_seconds: int | None = None, statement_timeout_seconds: float | None = None,
                  settings: Settings | None = None, read_only: bool = False) -> Engine:
    """An engine for the queue. `url` is one URL or several candidate primaries (default: the
    settings). `statement_timeout_seconds` bounds every statement, and makes metadata-lock
    waits as short as row-lock waits and lock-wait timeouts answered without a second try (web
    requests use it, so a table held by LOCK TABLES answers 503 within `lock_wait_seconds`
    instead of tying up a thread); workers leave it off, since their statements are short by
    construction.

    `read_only` makes an engine for reads from a replica (JOBQUEUE_READ_URL): its sessions are
    READ ONLY, so not even an account with SUPER could write through it, and its server's role is
    not watched (a replica is expected to be read-only)."""
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
                mariadb = _is_mariadb(conn)
                sets = init + ([timeout_sql(mariadb)] if timeout_sql else [])
                if not mariadb:
                    # MySQL answers information_schema.TABLES from a cache of up to a day unless
                    # told not to: table_status and job_queue's UPDATE_TIME (stats.py) read it.
                    sets.append("information_schema_stats_expiry = 0")
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
            # Every use ends its own transaction (db.transaction commits or rolls back; closing a
            # Connection with one open rolls it back), so the pool's extra ROLLBACK on check-in
            # would be a wasted round trip on every claim and completion.
            pool_reset_on_return=None,
        )
        engine.candidates = candidates
        engine.read_committed = True   # see reads_committed
        if statement_timeout_seconds:
            engine.transaction_policy = REQUEST_TRANSACTION
        if not read_only:
            _watch_roles(engine, candidates)
        return engine
    if backend == "sqlite":
        if len(urls) > 1:
            raise ValueError("SQLite takes one database URL")
        in_memory = make_url(urls[0]).database in (None, "", ":memory:")
        engine = sa.create_engine(
            urls[0], connect_args={"timeout": 30, "check_same_thread": False},
            **({} if in_memory else {"pool_size": pool_size, "max_overflow": pool_size}),
        )
        _configure_sqlite(engine)
        return engine
    raise ValueError(f"unsupported database URL {urls[0]!r}: use mysql+pymysql://, mariadb+pymysql:// or sqlite:///")


def _statement_timeout_sql(seconds: float | None) -> Callable[[bool], str] | None:
    if not seconds:
        return None
    # MariaDB bounds every statement; MySQL's MAX_EXECUTION_TIME bounds read-only SELECTs (the
    # write paths are bounded by the lock waits above).
    return lambda mariadb: (f"max_statement_time = {seconds:g}" if mariadb
                            else f"max_execution_time = {int(seconds * 1000)}")


# SQLite has no clock of its own that we can shift, so the database clock is this function; a
# test may replace `sqlite_clock` to move time (the lease state machine's Hypothesis test does).
def sqlite_clock() -> float:
    return time.time()


def _sqlite_now() -> str:
    return datetime.fromtimestamp(sqlite_clock(), timezone.utc).strftime("%Y-%m-%d %H:%M:%S.%f")


def _sqlite_now_plus(microseconds: int) -> str:
    ts = sqlite_clock() + microseconds / 1e6
    return datetime.fromtimestamp(ts, timezone.utc).strftime("%Y-%m-%d %H:%M:%S.%f")


def _sqlite_micros_since(stamp: str | None) -> int | None:
    if stamp is None:
        return None
    then = datetime.fromisoformat(stamp).replace(tzinfo=timezone.utc)
    return int((sqlite_clock() - then.timestamp()) * 1_000_000)


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
        dbapi_conn.create_function("jq_now", 0, lambda: _sqlite_now())
        dbapi_conn.create_function("jq_now_plus", 1, lambda us: _sqlite_now_plus(us))
        dbapi_conn.create_function("jq_micros_since", 1, _sqlite_micros_since)

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


# --- transactions --------------------------------------------------------------------------------

def error_code(exc: BaseException) -> int | None:
    return _code(getattr(exc, "orig", None))


def transient_kind(exc: BaseException) -> str | None:
    """'deadlock', 'record_changed', 'lock_timeout' or 'disconnect' for errors worth retrying, else None."""
    if not isinstance(exc, DBAPIError):
        return None
    if exc.connection_invalidated:
        return "disconnect"
    code = error_code(exc)
    if code in (ER_LOCK_DEADLOCK, ER_GR_ROLLBACK):
        return "deadlock"
    if code == ER_CHECKREAD:
        # Like a deadlock, the server rolled the transaction back: a new one takes a new snapshot.
        # The queue's own sessions run at READ COMMITTED, where MariaDB does not raise it; an
        # engine the application passed in (JobQueue(engine)) may run at REPEATABLE READ.
        return "record_changed"
    if code == ER_LOCK_WAIT_TIMEOUT:
        return "lock_timeout"
    if code in CR_CONNECTION_ERRORS or code in (ER_CONNECTION_KILLED, ER_SERVER_SHUTDOWN, ER_CLIENT_INTERACTION_TIMEOUT):
        return "disconnect"
    if isinstance(exc.orig, sqlite3.OperationalError) and "locked" in str(exc.orig):
        return "lock_timeout"
    return None


def is_not_primary(exc: BaseException) -> bool:
    return isinstance(exc, NotPrimary) or (isinstance(exc, DBAPIError) and error_code(exc) in NOT_PRIMARY_ERRORS)


# A deadlock is resolved at once and worth retrying; each lock-wait timeout already cost a full
# innodb_lock_wait_timeout, so give up on the second.
TRANSACTION = retry.RetryPolicy(attempts=6, first_delay=0.01, max_delay=0.5, attempts_by_kind={"lock_timeout": 2})
# A web request (an engine built with a statement time limit) does not wait twice: its user gets
# 503 with Retry-After after one lock wait, and the thread is free for the next request.
REQUEST_TRANSACTION = retry.RetryPolicy(attempts=6, first_delay=0.01, max_delay=0.5,
                                        attempts_by_kind={"lock_timeout": 1})


@contextlib.contextmanager
def callers_transaction(what: str) -> Iterator[None]:
    """Inside a transaction the caller owns: an error after which the server rolled the whole
    transaction back is raised as TransactionConflict, which says so; the caller retries it."""
    try:
        yield
    except DBAPIError as exc:
        code = error_code(exc)
        if code not in TRANSACTION_ROLLED_BACK:
            raise
        why = ("a row changed after the transaction's snapshot (REPEATABLE READ with innodb_snapshot_isolation)"
               if code == ER_CHECKREAD else "a deadlock")
        raise TransactionConflict(f"{what}: the server rolled back your transaction ({why}: {exc.orig}); "
                                  "none of its writes were kept: run the whole transaction again") from exc


def transaction(conn: Connection, fn: Callable[[Connection], T], *, what: str,
                policy: retry.RetryPolicy | None = None) -> T:
    """Run `fn(conn)` in its own short transaction; retry deadlocks, lock-wait timeouts and lost
    connections with jittered exponential backoff.

    InnoDB resolves a deadlock by rolling back one transaction, and a connection can drop between
    two statements; both are normal for a queue under load. They are counted and retried, and
    only when they persist does the caller see TransientDatabaseError. A server that refuses
    writes as read-only raises NotPrimary (not retried here: a failover takes seconds).
    """
    if policy is None:
        policy = getattr(conn.engine, "transaction_policy", TRANSACTION)
    if conn.in_transaction():
        # The caller owns the transaction (say, an enqueue next to its own business rows); it
        # also owns commit and retry.
        with callers_transaction(what):
            return fn(conn)

    def once() -> T:
        try:
            with conn.begin():
                return fn(conn)
        except DBAPIError as exc:
            if error_code(exc) in NOT_PRIMARY_ERRORS:
                mark_not_primary(conn, f"refused a write as read-only: {exc.orig}")
                raise NotPrimary(f"{what}: the server refused the write as read-only ({exc.orig})") from exc
            raise
        except NotPrimary as exc:
            # The transaction read the flags itself (a claim, a fenced write): the connection's
            # role must say so too, or the next uses would go on trying this server.
            mark_not_primary(conn, str(exc))
            raise

    def on_retry(kind: str, attempt: int, delay: float, exc: BaseException) -> None:
        from . import metrics

        metrics.TRANSIENT_RETRIES.labels(kind=kind, operation=what).inc()
        log_event(log, logging.WARNING, "db_retry", operation=what, kind=kind, attempt=attempt, delay_ms=f"{delay * 1000:.0f}",
              error=str(getattr(exc, "orig", exc))[:200])

    try:
        return retry.call(once, policy, transient_kind, on_retry=on_retry)
    except retry.RetriesExhausted as exc:
        from . import metrics

        metrics.TRANSIENT_RETRIES.labels(kind=exc.kind, operation=what).inc()
        raise TransientDatabaseError(f"{what}: {exc.kind} persisted after {exc.attempts} attempts: "
                                     f"{getattr(exc.last, 'orig', exc.last)}") from exc.last
