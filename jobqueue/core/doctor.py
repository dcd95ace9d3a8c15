"""`jobqueue doctor`: can this database run the queue safely, and well?

Every check ends in a verdict:
- ok: nothing to do;
- warning: the queue runs, but something will hurt later (deadlocks, slow claims, a setting that
  turns into a problem the day someone flips another one), or the check could not be made;
- problem: the queue cannot run safely here. Workers refuse to start on the same problems
  (preflight.require_supported), and `jobqueue doctor` exits 3.

The rules for "problem" on version, replica, binary log format and table engines live in
preflight.py (the *_refusal functions), so a worker and the doctor never disagree. On SQLite the
doctor reports the flavour and how claims are serialised; the server checks do not apply.

Thresholds, and why:
- clock: leases use the database clock (UTC_TIMESTAMP(6)), so skew never breaks fencing; but log
  lines, dashboard ages and an operator comparing `lease_until` with their own clock use the app
  host's time. Over 2 s is a warning (time sync is drifting); over 15 s, a quarter of the
  default 60 s lease, is a problem: judged from this host, a lease looks valid or expired for a
  quarter of its life when it is not, and the host's time sync is evidently broken.
- lock wait: our engines set innodb_lock_wait_timeout to 5 s per session; over 60 s is a warning
  (a fenced write or an operator action stuck behind a row lock holds a slot that long).
- isolation: READ COMMITTED is ok; anything else is a warning (REPEATABLE READ takes gap locks
  on locking reads, so claims, enqueues and the reaper deadlock on index gaps).
- claim plan: the claim's SELECT must read `ix_ready_pick` in order (no filesort); otherwise a
  warning, since it is slow rather than unsafe, and grows with the table.
- privileges: the account should hold SELECT, INSERT, UPDATE and DELETE on the queue's tables and
  nothing that `read_only` does not bind (SUPER, ALL PRIVILEGES, MariaDB's READ_ONLY ADMIN,
  MySQL's CONNECTION_ADMIN): with one of those, a replica made read-only still takes the
  account's writes. A warning, not a problem: the preflight refuses read-only servers by reading
  the flags, never by trying a write, so the queue itself stays off replicas either way.
- replicas (JOBQUEUE_REPLICA_URLS, one check each): ok while replicating within
  JOBQUEUE_REPLICA_LAG_LIMIT; a warning when behind by more (bulk actions wait for it), when its
  IO thread is reconnecting, when the account may not read its status, or when the server
  replicates from nobody (a promoted replica, or a URL that names the wrong server); a problem when
  it does not answer or a replication thread is stopped: its copy then falls behind without
  bound, and bulk actions cannot wait for a lag nobody can read (replica_watch.py).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from enum import Enum

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import DBAPIError

from . import preflight, repository
from .db import DEFAULT_LOCK_WAIT_SECONDS, db_now, transient_kind
from .replica_watch import ReplicaReport, ReplicaWatch

CLOCK_WARNING_SECONDS = 2.0
CLOCK_PROBLEM_SECONDS = 15.0  # a quarter of the default 60 s lease
LOCK_WAIT_WARNING_SECONDS = 60
PICK_INDEX = "ix_ready_pick"
CLAIM_LIMIT = 4  # a default worker's batch (--concurrency 4)


class Verdict(str, Enum):
    OK = "ok"
    WARNING = "warning"
    PROBLEM = "problem"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class Check:
    name: str
    verdict: Verdict
    detail: str
    advice: str | None = None

    def as_dict(self) -> dict[str, str | None]:
        data = asdict(self)
        data["verdict"] = self.verdict.value
        return data


def has_problem(checks: list[Check]) -> bool:
    return any(c.verdict is Verdict.PROBLEM for c in checks)


def run_checks(engine: Engine, *, queue: str = "default", replicas: ReplicaWatch | None = None) -> list[Check]:
    """Every check, on one connection from `engine`: it is set up exactly like the connections
    workers claim on (isolation level, lock-wait timeout), so what it sees is what they get.
    With `replicas`, one check per watched replica after them."""
    checks = _server_checks(engine, queue)
    if replicas is not None:
        checks += [check_replica(report, replicas.lag_limit) for report in replicas.read()]
    return checks


def _server_checks(engine: Engine, queue: str) -> list[Check]:
    with engine.connect() as conn:
        info = preflight.server_info(conn)
        if info.flavour == "sqlite":
            return [check_sqlite(info)]
        checks = [check_server(info)]
        server_checks: list[tuple[str, Callable[[Connection], Check]]] = [
            ("binlog", check_binlog),
            ("primary", check_primary),
            ("tables", check_tables),
            ("isolation", check_isolation),
            ("claim_plan", lambda c: check_claim_plan(c, queue)),
            ("lock_wait", check_lock_wait),
            ("clock", check_clock),
            ("privileges", lambda c: check_privileges(c, info.flavour)),
        ]
        for name, check in server_checks:
            checks.append(_guarded(conn, name, check))
        conn.rollback()
    return checks


def _guarded(conn: Connection, name: str, check: Callable[[Connection], Check]) -> Check:
    # One check the server will not answer (a privilege, an odd variant) must not hide the rest.
    # A lost connection is not that: it ends the run like any other database error.
    try:
        return check(conn)
    except DBAPIError as exc:
        if transient_kind(exc) == "disconnect":
            raise
        conn.rollback()
        return Check(
            name,
            Verdict.WARNING,
            f"could not check: {getattr(exc, 'orig', None) or exc}",
            "run `jobqueue doctor` as a user that may read server variables and information_schema",
        )


# --- the checks ----------------------------------------------------------------------------------


def _flavour_name(info: preflight.ServerInfo) -> str:
    return {"mariadb": "MariaDB", "mysql": "MySQL"}.get(info.flavour, info.flavour)


def check_sqlite(info: preflight.ServerInfo) -> Check:
    return Check(
        "server",
        Verdict.OK,
        f"SQLite {'.'.join(map(str, info.version))}: no row locks; claims are serialised by BEGIN IMMEDIATE "
        "(the database file's write lock), for workers on this one host",
    )


def check_server(info: preflight.ServerInfo) -> Check:
    version = ".".join(map(str, info.version))
    refusal = preflight.version_refusal(info)
    if refusal:
        return Check(
            "server",
            Verdict.PROBLEM,
            refusal,
            "upgrade to MySQL >= 8.0.1 or MariaDB >= 10.6; older servers reject SKIP LOCKED and NOWAIT "
            "(or, through some proxies, silently ignore them)",
        )
    return Check("server", Verdict.OK, f"{_flavour_name(info)} {version} supports SKIP LOCKED and NOWAIT")


def check_binlog(conn: Connection) -> Check:
    binlog = preflight.binlog_settings(conn)
    formats = (
        binlog.format
        if binlog.format == binlog.global_format
        else f"{binlog.format} on this connection, {binlog.global_format} for new sessions"
    )
    refusal = preflight.binlog_refusal(binlog)
    if refusal:
        return Check(
            "binlog",
            Verdict.PROBLEM,
            f"binlog_format={formats}, log_bin=ON: {refusal}",
            "SET GLOBAL binlog_format=ROW and make it permanent in the server config (binlog_format=ROW "
            "under [mysqld]); workers refuse to claim until then",
        )
    if binlog.statement_based:
        return Check(
            "binlog",
            Verdict.WARNING,
            f"binlog_format={formats} but log_bin=OFF, so nothing is logged today; the day binary logging "
            "is turned on (for a replica or point-in-time recovery), SKIP LOCKED and NOWAIT become unsafe "
            "for statement-based replication and workers will refuse to claim",
            "set binlog_format=ROW in the server config now, before enabling log_bin",
        )
    why = (
        "replicas receive the rows each claim changed, not the statement"
        if binlog.format == "ROW"
        else "at READ COMMITTED, which queue connections use, InnoDB changes are logged as rows, as with ROW"
    )
    if binlog.log_bin:
        return Check("binlog", Verdict.OK, f"binlog_format={formats}, log_bin=ON: {why}, so claims replicate safely")
    return Check(
        "binlog",
        Verdict.OK,
        f"binlog_format={formats}, log_bin=OFF: nothing is binary-logged; if logging is turned on, "
        f"{why}, so claims replicate safely",
    )


def check_primary(conn: Connection) -> Check:
    flags = preflight.read_only_flags(conn)
    refusal = preflight.writable_refusal(flags)
    if refusal:
        return Check(
            "primary",
            Verdict.PROBLEM,
            refusal,
            "point --database-url / JOBQUEUE_DATABASE_URL at the writable primary (after a failover: "
            "at the promoted server, once read_only is OFF there)",
        )
    listed = ", ".join(name for name in flags)
    return Check("primary", Verdict.OK, f"{listed} all OFF: this is a writable primary")


def check_tables(conn: Connection) -> Check:
    database = conn.exec_driver_sql("SELECT DATABASE()").scalar()
    if database is None:
        return Check(
            "tables",
            Verdict.PROBLEM,
            "no database selected: the URL names none",
            "add the database to the URL: mysql+pymysql://user:pass@host/<database>",
        )
    tables = preflight.table_status(conn)
    refusal = preflight.engine_refusal({name: t.engine for name, t in tables.items()})
    if refusal:
        return Check(
            "tables",
            Verdict.PROBLEM,
            refusal,
            "ALTER TABLE <table> ENGINE=InnoDB for each table listed (it rewrites the table; stop the workers first)",
        )
    missing = [name for name in preflight.QUEUE_TABLES if name not in tables]
    if missing:
        return Check(
            "tables",
            Verdict.PROBLEM,
            f"{', '.join(missing)} missing in database {database!r}: the schema is not installed",
            "run `jobqueue init-db` against this database URL",
        )
    size = tables["job_queue"].approx_rows
    return Check(
        "tables",
        Verdict.OK,
        f"{', '.join(preflight.QUEUE_TABLES)} in {database!r} use InnoDB, whose row locks SKIP LOCKED "
        f"relies on (job_queue holds about {size if size is not None else '?'} rows)",
    )


def isolation_level(conn: Connection, scope: str = "SESSION") -> str | None:
    # MySQL 8 and MariaDB >= 11.1 call it transaction_isolation; older MariaDB only tx_isolation.
    for name in ("transaction_isolation", "tx_isolation"):
        value = preflight.variable(conn, name, scope)
        if value is not None:
            return value.upper().replace(" ", "-")
    return None


def check_isolation(conn: Connection) -> Check:
    level = isolation_level(conn)
    server_default = isolation_level(conn, "GLOBAL")
    detail = f"claim connections run at {level} (server default for other sessions: {server_default})"
    if level == "READ-COMMITTED":
        return Check(
            "isolation",
            Verdict.OK,
            detail + ": locking reads take no gap locks, so claims and enqueues do not deadlock on index gaps",
        )
    why = {
        "REPEATABLE-READ": "locking reads take gap and next-key locks, so concurrent claims, enqueues and the "
        "reaper deadlock on index gaps (retried, but wasted work and latency)",
        "SERIALIZABLE": "every plain read becomes a locking read, so counts and the empty-claim probe block "
        "behind claims, and gap locks cause deadlocks",
        "READ-UNCOMMITTED": "plain reads (stats, the empty-claim probe) may see claims that are rolled back",
    }.get(level or "", "not the level the queue is built for")
    return Check(
        "isolation",
        Verdict.WARNING,
        f"{detail}: {why}",
        "create engines with jobqueue.core.db.create_engine (it sets READ COMMITTED per session), or set "
        "transaction_isolation=READ-COMMITTED on the server",
    )


@dataclass(frozen=True)
class Plan:
    """What matters in a claim's plan, whatever format the server answered EXPLAIN in."""

    key: str | None  # the index read
    filesort: bool  # the candidates are sorted instead of read in order
    steps: int  # tables (or scans) in the plan
    rows: object  # the server's estimate of rows read, as it gave it


