"""Fixtures shared by every test.

Servers: every test that needs a MySQL-family server runs on each selected one, its id saying
which (`test_x[mysql]`):

    mariadb     MariaDB 10.11, the machine's own, 127.0.0.1:3306
    mysql       MySQL 9.x from Debian unstable, 127.0.0.1:3307    (scripts/ensure-services)
    mariadb11   MariaDB 11.8 from Debian stable, 127.0.0.1:3308   (scripts/ensure-services)

`--servers mysql,mariadb` (or JOBQUEUE_TEST_SERVERS) picks some; the default is all three, and a
selected server that does not answer fails the run rather than skipping it. JOBQUEUE_TEST_SERVER_<NAME>
gives another URL for one (JOBQUEUE_TEST_MYSQL, the old spelling, still names the mariadb one).
`--driver mysqldb` (or JOBQUEUE_TEST_DRIVER=mysqldb) gives the tests URLs for mysqlclient
(`mysql+mysqldb://`, the optional extra) in place of PyMySQL, the default.
`--server-tests-only` keeps only the tests that run on a server (scripts/test runs the other
servers' share in processes of their own). Tests that run on both a server and SQLite take `db_url`.

Each test gets a database of its own with a unique name, migrated with the real init-db, and
dropped afterwards. Nothing here changes a global setting of a server; tests that need one start
a throwaway server of the same flavour (`throwaway_server`, `replication_cluster`: see
testkit/throwaway.py), which is why those take db_server's ids too.
"""

from __future__ import annotations

import contextlib
import os

import pytest
import sqlalchemy as sa
from sqlalchemy.pool import NullPool

from jobqueue.core.db import create_engine
from jobqueue.core.migrate import init_db
from jobqueue.core.task_modules import load_task_modules
from testkit.databases import databases
from testkit.netns import HostNetwork, netns_unavailable_reason
from testkit.replication import ReplicationCluster
from testkit.throwaway import ThrowawayMariaDB, ThrowawayServer

SERVERS = {
    "mariadb": os.environ.get("JOBQUEUE_TEST_SERVER_MARIADB")
    or os.environ.get("JOBQUEUE_TEST_MYSQL", "mysql+pymysql://root@127.0.0.1:3306"),
    "mysql": os.environ.get("JOBQUEUE_TEST_SERVER_MYSQL", "mysql+pymysql://root@127.0.0.1:3307"),
    "mariadb11": os.environ.get("JOBQUEUE_TEST_SERVER_MARIADB11", "mysql+pymysql://root@127.0.0.1:3308"),
}
MYSQL_SERVER = SERVERS["mariadb"]  # tests that need one server, whichever (the old name)
DRIVERS = ("pymysql", "mysqldb")
_driver = "pymysql"  # the driver of the URLs the database fixtures give (--driver)

load_task_modules(["testkit.tasks"])


def pytest_addoption(parser):
    parser.addoption(
        "--servers",
        default=os.environ.get("JOBQUEUE_TEST_SERVERS", ",".join(SERVERS)),
        help=f"comma-separated servers the database tests run on (of {', '.join(SERVERS)})",
    )
    parser.addoption(
        "--driver",
        default=os.environ.get("JOBQUEUE_TEST_DRIVER", "pymysql"),
        choices=DRIVERS,
        help="the driver in the URLs of the tests' databases: pymysql (the default) or mysqldb (mysqlclient)",
    )
    parser.addoption(
        "--server-tests-only",
        action="store_true",
        help="only the tests that run on a server, a throwaway one of its flavour included (no unit or SQLite-only tests)",
    )


def pytest_configure(config):
    global _driver
    _driver = config.getoption("--driver")


def driver_url(url: str, driver: str | None = None) -> str:
    """`url` (mysql+pymysql://...) through `driver` (default: --driver)."""
    return url.replace("+pymysql://", f"+{driver or _driver}://", 1)


def selected_servers(config) -> list[str]:
    names = [n.strip() for n in config.getoption("--servers").split(",") if n.strip()]
    unknown = sorted(set(names) - set(SERVERS))
    if unknown or not names:
        raise pytest.UsageError(f"--servers: unknown {unknown or 'none given'}; choose from {', '.join(SERVERS)}")
    return names


def pytest_generate_tests(metafunc):
    servers = selected_servers(metafunc.config)
    # @pytest.mark.only_servers("mariadb", "mysql"): a test whose run on the others is by hand (its
    # docstring says which command).
    only = metafunc.definition.get_closest_marker("only_servers")
    if only:
        servers = [s for s in servers if s in only.args]
    if "db_server" in metafunc.fixturenames:
        metafunc.parametrize("db_server", servers, indirect=True)
    if "db_backend" in metafunc.fixturenames:
        # @pytest.mark.servers_only: not on SQLite; @pytest.mark.sqlite_only: on SQLite alone.
        backends = servers + ([] if metafunc.config.getoption("--server-tests-only") else ["sqlite"])
        if metafunc.definition.get_closest_marker("servers_only"):
            backends = servers
        if metafunc.definition.get_closest_marker("sqlite_only"):
            backends = [b for b in backends if b == "sqlite"]
        metafunc.parametrize("db_backend", backends, indirect=True)


