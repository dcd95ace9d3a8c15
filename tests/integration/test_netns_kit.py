"""testkit.netns itself: hosts in network namespaces reach each other, the root namespace and a
database host, nothing else; link_down() cuts a host off and link_up() plugs it back in; cleanup()
leaves nothing behind. Later tests (partitions between workers and the database, failover across
hosts) rely on each of these. They need root: as another user they skip, saying so."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import pytest

from testkit import netns
from testkit.netns import netns_unavailable_reason
from testkit.replication import ReplicationCluster

pytestmark = pytest.mark.slow

# Run on a host: connect to argv[1]:argv[2] within argv[3] seconds, print what came back or why not.
CONNECT = """
import socket, sys
try:
    with socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=float(sys.argv[3])) as s:
        print("got", s.recv(64).decode())
except OSError as e:
    print("failed", type(e).__name__, e.errno)
"""

# Run on a host: accept on argv[1]:argv[2], greet each client with argv[3].
GREETER = """
import socket, sys
with socket.create_server((sys.argv[1], int(sys.argv[2]))) as server:
    print("listening", flush=True)
    while True:
        client, _ = server.accept()
        with client:
            client.sendall(sys.argv[3].encode())
"""

MYSQL_SELECT = """
import pymysql, sys
try:
    conn = pymysql.connect(host=sys.argv[1], port=int(sys.argv[2]), user="root", connect_timeout=float(sys.argv[3]))
    with conn, conn.cursor() as cur:
        cur.execute("SELECT @@bind_address, CURRENT_USER()")
        print("got", *cur.fetchone())
except pymysql.err.OperationalError as e:
    print("failed", e.args[0])
"""


def connect_from(net, host, address, port, timeout=1.0):
    return net.run(
        host,
        [sys.executable, "-c", CONNECT, address, str(port), str(timeout)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()


def mysql_from(net, host, server, timeout=1.0):
    return net.run(
        host,
        [sys.executable, "-c", MYSQL_SELECT, server.host, str(server.port), str(timeout)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()


def start_greeter(net, host, port, greeting):
    process = net.popen(
        host, [sys.executable, "-c", GREETER, net.address(host), str(port), greeting], stdout=subprocess.PIPE, text=True
    )
    assert process.stdout.readline().strip() == "listening"
    process.stdout.close()
    return process


def alive(pid):
    """Running, as opposed to gone or a zombie waiting for its reaper."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def ip_lines(*args):
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=True).stdout


def test_a_user_other_than_root_gets_a_reason_to_skip(monkeypatch):
    monkeypatch.setattr(netns.os, "geteuid", lambda: 1000)
    assert "root" in netns_unavailable_reason()


def test_hosts_reach_each_other_and_the_root_namespace_and_nothing_else(host_network):
    net = host_network("a", "b")
    a, b = net.address("a"), net.address("b")
    assert len({a, b, net.root_address}) == 3 and all(x.startswith("10.") for x in (a, b))
    start_greeter(net, "b", 7001, "hello from b")

    assert connect_from(net, "a", b, 7001) == "got hello from b"
    with socket.create_connection((b, 7001), timeout=2) as conn:  # root namespace -> host
        assert conn.recv(64) == b"hello from b"
    with socket.create_server((net.root_address, 0)) as server:  # host -> root namespace
        port = server.getsockname()[1]
        client = net.popen(
            "a",
            [
                sys.executable,
                "-c",
                "import socket, sys\nsocket.create_connection((sys.argv[1], int(sys.argv[2])), 2).sendall(b'hi')",
                net.root_address,
                str(port),
            ],
        )
        server.settimeout(5)
        conn, (peer, _) = server.accept()
        with conn:
            assert conn.recv(2) == b"hi" and peer == a
        assert client.wait(5) == 0

    # Each host has its own loopback, up.
    start_greeter(net, "a", 7002, "loopback")
    assert connect_from(net, "a", a, 7002) == "got loopback"
    # No default route: anything outside the network's /24 is unreachable at once, nothing leaves.
    routes = json.loads(net.run("a", ["ip", "-j", "route"], capture_output=True, text=True).stdout)
    assert [r["dst"] for r in routes] == [str(net.subnet)]
    assert connect_from(net, "a", "192.0.2.1", 80) == "failed OSError 101"  # ENETUNREACH
    outside = str(net.subnet.network_address + 256 + 1)  # the next /24
    assert connect_from(net, "a", outside, 80) == "failed OSError 101"