def read_plan(rows: list[dict]) -> Plan:
    """EXPLAIN's answer, read in any of its formats: traditional rows (MariaDB, MySQL with
    FORMAT=TRADITIONAL), or a single row of JSON or TREE text (MySQL 8.0.32+ follows
    `explain_format`, so a bare EXPLAIN may answer either)."""
    if len(rows) == 1 and len(rows[0]) == 1:
        text = str(next(iter(rows[0].values())))
        if text.lstrip().startswith("{"):
            return _read_json_plan(json.loads(text))
        if text.lstrip().startswith("->"):
            return _read_tree_plan(text)
    first = rows[0] if rows else {}
    return Plan(first.get("key"), "filesort" in (first.get("Extra") or "").lower(), len(rows), first.get("rows"))


def _read_json_plan(doc: dict) -> Plan:
    tables, filesort = [], False
    stack = [doc]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            if node.get("using_filesort") is True:
                filesort = True
            if "table_name" in node and "access_type" in node:
                tables.append(node)
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    first = tables[0] if tables else {}
    return Plan(first.get("key"), filesort, len(tables), first.get("rows_examined_per_scan"))


def _read_tree_plan(text: str) -> Plan:
    scans = re.findall(r"-> (?:Index (?:range scan|lookup|scan)|Table scan|Covering index \w+)[^\n]*", text)
    key = next((m.group(1) for line in scans if (m := re.search(r" using (\w+)", line))), None)
    estimate = re.search(r"rows=([0-9.e+]+)", scans[0]) if scans else None
    return Plan(key, bool(re.search(r"-> Sort\b", text)), max(1, len(scans)), estimate.group(1) if estimate else None)


