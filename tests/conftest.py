"""Fixtures shared by every test.

Databases: each test that needs MariaDB gets a database of its own with a unique name on the
server at JOBQUEUE_TEST_MYSQL (default the local MariaDB, root, no password), migrated with the
real init-db, and dropped afterwards. Nothing here changes a global setting of that server; tests
that need one start a throwaway mariadbd (see testkit/throwaway_mariadb.py).
"""

from __future__ import annotations

import os
import uuid

import pytest
import sqlalchemy as sa
from sqlalchemy.pool import NullPool

from jobqueue.core.db import create_engine
from jobqueue.core.migrate import init_db
from jobqueue.core.task_modules import load_task_modules

from testkit.netns import HostNetwork, netns_unavailable_reason
from testkit.replication import ReplicationCluster
from testkit.throwaway_mariadb import ThrowawayMariaDB

MYSQL_SERVER = os.environ.get("JOBQUEUE_TEST_MYSQL", "mysql+pymysql://root@127.0.0.1:3306")

load_task_modules(["testkit.tasks"])


def _admin():
    return sa.create_engine(MYSQL_SERVER + "/", poolclass=NullPool)


@pytest.fixture
def mysql_url():
    name = f"jqt_{uuid.uuid4().hex[:16]}"
    admin = _admin()
    with admin.connect() as conn:
        conn.exec_driver_sql(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4 COLLATE utf8mb4_bin")
    url = f"{MYSQL_SERVER}/{name}"
    engine = create_engine(url, pool_size=1)
    init_db(engine)
    engine.dispose()
    try:
        yield url
    finally:
        with admin.connect() as conn:
            conn.exec_driver_sql(f"DROP DATABASE IF EXISTS `{name}`")
        admin.dispose()


@pytest.fixture
def sqlite_url(tmp_path):
    url = f"sqlite:///{tmp_path / 'jobqueue.sqlite3'}"
    engine = create_engine(url, pool_size=1)
    init_db(engine)
    engine.dispose()
    return url


@pytest.fixture(params=["mariadb", "sqlite"])
def db_url(request):
    """The same test on both supported backends."""
    return request.getfixturevalue("mysql_url" if request.param == "mariadb" else "sqlite_url")


@pytest.fixture
def engine(db_url):
    eng = create_engine(db_url, pool_size=8)
    yield eng
    eng.dispose()


@pytest.fixture
def mysql_engine(mysql_url):
    eng = create_engine(mysql_url, pool_size=8)
    yield eng
    eng.dispose()


@pytest.fixture
def export_dir(tmp_path, monkeypatch):
    path = tmp_path / "exports"
    monkeypatch.setenv("JOBQUEUE_EXPORT_DIR", str(path))
    return path


@pytest.fixture
def throwaway_mariadb(tmp_path):
    """Start private mariadbd servers with the settings a test needs; all are stopped at teardown,
    pass or fail.

        server = throwaway_mariadb("--read-only")
        url = server.create_database("jq")
    """
    servers: list[ThrowawayMariaDB] = []

    def start(*extra_args: str) -> ThrowawayMariaDB:
        server = ThrowawayMariaDB(tmp_path / f"mariadb-{len(servers)}", *extra_args)
        servers.append(server)   # before start(): a server that fails halfway is still cleaned up
        return server.start()

    yield start
    for server in servers:
        server.cleanup()


@pytest.fixture
def replication_cluster(tmp_path):
    """Start a primary and replicas (testkit.replication.ReplicationCluster); all are stopped at
    teardown, pass or fail.

        cluster = replication_cluster(replicas=1, general_log=True)
        cluster.primary.create_database("jq"); cluster.wait_caught_up()
    """
    clusters: list[ReplicationCluster] = []

    def start(replicas: int = 1, *extra_args: str, **options) -> ReplicationCluster:
        cluster = ReplicationCluster.create(tmp_path / f"replication-{len(clusters)}", replicas, *extra_args,
                                            **options)
        clusters.append(cluster)   # before start(): a cluster that fails halfway is still cleaned up
        return cluster.start()

    yield start
    for cluster in clusters:
        cluster.cleanup()


@pytest.fixture
def host_network():
    """Hosts in network namespaces (testkit.netns.HostNetwork); skips the test when this user
    cannot make them (not root). Everything it made is removed at teardown, pass or fail.

        net = host_network("app", "db")
        server = net.start_mariadb("db", tmp_path / "db")
    """
    reason = netns_unavailable_reason()
    if reason:
        pytest.skip(reason)
    networks: list[HostNetwork] = []

    def make(*names: str) -> HostNetwork:
        network = HostNetwork()
        networks.append(network)   # before the hosts: one that fails halfway is still removed
        for name in names:
            network.add_host(name)
        return network

    yield make
    for network in networks:
        network.cleanup()


@pytest.fixture(autouse=True)
def _process_settings():
    """An app or a CLI command installs the process's settings (settings.use), and a one-shot
    command turns metrics off; each test starts from the environment again, metrics on."""
    yield
    from jobqueue.core import metrics, settings

    settings.use(None)
    metrics.on()
