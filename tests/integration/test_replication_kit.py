"""testkit.replication itself: a primary and GTID replicas of throwaway servers, the lag figure,
failover after a SIGKILL, and the readers of what a server executed. Later tests (reads from a
replica, failover under running workers) rely on each of these."""

from __future__ import annotations

import time

import pymysql
import pytest

from testkit.replication import (
    HEARTBEAT_DATABASE,
    binlog_events,
    executed_statements,
    gtid_binlog_pos,
    read_general_log,
    replica_status,
)

APP_USER, APP_PASSWORD = "app", "app-pw"


def app_connect(server, database="jq"):
    """As an application would: a user without SUPER, so read_only applies to it."""
    return pymysql.connect(
        host=server.host,
        port=server.port,
        user=APP_USER,
        password=APP_PASSWORD,
        database=database,
        autocommit=True,
        connect_timeout=5,
    )


def make_app_schema(primary):
    primary.create_database("jq")
    primary.execute("CREATE TABLE jq.t (id INT AUTO_INCREMENT PRIMARY KEY, v VARCHAR(40) NOT NULL)")
    primary.execute(f"CREATE USER '{APP_USER}'@'%' IDENTIFIED BY '{APP_PASSWORD}'")
    primary.execute(f"GRANT ALL PRIVILEGES ON jq.* TO '{APP_USER}'@'%'")


def values(server):
    return [row[0] for row in server.execute("SELECT v FROM jq.t ORDER BY id")]


def origin_and_count(position):
    """("0-1", 42) for MariaDB's 0-1-42, ("<uuid>", 42) for MySQL's <uuid>:1-42: all written on one
    server, so the last number counts its transactions."""
    if ":" in position:
        origin, numbers = position.split(":", 1)
        return origin, int(numbers.split("-")[-1])
    domain, server, count = position.split("-")
    return f"{domain}-{server}", int(count)


def semi_sync_status(cluster, server, role):
    return server.execute(f"SHOW GLOBAL STATUS LIKE '{cluster.dialect.semi_sync_status(role)}'")[0][1]


def eventually(check, timeout=10.0, interval=0.1):
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result or time.monotonic() > deadline:
            return result
        time.sleep(interval)


@pytest.mark.slow
def test_a_write_on_the_primary_appears_on_the_read_only_replica(replication_cluster):
    cluster = replication_cluster(replicas=1)
    primary, replica = cluster.primary, cluster.replicas[0]
    make_app_schema(primary)
    with app_connect(primary) as conn, conn.cursor() as cur:
        cur.execute("INSERT INTO jq.t (v) VALUES ('written on the primary')")
    cluster.wait_caught_up(timeout=10)

    assert values(replica) == ["written on the primary"]
    assert (primary.variable("read_only"), replica.variable("read_only")) == ("OFF", "ON")
    # MySQL counts from the applied event's commit time on the primary in whole seconds: a
    # heartbeat every 0.2 s keeps it at 0 or 1 when caught up, and on a busy machine it reads 2
    # for a moment (CI saw it); MariaDB says 0.
    settled = (0, 1) if primary.is_mysql else (0,)
    assert eventually(lambda: cluster.status().seconds_behind_master in settled), cluster.status()
    status = cluster.status()
    assert status.replicating
    assert (status.master_host, status.master_port) == (primary.host, primary.port)
    # The kit's heartbeat writes on the primary every 0.2 s, so the primary may be a heartbeat
    # or two ahead by the time it is asked.
    applied, written = origin_and_count(status.gtid_slave_pos), origin_and_count(gtid_binlog_pos(primary))
    assert applied[0] == written[0] and 0 <= written[1] - applied[1] <= 3, (applied, written)
    assert replica_status(primary) is None
    assert semi_sync_status(cluster, primary, "primary") == "ON"
    assert semi_sync_status(cluster, replica, "replica") == "ON"
    # The application cannot write on the replica, and nothing was ever written there: every
    # transaction in its binlog came from the primary (server id 1).
    with app_connect(replica) as conn, conn.cursor() as cur, pytest.raises(pymysql.err.OperationalError) as refused:
        cur.execute("INSERT INTO jq.t (v) VALUES ('on the replica')")
    assert refused.value.args[0] == 1290  # ER_OPTION_PREVENTS_STATEMENT: --read-only
    assert {event.server_id for event in binlog_events(replica) if event.event_type == "Gtid"} == {1}


