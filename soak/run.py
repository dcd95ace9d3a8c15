"""Fault-injection soak: enqueue thousands of jobs while killing, stopping and starving the
processes that run them, then check that nothing was lost or recorded twice.

    python -m soak.run                    # the full soak: 10,000 jobs, result in docs/soak.md
    python -m soak.run --quick            # about a minute (the test suite runs this)
    python -m soak.run --jobs 20000 --seed 7 --out /tmp/soak.md

What runs, all against a private mariadbd this script starts (so it may kill its connections and
restart it; the shared server is never touched):

- 3 `jobqueue worker --concurrency 4 --lease-seconds 3` processes, and the dashboard under
  gunicorn (2 web processes with 2 embedded workers each and the reaper);
- enqueuers: most jobs through `POST /api/jobs`, a few hundred through `jobqueue enqueue`, both
  retrying with the same task_key on 5xx, connection errors and exit code 1 (that is what
  idempotent enqueue is for); the jobs are `soak` tasks (soak/tasks.py): noop, sleep, flaky
  (fails 1-2 times, then succeeds), doomed (always fails; max_attempts 2);
- workflows among the jobs (soak/plan.py workflow_groups): chains and fan-ins of dependent jobs
  (`after`), and batches whose callbacks are `soak_callback` jobs, from one enqueuer thread of
  their own; checked afterwards: no dependent job claimed before its parents finished, each
  batch's callbacks enqueued exactly once as its outcome calls for;
- a monitor that reads (id, attempts, status) of every row twice a second and records any
  attempts that went backwards or a finished job that changed again;
- a seeded, bounded fault schedule: SIGKILL a worker (and start a replacement), SIGTERM one (a
  deploy; its grace, 8 s, outlasts its lease, 3 s), SIGSTOP a worker for twice its lease then
  SIGCONT it, cut the one worker that reaches the database through a proxy off for longer than
  its lease (a partition: its statements hang, nothing is refused), KILL CONNECTION random server
  connections, restart the server once, turn it read-only for a moment, force-requeue running
  jobs as an operator would, hold ready rows in a paused SELECT ... FOR UPDATE, SIGKILL a
  gunicorn worker (its master starts another), replay slices of known task_keys through both doors,
  pause the queue for a few seconds (`POST /api/queues/default/pause`, resumed by `jobqueue
  resume`), and cancel random jobs in every state (`POST /api/jobs/<id>/cancel` and `jobqueue cancel`);
- take back a prefetched job (fault_take_back_prefetched): a worker of its own (`--concurrency 1
  --prefetch 2`, a 12 s job and two short ones, its own database on the same server) holds a
  job in hand while another runs; the operator cancels, fails or force-requeues it; its handler
  must not start after the command answered;
- pause during stalled claims (fault_pause_stalled_claim): the queue's queue_state row held in a
  transaction stalls every claim of the queue inside its claim transaction, a worker is
  SIGSTOPped there, the pause is sent, the hold released, the worker continued: no claim may
  commit after the pause answered (the monitor's paused-claims count stays 0).
- two writable primaries: a twin server in one worker's candidate list made writable for a spell
  (soak/two_primaries.py): nothing may be claimed on the twin, nor by that worker while it sees both.

Then the faults stop, the queue drains, every process gets SIGTERM (exit 0 expected), and
soak/checks.py compares what was acknowledged with what the tables hold. One verdict line
(SOAK PASS / SOAK FAIL), a table, the markdown report in --out; exit 0 on pass, 1 on fail.
"""

from __future__ import annotations

import argparse
import os
import random
import re
import secrets
import shutil
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pymysql

from soak.checks import BATCH_COLUMNS, Observed, Row, read_executions
from soak.enqueue import Enqueuers
from soak.faults import ProcessFaults
from soak.operator import OperatorFaults
from soak.partition import PartitionProxy
from soak.plan import DB_NAME, FAULT_KINDS, LEASE_SECONDS, QUEUE, Plan, fault_schedule, job_specs, workflow_groups
from soak.report import judge, markdown
from soak.two_primaries import TwinServer
from testkit.faults import FaultRun, Outcome, Proc, close_quietly, count_events, rerun_command, seed_and_workdir
from testkit.procs import REPO, free_port
from testkit.throwaway import FLAVOURS, ThrowawayServer


