"""The MySQL drivers a URL may name: PyMySQL (`mysql://`, `mysql+pymysql://`: pure Python, the
default, nothing to compile) and mysqlclient (`mysql+mysqldb://`: a C extension built against
libmysqlclient, the optional extra `jobqueue[mysqlclient]`: about a fifth less worker CPU per job,
docs/benchmarks.md "Drivers"). What differs between them is kept here: the errors, the escaping
of literals and where the warning count is read (engines.py makes both take %(name)s parameters,
primary.py opens the connections)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

DRIVERS = ("pymysql", "mysqldb")


def dbapi(driver: str) -> Any:
    """The DB-API module of a driver (imported when first asked for)."""
    if driver == "mysqldb":
        import MySQLdb

        return MySQLdb
    import pymysql

    return pymysql


def connect_errors(driver: str) -> tuple[type[BaseException], ...]:
    """What a failed connect raises: the driver's errors (and PyMySQL's RuntimeError when an auth
    plugin needs a missing package, caching_sha2_password without `cryptography`)."""
    return (dbapi(driver).Error, RuntimeError) if driver == "pymysql" else (dbapi(driver).Error,)


def _mysqlclient(dbapi_conn: Any) -> bool:
    return hasattr(dbapi_conn, "string_literal")


def escaper(dbapi_conn: Any) -> Callable[[Any], str]:
    """A function quoting and escaping a value as a SQL literal (str), as the driver's parameters are."""
    if _mysqlclient(dbapi_conn):  # literal() gives bytes
        literal = dbapi_conn.literal
        return lambda value: literal(value).decode("utf-8")
    return dbapi_conn.escape


def bind(dbapi_conn: Any, sql: str, params: dict[str, Any] | None) -> tuple[str, dict[str, Any] | None]:
    """What to give cursor.execute for SQL text with %(name)s parameters. PyMySQL's: the text
    with the parameters rendered here. The claim cycle's statements carry a few parameters a job
    (the lease fence of each place), mostly ints, which PyMySQL dispatched one by one through its
    encoders (10 % of a 32-thread worker's samples under py-spy); rendered here, a job costs 3-4 %
    less CPU (docs/benchmarks.md). An int is its digits, as PyMySQL writes it; anything else goes
    through PyMySQL's own escaping. mysqlclient's (C) formatting is kept as it is."""
    if params is None or _mysqlclient(dbapi_conn):
        return sql, params
    escape = escaper(dbapi_conn)
    return sql % {key: str(value) if type(value) is int else escape(value) for key, value in params.items()}, None


def warning_count(cursor: Any, dbapi_conn: Any) -> int:
    """The warnings of the statement just run: PyMySQL's cursor attribute, mysqlclient's
    connection method."""
    count = getattr(cursor, "warning_count", None)
    return dbapi_conn.warning_count() if count is None else count


def installed() -> list[Any]:
    """The DB-API modules of the drivers installed (PyMySQL always is): what a worker catches
    from the DB-API connection it uses directly (the idle probe)."""
    modules = [dbapi("pymysql")]
    try:
        modules.append(dbapi("mysqldb"))
    except ImportError:
        pass
    return modules