def check_claim_plan(conn: Connection, queue: str = "default", limit: int = CLAIM_LIMIT) -> Check:
    tables = preflight.table_status(conn)
    if "job_queue" not in tables:
        return Check(
            "claim_plan",
            Verdict.WARNING,
            "not checked: job_queue does not exist",
            "run `jobqueue init-db`, then `jobqueue doctor` again",
        )
    size = tables["job_queue"].approx_rows
    plan = read_plan(repository.claim.explain_claim(conn, queue, limit))
    shown = (
        f"EXPLAIN of the claim (queue {queue!r}, LIMIT {limit}) at about {size if size is not None else '?'} "
        f"rows in job_queue: key={plan.key}, rows={plan.rows}, {'filesort' if plan.filesort else 'no filesort'}"
    )
    if plan.key == PICK_INDEX and not plan.filesort and plan.steps == 1:
        return Check(
            "claim_plan",
            Verdict.OK,
            f"{shown}: reads {PICK_INDEX} in order, no filesort, so a claim stays cheap as done rows pile up",
        )
    problem = [f"uses {plan.key or 'no index'} instead of {PICK_INDEX}"] if plan.key != PICK_INDEX else []
    if plan.filesort:
        problem.append("sorts the candidates (filesort), so it reads and locks more than the rows it takes")
    if plan.steps != 1:
        problem.append(f"has {plan.steps} steps instead of one")
    return Check(
        "claim_plan",
        Verdict.WARNING,
        f"{shown}: {'; '.join(problem)}",
        f"check that index {PICK_INDEX} (status, queue, priority, id) exists (`jobqueue init-db` creates "
        "it) and refresh statistics with ANALYZE TABLE job_queue",
    )


