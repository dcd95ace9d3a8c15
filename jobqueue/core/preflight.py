"""Is this server safe to claim on? Checked when a process starts, before its first claim.

SKIP LOCKED exists from MySQL 8.0.1 and MariaDB 10.6; older servers reject the syntax or (worse,
through some proxies) ignore it. Row locks exist only in InnoDB: on MyISAM, FOR UPDATE locks
nothing and two workers can take the same job. A read-only server is a replica: claims there
would fail or, on a replica that accepts writes, diverge from the primary. Statement-based binary
logs replay SKIP LOCKED and NOWAIT statements on replicas against rows locked differently there,
so the server flags them unsafe; at our READ COMMITTED InnoDB refuses to log them at all (error
1665), so every claim would fail.

`jobqueue doctor` (doctor.py) reports the same facts with more around them; the checks a worker
must pass before its first claim live here.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from .db import is_mysql
from .errors import UnsupportedDatabase

MIN_MYSQL = (8, 0, 1)
MIN_MARIADB = (10, 6, 0)
QUEUE_TABLES = (
    "job_queue",
    "job_result",
    "job_attempt",
    "worker_process",
    "worker_stats",
    "audit_log",
    "web_session",
    "login_throttle",
)


@dataclass(frozen=True)
class ServerInfo:
    flavour: str  # "mysql", "mariadb" or "sqlite"
    version: tuple[int, int, int]
    version_string: str

    @property
    def supports_skip_locked(self) -> bool:
        if self.flavour == "mariadb":
            return self.version >= MIN_MARIADB
        if self.flavour == "mysql":
            return self.version >= MIN_MYSQL
        return False


def parse_version(version_string: str) -> ServerInfo:
    """'10.11.19-MariaDB-0+deb12u1' -> mariadb 10.11.19; '8.0.36' -> mysql 8.0.36.

    MariaDB behind a MySQL 5.5 replication prefix ('5.5.5-10.6.12-MariaDB') reports its real
    version after the prefix.
    """
    flavour = "mariadb" if "mariadb" in version_string.lower() else "mysql"
    text = version_string
    if flavour == "mariadb" and text.startswith("5.5.5-"):
        text = text[len("5.5.5-") :]
    m = re.match(r"(\d+)\.(\d+)\.(\d+)", text)
    if not m:
        raise UnsupportedDatabase(f"cannot read the server version from {version_string!r}")
    return ServerInfo(flavour, (int(m[1]), int(m[2]), int(m[3])), version_string)


def server_info(conn: Connection) -> ServerInfo:
    if not is_mysql(conn):
        return ServerInfo(
            "sqlite",
            tuple(int(x) for x in conn.exec_driver_sql("select sqlite_version()").scalar().split(".")),  # type: ignore[arg-type]
            "SQLite",
        )
    return parse_version(conn.exec_driver_sql("SELECT VERSION()").scalar())


# Each rule is a function of facts already read, returning why the queue must not run here (or
# None), so that workers (check_*: raise) and `jobqueue doctor` (a "problem" verdict) refuse for
# exactly the same reasons.


def version_refusal(info: ServerInfo) -> str | None:
    if info.flavour == "sqlite" or info.supports_skip_locked:
        return None
    need = "MariaDB 10.6" if info.flavour == "mariadb" else "MySQL 8.0.1"
    return (
        f"{info.flavour} {'.'.join(map(str, info.version))} does not support SELECT ... FOR UPDATE SKIP LOCKED; "
        f"the queue needs {need} or newer"
    )


def check_version(info: ServerInfo) -> None:
    _refuse(version_refusal(info))


@dataclass(frozen=True)
class TableStatus:
    engine: str
    approx_rows: int | None  # InnoDB's estimate, as the optimizer sees it


def table_status(conn: Connection) -> dict[str, TableStatus]:
    """The queue tables that exist in the current database, with engine and estimated size."""
    # Fresh on MySQL too: the engine sets information_schema_stats_expiry = 0 on every connection.
    rows = conn.execute(
        sa.text(
            "SELECT TABLE_NAME, ENGINE, TABLE_ROWS FROM information_schema.TABLES "
            "WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME IN :names"
        ).bindparams(sa.bindparam("names", expanding=True)),
        {"names": list(QUEUE_TABLES)},
    ).all()
    return {name: TableStatus(engine or "", None if n is None else int(n)) for name, engine, n in rows}


def table_engines(conn: Connection) -> dict[str, str]:
    return {name: status.engine for name, status in table_status(conn).items()}


def engine_refusal(engines: dict[str, str]) -> str | None:
    wrong = {t: e for t, e in engines.items() if e.lower() != "innodb"}
    if not wrong:
        return None
    listed = ", ".join(f"{t} is {e or 'unknown'}" for t, e in sorted(wrong.items()))
    return (
        f"queue tables must use InnoDB, which has the row locks SKIP LOCKED relies on ({listed}); "
        "convert with ALTER TABLE ... ENGINE=InnoDB"
    )


def check_engines(conn: Connection) -> None:
    _refuse(engine_refusal(table_engines(conn)))


def variables(conn: Connection, names: Sequence[str], scope: str = "SESSION") -> dict[str, str]:
    """Server variables in one statement, as this connection sees them (SESSION) or as new
    sessions start (GLOBAL); a name the server does not have is left out (MySQL and MariaDB name
    some differently)."""
    assert scope in ("SESSION", "GLOBAL")
    rows = conn.execute(
        sa.text(f"SHOW {scope} VARIABLES WHERE Variable_name IN :names").bindparams(
            sa.bindparam("names", expanding=True)
        ),
        {"names": list(names)},
    ).all()
    return {str(name).lower(): str(value) for name, value in rows}


def variable(conn: Connection, name: str, scope: str = "SESSION") -> str | None:
    """One server variable (see `variables`); None when the server has no such variable."""
    return variables(conn, [name], scope).get(name)


def is_on(value: str | None) -> bool:
    return value is not None and value.upper() in ("ON", "1")


READ_ONLY_FLAGS = ("read_only", "super_read_only", "innodb_read_only", "transaction_read_only", "tx_read_only")
BINLOG_VARIABLES = ("log_bin", "binlog_format")


def read_only_flags(conn: Connection, known: Mapping[str, str] | None = None) -> dict[str, bool]:
    """The read-only flags the server has, ON or not (from `known`, variables already read, if
    given)."""
    values = known if known is not None else variables(conn, READ_ONLY_FLAGS)
    return {name: is_on(values[name]) for name in READ_ONLY_FLAGS if name in values}


def writable_refusal(flags: dict[str, bool]) -> str | None:
    on = [name for name, value in flags.items() if value]
    if not on:
        return None
    return (
        f"the server is read-only ({', '.join(on)} is ON): this looks like a replica; point the queue at the "
        "writable primary, claims are never attempted on a replica"
    )


def check_writable(conn: Connection) -> None:
    # Read the variables, never try a write: an account with SUPER (or READ_ONLY ADMIN) writes
    # happily to a read-only replica, which is exactly the divergence we refuse.
    _refuse(writable_refusal(read_only_flags(conn)))


@dataclass(frozen=True)
class BinlogSettings:
    log_bin: bool
    format: str  # this session's binlog_format: STATEMENT, MIXED or ROW
    global_format: str  # what new sessions start with

    @property
    def statement_based(self) -> bool:
        return "STATEMENT" in (self.format.upper(), self.global_format.upper())


def binlog_settings(conn: Connection, known: Mapping[str, str] | None = None) -> BinlogSettings:
    """This session's binary logging (from `known`, session variables already read, if given)
    and the format new sessions get."""
    values = known if known is not None else variables(conn, BINLOG_VARIABLES)
    return BinlogSettings(
        log_bin=is_on(values.get("log_bin")),
        format=(values.get("binlog_format") or "").upper(),
        global_format=(variable(conn, "binlog_format", "GLOBAL") or "").upper(),
    )


def binlog_refusal(binlog: BinlogSettings) -> str | None:
    if not (binlog.log_bin and binlog.statement_based):
        return None
    return (
        "the server writes statement-based binary logs (binlog_format=STATEMENT, log_bin=ON): SKIP LOCKED "
        "and NOWAIT are unsafe for statement-based replication, and at READ COMMITTED InnoDB refuses to "
        "log the queue's writes at all (error 1665); set binlog_format=ROW (or MIXED) on the server"
    )


def check_binlog(conn: Connection) -> None:
    _refuse(binlog_refusal(binlog_settings(conn)))


def _refuse(reason: str | None) -> None:
    if reason is not None:
        raise UnsupportedDatabase(reason)


def require_supported(engine: Engine) -> ServerInfo:
    """Raise UnsupportedDatabase unless this server can run the queue safely. Three statements
    on MySQL/MariaDB, the first of a worker's start: what this session says (version, read-only
    flags, binary logging), the binary log format of new sessions, the tables' engines."""
    with engine.connect() as conn:
        if not is_mysql(conn):
            return server_info(conn)
        session = variables(conn, ("version", *READ_ONLY_FLAGS, *BINLOG_VARIABLES))
        info = parse_version(session.get("version", ""))
        check_version(info)
        _refuse(writable_refusal(read_only_flags(conn, session)))
        _refuse(binlog_refusal(binlog_settings(conn, session)))
        check_engines(conn)
        conn.rollback()
    return info
