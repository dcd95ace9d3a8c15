"""The lock inspector on MySQL 8.0 without a MySQL 8.0 server: its answers, recorded (as 8.0.36
gives them), against our reading of them. MySQL has no INNODB_LOCKS / INNODB_LOCK_WAITS; it lists
every record lock in performance_schema.data_locks, so no waiting probe is needed there."""

from __future__ import annotations

from datetime import datetime

import pymysql
import pytest
from sqlalchemy.dialects import mysql
from sqlalchemy.exc import OperationalError

from jobqueue.core.repository import locks

# information_schema.INNODB_TRX, the transactions that lock rows or wait, fewest rows first:
# (trx_id, trx_mysql_thread_id, trx_rows_locked, its connection uses this database). Connection 63
# runs a migration that locks 200,000 rows: too many to read; connection 70 another application's
# batch in another database.
LOCKING_TRX = [("4257", 57, 1, 1), ("4241", 41, 3, 1), ("4263", 63, 200_000, 1), ("4270", 70, 90_000, 0)]
# performance_schema.data_locks of those transactions: (ENGINE_TRANSACTION_ID, INDEX_NAME, LOCK_DATA,
# LOCK_STATUS). Connection 41 holds job 12 by primary key and job 13 through ix_ready_pick (a
# claim-like read); connection 57 waits for job 12; the supremum pseudo-record names no job.
DATA_LOCKS = [
    (4241, "PRIMARY", "12", "GRANTED"),
    (4241, "ix_ready_pick", "'ready', 'default', 0, 13", "GRANTED"),
    (4241, "PRIMARY", "13", "GRANTED"),
    (4241, "ix_ready_pick", "supremum pseudo-record", "GRANTED"),
    (4257, "PRIMARY", "12", "WAITING"),
]
# information_schema.INNODB_TRX joined to threads and events_statements_current.
TRX = [
    (
        41,
        "app",
        "10.0.0.7",
        datetime(2026, 12, 2, 9, 0, 0),
        754,
        "RUNNING",
        "Sleep",
        None,
        "SELECT * FROM job_queue WHERE id IN (12, 13) FOR UPDATE",
        3,
    ),
    (41, "app", "10.0.0.7", datetime(2026, 12, 2, 9, 0, 0), 754, "RUNNING", "Sleep", None, "SELECT 1", 3),
    (
        57,
        "ops",
        "bastion",
        datetime(2026, 12, 2, 9, 12, 30),
        4,
        "LOCK WAIT",
        "Query",
        "executing",
        "UPDATE job_queue SET status = 'failed' WHERE id = 12",
        1,
    ),
    (
        63,
        "migrate",
        "deploy",
        datetime(2026, 12, 2, 8, 0, 0),
        4354,
        "RUNNING",
        "Query",
        "updating",
        "UPDATE job_queue SET priority = 0",
        200_000,
    ),
]
STATUS = """
=====================================
2026-12-02 09:12:34 0x7f01 INNODB MONITOR OUTPUT
=====================================
------------------------
LATEST DETECTED DEADLOCK
------------------------
2026-12-02 09:10:01 140646
*** (1) TRANSACTION:
TRANSACTION 4211, ACTIVE 0 sec starting index read
*** (2) TRANSACTION:
TRANSACTION 4212, ACTIVE 0 sec starting index read
*** WE ROLL BACK TRANSACTION (2)
------------
TRANSACTIONS
------------
Trx id counter 4300
"""


class Result:
    def __init__(self, rows):
        self.rows = rows

    def all(self):
        return list(self.rows)

    def first(self):
        return self.rows[0] if self.rows else None


class MySQL80:
    """A connection that answers as MySQL 8.0.36 does, and remembers what it was sent."""

    class dialect:
        name = "mysql"
        is_mariadb = False

    def __init__(self):
        self.sent: list[str] = []

    def execute(self, stmt, params=None):
        sql = str(stmt.compile(dialect=mysql.dialect()))
        self.sent.append(sql)
        if sql.endswith("FOR UPDATE NOWAIT"):
            raise OperationalError(
                sql,
                {},
                pymysql.err.OperationalError(
                    3572, "Statement aborted because lock(s) could not be acquired immediately and NOWAIT is set."
                ),
            )
        if "performance_schema.data_locks" in sql:
            assert 4263 not in params["trx"] and 4270 not in params["trx"]  # big ones are never read
            return Result([r for r in DATA_LOCKS if r[0] in params["trx"]])
        if "information_schema.INNODB_TRX" in sql and "trx_rows_locked > 0" in sql:
            return Result(LOCKING_TRX)
        if "information_schema.INNODB_TRX" in sql:
            return Result([r for r in TRX if r[0] in params["ids"]])
        raise AssertionError(f"unexpected statement: {sql}")

    def exec_driver_sql(self, sql):
        self.sent.append(sql)
        assert sql == "SHOW ENGINE INNODB STATUS"
        return Result([("InnoDB", "", STATUS)])

    def in_transaction(self):
        return False

    def rollback(self):
        pass