class Soak(Enqueuers, ProcessFaults, OperatorFaults, FaultRun):
    FAULT_KINDS = FAULT_KINDS

    def __init__(self, plan: Plan, seed: int, workdir: Path, log=print):
        super().__init__(plan, seed, workdir, log)
        self.payloads: dict[str, tuple[dict, float]] = {}
        self.server = ThrowawayServer(workdir / "mariadb", flavour=plan.server)
        self.url = ""
        self.workers: list[Proc] = []
        self.all_workers: list[Proc] = []
        self.web: Proc | None = None
        self.web_port = 0
        self.worker_seq = 0
        self.enqueue_done = threading.Event()
        # What the faults did.
        self.stopped_pids: set[int] = set()
        self.terminated_pids: set[int] = set()
        self.forced: set[tuple[str, int]] = set()  # (task_key, attempt) an operator requeued while running
        self.proxy: PartitionProxy | None = None
        self.read_only_since: float | None = None
        self.read_only_grace_until = 0.0
        self.refused_while_read_only = 0
        self.held_touched: list[str] = []
        # Pauses and cancellations.
        self.pause_windows: list[list[float]] = []  # [claims forbidden from, until] (monotonic)
        self.paused_claims: list[dict] = []
        self.actions_gave_up: list[str] = []  # a resume or a cancel that never went through
        self.cancelled: set[str] = set()
        self.cancel_unknown: set[str] = set()
        self.cancel_answers: Counter = Counter()
        self.own_connection_ids: set[int] = set()
        self.restart_outage = 0.0
        self.twin: TwinServer | None = None
        self.twin_worker: Proc | None = None
        # Operators taking back prefetched jobs (fault_take_back_prefetched).
        self.take_back_url = ""
        self.take_back_busy = False
        self.take_back_rounds: list[str] = []
        self.take_back_done = 0  # rounds that got to take a job back
        self.take_back_late: list[str] = []  # a handler started after the action answered
        self.resumes_in_flight = 0  # resumes sent that have not answered yet
        # Workflows: each batch the soak opened, and whether its open / close went through.
        self.batches_opened: dict[str, bool] = {}
        self.batches_closed: dict[str, bool] = {}

    # --- set-up ----------------------------------------------------------------------------------
    # --- set-up ----------------------------------------------------------------------------------

    def start_database(self) -> None:
        self.server.start()
        self.url = self.server.create_database(DB_NAME)
        out = subprocess.run(
            [sys.executable, "-m", "jobqueue.cli", "--database-url", self.url, "init-db"],
            capture_output=True,
            text=True,
            env=self.base_env(),
            cwd=REPO,
            timeout=120,
        )
        if out.returncode != 0:
            raise RuntimeError(f"init-db failed: {out.stdout}{out.stderr}")

    def base_env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
        env["PYTHONUNBUFFERED"] = "1"
        env["JOBQUEUE_TASKS"] = "soak.tasks"
        env["SOAK_EXEC_LOG"] = str(self.exec_log)
        env.pop("JOBQUEUE_DATABASE_URL", None)
        return env

    def start_worker(self, proxied: bool = False) -> Proc:
        """A worker process; `proxied`, it reaches the database through the partition proxy."""
        self.worker_seq += 1
        name = f"w{self.worker_seq}" + ("p" if proxied else "")
        url = self.proxy.url(DB_NAME) if proxied else self.url
        # Every other worker names its queue (it reads the paused set), the rest take every queue
        # (their list of ready queues leaves paused ones out): pauses must hold for both.
        queues = ["--queues", QUEUE] if self.worker_seq % 2 == 0 else []
        p = Proc(
            name,
            [
                sys.executable,
                "-m",
                "jobqueue.cli",
                "--database-url",
                url,
                "worker",
                "--name",
                name,
                "--concurrency",
                str(self.plan.concurrency),
                "--lease-seconds",
                str(LEASE_SECONDS),
                "--grace-seconds",
                str(self.plan.grace_seconds),
                "--tasks",
                "soak.tasks",
                *queues,
            ],
            self.base_env(),
            self.logs / f"worker-{name}.log",
        )
        p.proxied = proxied
        self.workers.append(p)
        self.all_workers.append(p)
        return p

    def start_web(self) -> None:
        from werkzeug.security import generate_password_hash

        self.web_port = free_port()
        env = self.base_env()
        env.update(
            {
                "JOBQUEUE_DATABASE_URL": self.url,
                "JOBQUEUE_BIND": f"127.0.0.1:{self.web_port}",
                "JOBQUEUE_WEB_WORKERS": str(self.plan.web_workers),
                "JOBQUEUE_WEB_THREADS": "4",
                "JOBQUEUE_EMBEDDED_WORKERS": str(self.plan.embedded_workers),
                "JOBQUEUE_USERS": f"soak:admin:{generate_password_hash(secrets.token_urlsafe(16))}",
                "JOBQUEUE_SECRET_KEY": secrets.token_hex(32),
                "JOBQUEUE_API_TOKENS": f"soak:admin:{self.token}",
                "JOBQUEUE_LEASE_SECONDS": str(LEASE_SECONDS),
                "JOBQUEUE_GRACE_SECONDS": "1",
            }
        )
        self.web = Proc(
            "gunicorn",
            [sys.executable, "-m", "gunicorn", "-c", str(REPO / "jobqueue/web/gunicorn_conf.py")],
            env,
            self.logs / "gunicorn.log",
        )
        deadline = time.monotonic() + 60
        while True:
            try:
                status, _ = self._http("GET", "/healthz", None, timeout=2)
                if status == 200:
                    return
            except OSError:
                pass
            if not self.web.alive() or time.monotonic() > deadline:
                raise RuntimeError(f"gunicorn did not come up:\n{self.web.log()[-3000:]}")
            time.sleep(0.2)

    # --- the monitor -----------------------------------------------------------------------------

    def _connect(self, own: bool = True) -> pymysql.Connection:
        conn = pymysql.connect(
            host="127.0.0.1",
            port=self.server.port,
            user="root",
            password="",
            database=DB_NAME,
            autocommit=True,
            connect_timeout=5,
            read_timeout=30,
            write_timeout=30,
        )
        with conn.cursor() as cur:
            cur.execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
            cur.execute("SELECT CONNECTION_ID()")
            if own:
                with self.lock:
                    self.own_connection_ids.add(cur.fetchone()[0])
        return conn

    def monitor(self) -> None:
        """Every ~0.5 s: (id, attempts, status) of every row. Attempts must never go down, a
        finished job must stay so (nothing in the soak requeues; a failed job may be cancelled),
        and while the queue is paused no attempt may start."""
        conn = None
        previous_start: float | None = None
        while not self.monitor_stop.is_set():
            started = time.monotonic()
            try:
                if conn is None:
                    conn = self._connect()
                with conn.cursor() as cur:
                    # The lease's owner and its start (the database's clock) say who claimed a job
                    # and when, should it turn out to be a claim from a paused queue.
                    cur.execute("SELECT id, attempts, status, lease_owner, started_at FROM job_queue")
                    rows = cur.fetchall()
                read_at = time.monotonic()
            except pymysql.MySQLError:
                close_quietly(conn)
                conn = None
                previous_start = None  # the next sample has no comparable predecessor
                self.monitor_stop.wait(0.5)
                continue
            # Both samples inside a pause window (after its notice time): any attempt started
            # between them was a claim from the paused queue.
            with self.lock:
                in_pause = previous_start is not None and any(
                    start <= previous_start and read_at <= end for start, end in self.pause_windows
                )
            counts: Counter = Counter()
            for job_id, attempts, status, owner, started_at in rows:
                counts[status] += 1
                before = self.watch(job_id, attempts, status)
                if in_pause and attempts > (before[0] if before else 0):
                    self.paused_claims.append(
                        {
                            "id": job_id,
                            "attempt": attempts,
                            **({} if before else {"new": True}),
                            "owner": owner,
                            "started_at": str(started_at),
                            "pause": self._pause_stamp(conn),
                        }
                    )
            previous_start = started
            self.monitor_samples += 1
            self.status_counts = counts
            self.monitor_stop.wait(max(0.05, 0.5 - (time.monotonic() - started)))
        if conn is not None:
            conn.close()

    @staticmethod
    def _pause_stamp(conn) -> str:
        """When the soak's queue was last paused or resumed, by the database's clock."""
        try:
            with conn.cursor() as cur:
                cur.execute("SELECT paused, changed_at FROM queue_state WHERE queue = %s", (QUEUE,))
                row = cur.fetchone()
        except pymysql.MySQLError as exc:
            return f"unknown ({exc})"
        return f"paused={row[0]} at {row[1]}" if row else "no queue_state row"

    # --- faults ----------------------------------------------------------------------------------

    def live_workers(self, started: bool = False) -> list[Proc]:
        return [w for w in self.workers if w.alive() and not w.stopped and (w.started() or not started)]

    def read_only_lately(self) -> bool:
        """The server is read-only now, or was a moment ago (read_only_flip)."""
        return self.read_only_since is not None or time.monotonic() < self.read_only_grace_until

    def check_unexpected_exits(self) -> None:
        for w in list(self.workers):
            if not w.alive() and w.fate == "running":
                if w.proc.returncode == 3 and self.read_only_lately():
                    # Started while the server was read-only: refusing to start (exit 3, nothing
                    # claimed) is the contract; a supervisor starts it again, and so do we.
                    w.fate = "refused (server read-only)"
                    self.refused_while_read_only += 1
                    self.note(f"worker {w.name} refused to start on the read-only server (exit 3)")
                else:
                    w.fate = "exited"
                    self.unexpected_exits.append(f"worker {w.name} (pid {w.pid}) exited with {w.proc.returncode}")
                self.workers.remove(w)
                self.start_worker(proxied=getattr(w, "proxied", False))
        if self.web is not None and not self.web.alive() and self.web.fate == "running":
            self.web.fate = "exited"
            self.unexpected_exits.append(f"gunicorn exited with {self.web.proc.returncode}")

    # --- drain and stop --------------------------------------------------------------------------

    def drain(self) -> bool:
        # A pause still open (its resume failed) would stall the drain: resume, and say so.
        with self.lock:
            open_windows = [w for w in self.pause_windows if w[1] == float("inf")]
        if open_windows:
            self.actions_gave_up.append("a pause was still open at the drain")
            for w in open_windows:
                w[1] = time.monotonic()
            self._until_ok("resume before the drain", lambda: self._cli("resume", QUEUE).returncode == 0)
        return self.wait_drained(self._connect, self.enqueue_done)

    def stop_all(self) -> dict[str, int | None]:
        codes: dict[str, int | None] = {}
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not all(w.started() for w in self.workers if w.alive()):
            time.sleep(0.2)  # a replacement still importing has no SIGTERM handler yet
        for w in self.workers:
            w.sigterm()
        for w in self.workers:
            codes[f"worker {w.name}"] = w.terminate(30)
            w.fate = "stopped" if w.fate == "running" else w.fate
        for w in self.all_workers:
            w.close_log()
        if self.web is not None:
            codes["gunicorn"] = self.web.terminate(60)
        return codes

    # --- reading the result ----------------------------------------------------------------------

    def observe(self) -> Observed:
        conn = self._connect(own=False)
        try:
            with conn.cursor() as cur:
                cur.execute("SELECT id, task_key, status, attempts, max_attempts, last_error FROM job_queue")
                rows = [Row(*r) for r in cur.fetchall()]
                cur.execute("SELECT task_key, job_id, attempt FROM job_result")
                results = [tuple(r) for r in cur.fetchall()]
                cur.execute("SELECT job_id, attempt, outcome, error FROM job_attempt")
                attempt_rows = [(r[0], r[1], r[2], r[3] or "") for r in cur.fetchall()]
                # When each job was first claimed (an unsuccessful attempt's start is kept in
                # job_attempt, the last one's on the row) and when it finished: the database's clock.
                cur.execute(
                    "SELECT q.task_key, LEAST(COALESCE(MIN(a.started_at), q.started_at), "
                    "COALESCE(q.started_at, MIN(a.started_at))), q.finished_at FROM job_queue q "
                    "LEFT JOIN job_attempt a ON a.job_id = q.id GROUP BY q.id, q.task_key, q.started_at, q.finished_at"
                )
                times = {key: (first, finished) for key, first, finished in cur.fetchall()}
                cur.execute(
                    "SELECT batch_key, state, total, done, failed, cancelled, success_job_id, failure_job_id, "
                    "complete_job_id FROM job_batch"
                )
                batches = {r[0]: dict(zip(BATCH_COLUMNS, r[1:], strict=True)) for r in cur.fetchall()}
        finally:
            conn.close()
        return Observed(
            specs=self.specs,
            acked=dict(self.acked),
            rows=rows,
            results=results,
            attempt_rows=attempt_rows,
            executions=read_executions(self.exec_log),
            attempts_backwards=self.attempts_backwards,
            terminal_regressions=self.terminal_regressions,
            cancelled=set(self.cancelled),
            cancel_unknown=set(self.cancel_unknown),
            paused_claims=list(self.paused_claims),
            killed_pids=self.killed_pids,
            stopped_pids=self.stopped_pids,
            terminated_pids=self.terminated_pids,
            partitioned_pids=self.partitioned_pids,
            forced=self.forced,
            times=times,
            batches=batches,
            batches_opened={k for k, ok in self.batches_opened.items() if ok},
            batches_closed={k for k, ok in self.batches_closed.items() if ok},
        )

    def fenced_late_writes(self) -> int:
        """lease_lost lines in the logs of workers that were stopped or cut off past their lease:
        writes the fence refused after they woke up, and leases their keepers gave up on."""
        n = 0
        for w in self.all_workers:
            if w.pid in self.stopped_pids or w.pid in self.partitioned_pids:
                n += len(re.findall(r"event=lease_lost ", w.log()))
        return n

    def log_counts(self) -> Counter:
        paths = [w.log_path for w in self.all_workers] + ([self.web.log_path] if self.web else [])
        return count_events(
            paths,
            (
                "lease_lost",
                "reclaimed",
                "sql_error",
                "db_retry",
                "duplicate_result",
                "finish_abandoned",
                "handler_lease_lost",
                "released",
                "claim_mismatch",
            ),
        )