@pytest.mark.slow
def test_lag_grows_while_the_sql_thread_is_stopped_and_returns_to_zero(replication_cluster):
    cluster = replication_cluster(replicas=1)
    primary, replica = cluster.primary, cluster.replicas[0]
    make_app_schema(primary)
    cluster.wait_caught_up(timeout=10)
    assert cluster.lag_seconds() < 1.0

    cluster.stop_sql_thread()
    primary.execute("INSERT INTO jq.t (v) VALUES ('held back')")
    time.sleep(1.0)
    first = cluster.lag_seconds()
    time.sleep(1.0)
    second = cluster.lag_seconds()
    status = cluster.status()
    # What MariaDB reports meanwhile: the IO thread still receives, the SQL thread applies nothing,
    # and Seconds_Behind_Master is NULL, not a growing number. The heartbeat figure grows.
    assert (status.io_running, status.sql_running, status.seconds_behind_master) == ("Yes", "No", None)
    assert status.gtid_io_pos != status.gtid_slave_pos
    assert first >= 0.8 and second >= first + 0.8, (first, second)
    assert values(replica) == []

    cluster.start_sql_thread()
    cluster.wait_caught_up(timeout=10)
    assert values(replica) == ["held back"]
    assert eventually(lambda: cluster.lag_seconds() < 0.6), cluster.lag_seconds()
    # MySQL counts from the applied event's commit time on the primary, so on a busy machine it
    # reads 2 for a moment after catching up; it settles at 0 or 1 (MariaDB: 0).
    settled = (0, 1) if primary.is_mysql else (0,)
    assert eventually(lambda: cluster.status().seconds_behind_master in settled), cluster.status()


@pytest.mark.slow
def test_failover_after_sigkill_then_the_old_primary_replicates_read_only(replication_cluster):
    cluster = replication_cluster(replicas=2)
    old, new, other = cluster.primary, cluster.replicas[0], cluster.replicas[1]
    make_app_schema(old)
    old.execute("INSERT INTO jq.t (v) VALUES ('before the crash')")
    cluster.wait_caught_up(timeout=10)

    old.kill()
    assert eventually(lambda: cluster.status(new).io_running == "Connecting")
    if not new.is_mysql:  # MySQL keeps a number while its IO thread reconnects
        assert cluster.status(new).seconds_behind_master is None

    assert cluster.promote(new) is new
    assert cluster.primary is new and old not in cluster.replicas
    assert new.variable("read_only") == "OFF" and replica_status(new) is None
    with app_connect(new) as conn, conn.cursor() as cur:  # writable at once, old one still dead
        cur.execute("INSERT INTO jq.t (v) VALUES ('after the failover')")
    cluster.wait_caught_up(other, timeout=10)  # the other replica follows the new primary
    assert cluster.status(other).master_port == new.port and values(other)[-1] == "after the failover"

    cluster.demote(old)  # restarted --read-only, then attached
    assert old.running and "--read-only" in old.extra_args
    assert old.variable("read_only") == "ON"
    status = cluster.status(old)
    assert status.replicating and (status.master_host, status.master_port) == (new.host, new.port)
    assert values(old) == ["before the crash", "after the failover"]

    with app_connect(new) as conn, conn.cursor() as cur:
        cur.execute("INSERT INTO jq.t (v) VALUES ('after the demotion')")
    cluster.wait_caught_up(timeout=10)
    assert values(old)[-1] == values(other)[-1] == "after the demotion"
    with app_connect(old) as conn, conn.cursor() as cur, pytest.raises(pymysql.err.OperationalError) as refused:
        cur.execute("INSERT INTO jq.t (v) VALUES ('on the old primary')")
    assert refused.value.args[0] == 1290
    # The semi-sync roles moved with the failover.
    assert semi_sync_status(cluster, new, "primary") == "ON"
    assert new.variable(cluster.dialect.semi_sync_variable("replica")) == "OFF"
    assert semi_sync_status(cluster, old, "replica") == "ON"
    assert old.variable(cluster.dialect.semi_sync_variable("primary")) == "OFF"
    # The lag figure follows the new primary's heartbeat.
    assert eventually(lambda: cluster.lag_seconds(old) < 0.6)
    assert set(cluster.timings) == {"start", "promote", "demote"}


