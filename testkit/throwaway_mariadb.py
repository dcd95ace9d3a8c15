"""A private mariadbd for tests that need a server setting (binlog format, read-only, a restart).

The shared server on 127.0.0.1:3306 is never reconfigured by a test: a test that needs
`--read-only` or `--binlog-format=STATEMENT`, or that has to stop and restart the server under
running workers, starts one of these instead:

    server = ThrowawayMariaDB(tmp_path / "db", "--log-bin", "--binlog-format=STATEMENT")
    server.start()                       # about 1 s: install the system tables, then start
    url = server.create_database("jq")   # mysql+pymysql://root@127.0.0.1:<port>/jq
    ...
    server.stop()                        # SIGTERM, clean shutdown
    server.start()                       # same datadir, same port: the data is still there
    server.restart("--read-only")        # the same data under other settings
    server.kill()                        # SIGKILL, InnoDB recovers on the next start

The datadir lives under the directory given (a pytest tmp_path); the unix socket lives in a short
directory of its own, because socket paths are limited to 107 bytes and tmp_path is long. Root
has no password and logs in over TCP from 127.0.0.1, with real grants (`root` has SUPER, which
matters: `--read-only` does not stop it from writing, so checks must read the variable).

Every started server is also stopped at interpreter exit, in case a test run is interrupted
before its fixture teardown.

Optional, for replication and network tests (testkit.replication, testkit.netns):

    ThrowawayMariaDB(path, host="10.77.3.4",                        # bind there, not 127.0.0.1
                     command_prefix=["ip", "netns", "exec", "jqt-..-db"],  # start it in a netns
                     general_log=True)                              # every statement to a file

A server on another address also lets `root` log in from the network (`root@'%'`, created without
writing the binlog, so replicas get no extra GTID); readiness is checked over the unix socket,
which works from any network namespace. `general_log=True` writes `general.log` next to the
datadir (`server.general_log_file`); `testkit.replication.executed_statements()` reads it.
"""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import pymysql

MARIADBD = os.environ.get("JOBQUEUE_TEST_MARIADBD", "/usr/sbin/mariadbd")
INSTALL_DB = os.environ.get("JOBQUEUE_TEST_MARIADB_INSTALL_DB", shutil.which("mariadb-install-db") or "mariadb-install-db")

# Small and quick: a test server holds a few thousand rows at most. The same InnoDB sizes go to
# the installer and the server so the redo log is not resized at the first start.
_COMMON = ("--innodb-buffer-pool-size=32M", "--innodb-log-file-size=16M")
_SERVER = (
    "--skip-name-resolve",
    "--innodb-buffer-pool-dump-at-shutdown=OFF",   # shutdown in ~0.1 s instead of ~1 s
    "--innodb-buffer-pool-load-at-startup=OFF",
    "--max-connections=200",
)

