"""The scale-out and failover drill: three application hosts and a replicated database, each host a
network namespace, jobs enqueued from all of them while processes die and a host is cut off, then
the primary is killed and the replica promoted. Nothing acknowledged may be lost or run to two
results, no claim may run on a read-only server, and every process must find the new primary by
itself.

    python -m drill.run                  # 20,000 jobs and the throughput steps; docs/scale-out.md
    python -m drill.run --quick          # a few minutes (the test suite runs this)
    python -m drill.run --skip-throughput --jobs 5000 --seed 7 --out /tmp/drill.md

What runs (root: `ip netns`, veth pairs and a bridge, all removed at the end):

- hosts db1 and db2: a throwaway server each (--server: the machine's MariaDB, MySQL 9.x or
  MariaDB 11.8, testkit/throwaway.py), db1 the GTID primary, db2 its semi-synchronous
  replica (--read-only), both with general logs; the application's account has no SUPER, so
  read_only binds it;
- hosts app1..app3: gunicorn (2 web processes, 2 embedded workers each, the reaper) and a
  standalone `jobqueue worker --concurrency 4`, all with JOBQUEUE_DATABASE_URL="db1 db2";
- enqueuers in this process: most jobs through `POST /api/jobs` on the hosts in turn (another host
  when one does not answer), some through `jobqueue enqueue` run on the hosts, at a steady pace
  over the whole window, retrying with the same task_key on 5xx, connection errors and exit 1/75;
  the jobs are soak/tasks.py's (noop, sleep, flaky, doomed), so soak/checks.py judges them;
- faults on a seeded schedule: SIGKILL a standalone worker (and start another), SIGKILL a gunicorn
  worker, take a host's link down for longer than the lease, replay known task_keys through both
  doors; then the failover: SIGKILL db1, promote db2, restart db1 read-only as db2's replica; one
  more SIGKILL after it;
- a monitor reading every row from whichever server is the primary.

Then the queue drains, every process gets SIGTERM (exit 0 expected), and the verdict is read from
the servers: soak/checks.py over the final tables and the execution log, drill/readonly.py over
the general logs and binlogs, the failover timings from the rows' started_at. One line (DRILL
PASS / DRILL FAIL), a table, the report in --out (docs/scale-out.md for a full run, with the
throughput steps of drill/throughput.py); exit 0 on pass, 1 on fail.
"""

from __future__ import annotations

import argparse
import os
import secrets
import shutil
import signal
import sys
import threading
import time
import traceback
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

import pymysql

from drill import readonly
from drill.enqueue import Enqueuers
from drill.failover import Failover, utc
from drill.plan import DB_NAME, FAULT_KINDS, LEASE_SECONDS, Plan, fault_schedule, job_specs
from drill.report import duplicate_runs
from drill.topology import APP_USER, REPO, AppHost, Topology, base_env, semi_sync_counts
from soak.checks import Observed, Row, check, read_executions
from testkit.faults import FaultRun, NotNow, Outcome, Proc, close_quietly, count_events, rerun_command, seed_and_workdir