@pytest.mark.slow
def test_an_old_primary_with_a_transaction_the_new_one_never_got_is_not_attached(replication_cluster):
    """What a crashed primary may bring back (a transaction it binlogged that no replica got,
    made here by writing on it after the failover; CI's quick drill met one on MariaDB 10.11,
    committed while semi-sync had fallen back to asynchronous): MariaDB's strict GTID mode would
    stop its IO thread (1236); MySQL's source would take it as a replica, which then stops on the
    first row the extra transaction touched. demote() refuses it on every server, and with
    rebuild=True replaces its data by the new primary's (MySQL: CLONE; MariaDB: a dump)."""
    cluster = replication_cluster(replicas=1)
    old, new = cluster.primary, cluster.replicas[0]
    make_app_schema(old)
    cluster.wait_caught_up(timeout=10)
    old.kill()
    cluster.promote(new)
    new.execute("INSERT INTO jq.t (v) VALUES ('on the new primary')")
    old.start()  # as the primary it was: root writes what nobody gets
    old.execute("INSERT INTO jq.t (v) VALUES ('only on the old primary')")
    old.kill()

    with pytest.raises(RuntimeError, match="never got"):
        cluster.demote(old)
    assert values(old) == ["only on the old primary"] and old not in cluster.discarded
    cluster.demote(old, rebuild=True)
    origin = old.execute("SELECT @@server_uuid")[0][0] + ":" if old.is_mysql else "0-1-"
    assert cluster.discarded[old].startswith(origin)
    assert old.variable("read_only") == "ON"
    assert cluster.status(old).replicating and values(old) == ["on the new primary"]
    new.execute("INSERT INTO jq.t (v) VALUES ('after the rebuild')")
    cluster.wait_caught_up(timeout=10)
    assert values(old) == ["on the new primary", "after the rebuild"]


@pytest.mark.slow
def test_planned_switchover_and_back_while_both_run(replication_cluster):
    cluster = replication_cluster(replicas=1)
    first, second = cluster.primary, cluster.replicas[0]
    make_app_schema(first)
    cluster.stop_sql_thread()  # promote() applies what the replica holds anyway
    first.execute("INSERT INTO jq.t (v) VALUES ('one')")

    cluster.promote(second)  # the running old primary is fenced read-only first
    assert first.variable("read_only") == "ON" and values(second) == ["one"]
    second.execute("INSERT INTO jq.t (v) VALUES ('two')")
    cluster.demote(first)  # still running: switched in place, no restart
    assert cluster.status(first).replicating and values(first) == ["one", "two"]

    # And back: `second` now has a gtid_slave_pos of its time as a replica, older than its binlog.
    cluster.promote(first)
    first.execute("INSERT INTO jq.t (v) VALUES ('three')")
    cluster.demote(second)
    cluster.wait_caught_up(timeout=10)
    assert cluster.primary is first and cluster.replicas == [second]
    assert values(second) == ["one", "two", "three"] and second.variable("read_only") == "ON"
    assert first.variable("read_only") == "OFF"