# --- the whole run ---------------------------------------------------------------------------------


def run(plan: Plan, seed: int, workdir: Path, say=print) -> Outcome:
    soak = Soak(plan, seed, workdir, log=say)
    load_before = os.getloadavg()[0]
    jobs = job_specs(plan, soak.rng)
    schedule = fault_schedule(plan, soak.rng)
    # A generator of their own: the seed's job mix, schedule and every fault's choices stay as
    # they were without workflows.
    groups = workflow_groups(plan, random.Random(f"workflows-{seed}"))
    soak.announce("soak", schedule, plan.fault_seconds)
    monitor = threading.Thread(target=soak.monitor, name="monitor", daemon=True)
    codes: dict[str, int | None] = {}
    drained = False
    times = {"load_before": load_before}
    try:
        soak.start_database()
        if plan.two_primaries:
            soak.twin = TwinServer(workdir, DB_NAME, flavour=plan.server)
            soak.twin.start(soak.base_env(), REPO, then=soak.start_twin_worker)
        soak.proxy = PartitionProxy(soak.server.port)
        for i in range(plan.workers):
            soak.start_worker(proxied=plan.partitions > 0 and i == 0)
        soak.start_web()
        soak.t0 = time.monotonic()
        monitor.start()
        enqueuers = soak.run_enqueuers(jobs, groups)

        def wait_enqueuers():
            for t in enqueuers:
                t.join()
            soak.enqueue_done.set()
            soak.enqueue_seconds = time.monotonic() - soak.t0

        waiter = threading.Thread(target=wait_enqueuers, name="enqueue-waiter", daemon=True)
        waiter.start()
        fault_start = time.monotonic()
        terminal_at_fault_start = sum(soak.status_counts.get(s, 0) for s in ("done", "failed"))
        soak.run_faults(schedule)
        fault_end = time.monotonic()
        terminal_at_fault_end = sum(soak.status_counts.get(s, 0) for s in ("done", "failed"))
        for t in soak.action_threads:
            t.join(120)
        say(f"faults over after {fault_end - fault_start:.1f} s; draining")
        waiter.join(plan.drain_timeout)
        drained = soak.drain()
        drain_end = time.monotonic()
        if soak.twin_worker is not None and soak.twin_worker.fate == "running" and soak.twin_worker not in soak.workers:
            soak.workers.append(soak.twin_worker)  # the fault never ran: stopped like the others
            # (after it ran, the twin worker is one of soak.workers, or was killed by a fault
            # and replaced: its exit code is that fault's, not a stop's)
        codes = soak.stop_all()
        soak.monitor_stop.set()
        monitor.join(10)
        obs = soak.observe()
        if soak.twin is not None and soak.twin.ready.is_set() and not soak.twin.error:
            primary = soak._connect(own=False)
            try:
                twin_check = soak.twin.check(primary, soak.twin_worker.log() if soak.twin_worker else "")
            finally:
                primary.close()
        else:
            twin_check = {"problems": {}, "numbers": {}}
    finally:
        soak.monitor_stop.set()
        for w in soak.all_workers:
            if w.alive():
                w.proc.kill()
        if soak.web is not None and soak.web.alive():
            soak.web.proc.kill()
        if soak.proxy is not None:
            soak.proxy.close()
        if soak.twin is not None:
            soak.twin.ready.wait(60)
            soak.twin.cleanup()
        soak.server.cleanup()
        shutil.rmtree(workdir / "mariadb" / "data", ignore_errors=True)
    times.update(
        fault_start=fault_start,
        fault_end=fault_end,
        terminal_at_fault_start=terminal_at_fault_start,
        terminal_at_fault_end=terminal_at_fault_end,
        drain_end=drain_end,
    )
    return judge(soak, schedule, obs, twin_check, drained, codes, times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m soak.run", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="about a minute: 1,200 jobs, 30 s of faults")
    parser.add_argument("--jobs", type=int, default=None)
    parser.add_argument("--seed", type=int, default=None, help="fault schedule and job mix (default: random)")
    parser.add_argument("--fault-seconds", type=float, default=None)
    parser.add_argument(
        "--db-crash",
        action="store_true",
        help="restart the database by SIGKILL (crash recovery) instead of a clean stop",
    )
    parser.add_argument(
        "--server",
        choices=sorted(FLAVOURS),
        default="mariadb",
        help="the throwaway server: the machine's MariaDB, or the MySQL or MariaDB 11.8 root",
    )
    parser.add_argument(
        "--out",
        default=None,
        help="markdown report (default docs/soak.md, docs/soak-mysql.md or docs/soak-mariadb11.md by --server; with "
        "--quick, none)",
    )
    parser.add_argument("--workdir", default=None, help="logs and results.json (default test-artifacts/soak-<time>)")
    args = parser.parse_args(argv)

    plan = Plan.quick() if args.quick else Plan()
    if args.jobs is not None:
        plan.jobs = args.jobs
        plan.cli_jobs = min(plan.cli_jobs, max(1, args.jobs // 10))
    if args.fault_seconds is not None:
        plan.fault_seconds = args.fault_seconds
    plan.crash_db = args.db_crash
    plan.server = args.server
    seed, workdir = seed_and_workdir(args.seed, args.workdir, "soak")
    # Each server's last full result has its own page: a run on one must not overwrite another's.
    page = "soak.md" if args.server == "mariadb" else f"soak-{args.server}.md"
    out = args.out if args.out is not None else (None if args.quick else str(REPO / "docs" / page))

    outcome = run(plan, seed, workdir, say=lambda s: print(s, flush=True))
    print(outcome.verdict)
    print(outcome.table)
    if out:
        command = rerun_command("python -m soak.run", list(argv if argv is not None else sys.argv[1:]), seed)
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(markdown(outcome, command, plan))
        print(f"report written to {out}")
    return 0 if outcome.passed else 1


if __name__ == "__main__":
    sys.exit(main())