def pytest_collection_modifyitems(config, items):
    servers = set(selected_servers(config))

    def wanted(item) -> bool:
        only = item.get_closest_marker("only_servers")
        if only and not servers & set(only.args):
            return False  # none of its servers selected: deselected, not an empty parameter set's skip
        if not config.getoption("--server-tests-only"):
            return True
        return getattr(item, "callspec", None) is not None and bool(
            {item.callspec.params.get("db_server"), item.callspec.params.get("db_backend")} & servers
        )

    kept, dropped = [], []
    for item in items:
        (kept if wanted(item) else dropped).append(item)
    config.hook.pytest_deselected(items=dropped)
    items[:] = kept


_answered: dict[str, str | None] = {}


def _admin(server: str = "mariadb"):
    return sa.create_engine(SERVERS[server] + "/", poolclass=NullPool)


def _server_up(server: str) -> None:
    """Fail (never skip) when a selected server does not answer: scripts/ensure-services starts them."""
    if server not in _answered:
        try:
            with _admin(server).connect() as conn:
                conn.exec_driver_sql("SELECT 1")
            _answered[server] = None
        except sa.exc.OperationalError as exc:
            _answered[server] = f"{exc.orig}"
    if _answered[server] is not None:
        pytest.fail(
            f"the {server} server at {SERVERS[server]} does not answer ({_answered[server]}); "
            "scripts/ensure-services starts it, or leave it out with --servers",
            pytrace=False,
        )


@pytest.fixture
def db_server(request) -> str:
    """The name of the server this test runs on (parametrised: mariadb, mysql, mariadb11)."""
    return request.param


@pytest.fixture
def db_backend(request) -> str:
    """A server's name, or sqlite (parametrised)."""
    return request.param


def _migrate(url: str) -> None:
    engine = create_engine(url, pool_size=1)
    try:
        init_db(engine)
    finally:
        engine.dispose()


@contextlib.contextmanager
def database_on(server: str, *, migrations: bool = False):
    """A database on `server` as init_db leaves a new one, for one test (testkit/databases.py:
    built from the migrated schema's statements, renewed after the test), or a new one every
    migration builds when `migrations` (the tests of the migrations), dropped after."""
    _server_up(server)
    each = databases(SERVERS[server], _migrate)
    if migrations:
        name = each.create()
        try:
            _migrate(driver_url(each.url(name)))
            yield driver_url(each.url(name))
        finally:
            each.drop(name)
        return
    name = each.take()
    try:
        yield driver_url(each.url(name))
    finally:
        each.give_back(name)


@pytest.fixture
def mysql_url(db_server):
    with database_on(db_server) as url:
        yield url


def _sqlite(tmp_path) -> str:
    url = f"sqlite:///{tmp_path / 'jobqueue.sqlite3'}"
    engine = create_engine(url, pool_size=1)
    init_db(engine)
    engine.dispose()
    return url


@pytest.fixture
def sqlite_url(tmp_path):
    return _sqlite(tmp_path)


@pytest.fixture
def db_url(db_backend, tmp_path):
    """The same test on every selected server and on SQLite."""
    if db_backend == "sqlite":
        yield _sqlite(tmp_path)
        return
    with database_on(db_backend) as url:
        yield url


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
def throwaway_server(db_server, tmp_path):
    """Start private servers of this test's flavour (db_server: mariadb, mysql, mariadb11) with
    the settings a test needs; all are stopped at teardown, pass or fail.

        server = throwaway_server("--read-only")           # options too: general_log=True
        url = server.create_database("jq")
    """
    servers: list[ThrowawayServer] = []

    def start(*extra_args: str, **options) -> ThrowawayServer:
        server = ThrowawayServer(tmp_path / f"{db_server}-{len(servers)}", *extra_args, flavour=db_server, **options)
        servers.append(server)  # before start(): a server that fails halfway is still cleaned up
        return server.start()

    yield start
    for server in servers:
        server.cleanup()


@pytest.fixture
def throwaway_mariadb(tmp_path):
    """throwaway_server on the machine's own MariaDB only (not parametrised)."""
    servers: list[ThrowawayMariaDB] = []

    def start(*extra_args: str) -> ThrowawayMariaDB:
        server = ThrowawayMariaDB(tmp_path / f"mariadb-{len(servers)}", *extra_args)
        servers.append(server)
        return server.start()

    yield start
    for server in servers:
        server.cleanup()


@pytest.fixture
def replication_cluster(db_server, tmp_path):
    """Start a primary and replicas of this test's flavour (testkit.replication.ReplicationCluster);
    all are stopped at teardown, pass or fail.

        cluster = replication_cluster(replicas=1, general_log=True)
        cluster.primary.create_database("jq"); cluster.wait_caught_up()
    """
    clusters: list[ReplicationCluster] = []

    def start(replicas: int = 1, *extra_args: str, **options) -> ReplicationCluster:
        cluster = ReplicationCluster.create(
            tmp_path / f"replication-{len(clusters)}", replicas, *extra_args, flavour=db_server, **options
        )
        clusters.append(cluster)  # before start(): a cluster that fails halfway is still cleaned up
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
        networks.append(network)  # before the hosts: one that fails halfway is still removed
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
