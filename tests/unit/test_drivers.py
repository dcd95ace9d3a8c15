"""Which MySQL drivers a URL may name: PyMySQL (the default) and mysqlclient (mysql+mysqldb://),
for one server; anything else is refused before a connection is tried."""

from __future__ import annotations

import pytest

from jobqueue.core.db import resolve_urls
from jobqueue.core.db.drivers import escaper, warning_count


def test_bare_mysql_urls_mean_pymysql_and_mysqldb_is_kept():
    assert resolve_urls("mysql://u@h/db") == ["mysql+pymysql://u@h/db"]
    assert resolve_urls("mariadb://u@h/db") == ["mariadb+pymysql://u@h/db"]
    assert resolve_urls("mysql+mysqldb://u@h/db") == ["mysql+mysqldb://u@h/db"]
    assert resolve_urls("mariadb+mysqldb://u@h/db") == ["mariadb+mysqldb://u@h/db"]


def test_another_driver_is_refused():
    with pytest.raises(ValueError, match="unsupported MySQL driver 'mysqlconnector'"):
        resolve_urls("mysql+mysqlconnector://u@h/db")


def test_several_candidates_need_pymysql():
    assert len(resolve_urls("mysql://u@a/db mysql://u@b/db")) == 2
    with pytest.raises(ValueError, match="failover is not supported with mysql\\+mysqldb://"):
        resolve_urls("mysql+mysqldb://u@a/db mysql+mysqldb://u@b/db")
    with pytest.raises(ValueError, match="several candidate primaries need PyMySQL"):
        resolve_urls("mysql://u@a/db mysql+mysqldb://u@b/db")


class _MySQLdbLike:
    """What escaper and warning_count read of a mysqlclient connection (its literal() gives bytes)."""

    def string_literal(self, value: bytes) -> bytes:
        return b"'" + value.replace(b"'", b"\\'") + b"'"

    def literal(self, value) -> bytes:
        return self.string_literal(value.encode()) if isinstance(value, str) else str(value).encode()

    def warning_count(self) -> int:
        return 2


class _PyMySQLLike:
    def escape(self, value) -> str:
        return "'" + value.replace("'", "\\'") + "'"


class _PyMySQLCursor:
    warning_count = 3


def test_literals_are_str_whichever_the_driver():
    assert escaper(_MySQLdbLike())("it's") == "'it\\'s'"
    assert escaper(_PyMySQLLike())("it's") == "'it\\'s'"


def test_warning_count_from_the_cursor_or_the_connection():
    assert warning_count(_PyMySQLCursor(), None) == 3
    assert warning_count(object(), _MySQLdbLike()) == 2
