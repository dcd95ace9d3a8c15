"""A primary and GTID replicas made of throwaway servers (MariaDB or MySQL: testkit.throwaway's
flavours), for tests of failover and of reading from replicas; and readers of what a server
executed (general log, binlog).

    cluster = ReplicationCluster.create(tmp_path, replicas=1, flavour="mysql").start()
    url = cluster.primary.create_database("jq")        # replicated: the replica has it too
    cluster.wait_caught_up()
    cluster.stop_sql_thread(); ...; cluster.lag_seconds()   # grows while the SQL thread is stopped
    with cluster.hold_sql_thread(): ...    # Seconds_Behind_Master grows (a row lock holds the SQL thread)
    cluster.primary.kill()                                   # SIGKILL
    new = cluster.promote(cluster.replicas[0])               # writable, semi-sync master
    cluster.demote(old, new)                                 # restarted --read-only, replicating
    cluster.cleanup()

Every server has the binary log (ROW, log_slave_updates, gtid_strict_mode) so any replica can be
promoted; server ids are 1, 2, ... by position. A replica runs with --read-only and replicates
with MASTER_USE_GTID=slave_pos as the user `repl`. Semi-synchronous replication (built into
MariaDB 10.3+) is on by default: the primary is rpl_semi_sync_master, replicas are
rpl_semi_sync_slave, and promote()/demote() switch the roles.

On MySQL the same in its own words (the `_Dialect` below holds each statement): GTIDs with
gtid_mode=ON and enforce_gtid_consistency, log_replica_updates; `CHANGE REPLICATION SOURCE TO
... SOURCE_AUTO_POSITION = 1, GET_SOURCE_PUBLIC_KEY = 1` (the `repl` account uses
caching_sha2_password, whose full authentication over plain TCP needs the server's RSA key),
`START REPLICA`, `SHOW REPLICA STATUS`; positions are GTID sets (`@@gtid_executed`,
Retrieved_Gtid_Set) waited for with WAIT_FOR_EXECUTED_GTID_SET; semi-sync comes from the plugins
semisync_source and semisync_replica, both loaded on every server (rpl_semi_sync_source_* /
rpl_semi_sync_replica_*). ReplicaStatus keeps MariaDB's field names for both. MySQL has no
gtid_strict_mode, but a source refuses a replica holding GTIDs it lacks (error 1236) all the same.

What MariaDB 10.11 does here (measured with these servers):

- Seconds_Behind_Master is NULL whenever the SQL thread is stopped, and also while the IO thread
  is stopped or reconnecting ("Connecting", e.g. the primary is dead); it is 0 as soon as both run
  and the relay log is applied, however old the last event. So it cannot show lag growing while a
  test holds the SQL thread. lag_seconds() uses a heartbeat instead: a thread writes
  UTC_TIMESTAMP(6) into `testkit_heartbeat.heartbeat` on the primary every `heartbeat_interval`
  (0.2 s), and the lag is the replica's clock minus the newest heartbeat the replica has applied
  (all servers share this machine's clock). It grows by 1 s per second while the SQL thread is
  stopped and is below about interval + commit time when caught up. While no primary writes (dead,
  between kill and promote) it grows too: "no news from a primary for N seconds".
- A SQL thread that runs but waits is another matter: blocked by a row lock a session on the
  replica holds (hold_sql_thread()), Seconds_Behind_Master grows by about 1 s per second
  (measured: 1, 3, 4, 5 after 1..4 s) and is 0 again once the lock goes and the relay log is
  applied. MASTER_DELAY=N gives a steady N while the primary writes (the heartbeat: every 0.2 s).
- The heartbeat writes as a user without SUPER / READ ONLY ADMIN, so read_only stops it: a
  demoted server never gets a heartbeat of its own, which would be an extra GTID that
  gtid_strict_mode refuses when it later replicates. (Root can write on a --read-only server.)
- Semi-sync with the default rpl_semi_sync_master_wait_no_slave=ON makes every commit on a
  primary without a connected semi-sync replica wait the full rpl_semi_sync_master_timeout (10 s
  by default) before falling back to async: a fresh primary's first CREATE USER, and the first
  write on a promoted primary whose old one is dead. Here wait_no_slave is OFF (asynchronous
  while no semi-sync replica is connected) and the timeout is 1 s.
- The replica's general log shows what its SQL thread applied: DDL as text, row events only as
  `BEGIN` / `COMMIT /* implicit, from Xid_log_event */`, under a thread id that has no `Connect`
  line. Client sessions always start with `Connect user@host`, which is how executed_statements()
  tells a client's statement (a claim) from replication.
- On a --read-only server, SELECT ... FOR UPDATE [SKIP LOCKED] by a user without READ ONLY
  ADMIN fails with 1290 (ER_OPTION_PREVENTS_STATEMENT) like a write; LOCK IN SHARE MODE and plain
  reads pass. The general log still has the refused statement (it logs what was received, before
  it runs); the binlog has only what was written.
- After a SIGKILL of the primary, a replica's IO thread shows `Connecting` with "Connection
  refused" in Last_IO_Error, retrying every MASTER_CONNECT_RETRY (1 s here). A demoted old primary
  replicates from `SET GLOBAL gtid_slave_pos = @@gtid_binlog_pos` (its gtid_slave_pos is empty or
  stale: it was the primary); if it holds a transaction the new primary never got, demote()
  raises, or with rebuild=True reloads it from a dump of the new primary. Replica-role servers
  start with --rpl-semi-sync-slave-enabled, with which 10.6+ crash recovery truncates binlogged
  transactions that were not committed in the engine, so a crashed primary is less likely to
  hold such a transaction.
"""

