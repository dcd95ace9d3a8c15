"""The MySQL / MariaDB error codes the queue acts on, which errors are worth retrying, and telling a
MySQL-family connection from SQLite."""

from __future__ import annotations

import sqlite3

from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import DBAPIError

from ..errors import NotPrimary

# MySQL / MariaDB error codes we act on.
ER_LOCK_WAIT_TIMEOUT = 1205  # also MariaDB's answer to NOWAIT on a locked row
ER_LOCK_DEADLOCK = 1213
ER_CHECKREAD = 1020  # MariaDB 11.6.2+ at REPEATABLE READ: a row changed since the snapshot
ER_LOCK_NOWAIT = 3572  # MySQL 8.0's answer to NOWAIT on a locked row
ER_GR_ROLLBACK = 3101  # MySQL group replication rolled the transaction back: retry like a deadlock
ER_CONNECTION_KILLED = 1927  # MariaDB
ER_CLIENT_INTERACTION_TIMEOUT = 4031  # MySQL 8.0.24+: the server closed an idle connection
ER_SERVER_SHUTDOWN = 1053
ER_READ_ONLY = 1290  # --read-only (ER_OPTION_PREVENTS_STATEMENT)
ER_READ_ONLY_TRANSACTION = 1792
ER_INNODB_READ_ONLY = 1836  # innodb_read_only (MySQL) / read-only mode
ER_STATEMENT_TIMEOUT = (1969, 3024)  # MariaDB max_statement_time, MySQL MAX_EXECUTION_TIME
CR_CONNECTION_ERRORS = {2002, 2003, 2006, 2013, 2055}
NOT_PRIMARY_ERRORS = {ER_READ_ONLY, ER_READ_ONLY_TRANSACTION, ER_INNODB_READ_ONLY}
# Errors after which the server has rolled back the whole transaction, not just the statement.
TRANSACTION_ROLLED_BACK = {ER_LOCK_DEADLOCK, ER_CHECKREAD, ER_GR_ROLLBACK}


def is_mysql(engine_or_conn: Engine | Connection) -> bool:
    return engine_or_conn.dialect.name in ("mysql", "mariadb")


def code_of(exc: BaseException) -> int | None:
    args = getattr(exc, "args", None)
    return args[0] if args and isinstance(args[0], int) else None


def error_code(exc: BaseException) -> int | None:
    return code_of(getattr(exc, "orig", None))


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
    if code in CR_CONNECTION_ERRORS or code in (
        ER_CONNECTION_KILLED,
        ER_SERVER_SHUTDOWN,
        ER_CLIENT_INTERACTION_TIMEOUT,
    ):
        return "disconnect"
    if isinstance(exc.orig, sqlite3.OperationalError) and "locked" in str(exc.orig):
        return "lock_timeout"
    return None


def is_not_primary(exc: BaseException) -> bool:
    return isinstance(exc, NotPrimary) or (isinstance(exc, DBAPIError) and error_code(exc) in NOT_PRIMARY_ERRORS)
