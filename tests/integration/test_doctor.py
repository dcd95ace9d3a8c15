"""`jobqueue doctor` and the worker's preflight: each verdict against a server that really has the
setting in question. Server settings (binlog format, read-only) come from throwaway servers of
each flavour started here; the shared server's globals are never touched. Session settings
(isolation, lock-wait timeout, the session clock) are set on one connection of the shared server.
"""

from __future__ import annotations

import json
import re

import pytest

from jobqueue.core import doctor, preflight
from jobqueue.core.db import create_engine
from jobqueue.core.doctor import Verdict
from jobqueue.core.errors import UnsupportedDatabase
from testkit.procs import WorkerProcess, jobqueue
from testkit.sql import seq_rows
from testkit.throwaway import ThrowawayServer, free_port

pytestmark = pytest.mark.slow

CHECK_NAMES = ["server", "binlog", "primary", "tables", "isolation", "claim_plan", "lock_wait", "clock", "privileges"]
LOG_BIN_ROW = ("--log-bin=binlog", "--binlog-format=ROW")
LOG_BIN_STATEMENT = ("--log-bin=binlog", "--binlog-format=STATEMENT")


def run_doctor(url: str, *args: str):
    """(exit code, {name: check dict}, stdout) of `jobqueue doctor --json`."""
    result = jobqueue(url, "doctor", "--json", *args)
    assert result.returncode in (0, 3), result.stderr
    checks = json.loads(result.stdout)
    return result.returncode, {c["name"]: c for c in checks}, result.stdout


def job_row(server: ThrowawayServer, database: str, task_key: str) -> tuple:
    (row,) = server.execute(
        f"SELECT status, attempts, lease_owner FROM job_queue WHERE task_key = '{task_key}'", database
    )
    return row


def with_job(server: ThrowawayServer, database: str) -> str:
    """A migrated database holding one ready job, created while the server takes writes."""
    url = server.create_database(database)
    init = jobqueue(url, "init-db")
    assert init.returncode == 0, init.stderr
    enq = jobqueue(url, "enqueue", "noop", "--key", "waiting-1")
    assert enq.returncode == 0, enq.stderr
    return url


# --- the shared server and SQLite --------------------------------------------------------------


def test_doctor_on_the_shared_server_finds_no_problem(mysql_url):
    code, checks, _ = run_doctor(mysql_url)
    assert code == 0, checks
    assert list(checks) == CHECK_NAMES
    for check in checks.values():
        assert set(check) == {"name", "verdict", "detail", "advice"}
        assert check["verdict"] in ("ok", "warning"), check
        assert check["detail"]
        if check["verdict"] == "warning":
            assert check["advice"], check
    # What this server is known to be: MariaDB 10.6+, a writable primary, migrated by init-db.
    assert checks["server"]["verdict"] == "ok"
    assert re.fullmatch(r"(MariaDB|MySQL) \d+\.\d+\.\d+ supports SKIP LOCKED and NOWAIT", checks["server"]["detail"])
    for name in ("primary", "tables", "isolation", "claim_plan", "lock_wait"):
        assert checks[name]["verdict"] == "ok", checks[name]
    assert "READ-COMMITTED" in checks["isolation"]["detail"]
    assert "is 5 s on queue connections" in checks["lock_wait"]["detail"]


def test_doctor_text_output_has_one_line_per_check(mysql_url):
    result = jobqueue(mysql_url, "doctor")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert re.fullmatch(r"ok {7}server: (MariaDB|MySQL) \d+\.\d+\.\d+ supports SKIP LOCKED and NOWAIT", lines[0])
    verdict_lines = [line for line in lines if not line.startswith(" ")]
    assert [line.split()[1].rstrip(":") for line in verdict_lines] == CHECK_NAMES
    assert all(line.split()[0] in ("ok", "warning") for line in verdict_lines)


def test_doctor_on_sqlite_reports_begin_immediate(sqlite_url):
    code, checks, _ = run_doctor(sqlite_url)
    assert code == 0
    assert list(checks) == ["server"]
    assert checks["server"]["verdict"] == "ok"
    assert "BEGIN IMMEDIATE" in checks["server"]["detail"]