def test_link_down_cuts_a_host_off_and_link_up_reconnects_it(host_network):
    net = host_network("a", "b")
    start_greeter(net, "b", 7003, "up")
    assert connect_from(net, "a", net.address("b"), 7003) == "got up"

    net.link_down("b")
    assert not net.link_is_up("b")
    started = time.monotonic()
    # Dropped, not refused: the connect times out (EHOSTUNREACH if ARP had to ask).
    assert connect_from(net, "a", net.address("b"), 7003, timeout=1.0) in (
        "failed TimeoutError None",
        "failed OSError 113",
    )
    assert time.monotonic() - started < 5
    with pytest.raises(OSError):
        socket.create_connection((net.address("b"), 7003), timeout=1.0).close()

    net.link_up("b")
    assert net.link_is_up("b")
    assert connect_from(net, "a", net.address("b"), 7003) == "got up"


def test_a_mariadb_on_a_database_host_is_reachable_from_the_other_hosts(host_network, tmp_path):
    net = host_network("app", "db")
    server = net.start_mariadb("db", tmp_path / "db")
    assert server.host == net.address("db")
    # mariadbd itself (ip exec()s it) runs in the db namespace, not ours.
    assert os.readlink(f"/proc/{server.proc.pid}/ns/net") != os.readlink("/proc/self/ns/net")
    with open(f"/proc/{server.proc.pid}/comm") as comm:
        assert comm.read().strip() == "mariadbd"

    assert mysql_from(net, "app", server) == f"got {net.address('db')} root@%"
    assert server.execute("SELECT 1") == [(1,)]  # the test process, via the bridge
    with pytest.raises(OSError):  # not on the root's loopback
        socket.create_connection(("127.0.0.1", server.port), timeout=1).close()

    net.link_down("db")
    assert mysql_from(net, "app", server) == "failed 2003"  # can't connect (timed out)
    net.link_up("db")
    assert mysql_from(net, "app", server).startswith("got ")


def test_a_primary_and_a_replica_on_two_database_hosts(host_network, tmp_path):
    net = host_network("app", "db1", "db2")
    cluster = ReplicationCluster([net.mariadb("db1", tmp_path / "db1"), net.mariadb("db2", tmp_path / "db2")])
    try:
        cluster.start()
        primary, replica = cluster.primary, cluster.replicas[0]
        assert cluster.status().master_host == net.address("db1")
        primary.create_database("jq")
        primary.execute("CREATE TABLE jq.t (id INT PRIMARY KEY)")
        primary.execute("INSERT INTO jq.t VALUES (1)")
        cluster.wait_caught_up(timeout=10)
        assert replica.execute("SELECT id FROM jq.t") == [(1,)]
        assert mysql_from(net, "app", replica) == f"got {net.address('db2')} root@%"
    finally:
        cluster.cleanup()


def test_cleanup_removes_namespaces_veths_bridge_and_processes(host_network, tmp_path):
    net = host_network("a", "b")
    sleeper = net.popen("a", ["sleep", "600"])
    orphan = net.run(
        "b",
        ["sh", "-c", "sleep 600 >/dev/null 2>&1 & echo $!"],  # not ours to track
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    server = net.start_mariadb("b", tmp_path / "db")
    assert net.prefix in ip_lines("netns", "list") and net.token in ip_lines("link")

    net.cleanup()
    assert net.prefix not in ip_lines("netns", "list")
    assert net.token not in ip_lines("link")  # neither end of a veth, nor the bridge
    assert sleeper.poll() is not None and not server.running
    assert not alive(orphan)
    net.cleanup()  # again: nothing to do, no error