@pytest.mark.slow
def test_the_general_log_reader_tells_client_statements_from_replication(replication_cluster):
    cluster = replication_cluster(replicas=1, general_log=True)
    primary, replica = cluster.primary, cluster.replicas[0]
    make_app_schema(primary)
    primary.execute("INSERT INTO jq.t (v) VALUES ('replicated row')")
    cluster.wait_caught_up(timeout=10)
    with app_connect(replica) as conn, conn.cursor() as cur:
        # MariaDB refuses a locking read on a --read-only server (LOCK IN SHARE MODE passes),
        # and the general log has it all the same: it logs what a server received.
        with pytest.raises(pymysql.err.OperationalError) as refused:
            cur.execute("SELECT id FROM jq.t\nWHERE v = 'replicated row'\nFOR UPDATE SKIP LOCKED")
        assert refused.value.args[0] == 1290
        cur.execute("SELECT 'a plain read on the replica'")

    assert executed_statements(replica, "a plain read") == ["SELECT 'a plain read on the replica'"]
    claims = executed_statements(replica, r"FOR UPDATE SKIP LOCKED")
    assert claims == ["SELECT id FROM jq.t\nWHERE v = 'replicated row'\nFOR UPDATE SKIP LOCKED"]
    assert executed_statements(primary, r"SKIP LOCKED") == []
    # What the SQL thread applied is in the replica's log too, but not as a client's statement.
    assert executed_statements(replica, r"CREATE TABLE jq\.t") == []
    assert len(executed_statements(replica, r"CREATE TABLE jq\.t", clients_only=False)) == 1
    assert executed_statements(primary, r"CREATE TABLE jq\.t")
    entries = read_general_log(replica)
    (claim,) = [e for e in entries if "SKIP LOCKED" in e.argument]
    assert claim.command == "Query" and claim.user.startswith(f"{APP_USER}@")
    # The heartbeat writes on the primary are there, and left out unless asked for.
    heartbeat_write = rf"INSERT INTO {HEARTBEAT_DATABASE}\.heartbeat"
    assert eventually(lambda: executed_statements(primary, heartbeat_write, include_heartbeat=True))
    assert executed_statements(primary, heartbeat_write) == []


def test_read_general_log_parses_runs_threads_and_multi_line_statements(tmp_path):
    log = tmp_path / "general.log"
    log.write_text(
        "/usr/sbin/mariadbd, Version: 10.11.19-MariaDB-0+deb12u1-log (Debian 12). started with:\n"
        "Tcp port: 41395  Unix socket: /tmp/jqdb-x/mariadbd.sock\n"
        "Time\t\t    Id Command\tArgument\n"
        "261202  3:21:35\t     4 Connect\troot@127.0.0.1 on  using TCP/IP\n"
        "\t\t     4 Query\tSELECT 1\n"
        "\t\t     8 Query\tBEGIN\n"
        "\t\t     4 Query\tUPDATE jobs\n"
        "SET status = 'running'\n"
        "\n"
        "WHERE id = 1\n"
        "\t\t     4 Quit\t\n"
        "/usr/sbin/mariadbd, Version: 10.11.19-MariaDB-0+deb12u1-log (Debian 12). started with:\n"
        "Tcp port: 41395  Unix socket: /tmp/jqdb-x/mariadbd.sock\n"
        "Time\t\t    Id Command\tArgument\n"
        "261202  3:22:01\t     4 Connect\tapp@10.1.2.3 on jq using TCP/IP\n"
        "\t\t     4 Query\tSELECT 2\n"
    )
    entries = read_general_log(log)
    assert [(e.run, e.thread_id, e.command, e.user) for e in entries] == [
        (0, 4, "Connect", "root@127.0.0.1"),
        (0, 4, "Query", "root@127.0.0.1"),
        (0, 8, "Query", None),
        (0, 4, "Query", "root@127.0.0.1"),
        (0, 4, "Quit", "root@127.0.0.1"),
        (1, 4, "Connect", "app@10.1.2.3"),
        (1, 4, "Query", "app@10.1.2.3"),
    ]
    assert entries[3].argument == "UPDATE jobs\nSET status = 'running'\n\nWHERE id = 1"