from __future__ import annotations

import contextlib
import re
import subprocess
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pymysql

from testkit.throwaway import ThrowawayServer

REPLICATION_USER = "repl"
REPLICATION_PASSWORD = "repl-pw"
HEARTBEAT_USER = "testkit_heartbeat"
HEARTBEAT_PASSWORD = "heartbeat-pw"
HEARTBEAT_DATABASE = "testkit_heartbeat"


@dataclass(frozen=True)
class _Dialect:
    """What differs between MariaDB and MySQL in setting up and watching replication."""

    mysql: bool

    def binlog_args(self) -> list[str]:
        """The same on every server, so that any replica can become the primary."""
        common = [
            "--log-bin=binlog",  # fixed names: the default ones carry the host name
            "--relay-log=relay-bin",
            "--binlog-format=ROW",
        ]
        if self.mysql:
            return [
                *common,
                "--log-replica-updates",
                "--gtid-mode=ON",
                "--enforce-gtid-consistency=ON",
                "--plugin-load-add=mysql_clone.so",
            ]  # demote(rebuild=True)
        return [
            *common,
            "--log-slave-updates",  # a replica's binlog holds what it applied: it can serve replicas
            "--gtid-strict-mode=ON",
        ]  # out-of-order or extra GTIDs are an error, not silent divergence

    def semi_sync_args(self, role: str, timeout_ms: int) -> list[str]:
        primary = role == "primary"
        source, replica = ("source", "replica") if self.mysql else ("master", "slave")
        plugins = (
            ["--plugin-load-add=semisync_source.so", "--plugin-load-add=semisync_replica.so"] if self.mysql else []
        )
        return [
            *plugins,
            f"--rpl-semi-sync-{source}-enabled={'ON' if primary else 'OFF'}",
            f"--rpl-semi-sync-{replica}-enabled={'OFF' if primary else 'ON'}",
            f"--rpl-semi-sync-{source}-timeout={timeout_ms}",
            f"--rpl-semi-sync-{source}-wait-no-{replica}=OFF",  # see the module docstring
            f"--rpl-semi-sync-{source}-wait-point=AFTER_SYNC",  # acked before the commit is visible
        ]

    def semi_sync_variable(self, role: str) -> str:
        """rpl_semi_sync_master_enabled (MariaDB) / rpl_semi_sync_source_enabled (MySQL), ..."""
        if role == "primary":
            return "rpl_semi_sync_source_enabled" if self.mysql else "rpl_semi_sync_master_enabled"
        return "rpl_semi_sync_replica_enabled" if self.mysql else "rpl_semi_sync_slave_enabled"

    def semi_sync_status(self, role: str) -> str:
        """The status variable saying whether semi-sync is active in that role now."""
        if role == "primary":
            return "Rpl_semi_sync_source_status" if self.mysql else "Rpl_semi_sync_master_status"
        return "Rpl_semi_sync_replica_status" if self.mysql else "Rpl_semi_sync_slave_status"

    def change_source(self, primary: ThrowawayServer) -> str:
        if self.mysql:
            return (
                f"CHANGE REPLICATION SOURCE TO SOURCE_HOST='{primary.host}', SOURCE_PORT={primary.port}, "
                f"SOURCE_USER='{REPLICATION_USER}', SOURCE_PASSWORD='{REPLICATION_PASSWORD}', "
                # MySQL gives up reconnecting after 10 tries (MariaDB after 100,000).
                "SOURCE_AUTO_POSITION=1, SOURCE_CONNECT_RETRY=1, SOURCE_RETRY_COUNT=86400, GET_SOURCE_PUBLIC_KEY=1"
            )
        return (
            f"CHANGE MASTER TO MASTER_HOST='{primary.host}', MASTER_PORT={primary.port}, "
            f"MASTER_USER='{REPLICATION_USER}', MASTER_PASSWORD='{REPLICATION_PASSWORD}', "
            "MASTER_USE_GTID=slave_pos, MASTER_CONNECT_RETRY=1"
        )

    def replica(self, verb: str) -> str:
        """STOP / START / RESET ... ALL / SHOW ... STATUS, with an optional tail (SQL_THREAD)."""
        return verb.replace("%", "REPLICA" if self.mysql else "SLAVE")

    @property
    def executed_gtids(self) -> str:
        """An expression for what the server has written to its binlog."""
        return "@@GLOBAL.gtid_executed" if self.mysql else "@@gtid_binlog_pos"

    def wait_for_gtids(self, position: str, seconds: float) -> str:
        """A SELECT answering 0 once `position` is applied, non-zero after `seconds`."""
        if self.mysql:
            return f"SELECT WAIT_FOR_EXECUTED_GTID_SET('{position}', {seconds:.3f})"
        return f"SELECT MASTER_GTID_WAIT('{position}', {seconds:.3f})"


