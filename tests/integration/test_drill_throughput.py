"""The drill's throughput steps read the primary's binlog commits and group commits: MariaDB
counts both (Binlog_commits, Binlog_group_commits), MySQL neither (its transactions are its
GTIDs, its group commits the binlog's syncs). On a private server with a binary log, each flavour."""

from __future__ import annotations

import pytest

from drill.throughput import binlog_counters, gtid_count

pytestmark = pytest.mark.slow


def test_binlog_counters_count_each_transaction_and_its_group_commit(throwaway_server):
    server = throwaway_server("--log-bin", "--sync-binlog=1")
    server.create_database("tp")
    conn = server.connect("tp")
    try:
        with conn.cursor() as cur:
            cur.execute("CREATE TABLE t (id INT PRIMARY KEY)")
            before = binlog_counters(cur)
            for i in range(5):
                cur.execute("INSERT INTO t VALUES (%s)", (i,))
            conn.commit()
            after = binlog_counters(cur)
    finally:
        conn.close()
    # One client, autocommit: five transactions, each its own group commit.
    assert after["Binlog_commits"] - before["Binlog_commits"] == 5
    assert after["Binlog_group_commits"] - before["Binlog_group_commits"] == 5


def test_a_gtid_set_is_counted_by_its_intervals_tags_and_all():
    assert gtid_count("") == 0
    assert gtid_count("3e11fa47-71ca-11e1-9e33-c80aa9429562:1-5:7") == 6
    assert (
        gtid_count("3e11fa47-71ca-11e1-9e33-c80aa9429562:1-5,\n4a11fa47-71ca-11e1-9e33-c80aa9429562:tag_1:1-3:9") == 9
    )
