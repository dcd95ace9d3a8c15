"""db.drivers.bind, which renders the hot path's %(name)s parameters itself on PyMySQL, gives the
exact text PyMySQL would send, on every server, with backslash escapes on and off
(NO_BACKSLASH_ESCAPES, the session's sql_mode only); mysqlclient formats its own."""

from __future__ import annotations

import datetime
import decimal

import pytest

from jobqueue.core.db.drivers import bind, dbapi
from tests.conftest import SERVERS

VALUES = {
    "int": 7,
    "negative": -(2**63),
    "big": 2**70,
    "zero": 0,
    "true": True,
    "false": False,
    "none": None,
    "float": 0.25,
    "decimal": decimal.Decimal("1.50"),
    "str": "host-1:w3:abcdef",
    "quotes": 'it\'s "quoted"',
    "backslash": "a\\b\\'c",
    "percent": "100% %(int)s %s",
    "nul_and_newlines": "a\x00b\nc\rd\x1a",
    "unicode": "é ☃ 😀",
    "empty": "",
    "bytes": b"\x00\xff'",
    "datetime": datetime.datetime(2026, 12, 5, 19, 0, 0, 123456),
}
SQL = "SELECT " + ", ".join(f"%({name})s" for name in VALUES) + ", '%%'"


VALUES_INDEX = {name: i for i, name in enumerate(VALUES)}


@pytest.mark.parametrize("sql_mode", ["", "NO_BACKSLASH_ESCAPES"])
def test_rendered_text_is_what_pymysql_sends(db_server, sql_mode):
    host, port = SERVERS[db_server].split("@", 1)[1].split("/", 1)[0].rsplit(":", 1)
    conn = dbapi("pymysql").connect(host=host, port=int(port), user="root", charset="utf8mb4")
    try:
        cursor = conn.cursor()
        cursor.execute("SET SESSION sql_mode = %s", (sql_mode,))  # the reply's status flags say which
        rendered, params = bind(conn, SQL, VALUES)
        assert params is None and rendered == cursor.mogrify(SQL, VALUES)
        cursor.execute(rendered)  # and the server reads the values back
        row = cursor.fetchone()
        for name in ("quotes", "backslash", "percent", "nul_and_newlines", "unicode", "int", "big"):
            assert row[VALUES_INDEX[name]] in (VALUES[name], str(VALUES[name])), name
        assert row[-1] == "%"
    finally:
        conn.close()


def test_mysqlclient_formats_its_own():
    class MySQLdbLike:
        def string_literal(self, value):
            raise AssertionError("not called")

    assert bind(MySQLdbLike(), SQL, VALUES) == (SQL, VALUES)
