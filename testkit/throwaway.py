"""A private server for tests that need a server setting (binlog format, read-only, a restart),
in three flavours: `mariadb` (the machine's own mariadbd, MariaDB 10.11), `mysql` (MySQL 9.x) and
`mariadb11` (MariaDB 11.8), the last two from the Debian roots scripts/provision-server builds
under /var/cache/jobqueue-servers (JOBQUEUE_SERVER_CACHE), run with `chroot`.

The shared servers (3306/3307/3308) are never reconfigured by a test: a test that needs
`--read-only` or `--binlog-format=STATEMENT`, or that has to stop and restart the server under
running workers, starts one of these instead:

    server = ThrowawayServer(tmp_path / "db", "--log-bin", "--binlog-format=STATEMENT", flavour="mysql")
    server.start()                       # 1-2 s: system tables, then start
    url = server.create_database("jq")   # mysql+pymysql://root@127.0.0.1:<port>/jq
    ...
    server.stop()                        # SIGTERM, clean shutdown
    server.start()                       # same datadir, same port: the data is still there
    server.restart("--read-only")        # the same data under other settings
    server.kill()                        # SIGKILL, InnoDB recovers on the next start

Root has no password and logs in over TCP, with real grants (`root` has SUPER, which matters:
`--read-only` does not stop it from writing, so checks must read the variable).

Where things live: for `mariadb` the datadir and logs are under the directory given (a pytest
tmp_path) and the unix socket in a short directory of its own (socket paths are limited to 107
bytes). A chrooted server can only see its root, so its datadir, logs and socket live in a
directory of their own under ROOT/tmp (`server.run_dir`; the attributes below give their paths
as this process sees them); cleanup() moves the error and general logs to the directory given
and removes the rest. Its datadir is a copy of one initialised once per root and set of
InnoDB sizes (ROOT/var/lib/jobqueue-throwaway: MySQL's --initialize takes ~3 s, a copy ~0.5 s),
without auto.cnf, so each MySQL gets a server_uuid of its own (GTID replication needs that).

Server defaults are the flavour's own: MySQL 9.x writes a ROW binlog with GTIDs unless told
otherwise (MariaDB has no binlog unless given --log-bin).

Every started server is also stopped at interpreter exit, in case a test run is interrupted
before its fixture teardown.

Optional, for replication and network tests (testkit.replication, testkit.netns):

    ThrowawayServer(path, host="10.77.3.4",                        # bind there, not 127.0.0.1
                    command_prefix=["ip", "netns", "exec", "jqt-..-db"],  # start it in a netns
                    general_log=True)                              # every statement to a file

A server on another address also lets `root` log in from the network (`root@'%'`, created without
writing the binlog, so replicas get no extra GTID; MySQL's is made at initialisation); readiness is
checked over the unix socket, which works from any network namespace. `general_log=True` writes
`general.log` (`server.general_log_file`); `testkit.replication.executed_statements()` reads it.
"""

from __future__ import annotations

import atexit
import fcntl
import os
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pymysql

MARIADBD = os.environ.get("JOBQUEUE_TEST_MARIADBD", "/usr/sbin/mariadbd")
INSTALL_DB = os.environ.get(
    "JOBQUEUE_TEST_MARIADB_INSTALL_DB", shutil.which("mariadb-install-db") or "mariadb-install-db"
)
SERVER_CACHE = Path(os.environ.get("JOBQUEUE_SERVER_CACHE", "/var/cache/jobqueue-servers"))


@dataclass(frozen=True)
class Flavour:
    name: str  # as tests/conftest.py names the servers: mariadb, mysql, mariadb11
    root: Path | None  # the chroot it runs in; None: the host's own
    mysql: bool  # MySQL rather than MariaDB
    init_args: tuple[str, ...]  # InnoDB sizes, to the initialisation and to every start
    server_args: tuple[str, ...]

    @property
    def daemon(self) -> str:
        if self.root is None:
            return MARIADBD
        return "/usr/sbin/mysqld" if self.mysql else "/usr/sbin/mariadbd"