def dialect(server: ThrowawayServer) -> _Dialect:
    return _Dialect(server.is_mysql)


# --- what a server reports -----------------------------------------------------------------------


@dataclass(frozen=True)
class ReplicaStatus:
    """The parts of SHOW SLAVE STATUS / SHOW REPLICA STATUS (and the GTID variables) that tests
    look at, under MariaDB's names; on MySQL the positions are GTID sets."""

    seconds_behind_master: int | None  # NULL (None) whenever the SQL or IO thread is not running
    io_running: str  # "Yes", "No" or "Connecting"
    sql_running: str  # "Yes" or "No"
    gtid_io_pos: str  # received by the IO thread (MySQL: Retrieved_Gtid_Set)
    gtid_slave_pos: str  # applied by the SQL thread (MySQL: gtid_executed)
    gtid_binlog_pos: str  # in this server's own binlog (MySQL: gtid_executed)
    master_host: str
    master_port: int
    last_io_error: str
    last_sql_error: str

    @property
    def replicating(self) -> bool:
        return self.io_running == "Yes" and self.sql_running == "Yes"


def replica_status(server: ThrowawayServer) -> ReplicaStatus | None:
    """None when the server is not configured as a replica."""
    mysql = server.is_mysql
    conn = server.connect()
    try:
        with conn.cursor(pymysql.cursors.DictCursor) as cur:
            cur.execute(dialect(server).replica("SHOW % STATUS"))
            row = cur.fetchone()
            if row is None:
                return None
            if mysql:
                cur.execute("SELECT @@GLOBAL.gtid_executed AS slave_pos, @@GLOBAL.gtid_executed AS binlog_pos")
            else:
                cur.execute("SELECT @@gtid_slave_pos AS slave_pos, @@gtid_binlog_pos AS binlog_pos")
            gtid = cur.fetchone()
    finally:
        conn.close()
    if mysql:
        return ReplicaStatus(
            seconds_behind_master=row["Seconds_Behind_Source"],
            io_running=row["Replica_IO_Running"],
            sql_running=row["Replica_SQL_Running"],
            gtid_io_pos=_gtid_set(row["Retrieved_Gtid_Set"]),
            gtid_slave_pos=_gtid_set(gtid["slave_pos"]),
            gtid_binlog_pos=_gtid_set(gtid["binlog_pos"]),
            master_host=row["Source_Host"],
            master_port=int(row["Source_Port"]),
            last_io_error=row["Last_IO_Error"],
            last_sql_error=row["Last_SQL_Error"],
        )
    return ReplicaStatus(
        seconds_behind_master=row["Seconds_Behind_Master"],
        io_running=row["Slave_IO_Running"],
        sql_running=row["Slave_SQL_Running"],
        gtid_io_pos=row["Gtid_IO_Pos"],
        gtid_slave_pos=gtid["slave_pos"],
        gtid_binlog_pos=gtid["binlog_pos"],
        master_host=row["Master_Host"],
        master_port=int(row["Master_Port"]),
        last_io_error=row["Last_IO_Error"],
        last_sql_error=row["Last_SQL_Error"],
    )


def gtid_binlog_pos(server: ThrowawayServer) -> str:
    """What the server has in its binlog: MariaDB's gtid_binlog_pos, MySQL's gtid_executed."""
    return _gtid_set(server.execute(f"SELECT {dialect(server).executed_gtids}")[0][0])


def _gtid_set(value: str) -> str:
    return value.replace("\n", "")  # MySQL breaks a long GTID set over lines


def _extra_gtids(server: ThrowawayServer, primary: ThrowawayServer) -> str:
    """The transactions `server` has that `primary` never got ('' when none): MySQL's
    GTID_SUBTRACT; on MariaDB, per domain and server id, the sequence numbers past the primary's
    (gtid_binlog_state keeps the last of each; with gtid_strict_mode they only grow)."""
    if server.is_mysql:
        return _gtid_set(
            server.execute(f"SELECT GTID_SUBTRACT(@@GLOBAL.gtid_executed, '{gtid_binlog_pos(primary)}')")[0][0]
        )

    def last(s: ThrowawayServer) -> dict[tuple[str, str], int]:
        state = s.execute("SELECT @@GLOBAL.gtid_binlog_state")[0][0] or ""
        out = {}
        for gtid in filter(None, state.split(",")):
            domain, server_id, seq = gtid.strip().split("-")
            out[(domain, server_id)] = int(seq)
        return out

    theirs = last(primary)
    extra = []
    for (domain, server_id), seq in sorted(last(server).items()):
        first = theirs.get((domain, server_id), 0) + 1
        if seq >= first:
            extra.append(f"{domain}-{server_id}-{first}" + (f"..{seq}" if seq > first else ""))
    return ",".join(extra)


