"""Real hosts on one machine, for tests where an application host, a worker host and database hosts
must be cut off from each other: Linux network namespaces joined by veth pairs to a bridge.

    net = HostNetwork(["app", "worker"])           # needs root (ip netns add)
    net.address("app")                             # "10.173.41.2": its own address
    net.run("app", ["python", "-c", "..."])        # subprocess.run via `ip netns exec`
    server = net.start_mariadb("db", tmp_path / "db")   # a database host: mariadbd in namespace
    net.link_down("db"); net.link_up("db")          # pull its cable, plug it back in
    net.cleanup()                                  # namespaces, veths, bridge, processes: gone

Layout: one Linux bridge in the root namespace (`jqt<token>br`, holding <subnet>.1, so the test
process reaches every host) and per host a namespace `jqt-<token>-<name>` with loopback up and an
`eth0` whose veth peer (`jqt<token>v<n>`) is a port of the bridge. The /24 is picked at random from
10.0.0.0/8 among the ones no interface or route of this machine uses. All hosts share that /24,
so the connected route is the only one they need: the bridge switches between them without IP
forwarding (net.ipv4.ip_forward stays 0, as it is here) and nothing is routed anywhere else. The
namespaces have no default route, so anything outside the /24 fails at once with ENETUNREACH
(tests assert it): traffic stays between these namespaces, the root namespace's bridge address and
each namespace's loopback. No IPv6 addresses are generated on these links (addrgenmode none).

What was found on this machine (Debian 12, kernel with br_netfilter loaded):

- `ip netns` works as root. `ip netns exec NS cmd` enters the namespace and exec()s cmd, so a
  Popen's pid is the command itself (signals reach mariadbd directly). It also gives the
  command a mount namespace of its own with /sys remounted; the file system is shared, so unix
  sockets (mariadbd's) and files under /tmp work across namespaces.
- A veth peer can be created directly inside the namespace under the name eth0 (`ip link add X
  type veth peer name eth0 netns NS`), no clash with the root namespace's eth0.
- net.bridge.bridge-nf-call-iptables is 1 (a global setting; not changed here), so bridged IPv4
  would pass the iptables FORWARD chain; no iptables table is loaded here, so nothing filters it.
  On a machine with a FORWARD policy of DROP (Docker installs one) host-to-host traffic would be
  dropped and the tests here would show it.
- link_down() sets the bridge side of the host's veth down: like a pulled cable or a dead switch
  port. The host keeps its address and its listening sockets, its eth0 loses carrier, packets in
  both directions are dropped silently: connects time out (or fail with EHOSTUNREACH after the
  ARP timeout of about 3 s when the peer's MAC is not cached), established connections hang
  until TCP gives up. Nothing gets a RST. link_up() restores it at once (the bridge runs no STP,
  so the port forwards immediately).
- `ip netns del` only removes the name: a namespace lives on while a process is inside it, and
  so does its veth. cleanup() therefore stops the servers and processes started here and kills
  whatever is left in its namespaces (`ip netns pids`) before deleting them.

A run killed with SIGKILL leaves its network behind (atexit never runs): `python -m testkit.netns
--remove-stale` removes the networks whose creating process is gone (the bridge's alias records it).
"""

from __future__ import annotations

import atexit
import ipaddress
import json
import os
import random
import re
import secrets
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from testkit.throwaway import ThrowawayMariaDB

IP = shutil.which("ip") or "/usr/sbin/ip"
_ALIAS = "jobqueue-testkit pid="
_NAME = re.compile(r"^[a-z][a-z0-9-]{0,19}$")


def netns_unavailable_reason() -> str | None:
    """Why HostNetwork cannot work for this process, or None when it can (tests skip on a reason)."""
    if os.geteuid() != 0:
        return "network namespaces need root (ip netns add, veth pairs, a bridge): run the suite as root"
    if not os.path.exists(IP):
        return "iproute2's `ip` is not installed (apt-get install iproute2)"
    # Root in a container may lack them: `ip netns add` needs CAP_SYS_ADMIN, links CAP_NET_ADMIN.
    with open("/proc/self/status") as status:
        effective = next(int(line.split()[1], 16) for line in status if line.startswith("CapEff:"))
    missing = [name for name, bit in (("CAP_SYS_ADMIN", 21), ("CAP_NET_ADMIN", 12)) if not effective >> bit & 1]
    if missing:
        return f"network namespaces need {' and '.join(missing)}, which this root process lacks"
    return None


