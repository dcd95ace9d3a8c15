"""Row locks on job_queue: which transactions hold or wait on job rows, who holds one job's row,
ending such a transaction (KILL CONNECTION, audited), and the server's latest deadlock.

Why a ready job can "vanish": every claim reads with SKIP LOCKED, so a row another transaction
holds (an operator's SELECT ... FOR UPDATE left open, a stuck migration) is passed by, claim after
claim, and nothing waits or fails. Nothing here ever waits on a row for more than about a second.

The two servers show locks differently:
- MySQL 8.0: performance_schema.data_locks lists every record lock, granted or waited for, with the
  row's key (LOCK_DATA). Reading it costs the server (see _MYSQL_LOCKS): it is read only for the
  transactions INNODB_TRX says lock rows, bounded in rows and time.
- MariaDB 10.11: information_schema.INNODB_LOCKS / INNODB_LOCK_WAITS list only locks that someone
  waits for. So who holds job N's row is found by making someone wait: a probe connection tries
  the row with FOR UPDATE under innodb_lock_wait_timeout = 1 (its session only), the lock-wait
  tables name whoever blocks it, and the probe is ended at once (KILL QUERY on its own
  connection). Which job rows are held at all is found with SKIP LOCKED: ready and running rows a
  plain read sees but a SKIP LOCKED read passes by.

Both read INNODB_TRX for a transaction's age, state and rows locked (PROCESS privilege, and on
MySQL SELECT on performance_schema's data_locks, threads and events_statements_current; without
them the holder is reported as unknown) and the process list for account, host and statement.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError

from ..db import ER_LOCK_NOWAIT, ER_LOCK_WAIT_TIMEOUT, error_code, is_mysql, transaction
from ..errors import InvalidState
from ..models import Status
from ..schema import job_queue
from .claim import flavour
from .common import audit, jq

ER_ACCESS_DENIED = (1227, 1142, 1044)  # PROCESS (or performance_schema) not granted
ER_UNKNOWN_THREAD = 1094
PROBE_SECONDS = 1  # the waiting probe's innodb_lock_wait_timeout
# InnoDB refreshes what its information_schema tables show only when they were last read more
# than 0.1 s ago: a faster poll would keep reading the same (stale) picture.
PROBE_POLL = 0.12
SCAN_READY, SCAN_RUNNING = 300, 200  # rows the inspector checks for locks (MariaDB)
MAX_PROBES = 8  # held rows whose holder the inspector looks up by probing (MariaDB)
MAX_JOBS_SHOWN = 50


@dataclass(frozen=True)
class Transaction:
    """An open transaction that holds (or waits on) job_queue rows."""

    connection_id: int
    user: str | None = None
    host: str | None = None
    started_at: datetime | None = None
    age_seconds: float | None = None
    trx_state: str | None = None  # RUNNING, LOCK WAIT, ...
    command: str | None = None  # the connection: Sleep, Query, ...
    state: str | None = None  # what the statement is doing, if one runs
    statement: str | None = None  # the current statement, or the last one where the server keeps it
    rows_locked: int | None = None
    jobs: tuple[int, ...] = ()  # job rows it holds (those found)
    waiting_for: tuple[int, ...] = ()  # job rows it waits on
    locks_unread: bool = False  # MySQL: it locks too many rows for its locks to be read

    @property
    def account(self) -> str | None:
        return f"{self.user}@{self.host}" if self.user else None

    @property
    def idle(self) -> bool:
        """Open but running no statement: `statement` is then its last one where the server keeps
        it (MySQL's events_statements_current), not something it is doing."""
        return (self.command or "").lower() == "sleep"

    @property
    def waiting(self) -> bool:
        return bool(self.waiting_for) or (self.trx_state or "").upper() == "LOCK WAIT"

    def as_dict(self, *, statement: bool = True) -> dict[str, Any]:
        return {
            "connection_id": self.connection_id,
            "account": self.account,
            "user": self.user,
            "host": self.host,
            "transaction_age_seconds": self.age_seconds,
            "transaction_state": self.trx_state,
            "command": self.command,
            "state": self.state,
            "rows_locked": self.rows_locked,
            "statement": self.statement if statement else None,
            "jobs": list(self.jobs),
            "waiting_for": list(self.waiting_for),
            "locks_unread": self.locks_unread,
        }


@dataclass(frozen=True)
class RowLock:
    """What stands on one job's row right now: held or not, and by whom (when that could be read)."""

    held: bool
    holders: tuple[Transaction, ...] = ()
    unknown_why: str | None = None  # why the holder could not be named


@dataclass(frozen=True)
class LockReport:
    transactions: list[Transaction]
    unattributed: list[int] = field(default_factory=list)  # held job rows whose holder was not looked up
    unavailable: str | None = None  # why nothing could be read (a privilege, SQLite)


# --- one job's row -------------------------------------------------------------------------------


def _try_nowait(c: Connection, job_id: int) -> bool:
    """True when the row could be locked at once (then let go at once): nobody holds it."""
    try:
        c.execute(sa.select(jq.id).where(jq.id == job_id).with_for_update(nowait=True)).first()
        return True
    except DBAPIError as exc:
        # MariaDB answers NOWAIT on a locked row with 1205, MySQL 8.0 with 3572.
        if error_code(exc) in (ER_LOCK_WAIT_TIMEOUT, ER_LOCK_NOWAIT):
            return False
        raise


def row_lock(conn: Connection, job_id: int) -> RowLock:
    """Who holds job `job_id`'s row. Tries the row with FOR UPDATE NOWAIT in a short transaction
    (rolled back: the job is never changed); if refused, names the holder (MySQL: data_locks;
    MariaDB: a waiting probe of at most PROBE_SECONDS). SQLite has no row locks."""
    if not is_mysql(conn):
        return RowLock(False)
    try:
        free = _try_nowait(conn, job_id)
    finally:
        conn.rollback()
    if free:
        return RowLock(False)
    kind = flavour(conn)
    try:
        if kind == "mysql":
            ids, unread = _mysql_holders(conn, job_id)
            if not ids and not unread:
                # INNODB_TRX is a picture InnoDB refreshes at most every 0.1 s: a lock taken just
                # after someone read it is in the next one.
                time.sleep(PROBE_POLL)
                ids, unread = _mysql_holders(conn, job_id)
            if not ids and unread:
                return RowLock(
                    True,
                    unknown_why=f"the transactions of connections {', '.join(map(str, sorted(unread)))} "
                    f"lock over {MYSQL_LOCK_ROWS} rows: which ones is not read, to "
                    "spare the server (see the Locks page)",
                )
        else:
            blockers = _probe(conn, job_id)
            if blockers is None:
                return RowLock(False)
            ids = set(blockers)
        if not ids:
            return RowLock(True, unknown_why="it was let go, or its holder could not be read, while we looked")
        return RowLock(True, tuple(_details(conn, kind, ids, jobs={cid: (job_id,) for cid in ids})))
    except DBAPIError as exc:
        if error_code(exc) in ER_ACCESS_DENIED:
            return RowLock(True, unknown_why=f"reading who holds it {_denied(kind)}")
        if error_code(exc) == ER_QUERY_TIMEOUT:
            return RowLock(True, unknown_why=f"the server's lock tables took over {MYSQL_READ_MS} ms to read")
        raise
    finally:
        if conn.in_transaction():
            conn.rollback()


def _probe(conn: Connection, job_id: int) -> list[int] | None:
    """MariaDB: the connection ids that block a FOR UPDATE on the row, read from the lock-wait
    tables while a probe connection waits for it (at most PROBE_SECONDS; ended as soon as the
    blockers are read); None when the probe got the row at once (nobody holds it any more). The probe connection is thrown away afterwards, so its session setting
    and a late KILL QUERY never reach another user of the pool."""
    probe = conn.engine.connect()
    try:
        probe_id = int(probe.exec_driver_sql("SELECT CONNECTION_ID()").scalar())
        probe.exec_driver_sql(f"SET SESSION innodb_lock_wait_timeout = {PROBE_SECONDS}")
        probe.commit()
        done = threading.Event()
        got: list[bool] = []

        def wait_for_row() -> None:
            try:
                probe.execute(sa.select(jq.id).where(jq.id == job_id).with_for_update()).first()
                got.append(True)
            except Exception:  # noqa: BLE001 - 1205 after PROBE_SECONDS, 1317 when we end it: expected
                pass
            finally:
                done.set()

        thread = threading.Thread(target=wait_for_row, name=f"lock-probe-{job_id}", daemon=True)
        thread.start()
        blockers: list[int] = []
        deadline = time.monotonic() + PROBE_SECONDS
        try:
            while not done.is_set() and time.monotonic() < deadline:
                blockers = [int(r[0]) for r in conn.execute(_MARIADB_BLOCKERS, {"probe": probe_id}).all()]
                if blockers:
                    break
                done.wait(PROBE_POLL)
        finally:
            # Also when reading the blockers failed (no PROCESS): a probe left waiting would stand
            # in the row's queue, named by the next look as one more holder.
            if not done.is_set():
                try:
                    conn.exec_driver_sql(f"KILL QUERY {probe_id}")
                except DBAPIError as exc:
                    if error_code(exc) != ER_UNKNOWN_THREAD:
                        raise
            thread.join(PROBE_SECONDS + 1)
        if got and not blockers:
            return None  # the row was let go (a claim's or a completion's moment) before we looked
        return blockers
    finally:
        probe.invalidate()
        probe.close()


# The lock-wait tables pair a waiter with every lock ahead of it in the row's queue: the holder's
# granted lock, and the lock another waiter still waits for (trx_requested_lock_id), which holds
# nothing. Only the first kind names a holder.
_HOLDERS_ONLY = " AND NOT (w.blocking_lock_id <=> b.trx_requested_lock_id)"

_MARIADB_BLOCKERS = sa.text(
    "SELECT DISTINCT b.trx_mysql_thread_id FROM information_schema.INNODB_LOCK_WAITS w "
    "JOIN information_schema.INNODB_TRX r ON r.trx_id = w.requesting_trx_id "
    "JOIN information_schema.INNODB_TRX b ON b.trx_id = w.blocking_trx_id "
    "WHERE r.trx_mysql_thread_id = :probe" + _HOLDERS_ONLY
)

# Every wait on a job_queue row (MariaDB): waiter, blocker, and the row.
_MARIADB_WAITS = sa.text(
    "SELECT r.trx_mysql_thread_id, b.trx_mysql_thread_id, bl.lock_index, bl.lock_data "
    "FROM information_schema.INNODB_LOCK_WAITS w "
    "JOIN information_schema.INNODB_TRX r ON r.trx_id = w.requesting_trx_id "
    "JOIN information_schema.INNODB_TRX b ON b.trx_id = w.blocking_trx_id "
    "JOIN information_schema.INNODB_LOCKS bl ON bl.lock_id = w.blocking_lock_id "
    "WHERE bl.lock_table = CONCAT('`', DATABASE(), '`.`job_queue`') AND r.trx_mysql_thread_id <> CONNECTION_ID()"
    + _HOLDERS_ONLY
)

# MySQL: performance_schema.data_locks is built by walking InnoDB's lock lists under its
# transaction-system mutex, every lock of a transaction whatever the WHERE and LIMIT, so a read
# while a transaction holds 100,000 row locks halved a claim loop's rate here while it ran back
# to back (MySQL bugs 111082, 112035; docs/servers.md). So the inspector reads INNODB_TRX first
# (one row per transaction, with how many rows it locks) and data_locks only for transactions that
# lock MYSQL_LOCK_ROWS rows or fewer between them, through its ENGINE_TRANSACTION_ID index; a
# transaction that locks more is shown from INNODB_TRX alone (`locks_unread`) when its connection
# uses this database. Every statement
# stops after MYSQL_READ_MS (MAX_EXECUTION_TIME: error 3024).
MYSQL_TRANSACTIONS = 50
MYSQL_LOCK_ROWS = 5000
MYSQL_READ_MS = 2000
ER_QUERY_TIMEOUT = 3024

_MYSQL_LOCKING_TRX = sa.text(
    f"SELECT /*+ MAX_EXECUTION_TIME({MYSQL_READ_MS}) */ x.trx_id, x.trx_mysql_thread_id, x.trx_rows_locked, "
    "t.PROCESSLIST_DB <=> DATABASE() FROM information_schema.INNODB_TRX x "
    "LEFT JOIN performance_schema.threads t ON t.PROCESSLIST_ID = x.trx_mysql_thread_id "
    "WHERE (x.trx_rows_locked > 0 OR x.trx_state = 'LOCK WAIT') AND x.trx_mysql_thread_id <> CONNECTION_ID() "
    f"ORDER BY x.trx_rows_locked, x.trx_started LIMIT {MYSQL_TRANSACTIONS}"
)
_MYSQL_LOCKS = sa.text(
    f"SELECT /*+ MAX_EXECUTION_TIME({MYSQL_READ_MS}) */ ENGINE_TRANSACTION_ID, INDEX_NAME, LOCK_DATA, LOCK_STATUS "
    "FROM performance_schema.data_locks WHERE ENGINE_TRANSACTION_ID IN :trx AND OBJECT_SCHEMA = DATABASE() "
    f"AND OBJECT_NAME = 'job_queue' AND LOCK_TYPE = 'RECORD' LIMIT {MYSQL_LOCK_ROWS}"
).bindparams(sa.bindparam("trx", expanding=True))


def job_of_lock(index: str | None, data: str | None) -> int | None:
    """The job id a record lock is on, from its index and LOCK_DATA: '12' on PRIMARY, the key's
    values then the primary key on a secondary index ("'ready', 'default', 0, 12"); None for the
    supremum pseudo-record and the like."""
    if not data:
        return None
    last = str(data).rsplit(",", 1)[-1].strip().strip("'")
    return int(last) if last.isdigit() else None


def _mysql_record_locks(c: Connection) -> tuple[list[tuple[int, int, bool]], set[int]]:
    """(connection id, job id, granted) for record locks on job_queue (MySQL), and the connections
    whose locks were not read (too many: see _MYSQL_LOCKS), of those using this database (on a
    shared server, another application's big transaction is none of the queue's business)."""
    readable, unread, budget = {}, set(), MYSQL_LOCK_ROWS
    for trx, cid, rows, this_database in c.execute(_MYSQL_LOCKING_TRX).all():
        if cid is None:
            continue
        if int(rows or 0) <= budget:
            readable[int(trx)] = int(cid)
            budget -= int(rows or 0)
        elif this_database:
            unread.add(int(cid))
    out = []
    if readable:
        for trx, index, data, status in c.execute(_MYSQL_LOCKS, {"trx": sorted(readable)}).all():
            job = job_of_lock(index, data)
            if job is not None and int(trx) in readable:
                out.append((readable[int(trx)], job, str(status).upper() == "GRANTED"))
    return out, unread


def _mysql_holders(c: Connection, job_id: int) -> tuple[set[int], set[int]]:
    """The connections holding job `job_id`'s row, and those whose locks were not read (MySQL)."""
    found, unread = _mysql_record_locks(c)
    return {cid for cid, job, granted in found if job == job_id and granted}, unread


def _denied(kind: str) -> str:
    """Why another connection's transaction could not be read (an access error)."""
    from ..privileges import PERFORMANCE_SCHEMA_TABLES

    tables = ", ".join(f"performance_schema.{t}" for t in PERFORMANCE_SCHEMA_TABLES)
    return "needs the PROCESS privilege" + (f" and SELECT on {tables}" if kind == "mysql" else "")


def _details(
    c: Connection,
    kind: str,
    ids: Iterable[int],
    *,
    jobs: dict[int, Sequence[int]] | None = None,
    waiting: dict[int, Sequence[int]] | None = None,
) -> list[Transaction]:
    """Transactions of these connections from INNODB_TRX and the process list, oldest first."""
    ids = sorted(set(ids))
    if not ids:
        return []
    if kind == "mysql":
        # The process list there has no statement of an idle connection; events_statements_current
        # keeps its last one.
        sql = (
            f"SELECT /*+ MAX_EXECUTION_TIME({MYSQL_READ_MS}) */ x.trx_mysql_thread_id, t.PROCESSLIST_USER, t.PROCESSLIST_HOST, x.trx_started, "
            "TIMESTAMPDIFF(SECOND, x.trx_started, NOW()), x.trx_state, t.PROCESSLIST_COMMAND, t.PROCESSLIST_STATE, "
            "COALESCE(x.trx_query, s.SQL_TEXT), x.trx_rows_locked FROM information_schema.INNODB_TRX x "
            "LEFT JOIN performance_schema.threads t ON t.PROCESSLIST_ID = x.trx_mysql_thread_id "
            "LEFT JOIN performance_schema.events_statements_current s ON s.THREAD_ID = t.THREAD_ID "
            "WHERE x.trx_mysql_thread_id IN :ids ORDER BY x.trx_started"
        )
    else:
        sql = (
            "SELECT x.trx_mysql_thread_id, p.USER, p.HOST, x.trx_started, "
            "TIMESTAMPDIFF(SECOND, x.trx_started, NOW()), x.trx_state, p.COMMAND, p.STATE, "
            "COALESCE(x.trx_query, p.INFO), x.trx_rows_locked FROM information_schema.INNODB_TRX x "
            # A connection gone from the process list is gone: INNODB_TRX may still show it for
            # up to 0.1 s (see PROBE_POLL), the process list never does.
            "JOIN information_schema.PROCESSLIST p ON p.ID = x.trx_mysql_thread_id "
            "WHERE x.trx_mysql_thread_id IN :ids ORDER BY x.trx_started"
        )
    rows = c.execute(sa.text(sql).bindparams(sa.bindparam("ids", expanding=True)), {"ids": ids}).all()
    jobs, waiting = jobs or {}, waiting or {}
    out: dict[int, Transaction] = {}
    for cid, user, host, started, age, trx_state, command, state, statement, rows_locked in rows:
        cid = int(cid)
        if cid in out:
            continue  # several statement rows of one thread (MySQL): the first will do
        out[cid] = Transaction(
            cid,
            user,
            host,
            started,
            float(age) if age is not None else None,
            trx_state,
            command,
            state or None,
            statement,
            int(rows_locked) if rows_locked is not None else None,
            tuple(sorted(set(jobs.get(cid, ()))))[:MAX_JOBS_SHOWN],
            tuple(sorted(set(waiting.get(cid, ())))),
        )
    return list(out.values())


# --- the inspector ---------------------------------------------------------------------------------


def lock_report(conn: Connection) -> LockReport:
    """Every transaction that holds or waits on job_queue rows (other than this connection's),
    with the job rows it holds, oldest first. InnoDB's picture (INNODB_TRX), which it refreshes only
    when it was last read more than 0.1 s ago (see PROBE_POLL): a transaction begun since may not be
    in it yet, and a reader polling faster than that keeps reading the old picture."""
    if not is_mysql(conn):
        return LockReport([], unavailable="SQLite has no row locks: a transaction takes the whole database")
    kind = flavour(conn)
    try:
        return _mysql_report(conn) if kind == "mysql" else _mariadb_report(conn)
    except DBAPIError as exc:
        if error_code(exc) in ER_ACCESS_DENIED:
            return LockReport([], unavailable=f"reading other connections' transactions {_denied(kind)}")
        if error_code(exc) == ER_QUERY_TIMEOUT:
            return LockReport(
                [],
                unavailable=f"the server's lock tables took over {MYSQL_READ_MS} ms to read: "
                "left alone so as not to hold up its transactions",
            )
        raise
    finally:
        if conn.in_transaction():
            conn.rollback()


def _mysql_report(c: Connection) -> LockReport:
    holds: dict[int, set[int]] = {}
    waits: dict[int, set[int]] = {}
    found, unread = _mysql_record_locks(c)
    for cid, job, granted in found:
        (holds if granted else waits).setdefault(cid, set()).add(job)
    report = _details(c, "mysql", set(holds) | set(waits) | unread, jobs=holds, waiting=waits)
    return LockReport([replace(t, locks_unread=t.connection_id in unread) for t in report])


def _held_rows(c: Connection) -> list[int]:
    """Ready and running job rows that another transaction holds right now (MariaDB): those a plain
    read sees and a SKIP LOCKED read passes by. Reads a bounded sample, never waits; the locks the
    SKIP LOCKED read takes end with its transaction, at once."""
    ready = c.execute(sa.select(jq.id).where(jq.status == Status.READY.value).limit(SCAN_READY)).scalars().all()
    running = c.execute(sa.select(jq.id).where(jq.status == Status.RUNNING.value).limit(SCAN_RUNNING)).scalars().all()
    seen = sorted(set(ready) | set(running))
    if not seen:
        return []
    try:
        free = set(
            c.execute(
                sa.select(jq.id)
                .with_hint(job_queue, "FORCE INDEX (PRIMARY)", "mysql")
                .with_hint(job_queue, "FORCE INDEX (PRIMARY)", "mariadb")
                .where(jq.id.in_(seen))
                .with_for_update(skip_locked=True)
            )
            .scalars()
            .all()
        )
    finally:
        c.rollback()
    return [i for i in seen if i not in free]


def _mariadb_report(c: Connection) -> LockReport:
    holds: dict[int, set[int]] = {}
    waits: dict[int, set[int]] = {}
    # Rows someone already waits for: the lock-wait tables name their holders.
    for waiter, blocker, index, data in c.execute(_MARIADB_WAITS).all():
        job = job_of_lock(index, data)
        if job is not None:
            holds.setdefault(int(blocker), set()).add(job)
            waits.setdefault(int(waiter), set()).add(job)
    if c.in_transaction():
        c.rollback()
    known = set().union(*holds.values()) if holds else set()
    unattributed = []
    probes = 0
    for job in _held_rows(c):
        if job in known:
            continue
        if probes >= MAX_PROBES:
            unattributed.append(job)
            continue
        probes += 1
        for blocker in _probe(c, job) or ():
            holds.setdefault(blocker, set()).add(job)
    report = _details(c, "mariadb", set(holds) | set(waits), jobs=holds, waiting=waits)
    return LockReport(report, unattributed)


# --- ending a holder -------------------------------------------------------------------------------


def kill_connection(conn: Connection, connection_id: int, *, actor: str) -> Transaction:
    """End connection `connection_id` (KILL CONNECTION: its transaction rolls back, its locks go),
    audited, only when it holds or waits on job_queue rows right now. Returns what it was."""
    report = lock_report(conn)
    if report.unavailable:
        raise InvalidState(f"cannot kill connection {connection_id}: {report.unavailable}")
    found = next((t for t in report.transactions if t.connection_id == connection_id and t.jobs), None)
    if found is None and any(t.connection_id == connection_id and t.locks_unread for t in report.transactions):
        raise InvalidState(
            f"connection {connection_id} locks over {MYSQL_LOCK_ROWS} rows, which were not read: "
            "whether it holds job rows is not known, so it is not killed from here"
        )
    if found is None:
        raise InvalidState(f"connection {connection_id} holds no job_queue rows right now; nothing killed")

    def write(c: Connection) -> None:
        audit(
            c,
            actor,
            "kill",
            job_id=found.jobs[0] if len(found.jobs) == 1 else None,
            selection=f"connection {connection_id}",
            count=len(found.jobs),
            detail=f"KILL CONNECTION {connection_id} ({found.account or 'unknown account'}, transaction open "
            f"{found.age_seconds if found.age_seconds is not None else '?'} s, jobs "
            f"{', '.join(map(str, found.jobs))})",
        )

    transaction(conn, write, what="kill")
    try:
        conn.exec_driver_sql(f"KILL CONNECTION {int(connection_id)}")
    except DBAPIError as exc:
        if error_code(exc) == ER_UNKNOWN_THREAD:
            return replace(found, jobs=())  # it ended meanwhile
        raise
    return found


# --- the server's lock counters -------------------------------------------------------------------

_COUNTERS = sa.text(
    "SELECT NAME, `COUNT` FROM information_schema.INNODB_METRICS WHERE NAME IN ('lock_deadlocks', 'lock_timeouts')"
)


def lock_counters(conn: Connection) -> dict[str, int] | None:
    """The server's deadlocks and lock-wait timeouts since it started (InnoDB's own counters,
    every client's, on MySQL 8.0 and MariaDB alike): {"deadlocks", "lock_timeouts"}, or None
    where they cannot be read (SQLite, no PROCESS privilege)."""
    if not is_mysql(conn):
        return None
    try:
        rows = dict(transaction(conn, lambda c: c.execute(_COUNTERS).all(), what="lock_counters"))
    except DBAPIError as exc:
        if error_code(exc) in ER_ACCESS_DENIED:
            return None
        raise
    return {"deadlocks": int(rows.get("lock_deadlocks", 0)), "lock_timeouts": int(rows.get("lock_timeouts", 0))}


# --- deadlocks -------------------------------------------------------------------------------------

_DEADLOCK = re.compile(r"LATEST DETECTED DEADLOCK\n-+\n(.*?)\n-+\n[A-Z /]+\n-+\n", re.S)


def deadlock_section(status_text: str) -> str | None:
    """The LATEST DETECTED DEADLOCK section of SHOW ENGINE INNODB STATUS, or None."""
    m = _DEADLOCK.search(status_text or "")
    return m.group(1).strip() if m else None


def latest_deadlock(conn: Connection) -> tuple[str | None, str | None]:
    """(the server's latest detected deadlock as it describes it, or None; why it could not be
    read, or None). Needs the PROCESS privilege."""
    if not is_mysql(conn):
        return None, "SQLite has no deadlocks to report"
    try:
        row = conn.exec_driver_sql("SHOW ENGINE INNODB STATUS").first()
    except DBAPIError as exc:
        if error_code(exc) in ER_ACCESS_DENIED:
            return None, "reading it needs the PROCESS privilege"
        raise
    finally:
        if conn.in_transaction():
            conn.rollback()
    return deadlock_section(row[-1] if row else ""), None


__all__ = [
    "LockReport",
    "RowLock",
    "Transaction",
    "deadlock_section",
    "job_of_lock",
    "kill_connection",
    "latest_deadlock",
    "lock_counters",
    "lock_report",
    "row_lock",
]
