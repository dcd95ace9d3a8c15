"""The web process's handle on the queue: its settings, engines and embedded runtime (flaskr's
db.py, for the queue): `init_app` sets them up, `db()` lends a request a connection to the
primary, `read_db()` one for a read-only page (the replica of JOBQUEUE_READ_URL when set)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from flask import Flask, current_app, g
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import DBAPIError, SQLAlchemyError

from ..core import logs, preflight, repository
from ..core.db import PRIMARY_CHECK_SECONDS, create_engine
from ..core.errors import TransientDatabaseError, UnsupportedDatabase
from ..core.replica_watch import ReplicaWatch
from ..core.settings import use
from ..core.task_modules import load_task_modules
from .config import WebSettings
from .runtime import Runtime

if TYPE_CHECKING:
    from .auth import HostAccess

log = logging.getLogger("jobqueue.web")

# A request's statements and lock waits are bounded, so a table held by LOCK TABLES (or a
# runaway query) answers 503 within seconds instead of tying up every web thread.
REQUEST_STATEMENT_SECONDS = 5.0
REQUEST_LOCK_WAIT_SECONDS = 2
READ_REPLICA_RETRY_SECONDS = 10.0


@dataclass
class QueueExtension:
    engine: Engine  # web requests: statements and lock waits bounded
    settings: WebSettings
    runtime: Runtime  # embedded workers and the reaper, on an engine of their own
    sign_in_pruned_at: float = 0.0  # when this process last pruned sessions and throttle rows
    read_engine: Engine | None = None  # JOBQUEUE_READ_URL: read-only pages, READ ONLY sessions
    read_engine_down_until: float = 0.0  # after a failed connect, pages skip the replica a while
    url_prefix: str = ""  # where the blueprints are mounted ("" standalone)
    access: HostAccess | None = None  # mounted in a host app: its login decides (init_dashboard)
    replicas: ReplicaWatch | None = None  # JOBQUEUE_REPLICA_URLS: health and the pacing of bulk actions
    counts: repository.stats.CountsCache | None = None  # queue counts on the primary, shared by every request
    read_counts: repository.stats.CountsCache | None = None  # the same from the replica of JOBQUEUE_READ_URL
    _refusal: tuple[float, str | None] = (0.0, None)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def counts_for(self, conn: Connection) -> repository.stats.CountsCache | None:
        """The counts cache of the database `conn` reads from."""
        return self.read_counts if self.read_engine is not None and conn.engine is self.read_engine else self.counts

    def write_refusal(self, max_age: float = 60.0) -> str | None:
        """Why this database must not take queue writes (a replica, statement binlogs, MyISAM,
        an old server), or None. An all-clear is checked again at most once a minute per web
        process (a primary demoted meanwhile is caught by the engine's own check of each pooled
        connection); a refusal as often as that check, so that writes are taken again within
        seconds of a read-only primary becoming writable, not a minute later."""
        checked_at, reason = self._refusal
        if time.monotonic() - checked_at < (max_age if reason is None else min(max_age, PRIMARY_CHECK_SECONDS)):
            return reason
        # One thread checks; the others go on with the last answer rather than queue behind it
        # (the check reads information_schema, which a busy server may answer slowly).
        if not self._lock.acquire(blocking=False):
            return reason
        try:
            try:
                preflight.require_supported(self.engine)
                reason = None
            except UnsupportedDatabase as exc:
                reason = str(exc)
            except (SQLAlchemyError, TransientDatabaseError):
                return None  # unreachable or busy: the request itself will say so
            self._refusal = (time.monotonic(), reason)
        finally:
            self._lock.release()
        return reason


def init_app(app: Flask, settings: WebSettings, *, url_prefix: str = "", access: HostAccess | None = None) -> None:
    if access is None:
        logs.setup(settings.core.log_level)  # hosted, the host app's logging takes our lines
    use(settings.core)
    load_task_modules(settings.core.task_modules)
    engine = create_engine(
        settings.core.database_urls or None,
        pool_size=8,
        settings=settings.core,
        lock_wait_seconds=min(settings.core.lock_wait_seconds, REQUEST_LOCK_WAIT_SECONDS),
        statement_timeout_seconds=REQUEST_STATEMENT_SECONDS,
    )
    runtime_engine = create_engine(
        settings.core.database_urls or None,
        pool_size=max(4, settings.embedded_workers + 4),
        settings=settings.core,
        idle_transaction_seconds=settings.core.idle_transaction_seconds,
    )
    read_engine = None
    if settings.core.read_url:
        read_engine = create_engine(
            settings.core.read_url,
            pool_size=4,
            settings=settings.core,
            read_only=True,
            lock_wait_seconds=REQUEST_LOCK_WAIT_SECONDS,
            statement_timeout_seconds=REQUEST_STATEMENT_SECONDS,
        )
    seconds = settings.core.counts_cache_seconds
    app.extensions["jobqueue"] = QueueExtension(
        engine,
        settings,
        Runtime(runtime_engine, settings),
        read_engine=read_engine,
        url_prefix=url_prefix,
        access=access,
        replicas=ReplicaWatch.from_settings(settings.core),
        counts=repository.stats.CountsCache(seconds),
        read_counts=repository.stats.CountsCache(seconds),
    )


def extension() -> QueueExtension:
    return current_app.extensions["jobqueue"]


@contextmanager
def db() -> Iterator[Connection]:
    """A pooled connection for the length of a request's work; every statement on it goes
    through jobqueue.core.repository."""
    with extension().engine.connect() as conn:
        yield conn


@dataclass(frozen=True)
class ReadSource:
    """Where a page's reads came from, for its header: the replica and its lag."""

    address: str
    lag: repository.replicas.ReplicaLag | None
    fallback: str | None = None  # why the page read from the primary instead


@contextmanager
def read_db() -> Iterator[Connection]:
    """A connection for a page that only reads: the replica of JOBQUEUE_READ_URL when set, with
    its lag in `g.read_source` (shown by the page header), else the primary. Never for claims,
    enqueues, operator actions or anything fenced: those use db(). A replica that cannot be
    reached is skipped for the primary, and the page says so."""
    ext = extension()
    if ext.read_engine is None:
        with db() as conn:
            yield conn
        return
    address = ext.read_engine.candidates.address(0)
    conn = None
    if time.monotonic() >= ext.read_engine_down_until:
        try:
            conn = ext.read_engine.connect()
        except DBAPIError as exc:
            # A replica whose host is cut off costs a connect timeout: not on every page.
            ext.read_engine_down_until = time.monotonic() + READ_REPLICA_RETRY_SECONDS
            logs.event(
                log,
                logging.WARNING,
                "read_replica_unreachable",
                address=address,
                error=str(getattr(exc, "orig", exc))[:200],
            )
    if conn is None:
        g.read_source = ReadSource(address, None, fallback="the replica did not answer; read from the primary")
        with db() as primary:
            yield primary
        return
    with conn:
        g.read_source = ReadSource(address, repository.replicas.replica_lag(conn))
        yield conn