# Small and quick: a test server holds a few thousand rows at most. The same InnoDB sizes go to
# the initialisation and the server so the redo log is not resized at the first start.
_MARIADB_INIT = ("--innodb-buffer-pool-size=32M", "--innodb-log-file-size=16M")
_MARIADB_SERVER = (
    "--skip-name-resolve",
    "--innodb-buffer-pool-dump-at-shutdown=OFF",  # shutdown in ~0.1 s instead of ~1 s
    "--innodb-buffer-pool-load-at-startup=OFF",
    "--max-connections=200",
)
# MySQL: 8 MB of redo makes --initialize itself wait on checkpoints; 32 MB does not.
_MYSQL_INIT = ("--innodb-buffer-pool-size=32M", "--innodb-redo-log-capacity=32M")
_MYSQL_SERVER = (*_MARIADB_SERVER, "--mysqlx=OFF", "--secure-file-priv=")

FLAVOURS = {
    "mariadb": Flavour("mariadb", None, False, _MARIADB_INIT, _MARIADB_SERVER),
    "mysql": Flavour("mysql", SERVER_CACHE / "sid-3307", True, _MYSQL_INIT, _MYSQL_SERVER),
    "mariadb11": Flavour("mariadb11", SERVER_CACHE / "trixie-3308", False, _MARIADB_INIT, _MARIADB_SERVER),
}


def describe_flavour(name: str) -> str:
    """Where a throwaway server of that flavour comes from, for a report."""
    flavour = FLAVOURS[name]
    if flavour.root is None:
        return f"MariaDB from `{MARIADBD}`"
    product = "MySQL" if flavour.mysql else "MariaDB"
    return f"{product} from `{flavour.root}` (scripts/provision-server), `{flavour.daemon}` run with chroot"