# --- what a server executed ----------------------------------------------------------------------


@dataclass(frozen=True)
class LoggedCommand:
    """One entry of a general log."""

    run: int  # 0 for the first start of the server, 1 after the first restart, ...
    thread_id: int  # connection id (they start again at each run)
    command: str  # "Connect", "Query", "Execute", "Quit", "Init DB", "Connect Out", ...
    argument: str  # the statement for Query/Execute, may span lines
    user: str | None  # "root@127.0.0.1" from the thread's Connect line; None for server
    # threads (a replica's SQL thread) that never log a Connect


# An entry starts with a date and time (MariaDB: only when the second changed, else two tabs;
# MySQL: an ISO time on every line), then the thread id, the command and a tab. Any other line
# continues a multi-line statement.
_ENTRY = re.compile(r"^(?:\d{6}\s+\d{1,2}:\d\d:\d\d|\t\t|\d{4}-\d\d-\d\dT[\d:.]+Z)\s*(\d+) ([A-Z][A-Za-z ]*?)\t(.*)$")
_RUN_HEADER = re.compile(r"^\S+, Version: .* started with:$")


def read_general_log(source: ThrowawayServer | Path | str) -> list[LoggedCommand]:
    """Parse a general log file (a server started with general_log=True, or a path)."""
    if isinstance(source, ThrowawayServer):
        if not source.general_log:
            raise ValueError(f"{source} was not started with general_log=True")
        path = source.general_log_file
    else:
        path = Path(source)
    entries: list[LoggedCommand] = []
    run = -1
    users: dict[int, str] = {}
    pending: list | None = None  # [run, thread, command, argument lines, user]

    def flush():
        if pending is not None:
            # Trailing empty lines are the file's end or the separator before the next entry.
            argument = "\n".join(pending[3]).rstrip("\n")
            entries.append(LoggedCommand(pending[0], pending[1], pending[2], argument, pending[4]))

    with open(path, errors="replace") as f:
        lines = f.read().split("\n")
    for line in lines:
        if _RUN_HEADER.match(line):
            flush()
            pending = None
            run += 1
            users = {}
            continue
        if line.startswith("Tcp port: ") or line.startswith("Time\t") or line.startswith("Time "):
            continue
        m = _ENTRY.match(line)
        if m:
            flush()
            thread, command, argument = int(m[1]), m[2], m[3]
            if command == "Connect":
                users[thread] = argument.split(" ", 1)[0]
            pending = [max(run, 0), thread, command, [argument], users.get(thread)]
        elif pending is not None:
            pending[3].append(line)
    flush()
    return entries


def executed_statements(
    server: ThrowawayServer, pattern: str | None = None, *, clients_only: bool = True, include_heartbeat: bool = False
) -> list[str]:
    """The statements the server ran (Query and Execute entries of its general log), in order;
    with `pattern`, only those matching that regular expression (case-insensitive, searched).
    `clients_only` leaves out server threads: what a replica's SQL thread applied. The cluster's
    own heartbeat writes are left out unless `include_heartbeat`.

        assert not executed_statements(replica, r"FOR UPDATE SKIP LOCKED")
    """
    wanted = re.compile(pattern, re.IGNORECASE | re.DOTALL) if pattern else None
    heartbeat_user = HEARTBEAT_USER + "@"
    return [
        e.argument
        for e in read_general_log(server)
        if e.command in ("Query", "Execute")
        and (e.user is not None or not clients_only)
        and (include_heartbeat or not (e.user or "").startswith(heartbeat_user))
        and (wanted is None or wanted.search(e.argument))
    ]


@dataclass(frozen=True)
class BinlogEvent:
    log_name: str
    pos: int
    event_type: str  # "Gtid", "Query", "Table_map", "Write_rows_v1", "Xid", ...
    server_id: int  # the server where the transaction was first written
    end_log_pos: int
    info: str


def binlog_events(server: ThrowawayServer) -> list[BinlogEvent]:
    """Every event in the server's binary logs. On a replica (log_slave_updates) the events with
    its own server id are the transactions that were written there, not replicated."""
    events = []
    for log_name, *_ in server.execute("SHOW BINARY LOGS"):
        for row in server.execute(f"SHOW BINLOG EVENTS IN '{log_name}'"):
            events.append(BinlogEvent(row[0], int(row[1]), row[2], int(row[3]), int(row[4]), row[5]))
    return events