def check_lock_wait(conn: Connection) -> Check:
    session = int(preflight.variable(conn, "innodb_lock_wait_timeout") or 0)
    server = int(preflight.variable(conn, "innodb_lock_wait_timeout", "GLOBAL") or 0)
    detail = (
        f"innodb_lock_wait_timeout is {session} s on queue connections (server default {server} s); claims "
        "never wait (SKIP LOCKED), operator actions answer busy at once (NOWAIT), fenced writes wait at most "
        "this long"
    )
    if session > LOCK_WAIT_WARNING_SECONDS:
        return Check(
            "lock_wait",
            Verdict.WARNING,
            detail + f": over {LOCK_WAIT_WARNING_SECONDS} s, a write stuck behind a row lock holds a worker "
            "slot (and lets its lease run down) for minutes",
            f"create engines with jobqueue.core.db.create_engine (it sets {DEFAULT_LOCK_WAIT_SECONDS} s per "
            "session) or lower innodb_lock_wait_timeout",
        )
    return Check("lock_wait", Verdict.OK, detail)


def clock_skew(conn: Connection) -> tuple[float, float]:
    """(database clock minus this host's clock, uncertainty), in seconds. The database's time is
    compared with the midpoint of the round trip, so the uncertainty is half the round trip."""
    before = datetime.now(UTC)
    db_time = conn.execute(sa.select(db_now())).scalar()  # UTC_TIMESTAMP(6), what leases use
    after = datetime.now(UTC)
    midpoint = before + (after - before) / 2
    skew = (db_time.replace(tzinfo=UTC) - midpoint).total_seconds()
    return skew, (after - before).total_seconds() / 2


def clock_verdict(skew: float) -> Verdict:
    if abs(skew) > CLOCK_PROBLEM_SECONDS:
        return Verdict.PROBLEM
    if abs(skew) > CLOCK_WARNING_SECONDS:
        return Verdict.WARNING
    return Verdict.OK


def check_clock(conn: Connection) -> Check:
    skew, uncertainty = clock_skew(conn)
    direction = "ahead of" if skew >= 0 else "behind"
    detail = (
        f"the database clock is {abs(skew):.3f} s {direction} this host's (±{uncertainty:.3f} s); leases use "
        "the database clock"
    )
    verdict = clock_verdict(skew)
    if verdict is Verdict.OK:
        return Check("clock", verdict, detail)
    limit = CLOCK_PROBLEM_SECONDS if verdict is Verdict.PROBLEM else CLOCK_WARNING_SECONDS
    return Check(
        "clock",
        verdict,
        f"{detail}, so fencing is unaffected, but log times, dashboard ages and anyone judging a lease "
        f"from this host are off by more than {limit:g} s",
        "synchronise both hosts' clocks (chrony or systemd-timesyncd against the same NTP servers)",
    )