# Servers started and not yet stopped, killed at exit if a teardown never ran.
_running: set[ThrowawayServer] = set()
# Chrooted servers whose run directory is still in their root, removed at exit.
_in_roots: set[ThrowawayServer] = set()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ThrowawayServer:
    def __init__(
        self,
        base_dir: Path | str,
        *extra_args: str,
        flavour: str = "mariadb",
        port: int | None = None,
        startup_timeout: float = 30.0,
        host: str = "127.0.0.1",
        command_prefix: Sequence[str] = (),
        general_log: bool = False,
    ):
        if flavour not in FLAVOURS:
            raise ValueError(f"flavour {flavour!r}: choose from {', '.join(FLAVOURS)}")
        self.flavour = FLAVOURS[flavour]
        self.base_dir = Path(base_dir)
        self.base_dir.mkdir(parents=True, exist_ok=True)
        root = self.flavour.root
        if root is None:
            self.run_dir = self.base_dir
            self._inside = str(self.base_dir)  # the same path: no chroot
            self._sockdir = tempfile.mkdtemp(prefix="jqdb-")
            socket_inside = os.path.join(self._sockdir, "mariadbd.sock")
        else:
            if not os.access(root / self.flavour.daemon.lstrip("/"), os.X_OK):
                raise RuntimeError(f"no {self.flavour.daemon} in {root}: scripts/ensure-services builds it")
            name = f"jqt-{secrets.token_hex(4)}"
            self.run_dir = root / "tmp" / name
            self.run_dir.mkdir(parents=True)
            self._inside = f"/tmp/{name}"
            self._sockdir = None
            socket_inside = f"{self._inside}/mysqld.sock"
            _in_roots.add(self)
        self.datadir = self.run_dir / "data"
        self.error_log = self.run_dir / "mysqld.err"
        self.general_log_file = self.run_dir / "general.log"
        self._socket_inside = socket_inside
        self.socket = self._host_path(socket_inside)
        self.extra_args = list(extra_args)  # change between stop() and start() to restart differently
        self.host = host  # the address it binds to and clients connect to
        self.command_prefix = list(command_prefix)  # e.g. ["ip", "netns", "exec", name]
        self.general_log = general_log
        self.port = port or free_port()
        self._port_chosen = port is not None
        self.startup_timeout = startup_timeout
        self.proc: subprocess.Popen | None = None
        self.install_seconds: float | None = None
        self.start_seconds: float | None = None

    @property
    def is_mysql(self) -> bool:
        return self.flavour.mysql

    def _host_path(self, inside: str) -> str:
        return inside if self.flavour.root is None else str(self.flavour.root) + inside

    def _in_root(self, path: Path) -> str:
        """A path under run_dir as the server sees it."""
        return self._inside + "/" + str(path.relative_to(self.run_dir))

    def _chroot(self) -> list[str]:
        return [] if self.flavour.root is None else ["chroot", str(self.flavour.root)]

    # --- lifecycle -------------------------------------------------------------------------------

    def install(self) -> None:
        """Create the system tables once; later starts reuse the datadir."""
        if (self.datadir / "mysql").is_dir():
            return
        started = time.monotonic()
        if self.flavour.root is None:
            _run_init(
                [
                    INSTALL_DB,
                    "--no-defaults",
                    f"--datadir={self.datadir}",
                    "--auth-root-authentication-method=normal",
                    "--skip-test-db",
                    "--user=root",
                    *self.flavour.init_args,
                ],
                "mariadb-install-db",
                self.datadir,
            )
        else:
            template = _template(self.flavour)
            subprocess.run(["cp", "-a", "--reflink=auto", str(template), str(self.datadir)], check=True)
            (self.datadir / "auto.cnf").unlink(missing_ok=True)  # MySQL: a server_uuid of its own
        self.install_seconds = time.monotonic() - started

    def start(self) -> ThrowawayServer:
        if self.running:
            return self
        self.install()
        for attempt in range(3):
            started = time.monotonic()
            log_offset = self.error_log.stat().st_size if self.error_log.exists() else 0
            general_log = (
                ["--general-log=ON", f"--general-log-file={self._in_root(self.general_log_file)}"]
                if self.general_log
                else []
            )
            # With a command prefix of `ip netns exec NAME`, ip exec()s the next command after
            # entering the namespace, and chroot exec()s the server: self.proc is the server
            # itself and signals reach it directly.
            self.proc = subprocess.Popen(
                [
                    *self.command_prefix,
                    *self._chroot(),
                    self.flavour.daemon,
                    "--no-defaults",
                    "--user=root",
                    f"--datadir={self._in_root(self.datadir)}",
                    f"--socket={self._socket_inside}",
                    f"--port={self.port}",
                    f"--bind-address={self.host}",
                    f"--pid-file={self._inside}/mysqld.pid",
                    f"--log-error={self._in_root(self.error_log)}",
                    *self.flavour.init_args,
                    *self.flavour.server_args,
                    *general_log,
                    *self.extra_args,
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
            _running.add(self)
            try:
                self._wait_until_ready(log_offset)
            except _PortTaken:
                # Someone took the free port between free_port() and the bind; a fresh server
                # may move, a restarted one must keep its port (clients hold its URL).
                self.proc.wait(10)
                self.proc = None
                if self._port_chosen or attempt == 2:
                    raise RuntimeError(f"port {self.port} is taken:\n{self._log_tail(log_offset)}") from None
                self.port = free_port()
                continue
            except BaseException:
                self.kill()
                raise
            self._port_chosen = True
            self.start_seconds = time.monotonic() - started
            return self
        raise AssertionError("unreachable")

    def stop(self, timeout: float = 30.0) -> None:
        """Clean shutdown (SIGTERM); SIGKILL if it takes longer than `timeout`."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            if self.is_mysql:
                self._end_binlog_dumps()
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.proc = None
        _running.discard(self)

    def _end_binlog_dumps(self) -> None:
        """A MySQL source's shutdown waited about 10 s for each binlog dump thread, even one whose
        replica had gone (it learns so at its next heartbeat): 11 s of every replication test's
        teardown. Ended first, the shutdown takes as long as one without replicas (1.7 s)."""
        try:
            for (thread,) in self.execute(
                "SELECT ID FROM information_schema.PROCESSLIST WHERE COMMAND LIKE 'Binlog Dump%'"
            ):
                self.execute(f"KILL {int(thread)}")
        except pymysql.MySQLError:
            pass  # not answering: SIGTERM (or SIGKILL after the timeout) it is

    def kill(self) -> None:
        """Crash it (SIGKILL): connections drop at once, InnoDB recovers on the next start()."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)
        self.proc = None
        _running.discard(self)

    def restart(self, *extra_args: str) -> ThrowawayServer:
        """Clean stop, then start on the same datadir and port; with arguments, start with those
        instead (say, the same data with `--read-only`)."""
        self.stop()
        if extra_args:
            self.extra_args = list(extra_args)
        return self.start()

    def cleanup(self) -> None:
        self.stop()
        if self._sockdir is not None:
            shutil.rmtree(self._sockdir, ignore_errors=True)
        if self in _in_roots:
            # Out of the root: the logs to the directory given, the data (tens of MB) removed.
            for name in ("error_log", "general_log_file"):
                path = getattr(self, name)
                if path.exists():
                    moved = self.base_dir / path.name
                    shutil.move(str(path), moved)
                    setattr(self, name, moved)
            shutil.rmtree(self.run_dir, ignore_errors=True)
            _in_roots.discard(self)

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def __enter__(self) -> ThrowawayServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.cleanup()

    # --- talking to it ---------------------------------------------------------------------------

    def url(self, database: str = "") -> str:
        return f"mysql+pymysql://root@{self.host}:{self.port}/{database}"

    def connect(self, database: str | None = None, connect_timeout: float = 5) -> pymysql.Connection:
        # No TLS: MySQL 8+ and MariaDB 11.4+ offer it by default and PyMySQL 2.x then negotiates
        # it on every connection, a new SSL context each (tens of ms, seconds on a busy machine,
        # which made a promotion in the drill take 20 s instead of 2).
        return pymysql.connect(
            host=self.host,
            port=self.port,
            user="root",
            password="",
            database=database,
            autocommit=True,
            connect_timeout=connect_timeout,
            ssl_disabled=True,
        )

    def connect_socket(self, database: str | None = None) -> pymysql.Connection:
        """Over the unix socket (as root@localhost): works whatever the network does."""
        return pymysql.connect(
            unix_socket=self.socket,
            user="root",
            password="",
            database=database,
            autocommit=True,
            connect_timeout=5,
            ssl_disabled=True,
        )

    def execute(self, sql: str, database: str | None = None) -> list[tuple]:
        conn = self.connect(database)
        try:
            with conn.cursor() as cur:
                cur.execute(sql)
                return list(cur.fetchall())
        finally:
            conn.close()

    def create_database(self, name: str) -> str:
        """Create a database (utf8mb4, like the shared server's test databases); returns its URL."""
        self.execute(f"CREATE DATABASE IF NOT EXISTS `{name}` CHARACTER SET utf8mb4 COLLATE utf8mb4_bin")
        return self.url(name)

    def variable(self, name: str) -> str | None:
        rows = self.execute(f"SHOW GLOBAL VARIABLES LIKE '{name}'")
        return rows[0][1] if rows else None

    # --- internals -------------------------------------------------------------------------------

    def _wait_until_ready(self, log_offset: int) -> None:
        # The socket, not TCP: on an address other than 127.0.0.1 root may not log in over TCP
        # until _allow_root_from_network() ran, and the socket works from any network namespace.
        deadline = time.monotonic() + self.startup_timeout
        while True:
            if self.proc.poll() is not None:
                tail = self._log_tail(log_offset)
                if "Bind on TCP/IP port" in tail or "Address already in use" in tail or "already in use" in tail:
                    raise _PortTaken()
                raise RuntimeError(f"{self.flavour.daemon} exited with {self.proc.returncode} while starting:\n{tail}")
            try:
                # PyMySQL leaks its unix socket when the connect fails (a ResourceWarning, an
                # error under pytest), so probe with a socket of our own first.
                with socket.socket(socket.AF_UNIX) as probe:
                    probe.connect(self.socket)
                self.connect_socket().close()
                break
            except (OSError, pymysql.err.OperationalError):
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"{self.flavour.daemon} did not accept connections within {self.startup_timeout}s:\n"
                        f"{self._log_tail(log_offset)}"
                    ) from None
                time.sleep(0.02)
        if not self.host.startswith("127.") and not self.is_mysql:
            self._allow_root_from_network()
        self.connect().close()  # and over TCP, as clients will connect

    def _allow_root_from_network(self) -> None:
        """The installer creates root only for localhost and 127.0.0.1 (--skip-name-resolve makes
        clients on other addresses match nothing else). Not binlogged: on a replica a local
        GTID would be an extra transaction that strict GTID mode refuses on failover."""
        conn = self.connect_socket()
        try:
            with conn.cursor() as cur:
                cur.execute("SET SESSION sql_log_bin = 0")
                cur.execute("CREATE USER IF NOT EXISTS 'root'@'%'")
                cur.execute("GRANT ALL PRIVILEGES ON *.* TO 'root'@'%' WITH GRANT OPTION")
        finally:
            conn.close()

    def _log_tail(self, offset: int) -> str:
        try:
            with open(self.error_log, errors="replace") as f:
                f.seek(offset)
                return f.read()[-4000:]
        except FileNotFoundError:
            return "(no error log)"

    def __repr__(self) -> str:
        return f"ThrowawayServer({self.flavour.name} {self.host}:{self.port}, args={self.extra_args}, running={self.running})"


class _PortTaken(Exception):
    pass


ThrowawayMariaDB = ThrowawayServer  # the name tests and tools used before the other flavours


def _run_init(argv: list[str], what: str, datadir: Path) -> None:
    """Run an initialisation into datadir. On a loaded machine one has failed (exit 1, a CI run
    at its busiest) where the same command passes on its own: a failure is reported as a warning
    and tried once more on an empty datadir; a second one raises with its cause on the first line,
    the only line a CI summary prints."""
    for attempt in (1, 2):
        result = subprocess.run(argv, capture_output=True, text=True, timeout=180)
        if result.returncode == 0:
            return
        output = f"{result.stdout[-2000:]}\n{result.stderr[-2000:]}"
        if attempt == 1:
            # Shown in pytest's warnings summary, not made an error (pyproject.toml's filterwarnings).
            warnings.warn(f"initialisation tried again: {what} failed ({result.returncode}):\n{output}", stacklevel=3)
            shutil.rmtree(datadir, ignore_errors=True)
    raise RuntimeError(f"{what} failed twice ({result.returncode}): {_cause(output)}\n{output}")


def _cause(output: str) -> str:
    """The line that says why: the last error line, else the last line."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    errors = [line for line in lines if "ERROR" in line.upper()]
    return (errors or lines or ["(no output)"])[-1]


# MySQL's --initialize makes only root@localhost; with --skip-name-resolve a TCP client matches
# no 'localhost' row, so root@'%' is made here (at initialisation: no binlog, no GTID).
_MYSQL_INIT_SQL = "CREATE USER 'root'@'%';\nGRANT ALL PRIVILEGES ON *.* TO 'root'@'%' WITH GRANT OPTION;\n"


def _template(flavour: Flavour) -> Path:
    """An initialised datadir in the flavour's root, made once (under a lock: several test
    processes may ask at once) and copied for each server."""
    base = flavour.root / "var/lib/jobqueue-throwaway"
    base.mkdir(parents=True, exist_ok=True)
    key = "-".join(arg.split("=", 1)[1] for arg in flavour.init_args)
    template = base / f"template-{key}"
    with open(base / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (template / "mysql").is_dir():
            return template
        building = base / f"building-{os.getpid()}"
        shutil.rmtree(building, ignore_errors=True)
        inside = "/" + str(building.relative_to(flavour.root))
        chroot = ["chroot", str(flavour.root)]
        if flavour.mysql:
            (base / "init.sql").write_text(_MYSQL_INIT_SQL)
            init_file = "/" + str((base / "init.sql").relative_to(flavour.root))
            _run_init(
                [
                    *chroot,
                    flavour.daemon,
                    "--no-defaults",
                    "--initialize-insecure",
                    "--user=root",
                    f"--datadir={inside}",
                    f"--init-file={init_file}",
                    *flavour.init_args,
                ],
                "mysqld --initialize",
                building,
            )
        else:
            _run_init(
                [
                    *chroot,
                    "mariadb-install-db",
                    "--no-defaults",
                    f"--datadir={inside}",
                    "--auth-root-authentication-method=normal",
                    "--skip-test-db",
                    "--user=root",
                    *flavour.init_args,
                ],
                "mariadb-install-db",
                building,
            )
        building.rename(template)
        return template


@atexit.register
def _stop_all() -> None:
    for server in list(_running):
        server.kill()
    for server in list(_in_roots):
        shutil.rmtree(server.run_dir, ignore_errors=True)