def test_doctor_on_an_unreachable_server_is_a_one_line_error():
    result = jobqueue(f"mysql+pymysql://root@127.0.0.1:{free_port()}/nothing", "doctor")
    assert result.returncode == 1
    assert result.stdout == ""
    assert len(result.stderr.strip().splitlines()) == 1 and result.stderr.startswith("error: database:")


# --- session settings on the shared server -----------------------------------------------------


def test_isolation_read_committed_is_ok_repeatable_read_is_a_warning(mysql_engine):
    with mysql_engine.connect() as conn:
        check = doctor.check_isolation(conn)
    assert (check.verdict, "READ-COMMITTED" in check.detail) == (Verdict.OK, True), check
    with mysql_engine.connect().execution_options(isolation_level="REPEATABLE READ") as conn:
        check = doctor.check_isolation(conn)
    assert check.verdict is Verdict.WARNING, check
    assert "REPEATABLE-READ" in check.detail and "gap" in check.detail
    assert check.advice


def test_lock_wait_timeout_over_a_minute_is_a_warning(mysql_engine):
    with mysql_engine.connect() as conn:
        assert doctor.check_lock_wait(conn).verdict is Verdict.OK
        conn.exec_driver_sql("SET SESSION innodb_lock_wait_timeout = 120")
        check = doctor.check_lock_wait(conn)
    assert check.verdict is Verdict.WARNING, check
    assert "120 s" in check.detail


@pytest.mark.parametrize(
    "offset, verdict, direction",
    [
        (0, Verdict.OK, None),
        (5, Verdict.WARNING, "ahead of"),
        (-5, Verdict.WARNING, "behind"),
        (30, Verdict.PROBLEM, "ahead of"),
        (-30, Verdict.PROBLEM, "behind"),
    ],
)
def test_clock_difference_verdicts(mysql_engine, offset, verdict, direction):
    with mysql_engine.connect() as conn:
        if offset:
            # The session's own clock (SET timestamp moves NOW() and UTC_TIMESTAMP() for this
            # connection only): a database whose clock is off, without touching the server's.
            conn.exec_driver_sql(f"SET timestamp = UNIX_TIMESTAMP(NOW(6)) + {offset}")
        skew, uncertainty = doctor.clock_skew(conn)
        check = doctor.check_clock(conn)
    assert abs(skew - offset) < 1.0 and uncertainty < 1.0
    assert check.verdict is verdict, check
    if direction:
        assert direction in check.detail and check.advice


def test_claim_plan_uses_the_pick_index_and_notices_when_it_cannot(mysql_engine):
    with mysql_engine.connect() as conn:
        conn.exec_driver_sql(
            "INSERT INTO job_queue (task_key, task_name, queue, priority, payload, status, run_at, attempts, "
            "max_attempts, created_at, updated_at, finished_at) "
            "SELECT CONCAT('done-', seq), 'noop', 'default', 0, '{}', 'done', UTC_TIMESTAMP(6), 1, 5, "
            f"UTC_TIMESTAMP(6), UTC_TIMESTAMP(6), UTC_TIMESTAMP(6) FROM {seq_rows(5000)}"
        )
        conn.commit()
        conn.exec_driver_sql("ANALYZE TABLE job_queue").all()
        check = doctor.check_claim_plan(conn)
        assert check.verdict is Verdict.OK, check
        assert "key=ix_ready_pick" in check.detail
        conn.exec_driver_sql("ALTER TABLE job_queue DROP INDEX ix_ready_pick")
        check = doctor.check_claim_plan(conn)
    assert check.verdict is Verdict.WARNING, check
    assert "instead of ix_ready_pick" in check.detail and "ix_ready_pick" in check.advice


# --- binary log format: one throwaway server, restarted with each setting ----------------------