class Drill(Enqueuers, Failover, FaultRun):
    FAULT_KINDS = FAULT_KINDS

    def __init__(self, plan: Plan, seed: int, workdir: Path, say=print):
        super().__init__(plan, seed, workdir, say)
        self.topo: Topology | None = None
        self.hosts: list[AppHost] = []
        self.ack_times: list[tuple[float, float]] = []  # (sent, acknowledged), time.time()
        self.down: set[str] = set()
        self.failover: dict = {}

    # --- set-up ----------------------------------------------------------------------------------

    def host_env(self) -> dict[str, str]:
        from werkzeug.security import generate_password_hash

        return base_env(
            JOBQUEUE_DATABASE_URL=self.topo.candidate_urls(DB_NAME),
            JOBQUEUE_TASKS="soak.tasks",
            JOBQUEUE_API_TOKENS=f"drill:admin:{self.token}",
            JOBQUEUE_SECRET_KEY=secrets.token_hex(32),
            JOBQUEUE_USERS=f"drill:admin:{generate_password_hash(secrets.token_urlsafe(16))}",
            JOBQUEUE_SECURE_COOKIES="0",
            JOBQUEUE_LEASE_SECONDS=str(LEASE_SECONDS),
            JOBQUEUE_GRACE_SECONDS="2",
            SOAK_EXEC_LOG=str(self.exec_log),
        )

    def worker_args(self) -> list[str]:
        return [
            "--concurrency",
            str(self.plan.concurrency),
            "--lease-seconds",
            str(LEASE_SECONDS),
            "--grace-seconds",
            str(self.plan.grace_seconds),
        ]

    def start_servers(self) -> None:
        started = time.monotonic()
        self.topo = Topology(self.workdir / "servers", self.plan.hosts, flavour=self.plan.server).start()
        self.setup_seconds = time.monotonic() - started

    def start_hosts(self) -> None:
        started = time.monotonic()
        self.topo.create_database(DB_NAME)
        env = self.host_env()
        self.hosts = [self.topo.app_host(name, env, self.logs) for name in self.topo.app_names]
        for host in self.hosts:
            host.start_web(self.plan.web_workers, self.plan.embedded_workers)
            host.start_worker(*self.worker_args())
        for host in self.hosts:
            host.wait_web_ready(self.plan.web_workers)
        self.setup_seconds += time.monotonic() - started
        # The cluster's own first statements ran before the replica connected (asynchronously):
        # count only what the drill's processes committed.
        self.semi_sync_at_start = semi_sync_counts(self.topo.db1)
        self.say(f"drill: {len(self.hosts)} hosts up in {self.setup_seconds:.1f} s ({self.topo.net})")

    # --- reading the primary ---------------------------------------------------------------------

    def connect_primary(self) -> pymysql.Connection:
        primary = self.topo.cluster.primary
        conn = pymysql.connect(
            host=primary.host,
            port=primary.port,
            user="root",
            password="",
            database=DB_NAME,
            autocommit=True,
            connect_timeout=3,
            read_timeout=30,
            write_timeout=30,
            ssl_disabled=True,
        )
        with conn.cursor() as cur:
            cur.execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
        return conn

    def monitor(self) -> None:
        """About once a second: (id, attempts, status) of every row on the current primary.
        Attempts never go down and a finished job never changes again, failover included: what
        the old primary committed, the new one has (semi-sync)."""
        conn, conn_to = None, None
        while not self.monitor_stop.is_set():
            started = time.monotonic()
            try:
                if conn is None or conn_to is not self.topo.cluster.primary:
                    if conn is not None:
                        conn.close()
                    conn_to = self.topo.cluster.primary
                    conn = self.connect_primary()
                with conn.cursor() as cur:
                    cur.execute("SELECT @@global.read_only")
                    if cur.fetchone()[0]:
                        raise pymysql.err.OperationalError(0, "not the primary (yet)")
                    cur.execute("SELECT id, attempts, status FROM job_queue")
                    rows = cur.fetchall()
            except pymysql.MySQLError:
                close_quietly(conn)
                conn = None
                self.monitor_stop.wait(0.5)
                continue
            counts: Counter = Counter()
            for job_id, attempts, status in rows:
                counts[status] += 1
                self.watch(job_id, attempts, status)
            self.monitor_samples += 1
            self.status_counts = counts
            self.monitor_stop.wait(max(0.1, 1.0 - (time.monotonic() - started)))
        if conn is not None:
            conn.close()

    # --- faults ----------------------------------------------------------------------------------

    def live_workers(self) -> list[tuple[AppHost, Proc]]:
        return [(h, w) for h in self.hosts if h.name not in self.down for w in h.workers if w.alive()]

    def check_unexpected_exits(self) -> None:
        for host in self.hosts:
            for w in list(host.workers):
                if not w.alive() and w.fate == "running":
                    w.fate = "exited"
                    self.unexpected_exits.append(f"worker {w.name} (pid {w.pid}) exited with {w.proc.returncode}")
                    host.workers.remove(w)
                    host.start_worker(*self.worker_args())
            if host.web is not None and not host.web.alive() and host.web.fate == "running":
                host.web.fate = "exited"
                self.unexpected_exits.append(f"gunicorn on {host.name} exited with {host.web.proc.returncode}")
            host.web_pids()  # remember every web process's pid, for the lease owners

    def fault_sigkill_worker(self, later) -> None:
        choices = self.live_workers()
        if not choices:
            raise NotNow("no live worker to kill")
        host, victim = self.rng.choice(choices)
        victim.signal(signal.SIGKILL)
        victim.proc.wait(10)
        victim.fate = "killed"
        self.killed_pids.add(victim.pid)
        host.workers.remove(victim)
        new = host.start_worker(*self.worker_args())
        self.note(f"SIGKILL worker {victim.name} (pid {victim.pid}) on {host.name}; started {new.name} (pid {new.pid})")

    def fault_sigkill_web_worker(self, later) -> None:
        choices = [(h, pid) for h in self.hosts if h.name not in self.down for pid in h.web_pids()]
        if not choices:
            raise NotNow("no gunicorn worker process found")
        host, pid = self.rng.choice(choices)
        os.kill(pid, signal.SIGKILL)
        self.killed_pids.add(pid)
        self.note(f"SIGKILL gunicorn worker pid {pid} on {host.name} (its master starts another)")

    def fault_link_down(self, later) -> None:
        """Pull a host's cable for longer than the lease: its processes' statements hang, their
        leases run out (their local deadlines tell their handlers), other hosts' reapers take the
        jobs back, and their late writes must be refused by the fence."""
        choices = [h for h in self.hosts if h.name not in self.down]
        if not choices:
            raise NotNow("every host is down")
        host = self.rng.choice(choices)
        pids = host.pids()
        self.partitioned_pids |= pids
        self.down.add(host.name)
        self.topo.net.link_down(host.name)
        self.note(
            f"link down: {host.name} cut off for {self.plan.link_down_seconds:g} s (lease {LEASE_SECONDS} s), "
            f"pids {sorted(pids)}"
        )

        def back():
            self.topo.net.link_up(host.name)
            self.down.discard(host.name)
            self.note(f"link up: {host.name}")

        later(self.plan.link_down_seconds, back)

    def progress_suffix(self) -> str:
        return f"  down {','.join(sorted(self.down))}" if self.down else ""

    # --- drain and stop --------------------------------------------------------------------------

    def drain(self, enqueuers_done: threading.Event) -> bool:
        """Until every acknowledged job is finished; first, until the enqueuers are done (stopping
        the workers under a late enqueue would leave its job ready)."""
        deadline = time.monotonic() + self.plan.drain_timeout
        while not enqueuers_done.wait(5):
            self.progress()
            if time.monotonic() > deadline:
                return False
        return self.wait_drained(self.connect_primary, enqueuers_done)

    def stop_all(self) -> dict[str, int | None]:
        codes: dict[str, int | None] = {}
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not all(w.started() for h in self.hosts for w in h.workers if w.alive()):
            time.sleep(0.2)  # a replacement still importing has no SIGTERM handler yet
        for h in self.hosts:
            for w in h.workers:
                w.sigterm()
            if h.web is not None:
                h.web.sigterm()
        for h in self.hosts:
            for w in h.workers:
                codes[f"worker {w.name}"] = w.terminate(40)
            for w in h.all_workers:
                w.close_log()
            if h.web is not None:
                codes[f"gunicorn {h.name}"] = h.web.terminate(60)
        return codes

    def kill_everything(self) -> None:
        for h in self.hosts:
            for w in h.all_workers:
                if w.alive():
                    w.proc.kill()
            if h.web is not None and h.web.alive():
                h.web.proc.kill()

    # --- reading the result ----------------------------------------------------------------------

    def observe(self) -> Observed:
        conn = self.connect_primary()
        try:
            with conn.cursor() as cur:
                cur.execute("SELECT id, task_key, status, attempts, max_attempts, last_error FROM job_queue")
                rows = [Row(*r) for r in cur.fetchall()]
                cur.execute("SELECT task_key, job_id, attempt FROM job_result")
                results = [tuple(r) for r in cur.fetchall()]
                cur.execute("SELECT job_id, attempt, outcome, error, started_at, finished_at FROM job_attempt")
                attempt_rows = cur.fetchall()
        finally:
            conn.close()
        executions = read_executions(self.exec_log)
        # In flight at the failover: an attempt the reaper took back (its lease ran out) that
        # started before the primary died and ended after it.
        explained = {}
        if self.failover:
            # No claim runs between the old primary's death and the new one's read_only OFF: an
            # attempt that started before that and was reaped after the death was in flight.
            killed = utc(self.failover["killed_at"])
            writable = utc(self.failover["writable_at"] or self.failover["promoted_at"])
            key_of = {r.id: r.task_key for r in rows}
            for job_id, attempt, outcome, _, started, finished in attempt_rows:
                if outcome == "lease_expired" and started is not None and started < writable and killed <= finished:
                    explained[(key_of.get(job_id), attempt)] = (
                        "in flight at the failover: its lease ran out before its worker reached the new primary"
                    )
        return Observed(
            specs=self.specs,
            acked=dict(self.acked),
            rows=rows,
            results=results,
            attempt_rows=[(r[0], r[1], r[2], r[3] or "") for r in attempt_rows],
            executions=executions,
            attempts_backwards=self.attempts_backwards,
            terminal_regressions=self.terminal_regressions,
            killed_pids=self.killed_pids,
            partitioned_pids=self.partitioned_pids,
            explained=explained,
        )


