"""Is this server safe to claim on? Checked when a process starts, before its first claim.

SKIP LOCKED exists from MySQL 8.0.1 and MariaDB 10.6; older servers reject the syntax or (worse,
through some proxies) ignore it. Row locks exist only in InnoDB: on MyISAM, FOR UPDATE locks
nothing and two workers can take the same job. A read-only server is a replica: claims there
would fail or, on a replica that accepts writes, diverge from the primary.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from .db import is_mysql
from .errors import UnsupportedDatabase

MIN_MYSQL = (8, 0, 1)
MIN_MARIADB = (10, 6, 0)
QUEUE_TABLES = ("job_queue", "job_result", "job_attempt")


@dataclass(frozen=True)
class ServerInfo:
    flavour: str                 # "mysql", "mariadb" or "sqlite"
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
        text = text[len("5.5.5-"):]
    m = re.match(r"(\d+)\.(\d+)\.(\d+)", text)
    if not m:
        raise UnsupportedDatabase(f"cannot read the server version from {version_string!r}")
    return ServerInfo(flavour, (int(m[1]), int(m[2]), int(m[3])), version_string)


def server_info(conn: Connection) -> ServerInfo:
    if not is_mysql(conn):
        return ServerInfo("sqlite", tuple(int(x) for x in conn.exec_driver_sql("select sqlite_version()").scalar().split(".")),  # type: ignore[arg-type]
                          "SQLite")
    return parse_version(conn.exec_driver_sql("SELECT VERSION()").scalar())


def check_version(info: ServerInfo) -> None:
    if info.flavour == "sqlite" or info.supports_skip_locked:
        return
    need = "MariaDB 10.6" if info.flavour == "mariadb" else "MySQL 8.0.1"
    raise UnsupportedDatabase(
        f"{info.flavour} {'.'.join(map(str, info.version))} does not support SELECT ... FOR UPDATE SKIP LOCKED; "
        f"the queue needs {need} or newer")


def table_engines(conn: Connection) -> dict[str, str]:
    rows = conn.execute(sa.text(
        "SELECT TABLE_NAME, ENGINE FROM information_schema.TABLES "
        "WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME IN :names"
    ).bindparams(sa.bindparam("names", expanding=True)), {"names": list(QUEUE_TABLES)}).all()
    return {name: engine or "" for name, engine in rows}


def check_engines(conn: Connection) -> None:
    wrong = {t: e for t, e in table_engines(conn).items() if e.lower() != "innodb"}
    if wrong:
        listed = ", ".join(f"{t} is {e or 'unknown'}" for t, e in sorted(wrong.items()))
        raise UnsupportedDatabase(
            f"queue tables must use InnoDB, which has the row locks SKIP LOCKED relies on ({listed}); "
            "convert with ALTER TABLE ... ENGINE=InnoDB")


def read_only_flags(conn: Connection) -> dict[str, bool]:
    flags = {}
    for name in ("read_only", "super_read_only", "innodb_read_only", "transaction_read_only", "tx_read_only"):
        row = conn.execute(sa.text("SHOW VARIABLES LIKE :name"), {"name": name}).first()
        if row is not None:
            flags[name] = str(row[1]).upper() in ("ON", "1")
    return flags


def check_writable(conn: Connection) -> None:
    on = [name for name, value in read_only_flags(conn).items() if value]
    if on:
        raise UnsupportedDatabase(
            f"the server is read-only ({', '.join(on)} is ON): this looks like a replica; point the queue at the "
            "writable primary, claims are never attempted on a replica")


def require_supported(engine: Engine) -> ServerInfo:
    """Raise UnsupportedDatabase unless this server can run the queue safely."""
    with engine.connect() as conn:
        info = server_info(conn)
        if info.flavour == "sqlite":
            return info
        check_version(info)
        check_writable(conn)
        check_engines(conn)
        conn.rollback()
    return info