def check_privileges(conn: Connection, flavour: str) -> Check:
    from . import privileges

    account = conn.exec_driver_sql("SELECT CURRENT_USER()").scalar()
    lines = [row[0] for row in conn.exec_driver_sql("SHOW GRANTS FOR CURRENT_USER()").all()]
    grants = privileges.parse_grants(lines)
    database = conn.exec_driver_sql("SELECT DATABASE()").scalar()
    roles = (
        f"; it also has roles ({', '.join(grants.roles)}) whose privileges are not listed here" if grants.roles else ""
    )
    missing_reads = grants.lock_inspection_missing(flavour)
    # Optional, read-only; named so that an operator knows why the Locks page cannot say more.
    inspection = (
        (
            f"; without {' and '.join(missing_reads)} the Locks page and `explain` cannot name who holds "
            "a job's row (optional, read-only: docs/security.md)"
        )
        if missing_reads and not grants.roles
        else ""
    )
    exempt = grants.read_only_exempt(flavour)
    if exempt:
        return Check(
            "privileges",
            Verdict.WARNING,
            f"account {account} holds {', '.join(exempt)} on *.*, which read_only does not bind: on a "
            f"replica made read-only it still writes, so a queue pointed there by mistake would diverge "
            f"from the primary{roles}{inspection}",
            "run the queue as an account with only SELECT, INSERT, UPDATE, DELETE on its database, and "
            "`jobqueue init-db` as a separate one that may also CREATE, ALTER, INDEX, DROP there "
            "(docs/security.md: Least privilege)",
        )
    held = grants.on_tables(database or "", preflight.QUEUE_TABLES) if database else {}
    missing = sorted({p for table in held.values() for p in privileges.DML if p not in table})
    if missing and not grants.roles:
        return Check(
            "privileges",
            Verdict.WARNING,
            f"account {account} lacks {', '.join(missing)} on some queue tables in {database!r}: the "
            f"queue's statements will be refused there{inspection}",
            f"GRANT SELECT, INSERT, UPDATE, DELETE ON `{database}`.* TO {account}",
        )
    ddl = sorted({p for table in held.values() for p in privileges.DDL if p in table})
    note = (
        (
            f"; it may also change the schema ({', '.join(ddl)}): needed by `jobqueue init-db` only, a separate "
            "migration account is safer"
        )
        if ddl
        else ""
    )
    return Check(
        "privileges",
        Verdict.OK,
        f"account {account} holds SELECT, INSERT, UPDATE, DELETE on the queue's tables and nothing that "
        f"read_only does not bind{note}{roles}{inspection}",
    )


def check_replica(report: ReplicaReport, limit: int) -> Check:
    name = f"replica {report.address}"
    lag = report.lag
    if lag is None:
        return Check(
            name,
            Verdict.PROBLEM,
            f"the replica did not answer: {report.error}",
            "start it or fix the network; while it cannot be read, bulk actions do not wait for it",
        )
    if lag.replica is None:
        return Check(
            name,
            Verdict.WARNING,
            lag.detail,
            "GRANT SLAVE MONITOR (MariaDB) or REPLICATION CLIENT (MySQL) ON *.* to the account in "
            "JOBQUEUE_REPLICA_URLS",
        )
    if lag.replica is False:
        return Check(
            name,
            Verdict.WARNING,
            "this server replicates from nobody: it is a primary, not a replica",
            "after a failover, list the new replicas in JOBQUEUE_REPLICA_URLS; else check the URL",
        )
    threads = f"IO thread {lag.io_running}, SQL thread {lag.sql_running}"
    if lag.seconds is None:
        if lag.io_running == "Connecting" and lag.sql_running == "Yes":
            return Check(
                name,
                Verdict.WARNING,
                f"{threads}: reconnecting to its primary, lag unknown meanwhile",
                "check that the primary is up and reachable from the replica (Last_IO_Error)",
            )
        return Check(
            name,
            Verdict.PROBLEM,
            f"replication is not running ({threads}): Seconds_Behind_Master is NULL, so its data may be "
            "any age and bulk actions cannot wait for it",
            "see Last_IO_Error / Last_SQL_Error in SHOW REPLICA STATUS on the replica (SHOW SLAVE STATUS "
            "before MySQL 8.0.22 and MariaDB 10.5.1; gone in MySQL 8.4), then START REPLICA",
        )
    if lag.seconds > limit:
        return Check(
            name,
            Verdict.WARNING,
            f"{lag.seconds} s behind the primary ({threads}), over the {limit} s bound: bulk actions wait "
            "between batches until it catches up",
            "find what holds its SQL thread back (a long query or lock on the replica, a slow disk, a big "
            "transaction on the primary)",
        )
    return Check(name, Verdict.OK, f"{lag.seconds} s behind the primary ({threads}; the bound is {limit} s)")