@dataclass(frozen=True)
class Host:
    name: str  # as the test calls it: "app", "db"
    netns: str  # the namespace: jqt-<token>-<name>
    address: str  # its eth0 address in the network's /24
    veth: str  # the bridge side of its veth pair, in the root namespace


class HostNetwork:
    """Hosts in network namespaces on one bridge; see the module docstring."""

    def __init__(self, names: Iterable[str] = ()):
        reason = netns_unavailable_reason()
        if reason:
            raise RuntimeError(reason)
        self.token = secrets.token_hex(3)
        self.prefix = f"jqt-{self.token}-"  # every namespace's name starts with it
        self.bridge = f"jqt{self.token}br"  # interface names are limited to 15 bytes
        self.hosts: dict[str, Host] = {}
        self._processes: list[subprocess.Popen] = []
        self._servers: list[ThrowawayMariaDB] = []
        self._cleaned = False
        atexit.register(self.cleanup)  # registered first: a failure below still cleans up
        self.subnet = _pick_free_subnet()
        self.root_address = str(self.subnet.network_address + 1)
        _ip("link", "add", "name", self.bridge, "type", "bridge")
        _ip("link", "set", self.bridge, "addrgenmode", "none", "alias", f"{_ALIAS}{os.getpid()}")
        _ip("addr", "add", f"{self.root_address}/{self.subnet.prefixlen}", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        for name in names:
            self.add_host(name)

    # --- hosts -----------------------------------------------------------------------------------

    def add_host(self, name: str) -> Host:
        if not _NAME.match(name):
            raise ValueError(f"host name {name!r}: lower case letters, digits and '-', at most 20")
        if name in self.hosts:
            raise ValueError(f"host {name!r} exists")
        number = len(self.hosts)
        if number >= 250:
            raise ValueError("at most 250 hosts in one /24")
        host = Host(
            name=name,
            netns=self.prefix + name,
            address=str(self.subnet.network_address + 2 + number),
            veth=f"jqt{self.token}v{number}",
        )
        self.hosts[name] = host  # before creating: cleanup() removes a half-made host too
        _ip("netns", "add", host.netns)
        _ip("link", "add", host.veth, "type", "veth", "peer", "name", "eth0", "netns", host.netns)
        _ip("link", "set", host.veth, "addrgenmode", "none", "master", self.bridge)
        _ip("link", "set", host.veth, "up")
        _ip("-n", host.netns, "link", "set", "lo", "up")
        _ip("-n", host.netns, "link", "set", "eth0", "addrgenmode", "none")
        _ip("-n", host.netns, "addr", "add", f"{host.address}/{self.subnet.prefixlen}", "dev", "eth0")
        _ip("-n", host.netns, "link", "set", "eth0", "up")
        return host

    def host(self, name: str) -> Host:
        try:
            return self.hosts[name]
        except KeyError:
            raise KeyError(f"no host {name!r} in this network (hosts: {sorted(self.hosts)})") from None

    def address(self, name: str) -> str:
        return self.host(name).address

    def exec_prefix(self, name: str) -> list[str]:
        """Put before a command to run it on that host."""
        return [IP, "netns", "exec", self.host(name).netns]

    # --- running things on a host ----------------------------------------------------------------

    def run(self, name: str, argv: Sequence[str], *, timeout: float = 60, **kwargs) -> subprocess.CompletedProcess:
        """subprocess.run on that host (capture_output, text, check: as you pass them)."""
        return subprocess.run([*self.exec_prefix(name), *argv], timeout=timeout, **kwargs)

    def popen(self, name: str, argv: Sequence[str], **kwargs) -> subprocess.Popen:
        """subprocess.Popen on that host; still running at cleanup() it is terminated."""
        process = subprocess.Popen([*self.exec_prefix(name), *argv], **kwargs)
        self._processes.append(process)
        return process

    def mariadb(self, name: str, base_dir: Path | str, *extra_args: str, **options) -> ThrowawayMariaDB:
        """A ThrowawayMariaDB (not started) that runs on that host and binds to its address;
        stopped at cleanup() if still running."""
        server = ThrowawayMariaDB(
            base_dir, *extra_args, host=self.address(name), command_prefix=self.exec_prefix(name), **options
        )
        self._servers.append(server)
        return server

    def start_mariadb(self, name: str, base_dir: Path | str, *extra_args: str, **options) -> ThrowawayMariaDB:
        return self.mariadb(name, base_dir, *extra_args, **options).start()

    # --- faults ----------------------------------------------------------------------------------

    def link_down(self, name: str) -> None:
        """Cut the host off: its bridge port goes down, packets to and from it are dropped."""
        _ip("link", "set", self.host(name).veth, "down")

    def link_up(self, name: str) -> None:
        _ip("link", "set", self.host(name).veth, "up")

    def link_is_up(self, name: str) -> bool:
        (link,) = json.loads(_ip("-j", "link", "show", self.host(name).veth))
        return "UP" in link["flags"]

    # --- teardown --------------------------------------------------------------------------------

    def cleanup(self) -> None:
        """Remove all this network made; safe to call again (and called at interpreter exit)."""
        if self._cleaned:
            return
        self._cleaned = True
        atexit.unregister(self.cleanup)
        for server in self._servers:
            server.cleanup()  # a clean shutdown while its namespace still exists
        for process in self._processes:
            _end(process)
        for host in self.hosts.values():
            _remove_namespace(host.netns)
            _ip("link", "del", host.veth, check=False)  # gone with the namespace, unless a process held it
        _ip("link", "del", self.bridge, check=False)

    def __enter__(self) -> HostNetwork:
        return self

    def __exit__(self, *exc) -> None:
        self.cleanup()

    def __repr__(self) -> str:
        hosts = ", ".join(f"{h.name}={h.address}" for h in self.hosts.values())
        return f"HostNetwork({self.subnet}, root={self.root_address}, {hosts})"


# --- helpers -------------------------------------------------------------------------------------


def _ip(*args: str, check: bool = True) -> str:
    result = subprocess.run([IP, *args], capture_output=True, text=True, timeout=30)
    if check and result.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)} failed ({result.returncode}): {result.stderr.strip()}")
    return result.stdout