# --- the whole run ---------------------------------------------------------------------------------


def run(plan: Plan, seed: int, workdir: Path, say=print, throughput_steps=None) -> Outcome:
    drill = Drill(plan, seed, workdir, say=say)
    load_before = os.getloadavg()[0]
    jobs = job_specs(plan, drill.rng)
    schedule = fault_schedule(plan, drill.rng)
    drill.announce("drill", schedule, plan.window_seconds)
    monitor = threading.Thread(target=drill.monitor, name="monitor", daemon=True)
    codes: dict[str, int | None] = {}
    drained = False
    throughput: list[dict] = []
    read_only_windows: list[readonly.ReadOnlyWindow] = []
    binlog = None
    failover: dict = {}
    try:
        drill.start_servers()
        if throughput_steps:
            from drill import throughput as tp

            throughput = tp.measure(drill.topo, throughput_steps, workdir, say)
        drill.start_hosts()
        drill.t0 = time.monotonic()
        monitor.start()
        enqueuers = drill.run_enqueuers(jobs)
        enqueuers_done = threading.Event()

        def wait_enqueuers():
            for t in enqueuers:
                t.join()
            drill.enqueue_seconds = time.monotonic() - drill.t0
            enqueuers_done.set()

        threading.Thread(target=wait_enqueuers, name="enqueue-waiter", daemon=True).start()
        drill.run_faults(schedule, start=drill.t0, with_traceback=True)
        fault_end = time.monotonic()
        for t in drill.action_threads:
            t.join(240)
        say(f"faults over after {fault_end - drill.t0:.1f} s; draining")
        drained = drill.drain(enqueuers_done)
        drain_end = time.monotonic()
        codes = drill.stop_all()
        drill.monitor_stop.set()
        monitor.join(10)
        drill.topo.cluster.wait_caught_up(timeout=60)
        obs = drill.observe()
        # A mistake in reading the figures must not cost the run's verdict: it is reported.
        try:
            failover = drill.failover_figures()
            if drill.failover:
                read_only_windows = [
                    readonly.replica_before_promotion(drill.topo.db2, APP_USER),
                    readonly.old_primary_after_demotion(
                        drill.topo.db1,
                        APP_USER,
                        drill.failover["general_log_at_kill"],
                        workdir / "db1-general-after-demotion.log",
                    ),
                ]
                binlog = readonly.binlog_verdict(drill.topo.db1, drill.topo.db2)
        except Exception:
            drill.fault_errors.append(f"reading the failover figures crashed:\n{traceback.format_exc()}")
    finally:
        drill.monitor_stop.set()
        drill.kill_everything()
        if drill.topo is not None:
            drill.topo.cleanup()
            for name in ("db1", "db2"):  # the data (hundreds of MB); the logs stay
                shutil.rmtree(workdir / "servers" / name / "data", ignore_errors=True)

    findings = check(obs)
    duplicates = duplicate_runs(obs)
    wall = drain_end - drill.t0
    finished = sum(1 for r in obs.rows if r.status in ("done", "failed"))
    numbers = {
        "seed": seed,
        "jobs": plan.jobs,
        "hosts": plan.hosts,
        "server": plan.server,
        **drill.common_numbers(findings, load_before),
        "failover": failover,
        "read_only": [vars(w) for w in read_only_windows],
        "binlog": vars(binlog) if binlog else None,
        "setup_seconds": round(getattr(drill, "setup_seconds", 0.0), 1),
        "duration_seconds": round(wall, 1),
        "enqueue_seconds": round(getattr(drill, "enqueue_seconds", float("nan")), 1),
        "throughput_overall": round(finished / max(1e-9, wall), 1),
        "exit_codes": codes,
        "log_events": dict(log_counts(drill)),
        "duplicate_runs": duplicates[:40],
        "throughput": throughput,
        "finished_at": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
    }
    problems, bad_codes, missing = drill.common_problems(findings, drained, codes, schedule)
    for w in read_only_windows:
        if w.claim_updates or w.writes:
            problems[f"writes_on_read_only_{w.server.split()[0]}"] = w.claim_updates + w.writes
    if binlog is not None and not binlog.clean:
        problems["binlog_writes_while_read_only"] = binlog.own_before_promotion + binlog.extra_on_old_primary
    if failover:
        if failover["first_claim_seconds"] is None:
            problems["no_claim_on_new_primary"] = 1
        if failover["processes_never_claimed_on_new_primary"]:
            problems["processes_not_on_new_primary"] = len(failover["processes_never_claimed_on_new_primary"])
    numbers["problems"] = problems
    numbers["details"] = {
        "enqueue_gave_up": drill.enqueue_gave_up[:10],
        "enqueue_rejected": drill.enqueue_rejected[:10],
        "replay_mismatches": drill.replay_mismatches[:10],
        "unexpected_exits": drill.unexpected_exits,
        "nonzero_exit_codes": bad_codes,
        "faults_not_injected": missing,
    }
    from drill.report import table

    first_claim = failover.get("first_claim_seconds") if failover else None
    return drill.conclude(
        "DRILL",
        f"{plan.jobs} jobs on {plan.hosts} hosts, {sum(numbers['faults'].values())} faults "
        f"and a failover, {numbers['lost']} lost, {numbers['duplicate_results']} duplicate "
        f"results, {numbers['duplicate_executions']} duplicate executions, first claim on the "
        f"new primary {first_claim} s after the old one died",
        problems,
        numbers,
        table,
    )