# --- the cluster ---------------------------------------------------------------------------------


class ReplicationCluster:
    """A primary and replicas. `servers` are ThrowawayServer objects not started yet (build them
    with create(), or yourself to put them on other addresses or in network namespaces); the first
    becomes the primary. Their own extra_args are kept; the replication arguments are added."""

    def __init__(
        self,
        servers: Sequence[ThrowawayServer],
        *,
        semi_sync: bool = True,
        semi_sync_timeout_ms: int = 1000,
        heartbeat_interval: float | None = 0.2,
    ):
        if len(servers) < 2:
            raise ValueError("a primary and at least one replica")
        self.servers = list(servers)
        flavours = {server.flavour.name for server in self.servers}
        if len(flavours) != 1:
            raise ValueError(f"servers of one flavour, not {sorted(flavours)}")
        self.dialect = dialect(self.servers[0])
        self.server_ids = {server: number for number, server in enumerate(self.servers, start=1)}
        self._own_args = {server: list(server.extra_args) for server in self.servers}
        self.semi_sync = semi_sync
        self.semi_sync_timeout_ms = semi_sync_timeout_ms
        self.primary = self.servers[0]
        self.replicas = self.servers[1:]
        self.heartbeat_interval = heartbeat_interval
        self._primary_lock = threading.Lock()  # the heartbeat writes only to the current primary
        self._heartbeat: _Heartbeat | None = None
        self.timings: dict[str, float] = {}  # seconds: "start", "promote", "demote"
        self.discarded: dict[ThrowawayServer, str] = {}  # GTIDs a rebuilt old primary had alone

    @classmethod
    def create(
        cls,
        base_dir: Path | str,
        replicas: int = 1,
        *extra_args: str,
        general_log: bool = False,
        flavour: str = "mariadb",
        **options,
    ) -> ReplicationCluster:
        """Servers under base_dir/primary, base_dir/replica-1, ... on 127.0.0.1."""
        base_dir = Path(base_dir)
        names = ["primary"] + [f"replica-{n}" for n in range(1, replicas + 1)]
        servers = [
            ThrowawayServer(base_dir / name, *extra_args, general_log=general_log, flavour=flavour) for name in names
        ]
        return cls(servers, **options)

    # --- lifecycle -------------------------------------------------------------------------------

    def start(self, timeout: float = 30.0) -> ReplicationCluster:
        started = time.monotonic()
        self._set_role(self.primary, "primary")
        for replica in self.replicas:
            self._set_role(replica, "replica")
        for server in self.servers:
            server.start()
        # Created on the primary and replicated, so every server has them when it is promoted.
        self.primary.execute(f"CREATE USER '{REPLICATION_USER}'@'%' IDENTIFIED BY '{REPLICATION_PASSWORD}'")
        self.primary.execute(f"GRANT REPLICATION SLAVE ON *.* TO '{REPLICATION_USER}'@'%'")
        self.primary.execute(f"CREATE DATABASE {HEARTBEAT_DATABASE}")
        self.primary.execute(
            f"CREATE TABLE {HEARTBEAT_DATABASE}.heartbeat (server_id INT UNSIGNED PRIMARY KEY, ts DATETIME(6) NOT NULL)"
        )
        self.primary.execute(f"CREATE USER '{HEARTBEAT_USER}'@'%' IDENTIFIED BY '{HEARTBEAT_PASSWORD}'")
        self.primary.execute(f"GRANT INSERT, UPDATE, SELECT ON {HEARTBEAT_DATABASE}.* TO '{HEARTBEAT_USER}'@'%'")
        for replica in self.replicas:
            self._replicate(replica, self.primary)
        self.wait_caught_up(timeout=timeout)
        if self.heartbeat_interval:
            self._heartbeat = _Heartbeat(self, self.heartbeat_interval)
            self._heartbeat.write_once()
            self.wait_caught_up(timeout=timeout)  # lag_seconds() has a heartbeat to read from the start
        self.timings["start"] = time.monotonic() - started
        return self

    def cleanup(self) -> None:
        if self._heartbeat is not None:
            self._heartbeat.stop()
            self._heartbeat = None
        for server in self.servers:
            server.cleanup()

    def __enter__(self) -> ReplicationCluster:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.cleanup()

    # --- watching replication --------------------------------------------------------------------

    def status(self, replica: ThrowawayServer | None = None) -> ReplicaStatus:
        replica = self._replica(replica)
        status = replica_status(replica)
        if status is None:
            raise RuntimeError(f"{replica} is not a replica")
        return status

    def lag_seconds(self, replica: ThrowawayServer | None = None) -> float:
        """Seconds since the newest heartbeat the replica has applied was written on a primary
        (resolution: heartbeat_interval). Grows while the SQL thread is stopped, unlike
        Seconds_Behind_Master (NULL then)."""
        if self._heartbeat is None:
            raise RuntimeError("no heartbeat: the cluster was made with heartbeat_interval=None")
        rows = self._replica(replica).execute(
            f"SELECT TIMESTAMPDIFF(MICROSECOND, MAX(ts), UTC_TIMESTAMP(6)) FROM {HEARTBEAT_DATABASE}.heartbeat"
        )
        if rows[0][0] is None:
            return float("inf")  # no heartbeat applied yet (start() waits for the first)
        return max(0.0, rows[0][0] / 1e6)

    def wait_caught_up(self, replica: ThrowawayServer | None = None, timeout: float = 30.0) -> None:
        """Until the replica (every replica by default) applied all that the primary has binlogged
        now; TimeoutError with its status if it does not within `timeout`."""
        target = gtid_binlog_pos(self.primary)
        for each in [replica] if replica is not None else self.replicas:
            _wait_for_gtid(each, target, timeout)

    def stop_sql_thread(self, replica: ThrowawayServer | None = None) -> None:
        """The IO thread keeps receiving (and acking semi-sync), nothing is applied."""
        self._replica(replica).execute(self.dialect.replica("STOP % SQL_THREAD"))

    def start_sql_thread(self, replica: ThrowawayServer | None = None) -> None:
        self._replica(replica).execute(self.dialect.replica("START % SQL_THREAD"))

    @contextlib.contextmanager
    def hold_sql_thread(self, replica: ThrowawayServer | None = None) -> Iterator[None]:
        """Real lag, as the server reports it: while this holds, the replica's SQL thread runs
        but waits on a row lock that a root session on the replica holds (root may lock rows on a
        --read-only server), behind a write made on the primary just after; everything later
        queues up in the relay log. Seconds_Behind_Master then grows by about 1 s per second
        (stop_sql_thread() makes it NULL instead). On leaving, the lock goes and the replica
        catches up (call wait_caught_up() to wait for it). The SQL thread gives up a lock wait
        after innodb_lock_wait_timeout (50 s) and retries the transaction (10 times), still
        lagging."""
        replica = self._replica(replica)
        table = f"{HEARTBEAT_DATABASE}.lag_maker"
        self.primary.execute(f"CREATE TABLE IF NOT EXISTS {table} (id INT PRIMARY KEY, n INT NOT NULL)")
        self.primary.execute(f"INSERT IGNORE INTO {table} VALUES (1, 0)")
        self.wait_caught_up(replica)
        holder = replica.connect()
        try:
            with holder.cursor() as cur:
                cur.execute("BEGIN")
                cur.execute(f"SELECT n FROM {table} WHERE id = 1 FOR UPDATE")
            self.primary.execute(f"UPDATE {table} SET n = n + 1 WHERE id = 1")
            yield
        finally:
            holder.rollback()
            holder.close()

    # --- failover --------------------------------------------------------------------------------

    def promote(self, replica: ThrowawayServer | None = None, timeout: float = 30.0) -> ThrowawayServer:
        """Make a replica the primary: apply what it already received, STOP SLAVE, RESET SLAVE ALL,
        read_only OFF, semi-sync master. The other replicas follow it from their GTID positions.
        If the old primary still runs it is set read-only first (a planned switchover); a dead
        one stays out until demote(). Returns the new primary."""
        started = time.monotonic()
        new = self._replica(replica)
        old = self.primary
        if self.status(new).sql_running != "Yes":
            new.execute(self.dialect.replica("START % SQL_THREAD"))  # a test may have stopped it
        try:
            # Fence a primary that still runs (a planned switchover), then take all it has.
            old.execute("SET GLOBAL read_only = ON")
            _wait_for_gtid(new, gtid_binlog_pos(old), timeout)
        except pymysql.err.OperationalError:
            # Dead or cut off: apply what the IO thread already wrote to the relay log, or those
            # transactions would be lost with the relay log at RESET SLAVE ALL.
            _wait_for_gtid(new, self.status(new).gtid_io_pos, timeout)
        new.execute(self.dialect.replica("STOP %"))
        new.execute(self.dialect.replica("RESET % ALL"))
        new.execute("SET GLOBAL read_only = OFF")
        if self.semi_sync:
            new.execute(f"SET GLOBAL {self.dialect.semi_sync_variable('replica')} = OFF")
            new.execute(f"SET GLOBAL {self.dialect.semi_sync_variable('primary')} = ON")
        self._set_role(new, "primary")
        with self._primary_lock:
            self.primary = new
            self.replicas.remove(new)
        for other in self.replicas:
            if other.running:
                self._replicate(other, new)
        self.timings["promote"] = time.monotonic() - started
        return new

    def demote(
        self,
        old_primary: ThrowawayServer,
        new_primary: ThrowawayServer | None = None,
        timeout: float = 30.0,
        rebuild: bool = False,
    ) -> None:
        """Bring a former primary back as a read-only replica of the (already promoted) new one,
        from its own GTID position. A dead one (SIGKILLed, stopped) is started with --read-only
        first. Raises if it does not replicate and catch up (an extra transaction, see above).

        MySQL keeps what a SIGKILLed primary had binlogged but the replica never acknowledged
        (its crash recovery commits every transaction in the binlog; MariaDB 10.6+ truncates them
        on a server started as a semi-sync replica), and its source refuses a replica's extra
        GTIDs only when they carry the source's own server_uuid: such a server would replicate
        and then stop on the first row they touch (1062). MariaDB keeps one too when it was
        committed without an acknowledgement (semi-sync falls back to asynchronous while no
        replica is connected: the quick drill in CI met one). So demote() compares the GTIDs
        first: with extra transactions it raises, or with `rebuild` it replaces the old primary's
        data by the new primary's (MySQL: CLONE; MariaDB: a dump, _reload) and the extra
        transactions are gone; what they were is in self.discarded."""
        new_primary = new_primary or self.primary
        if new_primary is not self.primary or old_primary is new_primary:
            raise ValueError("promote() the new primary first, then demote the old one")
        started = time.monotonic()
        self._set_role(old_primary, "replica")
        if old_primary.running:
            old_primary.execute("SET GLOBAL read_only = ON")
            if self.semi_sync:
                old_primary.execute(f"SET GLOBAL {self.dialect.semi_sync_variable('primary')} = OFF")
                old_primary.execute(f"SET GLOBAL {self.dialect.semi_sync_variable('replica')} = ON")
        else:
            old_primary.start()  # with --read-only; InnoDB crash recovery if it was killed
        extra = _extra_gtids(old_primary, new_primary)
        if extra and not rebuild:
            raise RuntimeError(
                f"{old_primary} holds transactions {extra} that {new_primary} never got: "
                "rebuild it (demote(rebuild=True) copies the new primary's data)"
            )
        if extra:
            if self.dialect.mysql:
                self._clone(old_primary, new_primary)
            else:
                self._reload(old_primary, new_primary)
            self.discarded[old_primary] = extra
        old_primary.execute(self.dialect.replica("STOP %"))
        old_primary.execute(self.dialect.replica("RESET % ALL"))
        if not self.dialect.mysql and not extra:
            # Its gtid_slave_pos is empty or from an earlier time as a replica: what it has is
            # what it binlogged (log_slave_updates: replicated transactions too). MySQL's auto
            # position always sends gtid_executed, which is just that. (_reload set it.)
            old_primary.execute("SET GLOBAL gtid_slave_pos = @@gtid_binlog_pos")
        self._replicate(old_primary, new_primary)
        if old_primary not in self.replicas:
            self.replicas.append(old_primary)
        self.wait_caught_up(old_primary, timeout=timeout)
        # Caught up can come before the IO thread says Yes (MariaDB 11.8: "Preparing" a moment).
        deadline = time.monotonic() + timeout
        while not (status := self.status(old_primary)).replicating:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{old_primary} caught up but does not replicate: {status}")
            time.sleep(0.05)
        self.timings["demote"] = time.monotonic() - started

    # --- internals -------------------------------------------------------------------------------

    def _clone(self, server: ThrowawayServer, donor: ThrowawayServer) -> None:
        """MySQL's CLONE INSTANCE: the donor's data replaces the server's (binlogs included), and
        the server stops (no supervisor restarts it here: error 3707), so it is started again."""
        server.execute(f"SET GLOBAL clone_valid_donor_list = '{donor.host}:{donor.port}'")
        try:
            server.execute(f"CLONE INSTANCE FROM 'root'@'{donor.host}':{donor.port} IDENTIFIED BY ''")
        except pymysql.err.OperationalError as exc:
            if exc.args[0] != 3707:  # "Restart server failed (mysqld is not managed by supervisor process)"
                raise
        server.proc.wait(60)
        server.proc = None
        server.start()

    def _reload(self, server: ThrowawayServer, donor: ThrowawayServer) -> None:
        """MariaDB has no CLONE: the server's databases are replaced by a dump of the donor's
        (mariadb-dump --single-transaction --gtid: one consistent snapshot and the GTID position it
        is at), its binlog is emptied (RESET MASTER: the extra GTIDs go), and it will replicate from
        that position. The mysql schema (accounts) is left as it is: it replicated before."""
        system = {"mysql", "information_schema", "performance_schema", "sys"}
        databases = [r[0] for r in donor.execute("SHOW DATABASES") if r[0] not in system]
        dump = subprocess.run(
            [
                "mariadb-dump",
                "--no-defaults",
                "--skip-ssl",
                f"--host={donor.host}",
                f"--port={donor.port}",
                "--user=root",
                "--single-transaction",
                "--gtid",
                "--master-data=2",
                "--databases",
                *databases,
            ],
            capture_output=True,
            check=True,
            timeout=300,
        )
        position = re.search(rb"gtid_slave_pos='([^']*)'", dump.stdout)
        if position is None:
            raise RuntimeError(f"no GTID position in the dump of {donor}")
        server.execute(self.dialect.replica("STOP %"))
        for (name,) in server.execute("SHOW DATABASES"):
            if name not in system:
                server.execute(f"DROP DATABASE `{name}`")
        subprocess.run(
            ["mariadb", "--no-defaults", "--skip-ssl", f"--host={server.host}", f"--port={server.port}", "--user=root"],
            input=dump.stdout,
            capture_output=True,
            check=True,
            timeout=300,
        )
        server.execute("RESET MASTER")
        server.execute(f"SET GLOBAL gtid_slave_pos = '{position.group(1).decode()}'")

    def _replica(self, replica: ThrowawayServer | None) -> ThrowawayServer:
        if replica is None:
            if not self.replicas:
                raise RuntimeError("no replica left")
            return self.replicas[0]
        if replica not in self.replicas:
            raise ValueError(f"{replica} is not a replica of this cluster")
        return replica

    def _set_role(self, server: ThrowawayServer, role: str) -> None:
        """The arguments for the next start: a restart keeps the server in its role."""
        args = [*self._own_args[server], *self.dialect.binlog_args(), f"--server-id={self.server_ids[server]}"]
        if role == "replica":
            args.append("--read-only")
        if self.semi_sync:
            args += self.dialect.semi_sync_args(role, self.semi_sync_timeout_ms)
        server.extra_args = args

    def _replicate(self, replica: ThrowawayServer, primary: ThrowawayServer) -> None:
        replica.execute(self.dialect.replica("STOP %"))
        replica.execute(self.dialect.change_source(primary))
        replica.execute(self.dialect.replica("START %"))