@pytest.mark.parametrize(
    "index, data, job",
    [
        ("PRIMARY", "12", 12),
        ("ix_ready_pick", "'ready', 'default', 0, 13", 13),
        ("ix_due", "'scheduled', '2026-12-02 09:00:00.000000', 'default', 77", 77),
        ("PRIMARY", "supremum pseudo-record", None),
        ("PRIMARY", None, None),
    ],
)
def test_the_job_of_a_record_lock(index, data, job):
    assert locks.job_of_lock(index, data) == job


def test_who_holds_a_row_is_read_from_data_locks_without_waiting():
    conn = MySQL80()
    lock = locks.row_lock(conn, 12)
    assert conn.sent[0].endswith("FOR UPDATE NOWAIT")  # tried first, refused (3572)
    assert lock.held and [t.connection_id for t in lock.holders] == [41]  # the waiter 57 holds nothing
    holder = lock.holders[0]
    assert (holder.account, holder.age_seconds, holder.rows_locked) == ("app@10.0.0.7", 754.0, 3)
    assert holder.statement.startswith("SELECT * FROM job_queue WHERE id IN (12, 13)")  # its last statement
    assert not any("INNODB_LOCK" in s for s in conn.sent)  # MySQL 8.0 has no such tables
    assert any("events_statements_current" in s for s in conn.sent)


def test_data_locks_is_read_only_for_the_transactions_that_lock_rows_bounded_in_rows_and_time():
    """MySQL bugs 111082 / 112035: reading all of data_locks walks every lock under InnoDB's
    transaction-system mutex. INNODB_TRX first, then data_locks by transaction id, with a LIMIT
    and MAX_EXECUTION_TIME on every statement."""
    conn = MySQL80()
    locks.lock_report(conn)
    reads = [s for s in conn.sent if "performance_schema.data_locks" in s]
    assert len(reads) == 1 and "ENGINE_TRANSACTION_ID IN" in reads[0] and "LIMIT" in reads[0]
    assert conn.sent.index(reads[0]) > next(i for i, s in enumerate(conn.sent) if "trx_rows_locked > 0" in s)
    assert all("MAX_EXECUTION_TIME" in s for s in conn.sent)


def test_a_lock_read_cut_short_by_the_time_limit_says_so():
    class Slow(MySQL80):
        def execute(self, stmt, params=None):
            if "performance_schema.data_locks" in str(stmt):
                raise OperationalError(
                    "",
                    {},
                    pymysql.err.OperationalError(
                        3024, "Query execution was interrupted, maximum statement execution time exceeded"
                    ),
                )
            return super().execute(stmt, params)

    assert "took over" in locks.lock_report(Slow()).unavailable
    assert "took over" in locks.row_lock(Slow(), 12).unknown_why


def test_the_inspector_on_mysql80_lists_holders_and_waiters():
    report = locks.lock_report(MySQL80())
    by_id = {t.connection_id: t for t in report.transactions}
    assert by_id[41].jobs == (12, 13) and by_id[41].waiting_for == ()
    assert by_id[57].jobs == () and by_id[57].waiting_for == (12,) and by_id[57].waiting
    assert by_id[57].statement.startswith("UPDATE job_queue")
    assert by_id[63].locks_unread and by_id[63].rows_locked == 200_000 and by_id[63].jobs == ()
    assert not by_id[41].locks_unread and 70 not in by_id


def test_the_latest_deadlock_section():
    text, why = locks.latest_deadlock(MySQL80())
    assert why is None and text.startswith("2026-12-02 09:10:01") and "WE ROLL BACK TRANSACTION (2)" in text
    assert "Trx id counter" not in text
    assert locks.deadlock_section("no deadlock here") is None
