"""The drill's machines: application hosts and two database hosts, each a network namespace on
one bridge (testkit.netns), with a GTID primary and a semi-synchronous replica
(testkit.replication) on the database hosts.

    topo = Topology(workdir, app_hosts=3).start()     # db1 primary, db2 replica, app1..app3
    topo.create_database("drill")                      # on the primary; grants; replicated
    host = topo.app_host("app1", env)                  # gunicorn + `jobqueue worker` in app1
    topo.cleanup()

The application connects as `jq_app`, an account with only SELECT, INSERT, UPDATE and DELETE on
its database (plus SLAVE MONITOR on MariaDB, REPLICATION CLIENT on MySQL, so a process can tell a
replica from a primary): like every
account without SUPER / READ ONLY ADMIN, read_only binds it, which is what makes a replica
refuse its writes. Migrations run as `jq_migrate` (all privileges on the database, nothing
else). docs/deploy.md has the same grants.

Every process gets the candidate URLs "db1 db2" (the original primary first) and must find the
writable one by itself, before and after the failover.
"""

from __future__ import annotations

import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from testkit.faults import Proc, gunicorn_children
from testkit.netns import HostNetwork
from testkit.replication import ReplicationCluster
from testkit.throwaway import ThrowawayServer

REPO = Path(__file__).resolve().parents[1]
APP_USER, APP_PASSWORD = "jq_app", "app-pw-drill"
MIGRATE_USER, MIGRATE_PASSWORD = "jq_migrate", "migrate-pw-drill"
WEB_PORT = 8000
# A semi-sync commit waits this long for the replica's ack before the primary falls back to
# asynchronous replication. Long, so that no acknowledged write can be missing from the replica
# when the primary is killed (the drill reports Rpl_semi_sync_master_no_tx to show it held;
# MySQL's Rpl_semi_sync_source_no_tx).
SEMI_SYNC_TIMEOUT_MS = 60_000


class Topology:
    def __init__(self, workdir: Path, app_hosts: int = 3, *, general_log: bool = True, flavour: str = "mariadb"):
        self.workdir = workdir
        self.net = HostNetwork()
        for name in ("db1", "db2", *[f"app{i}" for i in range(1, app_hosts + 1)]):
            self.net.add_host(name)
        self.app_names = [f"app{i}" for i in range(1, app_hosts + 1)]
        servers = [
            self.net.mariadb(name, workdir / name, "--max-connections=600", general_log=general_log, flavour=flavour)
            for name in ("db1", "db2")
        ]
        self.db1, self.db2 = servers
        self.cluster = ReplicationCluster(servers, semi_sync_timeout_ms=SEMI_SYNC_TIMEOUT_MS)

    def start(self) -> Topology:
        self.cluster.start()
        primary = self.cluster.primary
        primary.execute(f"CREATE USER '{APP_USER}'@'%' IDENTIFIED BY '{APP_PASSWORD}'")
        monitor = "REPLICATION CLIENT" if primary.is_mysql else "SLAVE MONITOR"
        primary.execute(f"GRANT {monitor} ON *.* TO '{APP_USER}'@'%'")
        primary.execute(f"CREATE USER '{MIGRATE_USER}'@'%' IDENTIFIED BY '{MIGRATE_PASSWORD}'")
        self.cluster.wait_caught_up()
        return self

    def cleanup(self) -> None:
        try:
            self.cluster.cleanup()
        finally:
            self.net.cleanup()

    # --- databases ---------------------------------------------------------------------------

    def create_database(self, name: str) -> None:
        """On the primary, with the two accounts' grants, then the schema (as the migration
        account, from the first application host); replicated before it returns."""
        primary = self.cluster.primary
        primary.create_database(name)
        primary.execute(f"GRANT SELECT, INSERT, UPDATE, DELETE ON `{name}`.* TO '{APP_USER}'@'%'")
        primary.execute(f"GRANT ALL PRIVILEGES ON `{name}`.* TO '{MIGRATE_USER}'@'%'")
        out = self.net.run(
            self.app_names[0],
            [
                sys.executable,
                "-m",
                "jobqueue.cli",
                "--database-url",
                self.candidate_urls(name, MIGRATE_USER, MIGRATE_PASSWORD),
                "init-db",
            ],
            capture_output=True,
            text=True,
            env=base_env(),
            cwd=REPO,
            timeout=180,
        )
        if out.returncode != 0:
            raise RuntimeError(f"init-db failed ({out.returncode}): {out.stdout}{out.stderr}")
        self.cluster.wait_caught_up()

    def candidate_urls(self, database: str, user: str = APP_USER, password: str = APP_PASSWORD) -> str:
        """JOBQUEUE_DATABASE_URL for every process: the original primary, then the replica."""
        return " ".join(server_url(s, database, user, password) for s in (self.db1, self.db2))

    # --- application hosts -------------------------------------------------------------------

    def app_host(self, name: str, env: dict[str, str], logs: Path) -> AppHost:
        return AppHost(name, self.net.address(name), self.net.exec_prefix(name), env, logs)


