"""MySQL 8.0 readiness without a MySQL 8.0 server: its answers, recorded, against our reading of them.

There is no MySQL 8.0 on these machines (Debian ships MariaDB); these are the server's documented
answers, written down as MySQL 8.0.36 gives them."""

from __future__ import annotations

import json

import pymysql
import pytest
from sqlalchemy.exc import OperationalError

from jobqueue.core import db
from jobqueue.core.doctor import read_plan
from jobqueue.core.errors import NotPrimary

# EXPLAIN FORMAT=JSON of the claim on MySQL 8.0 (explain_format=JSON, or FORMAT=JSON).
JSON_PLAN = {
    "query_block": {
        "select_id": 1,
        "cost_info": {"query_cost": "1.41"},
        "ordering_operation": {
            "using_filesort": False,
            "table": {
                "table_name": "job_queue",
                "access_type": "ref",
                "possible_keys": ["ix_ready_pick"],
                "key": "ix_ready_pick",
                "used_key_parts": ["status", "queue"],
                "key_length": "259",
                "ref": ["const", "const"],
                "rows_examined_per_scan": 4,
                "rows_produced_per_join": 4,
                "filtered": "100.00",
                "locking_read": True,
                "skip_locked": True,
                "cost_info": {
                    "read_cost": "1.00",
                    "eval_cost": "0.40",
                    "prefix_cost": "1.41",
                    "data_read_per_join": "12K",
                },
                "used_columns": ["id", "task_key", "task_name", "queue", "priority", "payload", "status"],
            },
        },
    }
}
JSON_PLAN_FILESORT = {
    "query_block": {
        "select_id": 1,
        "ordering_operation": {
            "using_filesort": True,
            "table": {
                "table_name": "job_queue",
                "access_type": "ALL",
                "possible_keys": None,
                "key": None,
                "rows_examined_per_scan": 20031,
                "filtered": "1.00",
            },
        },
    }
}
TREE_PLAN = (
    "-> Limit: 4 row(s)  (cost=1.41 rows=4)\n"
    "    -> Index lookup on job_queue using ix_ready_pick (status='ready', queue='default')  (cost=1.41 rows=4)\n"
)
TREE_PLAN_FILESORT = (
    "-> Limit: 4 row(s)  (cost=2028 rows=4)\n"
    "    -> Sort: job_queue.priority, job_queue.id, limit input to 4 row(s) per chunk  (cost=2028 rows=20031)\n"
    "        -> Filter: ((job_queue.`status` = 'ready') and (job_queue.queue = 'default'))  (cost=2028 rows=200)\n"
    "            -> Table scan on job_queue  (cost=2028 rows=20031)\n"
)
TRADITIONAL_ROW = {
    "id": 1,
    "select_type": "SIMPLE",
    "table": "job_queue",
    "partitions": None,
    "type": "ref",
    "possible_keys": "ix_ready_pick",
    "key": "ix_ready_pick",
    "key_len": "259",
    "ref": "const,const",
    "rows": 4,
    "filtered": 100.0,
    "Extra": "Using where",
}


@pytest.mark.parametrize(
    "rows, key, filesort",
    [
        ([TRADITIONAL_ROW], "ix_ready_pick", False),
        ([{"EXPLAIN": json.dumps(JSON_PLAN)}], "ix_ready_pick", False),
        ([{"EXPLAIN": json.dumps(JSON_PLAN_FILESORT)}], None, True),
        ([{"EXPLAIN": TREE_PLAN}], "ix_ready_pick", False),
        ([{"EXPLAIN": TREE_PLAN_FILESORT}], None, True),
        ([{**TRADITIONAL_ROW, "key": None, "type": "ALL", "Extra": "Using where; Using filesort"}], None, True),
    ],
)
def test_the_claim_plan_is_read_in_every_format_explain_answers_in(rows, key, filesort):
    plan = read_plan(rows)
    assert (plan.key, plan.filesort, plan.steps) == (key, filesort, 1)