@pytest.fixture(scope="module")
def module_servers(tmp_path_factory):
    """One server per (purpose, flavour) for the whole module, restarted with each setting."""
    made: dict[tuple[str, str], tuple[ThrowawayServer, str]] = {}
    servers: list[ThrowawayServer] = []

    def get(purpose: str, flavour: str, *args: str, read_only: bool = False) -> tuple[ThrowawayServer, str]:
        if (purpose, flavour) not in made:
            server = ThrowawayServer(tmp_path_factory.mktemp(f"{purpose}-{flavour}"), *args, flavour=flavour)
            servers.append(server)
            server.start()
            url = with_job(server, "jq")
            if read_only:
                server.restart("--read-only")
            made[purpose, flavour] = server, url
        return made[purpose, flavour]

    yield get
    for server in servers:
        server.cleanup()


@pytest.fixture
def binlog_server(module_servers, db_server):
    return module_servers("binlog", db_server, *LOG_BIN_ROW)


def configured(server: ThrowawayServer, *args: str) -> ThrowawayServer:
    if server.is_mysql and not any(a.startswith("--log-bin") for a in args):
        args = (*args, "--skip-log-bin")  # MySQL writes a binlog unless told not to
    if server.extra_args != list(args):
        server.restart(*args)
    return server


def test_row_binlog_is_ok(binlog_server):
    server, url = binlog_server
    configured(server, *LOG_BIN_ROW)
    code, checks, _ = run_doctor(url)
    assert code == 0, checks
    assert checks["binlog"]["verdict"] == "ok"
    assert "binlog_format=ROW, log_bin=ON" in checks["binlog"]["detail"]


def test_statement_binlog_is_a_problem(binlog_server):
    server, url = binlog_server
    configured(server, *LOG_BIN_STATEMENT)
    assert (server.variable("log_bin"), server.variable("binlog_format")) == ("ON", "STATEMENT")
    code, checks, _ = run_doctor(url)
    assert code == 3
    assert checks["binlog"]["verdict"] == "problem"
    assert "binlog_format=STATEMENT, log_bin=ON" in checks["binlog"]["detail"]
    assert "unsafe for statement-based replication" in checks["binlog"]["detail"]
    assert "ROW" in checks["binlog"]["advice"]
    # Nothing else is wrong with this server: the exit code is the binlog's doing.
    assert [name for name, c in checks.items() if c["verdict"] == "problem"] == ["binlog"]
    engine = create_engine(url, pool_size=1)
    try:
        with pytest.raises(UnsupportedDatabase, match="statement-based binary logs"):
            preflight.require_supported(engine)
    finally:
        engine.dispose()


def test_statement_format_without_binary_logging_is_a_warning(binlog_server):
    server, url = binlog_server
    configured(server, "--binlog-format=STATEMENT")
    assert (server.variable("log_bin"), server.variable("binlog_format")) == ("OFF", "STATEMENT")
    code, checks, _ = run_doctor(url)
    assert code == 0, checks
    assert checks["binlog"]["verdict"] == "warning"
    assert "log_bin=OFF" in checks["binlog"]["detail"] and checks["binlog"]["advice"]
    engine = create_engine(url, pool_size=1)
    try:
        preflight.require_supported(engine)  # workers run: nothing is logged, so nothing replicates
    finally:
        engine.dispose()


def test_worker_refuses_to_claim_under_statement_binlogs(binlog_server, tmp_path):
    server, url = binlog_server
    configured(server, *LOG_BIN_STATEMENT)
    worker = WorkerProcess(url, tmp_path, "stmt", "--burst")
    try:
        assert worker.proc.wait(30) == 3, worker.log()
    finally:
        worker.kill()
    log = worker.log()
    assert re.search(r"event=worker_refused .*statement-based binary logs", log), log
    assert "event=claim " not in log and "worker_started" not in log
    assert job_row(server, "jq", "waiting-1") == ("ready", 0, None)