# Servers started and not yet stopped, killed at exit if a teardown never ran.
_running: set[ThrowawayMariaDB] = set()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ThrowawayMariaDB:
    def __init__(self, base_dir: Path | str, *extra_args: str, port: int | None = None,
                 startup_timeout: float = 30.0, host: str = "127.0.0.1",
                 command_prefix: Sequence[str] = (), general_log: bool = False):
        self.base_dir = Path(base_dir)
        self.datadir = self.base_dir / "data"
        self.error_log = self.base_dir / "mariadbd.err"
        self.general_log_file = self.base_dir / "general.log"
        self.extra_args = list(extra_args)   # change between stop() and start() to restart differently
        self.host = host                     # the address it binds to and clients connect to
        self.command_prefix = list(command_prefix)   # e.g. ["ip", "netns", "exec", name]
        self.general_log = general_log
        self.port = port or free_port()
        self._port_chosen = port is not None
        self.startup_timeout = startup_timeout
        self._sockdir = tempfile.mkdtemp(prefix="jqdb-")
        self.socket = os.path.join(self._sockdir, "mariadbd.sock")
        self.proc: subprocess.Popen | None = None
        self.install_seconds: float | None = None
        self.start_seconds: float | None = None

    # --- lifecycle -------------------------------------------------------------------------------

    def install(self) -> None:
        """Create the system tables once; later starts reuse the datadir."""
        if (self.datadir / "mysql").is_dir():
            return
        self.base_dir.mkdir(parents=True, exist_ok=True)
        started = time.monotonic()
        result = subprocess.run(
            [INSTALL_DB, "--no-defaults", f"--datadir={self.datadir}", "--auth-root-authentication-method=normal",
             "--skip-test-db", "--user=root", *_COMMON],
            capture_output=True, text=True, timeout=120)
        if result.returncode != 0:
            raise RuntimeError(f"mariadb-install-db failed ({result.returncode}):\n{result.stdout[-2000:]}"
                               f"\n{result.stderr[-2000:]}")
        self.install_seconds = time.monotonic() - started

    def start(self) -> ThrowawayMariaDB:
        if self.running:
            return self
        self.install()
        for attempt in range(3):
            started = time.monotonic()
            log_offset = self.error_log.stat().st_size if self.error_log.exists() else 0
            general_log = (["--general-log=ON", f"--general-log-file={self.general_log_file}"]
                           if self.general_log else [])
            # With a command prefix of `ip netns exec NAME`, ip exec()s mariadbd after entering the
            # namespace, so self.proc is still mariadbd itself and signals reach it directly.
            self.proc = subprocess.Popen(
                [*self.command_prefix,
                 MARIADBD, "--no-defaults", "--user=root", f"--datadir={self.datadir}", f"--socket={self.socket}",
                 f"--port={self.port}", f"--bind-address={self.host}", f"--pid-file={self.base_dir / 'mariadbd.pid'}",
                 f"--log-error={self.error_log}", *_COMMON, *_SERVER, *general_log, *self.extra_args],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
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
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.proc = None
        _running.discard(self)

    def kill(self) -> None:
        """Crash it (SIGKILL): connections drop at once, InnoDB recovers on the next start()."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)
        self.proc = None
        _running.discard(self)

    def restart(self, *extra_args: str) -> ThrowawayMariaDB:
        """Clean stop, then start on the same datadir and port; with arguments, start with those
        instead (say, the same data with `--read-only`)."""
        self.stop()
        if extra_args:
            self.extra_args = list(extra_args)
        return self.start()

    def cleanup(self) -> None:
        self.stop()
        shutil.rmtree(self._sockdir, ignore_errors=True)

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def __enter__(self) -> ThrowawayMariaDB:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.cleanup()

    # --- talking to it ---------------------------------------------------------------------------

    def url(self, database: str = "") -> str:
        return f"mysql+pymysql://root@{self.host}:{self.port}/{database}"

    def connect(self, database: str | None = None, connect_timeout: float = 5) -> pymysql.Connection:
        return pymysql.connect(host=self.host, port=self.port, user="root", password="", database=database,
                               autocommit=True, connect_timeout=connect_timeout)

    def connect_socket(self, database: str | None = None) -> pymysql.Connection:
        """Over the unix socket (as root@localhost): works whatever the network does."""
        return pymysql.connect(unix_socket=self.socket, user="root", password="", database=database,
                               autocommit=True, connect_timeout=5)

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
                if "Bind on TCP/IP port" in tail or "Address already in use" in tail:
                    raise _PortTaken()
                raise RuntimeError(f"mariadbd exited with {self.proc.returncode} while starting:\n{tail}")
            try:
                # PyMySQL leaks its unix socket when the connect fails (a ResourceWarning, an
                # error under pytest), so probe with a socket of our own first.
                with socket.socket(socket.AF_UNIX) as probe:
                    probe.connect(self.socket)
                self.connect_socket().close()
                break
            except (OSError, pymysql.err.OperationalError):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"mariadbd did not accept connections within {self.startup_timeout}s:\n"
                                       f"{self._log_tail(log_offset)}") from None
                time.sleep(0.02)
        if not self.host.startswith("127."):
            self._allow_root_from_network()
        self.connect().close()   # and over TCP, as clients will connect

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
        return f"ThrowawayMariaDB({self.host}:{self.port}, args={self.extra_args}, running={self.running})"


class _PortTaken(Exception):
    pass


@atexit.register
def _stop_all() -> None:
    for server in list(_running):
        server.kill()