def semi_sync_counts(server: ThrowawayServer) -> dict[str, int]:
    """The primary's commits acknowledged by a replica (yes_tx) and not (no_tx) since it started:
    Rpl_semi_sync_master_*_tx on MariaDB, Rpl_semi_sync_source_*_tx on MySQL."""
    source = "source" if server.is_mysql else "master"
    rows = server.execute(f"SHOW GLOBAL STATUS LIKE 'Rpl_semi_sync_{source}_%tx'")
    return {name.rsplit("_", 2)[-2] + "_tx": int(value) for name, value in rows}


def server_url(server: ThrowawayServer, database: str, user: str = APP_USER, password: str = APP_PASSWORD) -> str:
    return f"mysql+pymysql://{user}:{password}@{server.host}:{server.port}/{database}"


def base_env(**extra: str) -> dict[str, str]:
    import os

    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env["PYTHONUNBUFFERED"] = "1"
    for key in [k for k in env if k.startswith("JOBQUEUE_")]:
        del env[key]
    env.update(extra)
    return env


@dataclass
class AppHost:
    """One application host: gunicorn (web processes with embedded workers and the reaper) and
    standalone `jobqueue worker` processes, all inside the host's network namespace."""

    name: str
    address: str
    prefix: list[str]
    env: dict[str, str]
    logs: Path
    web: Proc | None = None
    workers: list[Proc] = field(default_factory=list)
    all_workers: list[Proc] = field(default_factory=list)
    seen_web_pids: set[int] = field(default_factory=set)
    _seq: int = 0

    @property
    def base_url(self) -> str:
        return f"http://{self.address}:{WEB_PORT}"

    def start_web(self, web_workers: int, embedded_workers: int, threads: int = 4) -> Proc:
        env = dict(
            self.env,
            JOBQUEUE_BIND=f"{self.address}:{WEB_PORT}",
            JOBQUEUE_WEB_WORKERS=str(web_workers),
            JOBQUEUE_EMBEDDED_WORKERS=str(embedded_workers),
            JOBQUEUE_WEB_THREADS=str(threads),
        )
        self.web = Proc(
            f"{self.name}-gunicorn",
            [*self.prefix, sys.executable, "-m", "gunicorn", "-c", str(REPO / "jobqueue/web/gunicorn_conf.py")],
            env,
            self.logs / f"{self.name}-gunicorn.log",
        )
        return self.web

    def start_worker(self, *args: str) -> Proc:
        self._seq += 1
        name = f"{self.name}-w{self._seq}"
        p = Proc(
            name,
            [*self.prefix, sys.executable, "-m", "jobqueue.cli", "worker", "--name", name, *args],
            self.env,
            self.logs / f"worker-{name}.log",
        )
        p.host = self.name
        self.workers.append(p)
        self.all_workers.append(p)
        return p

    def web_pids(self) -> list[int]:
        pids = gunicorn_children(self.web.pid) if self.web is not None else []
        self.seen_web_pids.update(pids)
        return pids

    def pids(self) -> set[int]:
        """Every process of this host running now."""
        return (
            {w.pid for w in self.workers if w.alive()}
            | set(self.web_pids())
            | ({self.web.pid} if self.web is not None and self.web.alive() else set())
        )

    def wait_web_ready(self, web_workers: int, timeout: float = 120) -> None:
        """Until /healthz answers and every web process has started its embedded worker."""
        import urllib.request

        deadline = time.monotonic() + timeout
        while True:
            try:
                with urllib.request.urlopen(self.base_url + "/healthz", timeout=3) as r:
                    if r.status == 200 and self.web.log().count("event=worker_started ") >= web_workers:
                        return
            except OSError:
                pass
            if not self.web.alive() or time.monotonic() > deadline:
                raise RuntimeError(f"gunicorn on {self.name} did not come up:\n{self.web.log()[-3000:]}")
            time.sleep(0.3)


def run_in(prefix: list[str], argv: list[str], env: dict, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run([*prefix, *argv], capture_output=True, text=True, env=env, cwd=REPO, timeout=timeout)
