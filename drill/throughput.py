"""Throughput against application hosts: 1, 2 and 3 hosts with the same threads each, the
primary's commits and CPU beside them, to show where the one primary becomes the limit.

Each step gets a fresh database, one `jobqueue worker --concurrency C` per host (in the host's
network namespace, with the candidate URLs), the workers started and then SIGSTOPped, N no-op jobs
inserted in batches, and the workers SIGCONTinued together: the rate is measured between 10% and
90% done, so neither start-up nor the tail counts. Over the same interval: the primary's binlog
commits (Binlog_commits: transactions; Binlog_group_commits: the fsyncs that carried them), its
mariadbd process's CPU, and the machine's.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

import pymysql

from drill.topology import APP_PASSWORD, APP_USER, Topology, base_env, server_url

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


@dataclass
class Steps:
    jobs: int = 20_000
    host_counts: tuple[int, ...] = (1, 2, 3)
    concurrency: int = 8
    rounds: int = 2
    enqueue_jobs: int = 2000


def measure(topo: Topology, steps: Steps, workdir: Path, say=print) -> list[dict]:
    servers = (topo.db1, topo.db2)
    for s in servers:
        s.execute("SET GLOBAL general_log = OFF")  # the drill's general logs are not for this
    results = []
    try:
        results.append(enqueue_cost(topo, steps.enqueue_jobs, say))
        for round_ in range(steps.rounds):
            for hosts in steps.host_counts:
                results.append(step(topo, hosts, steps, workdir, round_, say))
    finally:
        for s in servers:
            s.execute("SET GLOBAL general_log = ON")
    return results


def enqueue_cost(topo: Topology, jobs: int, say) -> dict:
    """What one enqueue costs the primary when jobs come one at a time (an API request or a
    `jobqueue enqueue` each: one transaction per job), measured from this process."""
    from jobqueue.core import service
    from jobqueue.core.db import create_engine
    from jobqueue.core.task_modules import load_task_modules

    load_task_modules([])
    database = "bench_enqueue"
    topo.create_database(database)
    primary = topo.cluster.primary
    engine = create_engine(server_url(primary, database, APP_USER, APP_PASSWORD), pool_size=1)
    conn = pymysql.connect(
        host=primary.host,
        port=primary.port,
        user="root",
        password="",
        database=database,
        autocommit=True,
        connect_timeout=5,
    )
    try:
        a = snapshot(conn, primary)
        with engine.connect() as c:
            for i in range(jobs):
                service.enqueue(c, "noop", f"e-{i}")
        b = snapshot(conn, primary)
    finally:
        conn.close()
        engine.dispose()
        primary.execute(f"DROP DATABASE `{database}`")
    seconds = b["t"] - a["t"]
    out = {
        "kind": "enqueue",
        "jobs": jobs,
        "jobs_per_second": round(jobs / seconds, 1),
        "commits_per_job": round((b["Binlog_commits"] - a["Binlog_commits"]) / jobs, 3),
        "primary_cpu_ms_per_job": round(1000 * (b["cpu"] - a["cpu"]) / jobs, 3),
    }
    say(
        f"throughput: enqueue one at a time from one client: {out['jobs_per_second']} jobs/s, "
        f"{out['commits_per_job']} commits and {out['primary_cpu_ms_per_job']} ms of primary CPU per job"
    )
    return out


def step(topo: Topology, hosts: int, steps: Steps, workdir: Path, round_: int, say) -> dict:
    from jobqueue.core import service
    from jobqueue.core.db import create_engine
    from jobqueue.core.task_modules import load_task_modules

    load_task_modules([])  # the built-in `noop`

    database = f"bench_{hosts}_{round_}"
    topo.create_database(database)
    logs = workdir / "throughput"
    logs.mkdir(exist_ok=True)
    env = base_env(JOBQUEUE_DATABASE_URL=topo.candidate_urls(database), JOBQUEUE_LOG_LEVEL="WARNING")
    app_hosts = [topo.app_host(name, env, logs) for name in topo.app_names[:hosts]]
    workers = [
        h.start_worker("--concurrency", str(steps.concurrency), "--lease-seconds", "30", "--idle-cap-seconds", "0.2")
        for h in app_hosts
    ]
    primary = topo.cluster.primary
    try:
        # Logging at WARNING (a completion line per job would cost a third of the rate): a worker
        # has started when its process row is there.
        deadline = time.monotonic() + 120
        while primary.execute("SELECT COUNT(*) FROM worker_process WHERE stopped_at IS NULL", database=database)[0][
            0
        ] < len(workers):
            if time.monotonic() > deadline or not all(w.alive() for w in workers):
                raise RuntimeError("throughput workers did not start:\n" + "\n".join(w.log()[-1000:] for w in workers))
            time.sleep(0.2)
        for w in workers:
            w.signal(signal.SIGSTOP)
        engine = create_engine(server_url(primary, database, APP_USER, APP_PASSWORD), pool_size=1)
        try:
            with engine.connect() as conn:
                for start in range(0, steps.jobs, 1000):
                    service.enqueue_many(
                        conn,
                        [{"task": "noop", "task_key": f"t-{i}"} for i in range(start, min(steps.jobs, start + 1000))],
                    )
        finally:
            engine.dispose()
        for w in workers:
            w.signal(signal.SIGCONT)
        samples = watch(primary, database, steps.jobs)
    finally:
        for w in workers:
            w.signal(signal.SIGCONT)
            w.terminate(30)
        primary.execute(f"DROP DATABASE `{database}`")
    a, b = samples
    seconds = b["t"] - a["t"]
    jobs = b["done"] - a["done"]
    out = {
        "kind": "hosts",
        "hosts": hosts,
        "threads_per_host": steps.concurrency,
        "round": round_,
        "jobs": steps.jobs,
        "jobs_per_second": round(jobs / seconds, 1),
        "commits_per_second": round((b["Binlog_commits"] - a["Binlog_commits"]) / seconds, 1),
        "group_commits_per_second": round((b["Binlog_group_commits"] - a["Binlog_group_commits"]) / seconds, 1),
        "primary_cpu_cores": round((b["cpu"] - a["cpu"]) / seconds, 2),
        "machine_cpu_cores": round((b["machine_busy"] - a["machine_busy"]) / seconds, 2),
        "seconds": round(seconds, 2),
    }
    out["commits_per_job"] = round(out["commits_per_second"] / max(1e-9, out["jobs_per_second"]), 3)
    out["primary_cpu_ms_per_job"] = round(1000 * out["primary_cpu_cores"] / max(1e-9, out["jobs_per_second"]), 3)
    say(
        f"throughput: {hosts} host(s) x {steps.concurrency} threads: {out['jobs_per_second']} jobs/s, "
        f"{out['commits_per_second']} commits/s, primary CPU {out['primary_cpu_cores']} cores "
        f"(machine {out['machine_cpu_cores']} of {os.cpu_count()})"
    )
    return out


def watch(primary, database: str, total: int) -> tuple[dict, dict]:
    """Samples at 10% and 90% done."""
    conn = pymysql.connect(
        host=primary.host,
        port=primary.port,
        user="root",
        password="",
        database=database,
        autocommit=True,
        connect_timeout=5,
    )
    first = last = None
    deadline = time.monotonic() + 600
    try:
        while time.monotonic() < deadline:
            sample = snapshot(conn, primary)
            if first is None and sample["done"] >= total * 0.1:
                first = sample
            if sample["done"] >= total * 0.9:
                last = sample
                break
            time.sleep(0.1)
    finally:
        conn.close()
    if first is None or last is None:
        raise RuntimeError(f"the throughput step did not finish within 600 s ({sample['done']} of {total} done)")
    return first, last


def binlog_counters(cur) -> dict[str, int]:
    """Transactions the server wrote to its binary log (Binlog_commits) and the group commits that
    wrote them (Binlog_group_commits; with sync_binlog=1 an fsync each). MariaDB counts both; MySQL
    neither: there the transactions are counted by their GTIDs (the drill's servers run with GTIDs)
    and the group commits by the binary log's syncs (performance_schema)."""
    cur.execute("SHOW GLOBAL STATUS WHERE Variable_name IN ('Binlog_commits', 'Binlog_group_commits')")
    status = {k: int(v) for k, v in cur.fetchall()}
    if status:
        return status
    cur.execute("SELECT @@global.gtid_executed")
    commits = gtid_count(cur.fetchone()[0])
    cur.execute(
        "SELECT COALESCE(SUM(COUNT_MISC), 0) FROM performance_schema.file_summary_by_event_name "
        "WHERE EVENT_NAME = 'wait/io/file/sql/binlog'"
    )
    return {"Binlog_commits": commits, "Binlog_group_commits": int(cur.fetchone()[0])}


def gtid_count(gtid_set: str) -> int:
    """How many transactions a MySQL GTID set holds: "uuid:1-5:7,uuid2:tag:1-3" -> 9."""
    n = 0
    for part in gtid_set.replace("\n", "").split(","):
        for interval in part.split(":")[1:]:
            if interval[:1].isdigit():  # a tag (MySQL 8.3+) starts with a letter or _
                low, _, high = interval.partition("-")
                n += int(high or low) - int(low) + 1
    return n


def snapshot(conn, primary) -> dict:
    with conn.cursor() as cur:
        cur.execute("SELECT COUNT(*) FROM job_queue WHERE status = 'done'")
        done = cur.fetchone()[0]
        status = binlog_counters(cur)
    with open(f"/proc/{primary.proc.pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    with open("/proc/stat") as f:
        cpu = [int(x) for x in f.readline().split()[1:]]
    idle = cpu[3] + cpu[4]
    return {
        "t": time.monotonic(),
        "done": done,
        **status,
        "cpu": (int(fields[11]) + int(fields[12])) / CLOCK_TICKS,
        "machine_busy": (sum(cpu) - idle) / CLOCK_TICKS,
    }


# --- the report ----------------------------------------------------------------------------------


def by_hosts(results: list[dict]) -> dict[int, list[dict]]:
    out: dict[int, list[dict]] = {}
    for r in results:
        if r.get("kind", "hosts") == "hosts":
            out.setdefault(r["hosts"], []).append(r)
    return dict(sorted(out.items()))


def enqueue_row(results: list[dict]) -> dict | None:
    return next((r for r in results if r.get("kind") == "enqueue"), None)


def _mean(rows: list[dict], key: str) -> float:
    return sum(r[key] for r in rows) / len(rows)


def steps_table(results: list[dict]) -> str:
    lines = [
        "| hosts × threads | jobs/s (each round) | primary commits/s | group commits (fsyncs)/s | primary CPU (cores) "
        f"| machine CPU (cores of {os.cpu_count()}) | commits per job | primary CPU per job |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for hosts, rows in by_hosts(results).items():
        lines.append(
            f"| {hosts} × {rows[0]['threads_per_host']} | {_mean(rows, 'jobs_per_second'):,.0f} "
            f"({', '.join(format(r['jobs_per_second'], ',.0f') for r in rows)}) "
            f"| {_mean(rows, 'commits_per_second'):,.0f} | {_mean(rows, 'group_commits_per_second'):,.0f} "
            f"| {_mean(rows, 'primary_cpu_cores'):.2f} | {_mean(rows, 'machine_cpu_cores'):.2f} "
            f"| {_mean(rows, 'commits_per_job'):.3f} | {_mean(rows, 'primary_cpu_ms_per_job'):.3f} ms |"
        )
    enq = enqueue_row(results)
    if enq:
        lines.append("")
        lines.append(
            f"Enqueueing one job at a time from one client (one transaction each, as an API request or "
            f"`jobqueue enqueue` does): {enq['jobs_per_second']:,.0f} jobs/s, {enq['commits_per_job']:.2f} "
            f"transactions and {enq['primary_cpu_ms_per_job']:.3f} ms of primary CPU per job."
        )
    return "\n".join(lines)


def plot(results: list[dict], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = by_hosts(results)
    hosts = list(groups)
    fig, left = plt.subplots(figsize=(7, 4.2), dpi=110)
    jobs = [_mean(groups[h], "jobs_per_second") for h in hosts]
    commits = [_mean(groups[h], "commits_per_second") for h in hosts]
    left.bar([h - 0.17 for h in hosts], jobs, width=0.34, label="jobs/s", color="#3a6ea5")
    left.bar([h + 0.17 for h in hosts], commits, width=0.34, label="primary commits/s", color="#9fb8d8")
    for h in hosts:
        for r in groups[h]:
            left.plot(h - 0.17, r["jobs_per_second"], "k.", markersize=4)
    left.set_xlabel(f"application hosts ({groups[hosts[0]][0]['threads_per_host']} worker threads each)")
    left.set_ylabel("per second")
    left.set_xticks(hosts)
    right = left.twinx()
    right.plot(
        hosts,
        [_mean(groups[h], "primary_cpu_cores") for h in hosts],
        "o-",
        color="#c0392b",
        label="primary CPU (cores)",
    )
    right.plot(
        hosts,
        [_mean(groups[h], "machine_cpu_cores") for h in hosts],
        "s--",
        color="#7f8c8d",
        label=f"machine CPU (cores of {os.cpu_count()})",
    )
    right.set_ylabel("CPU cores")
    right.set_ylim(0, max(os.cpu_count() or 2, 1) * 1.1)
    handles = left.get_legend_handles_labels()[0] + right.get_legend_handles_labels()[0]
    labels = left.get_legend_handles_labels()[1] + right.get_legend_handles_labels()[1]
    left.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=4, fontsize=8, frameon=False)
    left.set_title("No-op jobs against application hosts, one MariaDB primary (all on one machine)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


HEY_JOBS_PER_DAY = 18_000_000
HEY_PEAK_PER_SECOND = 500  # "a few hundred claims a second"


def arithmetic(results: list[dict]) -> str:
    groups = by_hosts(results)
    hosts = list(groups)
    rows = [r for rs in groups.values() for r in rs]
    cores = os.cpu_count() or 2
    rate = {h: _mean(groups[h], "jobs_per_second") for h in hosts}
    machine = {h: _mean(groups[h], "machine_cpu_cores") for h in hosts}
    primary = {h: _mean(groups[h], "primary_cpu_cores") for h in hosts}
    run_ms = _mean(rows, "primary_cpu_ms_per_job")
    run_commits = _mean(rows, "commits_per_job")
    enq = enqueue_row(results) or {"primary_cpu_ms_per_job": 0.0, "commits_per_job": 1.0, "jobs_per_second": 0.0}
    job_ms = run_ms + enq["primary_cpu_ms_per_job"]
    job_commits = run_commits + enq["commits_per_job"]
    first, last = hosts[0], hosts[-1]
    scaling = ", ".join(f"{h} hosts ×{rate[h] / rate[first]:.2f}" for h in hosts[1:])
    if min(machine.values()) > 0.95 * cores:
        limit = (
            f"the machine: its {cores} cores were fully busy in every step (they are the application hosts' and "
            "the database's at once, and this machine is shared with other test runs), so more hosts won "
            "more of the CPU rather than finding idle capacity, and the rates measure that share, not the primary"
        )
    elif machine[last] > 0.8 * cores:
        limit = (
            "the machine: its cores are the application hosts' and the database's at once, and with "
            f"{last} hosts they were busy {machine[last]:.2f} of {cores}"
        )
    else:
        limit = "not reached: the machine still had idle CPU"
    fsync_ratio = _mean(rows, "group_commits_per_second") / max(1e-9, _mean(rows, "commits_per_second"))
    fsyncs = (
        f"group commit had little to group at these rates: {fsync_ratio:.2f} fsyncs per transaction here; "
        "a busier primary shares one fsync among several commits"
        if fsync_ratio > 0.9
        else f"group commit helps: {fsync_ratio:.2f} fsyncs per transaction here"
    )
    hey_avg = HEY_JOBS_PER_DAY / 86_400
    return f"""### Where the one primary becomes the limit, and the arithmetic for bigger machines

From {first} to more hosts with {groups[first][0]["threads_per_host"]} threads each, throughput went
{scaling}; the machine's CPU went from {machine[first]:.2f} to {machine[last]:.2f} of its {cores} cores, the
primary's from {primary[first]:.2f} to {primary[last]:.2f}. The limit here is {limit}. The primary itself
was never the bottleneck on this machine: it used at most {max(primary.values()):.2f} cores. What carries
over to bigger machines is the cost of a job on the primary, which depends on the queue, not on the
hosts or on this machine's load:

- running a job (claim, complete; no-op handler, measured in the steps above):
  **{run_ms:.3f} ms of primary CPU and {run_commits:.3f} transactions per job**, since claims and
  completions are batched and one transaction carries several jobs under load;
- enqueueing it one at a time (one transaction per API request or `jobqueue enqueue`):
  **{enq["primary_cpu_ms_per_job"]:.3f} ms and {enq["commits_per_job"]:.2f} transactions per job**
  (`enqueue_many` batches them instead);
- together about **{job_ms:.3f} ms of primary CPU and {job_commits:.2f} commits per job**, so one
  primary core carries about {1000 / job_ms:,.0f} jobs/s end to end, and the fsyncs behind
  {job_commits:.2f} commits a job (fewer with group commit) are the other budget to watch.

Solid Queue at HEY runs about {HEY_JOBS_PER_DAY / 1e6:.0f} million jobs a day on one MySQL:
{hey_avg:,.0f} jobs/s on average, a few hundred claims a second at peak. At our cost, {hey_avg:,.0f}
jobs/s use about {hey_avg * job_ms / 1000:.2f} of a primary core and {hey_avg * job_commits:,.0f}
commits/s; a peak of {HEY_PEAK_PER_SECOND} jobs/s about {HEY_PEAK_PER_SECOND * job_ms / 1000:.2f} cores and
{HEY_PEAK_PER_SECOND * job_commits:,.0f} commits/s, which a dedicated database server (8-16 cores, an
NVMe log device good for tens of thousands of fsyncs a second) carries with most of its capacity
to spare. Extrapolated on CPU alone, an 8-core primary would saturate near
{8 * 1000 / job_ms:,.0f} jobs/s; long before that, watch the fsync rate ({fsyncs}) and lock
contention on the head of `ix_ready_pick`, and give workers
more threads rather than more processes, so that their claims and completion batches grow
(docs/benchmarks.md). The application hosts scale out freely: they hold no state, and SKIP
LOCKED keeps their claims apart.
"""