def _pick_free_subnet(tries: int = 200) -> ipaddress.IPv4Network:
    """A random 10.x.y.0/24 that overlaps no address or route of the root namespace (so neither
    another test run's network nor a real one)."""
    used = []
    for addr in json.loads(_ip("-j", "-4", "addr", "show")):
        for info in addr.get("addr_info", []):
            used.append(ipaddress.ip_network(f"{info['local']}/{info['prefixlen']}", strict=False))
    for route in json.loads(_ip("-j", "-4", "route", "show", "table", "all")):
        if route.get("dst") not in (None, "default"):
            used.append(ipaddress.ip_network(route["dst"], strict=False))
    for _ in range(tries):
        candidate = ipaddress.ip_network(f"10.{random.randint(1, 254)}.{random.randint(0, 255)}.0/24")
        if not any(candidate.overlaps(net) for net in used):
            return candidate
    raise RuntimeError("no free 10.x.y.0/24 found")


def _end(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)


def _remove_namespace(netns: str) -> None:
    # Whatever still runs inside was started in this network's namespace (by us): end it, or the
    # namespace and its veth would outlive `ip netns del`.
    for pid in _ip("netns", "pids", netns, check=False).split():
        try:
            os.kill(int(pid), signal.SIGKILL)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + 5
    while _ip("netns", "pids", netns, check=False).split() and time.monotonic() < deadline:
        time.sleep(0.02)
    _ip("netns", "del", netns, check=False)


def remove_stale_networks() -> list[str]:
    """Remove the networks left by runs that died without cleanup (their creating pid is gone);
    returns the bridges removed. Never touches a network whose creator still runs."""
    removed = []
    for link in json.loads(_ip("-j", "link", "show", "type", "bridge")):
        alias, name = link.get("ifalias", ""), link["ifname"]
        match = re.fullmatch(r"jqt([0-9a-f]{6})br", name)
        if not match or not alias.startswith(_ALIAS):
            continue
        try:
            os.kill(int(alias[len(_ALIAS) :]), 0)
            continue  # its creator still runs
        except ProcessLookupError:
            pass
        except PermissionError:
            continue
        token = match[1]
        for line in _ip("netns", "list").splitlines():
            netns = line.split()[0] if line.strip() else ""
            if netns.startswith(f"jqt-{token}-"):
                _remove_namespace(netns)
        for veth in json.loads(_ip("-j", "link", "show", "master", name)):
            _ip("link", "del", veth["ifname"], check=False)
        _ip("link", "del", name, check=False)
        removed.append(name)
    return removed


if __name__ == "__main__":
    if sys.argv[1:] == ["--remove-stale"]:
        print("removed:", " ".join(remove_stale_networks()) or "nothing")
    else:
        sys.exit("usage: python -m testkit.netns --remove-stale")
