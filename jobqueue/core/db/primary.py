"""Which server is the primary.

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
claim also re-reads the flags in its own locking SELECT (see repository/claim_sql.py), so not even a
claim sent between two checks can land on a demoted server.

One server at a time. The candidate a process chose stays its primary while it answers as
writable; a pooled connection to any other candidate is dropped at its next checkout, so that a
failover that left the old primary writable cannot spread one process's claims, renewals and
completions over two servers (a worker whose pool held connections to both would claim on
both, and renew and complete on the wrong one). Whether two candidates are writable at once
(split brain) is only seen by looking at all of them: a worker does so every PEER_CHECK_SECONDS
in a thread of its own (`watch_primaries`), stops claiming while it sees two (`two_primaries`),
and while it does, never moves to the other writable one even when its own stops answering."""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import event
from sqlalchemy.engine import Connection, Engine, make_url
from sqlalchemy.exc import DisconnectionError, InvalidRequestError

from ..errors import NotPrimary
from ..logs import event as log_event
from .codes import CR_CONNECTION_ERRORS, code_of, is_mysql
from .drivers import connect_errors, dbapi

log = logging.getLogger("jobqueue.db")

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


@dataclass(frozen=True)
class ServerRole:
    """What a connection's server said about itself when last checked."""

    address: str  # host:port
    refusal: str | None  # why it must not take writes (None: a writable primary)
    checked_at: float  # time.monotonic()
    candidate: int | None = None  # which of the engine's candidates (Candidates.urls) it is on

    @property
    def writable(self) -> bool:
        return self.refusal is None


def is_mariadb(dbapi_conn) -> bool:
    return "mariadb" in (dbapi_conn.get_server_info() or "").lower()


def server_refusal(dbapi_conn) -> str | None:
    """Why this server must not take queue writes right now, or None. One SELECT of server
    variables (plus the replica status on a new connection); never a write."""
    mariadb = is_mariadb(dbapi_conn)
    flags = ["read_only", "innodb_read_only"] + ([] if mariadb else ["super_read_only"])
    cursor = dbapi_conn.cursor()
    try:
        cursor.execute(
            "SELECT " + ", ".join(f"@@global.{f}" for f in flags) + ", @@session.binlog_format, @@global.log_bin"
        )
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
    statement = "SHOW SLAVE STATUS" if is_mariadb(dbapi_conn) else "SHOW REPLICA STATUS"
    cursor = dbapi_conn.cursor()
    try:
        try:
            cursor.execute(statement)
        except Exception as exc:  # a missing privilege (1227) or an older MySQL: skip this check
            if code_of(exc) in CR_CONNECTION_ERRORS:
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


class Candidates:
    """The candidate primaries of one engine: which one is chosen (the last that answered as
    writable), and whether a look at all of them found two writable."""

    def __init__(self, urls: Sequence[str], connect_args: dict):
        self.urls = [make_url(u) for u in urls]
        self.driver = self.urls[0].get_driver_name()  # resolve_urls made them all one driver
        self.connect_args = connect_args
        self._preferred = 0
        self._lock = threading.Lock()
        self.two_writable: tuple[str, ...] = ()  # addresses, while the last look found several
        self._watchers = 0
        self._watch_stop: threading.Event | None = None
        self._missed: dict[int, int] = {}  # looks a candidate did not answer in a row

    @property
    def chosen(self) -> int:
        return self._preferred

    def address(self, i: int) -> str:
        return f"{self.urls[i].host or 'localhost'}:{self.urls[i].port or 3306}"

    def _open(self, i: int, **overrides):
        u = self.urls[i]
        connection_class = dbapi(self.driver).connect if self.driver == "mysqldb" else _connection_class()
        return connection_class(
            host=u.host or "localhost",
            port=u.port or 3306,
            user=u.username,
            password=u.password or "",
            database=u.database,
            **{**self.connect_args, **overrides},
            **dict(u.query),
        )

    def _refusal(self, conn) -> str | None:
        return server_refusal(conn) or (replica_refusal(conn) if len(self.urls) > 1 else None)

    def connect(self):
        """A DB-API connection to the writable primary, or (none writable) to one that answers,
        with its ServerRole attached as `conn._jobqueue_role`. While two candidates are known to
        be writable, only the chosen one is taken as the primary: a process does not move its
        writes to the other side of a split brain because its own side stopped answering."""
        failures = connect_errors(self.driver)
        with self._lock:
            preferred = self._preferred
            order = list(range(preferred, len(self.urls))) + list(range(preferred))
        fallback = None
        errors = []
        for i in order:
            try:
                conn = self._open(i)
            except failures as exc:
                errors.append(f"{self.address(i)}: {exc}")
                continue
            try:
                refusal = self._refusal(conn)
            except dbapi(self.driver).Error as exc:
                conn.close()
                errors.append(f"{self.address(i)}: {exc}")
                continue
            if i == preferred and refusal is not None:
                self.two_writable = ()  # the chosen one is not writable: no longer two (the next look confirms)
            elif refusal is None and i != preferred and self.two_writable:
                refusal = (
                    f"two candidates are writable ({', '.join(self.two_writable)}): staying with "
                    f"{self.address(preferred)}, which does not answer"
                )
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
        raise dbapi(self.driver).OperationalError(2003, "no database server answered: " + "; ".join(errors))

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
            log_event(
                log,
                logging.ERROR,
                "two_primaries",
                writable=",".join(found),
                chosen=self.address(self._preferred),
                detail="two candidates are writable (split brain): claims stop until one is read-only",
            )
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
                except Exception as exc:  # never let the watch die silently
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


def watch_roles(engine: Engine, candidates: Candidates) -> None:
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
            raise DisconnectionError(
                f"{role.address} is not the chosen primary ({candidates.address(candidates.chosen)}); dropped"
            )
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


def pool_gave_up(exc: BaseException) -> bool:
    """SQLAlchemy's pool gives up a checkout when the hook above dropped each connection it made
    (two tries: the chosen primary down and the only server answering is another candidate, or
    not writable) and raises InvalidRequestError("This connection is closed"), a programming
    error by its class: for this process the primary is away, as with a lost connection."""
    return isinstance(exc, InvalidRequestError) and str(exc) == "This connection is closed"


def on_chosen_primary(engine: Engine, info: dict) -> bool:
    """False when a connection (its pool record's `info`) is on a candidate other than the one
    this engine chose: for connections kept checked out (the idle probe, the doorbell), which the
    checkout hook does not see again."""
    candidates = getattr(engine, "candidates", None)
    role = info.get("role")
    return (
        candidates is None
        or len(candidates.urls) < 2
        or role is None
        or role.candidate is None
        or role.candidate == candidates.chosen
    )


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
    return (
        f"two writable primaries ({', '.join(candidates.two_writable)}): a failover left the old primary "
        f"writable; claiming stopped on {candidates.address(candidates.chosen)} until one of them is "
        "read-only"
    )


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
        conn.connection.info["role"] = ServerRole(
            role.address if role else "?", reason, 0.0, role.candidate if role else None
        )
