"""What MySQL's binary log costs batch enqueue, and what server settings do not change it.

`service.enqueue_many` in batches of 1,000 and the hand-written multi-row INSERT beside it (both
exactly as bench.enqueue times them) on throwaway servers of this machine, started alike (128 MB
buffer pool; about 100 MB of redo, each server's default): MySQL 9.7 as Debian starts it (ROW
binlog, `sync_binlog=1`), the same with `--binlog-cache-size=4M` (a 1,000-row batch's row events
outgrow the default 32 KB cache and go through a temporary file: Binlog_cache_disk_use counts one
a batch), the same with `--disable-log-bin`; MariaDB 10.11 as it starts (no binlog), and with a
ROW binlog and `sync_binlog=1` as MySQL has them. Rounds alternate the servers' order; medians;
each against MariaDB without binlog (the issue's comparison). Throwaway servers because a
server's binlog is a global setting, which a run must not change on the shared ones.

Beside each rate, CPU seconds a row (not wall time): the server process's (from /proc, found by its
port) and this process's, over the timed calls. They say whose work a gap is: the client's CPU a
row is common to the servers, so what a serial caller can reach on one server against another
follows from the servers' CPU a row (docs/benchmarks.md).

    python -m bench.binlog_cost --rows 50000 --rounds 3 [--markdown]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from typing import Any

from bench import common
from bench.common import cpu_seconds, log, median, ratio
from bench.enqueue import BATCH, ours, raw
from bench.server_cost import server_pid
from testkit.throwaway import ThrowawayServer, describe_flavour

# The same InnoDB sizes for all (the throwaway servers' own are smaller, for tests).
_SIZES = ("--innodb-buffer-pool-size=128M",)
SERVERS = {
    "MySQL 9.7, binlog": ("mysql", ("--innodb-redo-log-capacity=100M",)),
    "MySQL 9.7, binlog, 4 MB binlog cache": ("mysql", ("--innodb-redo-log-capacity=100M", "--binlog-cache-size=4M")),
    "MySQL 9.7, no binlog": ("mysql", ("--innodb-redo-log-capacity=100M", "--disable-log-bin")),
    "MariaDB 10.11": ("mariadb", ("--innodb-log-file-size=96M",)),
    # As a primary with replicas runs it: MySQL's binlog settings, to compare like with like.
    "MariaDB 10.11, binlog": (
        "mariadb",
        ("--innodb-log-file-size=96M", "--log-bin", "--binlog-format=ROW", "--sync-binlog=1", "--server-id=1"),
    ),
}
BASELINE = "MariaDB 10.11"
VARIABLES = ("version", "log_bin", "binlog_format", "sync_binlog", "binlog_cache_size")


def _spills(server: ThrowawayServer) -> int:
    """Transactions whose binlog events went through a temporary file (0 without a binlog)."""
    rows = server.execute("SHOW GLOBAL STATUS LIKE 'Binlog_cache_disk_use'")
    return int(rows[0][1]) if rows else 0


def _timed(how, url: str, rows: int, pid: int) -> dict[str, float]:
    """rows/s of `how` (bench.enqueue's ours or raw), and CPU microseconds a row of the server
    and of this process over the call (its set-up included: a connection, a SELECT)."""
    server, client = cpu_seconds(pid), time.process_time()
    seconds = how(url, rows)
    return {
        "rows_per_s": rows / seconds,
        "server_us": (cpu_seconds(pid) - server) / rows * 1e6,
        "client_us": (time.process_time() - client) / rows * 1e6,
    }


def run(rows: int, rounds: int) -> dict[str, Any]:
    servers: dict[str, ThrowawayServer] = {}
    settings: dict[str, dict[str, str | None]] = {}  # as each server says them
    spills: dict[str, list[float]] = {name: [] for name in SERVERS}  # binlog cache to disk, a batch
    samples: dict[str, dict[str, list[dict[str, float]]]] = {name: {"ours": [], "raw": []} for name in SERVERS}
    with tempfile.TemporaryDirectory(prefix="jq-binlog-", dir="/var/tmp") as tmp:
        try:
            for name, (flavour, args) in SERVERS.items():
                servers[name] = ThrowawayServer(
                    os.path.join(tmp, flavour + str(len(servers))), *_SIZES, *args, flavour=flavour
                ).start()
                settings[name] = {v: servers[name].variable(v) for v in VARIABLES}
            pids = {name: server_pid(server.url()) for name, server in servers.items()}
            if None in pids.values():
                raise SystemExit(f"binlog_cost: no process found listening for {pids}")
            urls = {name: server.url().rstrip("/") for name, server in servers.items()}
            for r in range(rounds):
                order = list(SERVERS) if r % 2 == 0 else list(reversed(SERVERS))
                for name in order:
                    with common.mysql_db("binraw", server=urls[name]) as url:
                        samples[name]["raw"].append(_timed(raw, url, rows, pids[name]))
                    with common.mysql_db("binours", server=urls[name]) as url:
                        before = _spills(servers[name])
                        samples[name]["ours"].append(_timed(ours, url, rows, pids[name]))
                        spills[name].append((_spills(servers[name]) - before) / -(-rows // BATCH))
                    last = samples[name]["ours"][-1]
                    log(
                        f"round {r + 1}/{rounds} {name}: enqueue_many {last['rows_per_s']:,.0f} rows/s, "
                        f"CPU a row {last['server_us']:.1f} us the server's, {last['client_us']:.1f} us ours"
                    )
        finally:
            for server in servers.values():
                server.stop()
                server.cleanup()

    def medians(key: str) -> dict[str, dict[str, float]]:
        """server name -> "ours"/"raw" -> the median of that figure over the rounds."""
        return {name: {what: median([x[key] for x in xs]) for what, xs in by.items()} for name, by in samples.items()}

    rate = medians("rows_per_s")
    return {
        "rows": rows,
        "rounds": rounds,
        "batch": BATCH,
        "load_average": os.getloadavg(),
        "servers": {
            name: describe_flavour(flavour) + " " + " ".join(_SIZES + args) for name, (flavour, args) in SERVERS.items()
        },
        "settings": settings,
        "rows_per_s": rate,
        "server_cpu_us_a_row": medians("server_us"),
        "client_cpu_us_a_row": medians("client_us"),
        "binlog_cache_spills_a_batch": {name: median(x) for name, x in spills.items()},
        "samples": samples,
        "against_mariadb": {
            name: {what: ratio(rate[name][what], rate[BASELINE][what]) for what in ("ours", "raw")} for name in SERVERS
        },
    }


def markdown(res: dict[str, Any]) -> str:
    out = [
        f"{res['rows']:,} rows in batches of {res['batch']:,}, median of {res['rounds']} rounds, each on a "
        f"fresh database (load average at the end: {', '.join(f'{x:.1f}' for x in res['load_average'])}).",
        "",
        "| server | `service.enqueue_many` rows/s | / MariaDB | server CPU a row, us | client CPU a row, us "
        "| binlog cache spills a batch | hand-written INSERT rows/s | / MariaDB | server CPU a row, us |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name in SERVERS:
        r, q = res["rows_per_s"][name], res["against_mariadb"][name]
        server, client = res["server_cpu_us_a_row"][name], res["client_cpu_us_a_row"][name]
        spills = res["binlog_cache_spills_a_batch"][name]
        out.append(
            f"| {name} | {r['ours']:,.0f} | {q['ours']:.2f} | {server['ours']:.1f} | {client['ours']:.1f} "
            f"| {spills:.2f} | {r['raw']:,.0f} | {q['raw']:.2f} | {server['raw']:.1f} |"
        )
    return "\n".join(out)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=50_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--markdown", action="store_true", help="print the docs table after the JSON")
    args = parser.parse_args(argv)
    res = run(args.rows, args.rounds)
    print(json.dumps(res, indent=2))
    if args.markdown:
        print()
        print(markdown(res))
    return res


if __name__ == "__main__":
    main()