def test_init_db_refuses_statement_binlogs_before_creating_anything(binlog_server):
    server, _ = binlog_server
    configured(server, *LOG_BIN_STATEMENT)
    url = server.create_database("fresh")
    result = jobqueue(url, "init-db")
    assert result.returncode == 3, result.stderr
    assert "statement-based binary logs" in result.stderr
    assert server.execute("SHOW TABLES", "fresh") == []


# --- a read-only server: the same data, restarted with --read-only ------------------------------


@pytest.fixture
def read_only_server(module_servers, db_server):
    return module_servers("readonly", db_server, read_only=True)


def test_read_only_server_is_a_problem(read_only_server):
    server, url = read_only_server
    assert server.variable("read_only") == "ON"
    code, checks, stdout = run_doctor(url)
    assert code == 3
    assert checks["primary"]["verdict"] == "problem"
    assert "read_only is ON" in checks["primary"]["detail"] and "replica" in checks["primary"]["detail"]
    assert "primary" in checks["primary"]["advice"]
    assert [name for name, c in checks.items() if c["verdict"] == "problem"] == ["primary"]
    text = jobqueue(url, "doctor")
    assert text.returncode == 3
    assert re.search(r"^problem  primary: the server is read-only", text.stdout, re.M), text.stdout
    assert re.search(r"^ {9}-> point --database-url", text.stdout, re.M), text.stdout


def test_worker_refuses_to_claim_on_a_read_only_server(read_only_server, tmp_path):
    server, url = read_only_server
    worker = WorkerProcess(url, tmp_path, "replica", "--burst")
    try:
        assert worker.proc.wait(30) == 3, worker.log()
    finally:
        worker.kill()
    log = worker.log()
    assert re.search(r"event=worker_refused .*read_only is ON", log), log
    assert "event=claim " not in log and "worker_started" not in log
    assert job_row(server, "jq", "waiting-1") == ("ready", 0, None)
    # The refusal came from reading read_only, not from a failed write: root has SUPER and the
    # server takes its writes, so a worker that did not check would have claimed the job.
    server.execute("CREATE TABLE scratch (id INT PRIMARY KEY) ENGINE=InnoDB", "jq")
    server.execute("INSERT INTO scratch VALUES (1)", "jq")
    assert server.execute("SELECT id FROM scratch", "jq") == [(1,)]


# --- tables: a MyISAM job_queue, a missing schema, a user who may not EXPLAIN --------------------


def test_myisam_job_queue_is_a_problem(throwaway_server):
    server = throwaway_server()
    url = with_job(server, "jq")
    code, checks, _ = run_doctor(url)
    assert code == 0, checks
    assert checks["tables"]["verdict"] == "ok" and "use InnoDB" in checks["tables"]["detail"]

    server.execute("ALTER TABLE job_queue ENGINE=MyISAM", "jq")
    code, checks, _ = run_doctor(url)
    assert code == 3
    assert checks["tables"]["verdict"] == "problem"
    assert "job_queue is MyISAM" in checks["tables"]["detail"]
    assert "ENGINE=InnoDB" in checks["tables"]["advice"]
    assert [name for name, c in checks.items() if c["verdict"] == "problem"] == ["tables"]

    # Not installed at all: a problem too, with the command that fixes it.
    empty_url = server.create_database("empty")
    code, checks, _ = run_doctor(empty_url)
    assert code == 3
    assert checks["tables"]["verdict"] == "problem" and "init-db" in checks["tables"]["advice"]
    assert checks["claim_plan"]["verdict"] == "warning"

    # A user the server will not let EXPLAIN the claim (no SELECT on the table): that check says
    # it could not look, and the others still run.
    server.execute("CREATE USER 'writer'@'127.0.0.1'")
    server.execute("GRANT INSERT ON jq.* TO 'writer'@'127.0.0.1'")
    code, checks, _ = run_doctor(url.replace("root@", "writer@"))
    assert checks["claim_plan"]["verdict"] == "warning"
    assert checks["claim_plan"]["detail"].startswith("could not check:") and "1142" in checks["claim_plan"]["detail"]
    assert list(checks) == CHECK_NAMES and checks["clock"]["verdict"] == "ok"