def _wait_for_gtid(replica: ThrowawayServer, position: str, timeout: float) -> None:
    if not position:
        return
    status = replica_status(replica)
    if status is None or status.sql_running != "Yes":
        raise RuntimeError(f"{replica} cannot catch up, its SQL thread does not run: {status}")
    deadline = time.monotonic() + timeout
    # In slices: a broken IO thread (error 1236) is reported at once instead of at the timeout.
    while True:
        left = deadline - time.monotonic()
        if replica.execute(dialect(replica).wait_for_gtids(position, max(0.0, min(left, 0.5))))[0][0] == 0:
            return
        status = replica_status(replica)
        if status is not None and (status.last_io_error and status.io_running == "No" or status.last_sql_error):
            raise RuntimeError(f"{replica} stopped replicating before {position}: {status}")
        if left <= 0:
            raise TimeoutError(f"{replica} did not reach {position} within {timeout}s: {status}")


class _Heartbeat:
    """Writes UTC_TIMESTAMP(6) on the cluster's current primary every `interval` seconds, from a
    daemon thread, as a user that read_only stops."""

    def __init__(self, cluster: ReplicationCluster, interval: float):
        self.cluster = cluster
        self.interval = interval
        self._stopping = threading.Event()
        self._conn: pymysql.Connection | None = None
        self._conn_to: ThrowawayServer | None = None
        self._thread = threading.Thread(target=self._run, name="testkit-heartbeat", daemon=True)
        self._thread.start()

    def write_once(self) -> None:
        with self.cluster._primary_lock:
            primary = self.cluster.primary
            if self._conn_to is not primary:
                self._close()
            if self._conn is None:
                self._conn = pymysql.connect(
                    host=primary.host,
                    port=primary.port,
                    user=HEARTBEAT_USER,
                    password=HEARTBEAT_PASSWORD,
                    autocommit=True,
                    connect_timeout=2,
                    read_timeout=5,
                    write_timeout=5,
                    ssl_disabled=True,
                )
                self._conn_to = primary
            with self._conn.cursor() as cur:
                cur.execute(
                    f"INSERT INTO {HEARTBEAT_DATABASE}.heartbeat (server_id, ts) "
                    "VALUES (@@server_id, UTC_TIMESTAMP(6)) ON DUPLICATE KEY UPDATE ts = VALUES(ts)"
                )

    def _run(self) -> None:
        while not self._stopping.wait(self.interval):
            try:
                self.write_once()
            except (pymysql.err.Error, OSError):
                # The primary is dead, restarting or read-only (between a kill and promote()):
                # no heartbeat then, which is what makes the lag grow. Try again next time.
                self._close()

    def _close(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            except (pymysql.err.Error, OSError):
                pass
        self._conn = None
        self._conn_to = None

    def stop(self) -> None:
        self._stopping.set()
        self._thread.join(10)
        with self.cluster._primary_lock:
            self._close()


__all__ = [
    "ReplicationCluster",
    "ReplicaStatus",
    "replica_status",
    "gtid_binlog_pos",
    "LoggedCommand",
    "read_general_log",
    "executed_statements",
    "BinlogEvent",
    "binlog_events",
    "REPLICATION_USER",
    "REPLICATION_PASSWORD",
]
