"""The database layer: engines, the database clock, which server is the primary, and
transactions that survive deadlocks and lost connections; it never knows about jobs.

- `engines`: URLs, pools and session settings; SQLite (the embedded default for one host) with
  BEGIN IMMEDIATE in place of row locks. MySQL >= 8.0.1 / MariaDB >= 10.6 through PyMySQL is the
  production path, at READ COMMITTED: locking reads take no gap locks there, so claims, enqueues
  and the reaper do not deadlock on index gaps the way they do under REPEATABLE READ.
- `primary`: which of the candidate servers takes the writes, and what happens in a failover.
- `clock`: every timestamp that matters for leases comes from the database clock.
- `transactions`: `transaction()` and its retries; `codes`: the server errors acted on.

Everything but the SQLite clock is importable from here (`from jobqueue.core.db import transaction`); a
test that moves that clock replaces `jobqueue.core.db.clock.sqlite_clock`, where it is read."""

from __future__ import annotations

from .clock import db_after, db_micros_since, db_now, reads_committed
from .codes import (
    CR_CONNECTION_ERRORS,
    ER_CHECKREAD,
    ER_CLIENT_INTERACTION_TIMEOUT,
    ER_CONNECTION_KILLED,
    ER_GR_ROLLBACK,
    ER_INNODB_READ_ONLY,
    ER_LOCK_DEADLOCK,
    ER_LOCK_NOWAIT,
    ER_LOCK_WAIT_TIMEOUT,
    ER_READ_ONLY,
    ER_READ_ONLY_TRANSACTION,
    ER_SERVER_SHUTDOWN,
    ER_STATEMENT_TIMEOUT,
    NOT_PRIMARY_ERRORS,
    TRANSACTION_ROLLED_BACK,
    error_code,
    is_mysql,
    is_not_primary,
    transient_kind,
)
from .engines import (
    DEFAULT_LOCK_WAIT_SECONDS,
    create_engine,
    default_sqlite_path,
    keep_when_idle,
    resolve_url,
    resolve_urls,
)
from .primary import (
    NOT_WRITABLE_CHECK_SECONDS,
    PEER_CHECK_SECONDS,
    PEER_CONNECT_TIMEOUT,
    PEER_MISSED_LOOKS,
    PRIMARY_CHECK_SECONDS,
    Candidates,
    ServerRole,
    mark_not_primary,
    on_chosen_primary,
    pool_gave_up,
    preferred_tls_context,
    replica_refusal,
    require_primary,
    role_of,
    server_refusal,
    two_primaries,
    unwatch_primaries,
    watch_primaries,
)
from .transactions import REQUEST_TRANSACTION, TRANSACTION, callers_transaction, transaction

__all__ = [
    "CR_CONNECTION_ERRORS",
    "Candidates",
    "DEFAULT_LOCK_WAIT_SECONDS",
    "ER_CHECKREAD",
    "ER_CLIENT_INTERACTION_TIMEOUT",
    "ER_CONNECTION_KILLED",
    "ER_GR_ROLLBACK",
    "ER_INNODB_READ_ONLY",
    "ER_LOCK_DEADLOCK",
    "ER_LOCK_NOWAIT",
    "ER_LOCK_WAIT_TIMEOUT",
    "ER_READ_ONLY",
    "ER_READ_ONLY_TRANSACTION",
    "ER_SERVER_SHUTDOWN",
    "ER_STATEMENT_TIMEOUT",
    "NOT_PRIMARY_ERRORS",
    "NOT_WRITABLE_CHECK_SECONDS",
    "PEER_CHECK_SECONDS",
    "PEER_CONNECT_TIMEOUT",
    "PEER_MISSED_LOOKS",
    "PRIMARY_CHECK_SECONDS",
    "REQUEST_TRANSACTION",
    "ServerRole",
    "TRANSACTION",
    "TRANSACTION_ROLLED_BACK",
    "callers_transaction",
    "create_engine",
    "db_after",
    "db_micros_since",
    "db_now",
    "default_sqlite_path",
    "error_code",
    "is_mysql",
    "is_not_primary",
    "keep_when_idle",
    "mark_not_primary",
    "on_chosen_primary",
    "pool_gave_up",
    "preferred_tls_context",
    "reads_committed",
    "replica_refusal",
    "require_primary",
    "resolve_url",
    "resolve_urls",
    "role_of",
    "server_refusal",
    "transaction",
    "transient_kind",
    "two_primaries",
    "unwatch_primaries",
    "watch_primaries",
]