def dbapi_error(code: int, message: str, cls=pymysql.err.OperationalError) -> OperationalError:
    return OperationalError("UPDATE job_queue ...", {}, cls(code, message))


@pytest.mark.parametrize(
    "code, message, kind",
    [
        (1213, "Deadlock found when trying to get lock; try restarting transaction", "deadlock"),
        (3101, "Plugin instructed the server to rollback the current transaction.", "deadlock"),  # group replication
        (1205, "Lock wait timeout exceeded; try restarting transaction", "lock_timeout"),
        (4031, "The client was disconnected by the server because of inactivity.", "disconnect"),
        (1927, "Connection was killed", "disconnect"),  # MariaDB
        (2013, "Lost connection to MySQL server during query", "disconnect"),
        (1290, "The MySQL server is running with the --read-only option so it cannot execute this statement", None),
        (1062, "Duplicate entry 'k' for key 'uk_task_key'", None),
    ],
)
def test_error_codes_from_both_servers(code, message, kind):
    assert db.transient_kind(dbapi_error(code, message)) == kind


@pytest.mark.parametrize("code", [1290, 1836, 1792])
def test_read_only_answers_mean_not_a_primary(code):
    assert db.is_not_primary(dbapi_error(code, "read only"))
    assert db.transient_kind(dbapi_error(code, "read only")) is None  # not retried as a blip


def test_a_read_only_answer_inside_a_transaction_becomes_not_primary():
    class Conn:
        invalidated = True
        engine = None

        def in_transaction(self):
            return False

        def begin(self):
            class Tx:
                def __enter__(self):
                    return self

                def __exit__(self, *exc):
                    return False

            return Tx()

        dialect = type("D", (), {"name": "mysql"})()

    def write(conn):
        raise dbapi_error(1290, "The MySQL server is running with the --super-read-only option")

    with pytest.raises(NotPrimary):
        db.transaction(Conn(), write, what="enqueue")


def test_the_driver_refusing_an_auth_plugin_is_a_database_error_not_a_crash(monkeypatch):
    """PyMySQL raises RuntimeError when caching_sha2_password needs `cryptography` and it is
    missing; a worker must see a database error it waits out, never an exception that kills it."""

    def refuse(**kwargs):
        raise RuntimeError(
            "'cryptography' package is required for sha256_password or caching_sha2_password auth methods"
        )

    monkeypatch.setattr(db.primary, "_connection_class", lambda: refuse)  # what Candidates.connect calls
    candidates = db.Candidates(["mysql+pymysql://queue@127.0.0.1:3306/jq"], {})
    with pytest.raises(pymysql.err.OperationalError, match="cryptography"):
        candidates.connect()


def test_pymysql_has_what_caching_sha2_password_needs():
    import cryptography  # noqa: F401  (PyMySQL's `rsa` extra: full authentication over plain TCP)


@pytest.mark.parametrize(
    "flags, refused",
    [
        (("OFF", "OFF", "OFF", "ROW", "ON"), None),
        (("ON", "OFF", "OFF", "ROW", "ON"), "read_only"),
        (("OFF", "OFF", "ON", "ROW", "ON"), "super_read_only"),
        (("OFF", "ON", "OFF", "ROW", "OFF"), "innodb_read_only"),
        (("OFF", "OFF", "OFF", "STATEMENT", "ON"), "statement-based"),
        (("OFF", "OFF", "OFF", "STATEMENT", "OFF"), None),
    ],
)
def test_a_mysql_80_server_is_judged_writable_from_its_variables(flags, refused):
    class Cursor:
        def execute(self, sql):
            assert "@@global.super_read_only" in sql  # MySQL has it; MariaDB would refuse the name
            self.sql = sql

        def fetchone(self):
            return flags

        def close(self):
            pass

    class Conn:
        def get_server_info(self):
            return "8.0.36"

        def cursor(self):
            return Cursor()

    answer = db.server_refusal(Conn())
    assert (answer is None) if refused is None else (refused in answer)