def log_counts(drill: Drill) -> Counter:
    paths = [w.log_path for h in drill.hosts for w in h.all_workers] + [h.web.log_path for h in drill.hosts if h.web]
    return count_events(
        paths,
        (
            "lease_lost",
            "reclaimed",
            "sql_error",
            "db_retry",
            "duplicate_result",
            "finish_abandoned",
            "not_primary",
            "primary_found",
            "claiming_resumed",
            "write_refused",
            "claim_mismatch",
        ),
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m drill.run", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--quick", action="store_true", help="a few minutes: 1,500 jobs, 60 s window, no throughput steps"
    )
    parser.add_argument("--jobs", type=int, default=None)
    parser.add_argument("--seed", type=int, default=None, help="job mix and fault schedule (default: random)")
    parser.add_argument("--window-seconds", type=float, default=None)
    parser.add_argument("--skip-throughput", action="store_true", help="no throughput steps (1, 2, 3 hosts)")
    parser.add_argument("--throughput-jobs", type=int, default=None, help="jobs per throughput step")
    parser.add_argument(
        "--server",
        choices=("mariadb", "mysql", "mariadb11"),
        default="mariadb",
        help="the database hosts' server: the machine's MariaDB, or the MySQL or MariaDB 11.8 root",
    )
    parser.add_argument(
        "--out",
        default=None,
        help="markdown report (default docs/scale-out.md, or docs/scale-out-SERVER.md with --server; with --quick, "
        "none)",
    )
    parser.add_argument("--workdir", default=None, help="logs and results.json (default test-artifacts/drill-<time>)")
    args = parser.parse_args(argv)

    from testkit.netns import netns_unavailable_reason

    reason = netns_unavailable_reason()
    if reason:
        print(f"drill: cannot run: {reason}", file=sys.stderr)
        return 2
    plan = Plan.quick() if args.quick else Plan()
    if args.jobs is not None:
        plan.jobs = args.jobs
        plan.cli_jobs = min(plan.cli_jobs, max(1, args.jobs // 50))
    if args.window_seconds is not None:
        plan.window_seconds = args.window_seconds
    plan.server = args.server
    seed, workdir = seed_and_workdir(args.seed, args.workdir, "drill")
    # Each server's last full result has its own page (as its plot has): one must not overwrite another's.
    page = "scale-out.md" if args.server == "mariadb" else f"scale-out-{args.server}.md"
    out = args.out if args.out is not None else (None if args.quick else str(REPO / "docs" / page))
    steps = None
    if not (args.quick or args.skip_throughput):
        from drill.throughput import Steps

        steps = Steps(jobs=args.throughput_jobs or Steps.jobs)

    outcome = run(plan, seed, workdir, say=lambda s: print(s, flush=True), throughput_steps=steps)
    print(outcome.verdict)
    print(outcome.table)
    if out:
        from drill.report import markdown

        given = list(argv if argv is not None else sys.argv[1:])
        if "--workdir" in given:  # where the logs went: not part of what to run again
            i = given.index("--workdir")
            del given[i : i + 2]
        command = rerun_command("python -m drill.run", given, seed)
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(markdown(outcome, command, plan, Path(out).parent))
        print(f"report written to {out}")
    return 0 if outcome.passed else 1


if __name__ == "__main__":
    sys.exit(main())
