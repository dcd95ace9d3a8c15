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
import heapq
import http.client
import json
import os
import platform
import queue as queue_mod
import random
import re
import secrets
import shutil
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import pymysql

from soak.checks import Execution, Observed, Row, Spec, check
from soak.partition import PartitionProxy
from soak.two_primaries import NAME as TWIN_WORKER, Spell, TwinServer
from testkit.throwaway import FLAVOURS, ThrowawayServer, describe_flavour

REPO = Path(__file__).resolve().parents[1]

DB_NAME = "soak"
LEASE_SECONDS = 3
FAULT_KINDS = ("sigkill_worker", "sigterm_worker", "sigstop_worker", "kill_connection", "db_restart", "hold_rows",
               "sigkill_web_worker", "replay", "force_requeue", "read_only_flip", "partition_worker", "pause_queue",
               "cancel", "take_back_prefetched", "pause_stalled_claim", "two_primaries")
QUEUE = "default"
PAUSE_NOTICE_SECONDS = 2.0   # a pause takes effect in every process within this (docs/operations.md: about a second)


# --- the plan --------------------------------------------------------------------------------------

@dataclass
class Plan:
    jobs: int = 10_000
    cli_jobs: int = 250
    fault_seconds: float = 240.0
    workers: int = 3
    concurrency: int = 4
    web_workers: int = 2
    embedded_workers: int = 2
    api_threads: int = 4
    cli_threads: int = 2
    kill_every: tuple[float, float] = (3.0, 6.0)
    stops: int = 3
    stop_seconds: float = 2 * LEASE_SECONDS
    conn_kill_every: tuple[float, float] = (1.5, 4.0)
    conn_kills_each: tuple[int, int] = (1, 3)
    restart_at: float = 0.45                 # fraction of the fault window
    restart_down_seconds: float = 1.5
    crash_db: bool = False                   # SIGKILL the server instead of a clean stop
    server: str = "mariadb"                  # the throwaway server's flavour: mariadb, mysql, mariadb11
    holds: int = 3
    hold_rows: int = 5
    hold_seconds: float = 5.0
    web_kills: int = 2
    graceful_restarts: int = 3
    grace_seconds: float = 8.0               # longer than the lease: renewals must go on through it
    force_requeues: int = 6                  # an operator's forced requeue of a running job
    read_only_flips: int = 2                 # the primary turned read-only for a moment
    read_only_seconds: float = 2.0
    partitions: int = 2                      # one worker cut off from the database past its lease
    partition_seconds: float = 2 * LEASE_SECONDS + 1
    replays: int = 5
    pauses: int = 3
    pause_seconds: float = 6.0
    cancels: int = 5
    cancel_api_keys: int = 20
    cancel_cli_keys: int = 2
    take_backs: int = 3                      # an operator's action on a job prefetched, not started
    stalled_pauses: int = 2                  # a pause sent while claims stall in their transaction
    replay_api_keys: int = 40
    replay_cli_keys: int = 2
    drain_timeout: float = 600.0
    two_primaries: int = 1                   # a twin made writable in one worker's candidate list
    two_primaries_seconds: float = 12.0

    @classmethod
    def quick(cls) -> Plan:
        return cls(jobs=1200, cli_jobs=30, fault_seconds=30.0, kill_every=(3.0, 5.0), stops=1, pauses=2,
                   pause_seconds=4.0, cancels=2, cancel_api_keys=10, cancel_cli_keys=1,
                   conn_kill_every=(2.0, 4.0), holds=2, web_kills=1, graceful_restarts=1, replays=2, replay_api_keys=20,
                   replay_cli_keys=1, drain_timeout=60.0, force_requeues=2, read_only_flips=1, partitions=1,
                   take_backs=2, stalled_pauses=1)


def job_specs(plan: Plan, rng: random.Random) -> list[tuple[Spec, dict, float]]:
    """(spec, payload, delay) for each job, the CLI ones spread evenly among the API ones."""
    out = []
    cli_every = max(1, plan.jobs // max(1, plan.cli_jobs)) if plan.cli_jobs else 0
    for i in range(plan.jobs):
        kind = rng.choices(("noop", "sleep", "flaky", "doomed"), weights=(40, 30, 20, 10))[0]
        payload: dict = {"kind": kind}
        if kind == "sleep":
            # Mostly short; a few outlast the lease (3 s) but not the shutdown grace (8 s), so a
            # SIGTERM must keep renewing them to the end; a very few outlast the grace too, and
            # are released (their handlers told, and stopping).
            r = rng.random()
            payload["seconds"] = round(rng.uniform(8.5, 10.0) if r < 0.004 else rng.uniform(3.5, 6.0) if r < 0.05
                                       else rng.uniform(0.01, 0.4), 3)
        elif kind == "flaky":
            payload["fail_times"] = rng.randint(1, 2)
        max_attempts = 2 if kind == "doomed" else 4
        delay = round(rng.uniform(0.2, 2.0), 2) if rng.random() < 0.05 else 0.0
        via = "cli" if cli_every and i % cli_every == 0 and i // cli_every < plan.cli_jobs else "api"
        out.append((Spec(f"soak-{i:06d}-{kind}", kind, via, max_attempts), payload, delay))
    return out


def fault_schedule(plan: Plan, rng: random.Random) -> list[tuple[float, str]]:
    """(seconds into the fault window, fault kind), sorted: the same seed, the same schedule."""
    window = plan.fault_seconds
    events: list[tuple[float, str]] = []
    t = rng.uniform(*plan.kill_every) / 2
    while t < window:
        events.append((t, "sigkill_worker"))
        t += rng.uniform(*plan.kill_every)
    t = rng.uniform(*plan.conn_kill_every)
    while t < window:
        events.append((t, "kill_connection"))
        t += rng.uniform(*plan.conn_kill_every)
    events.append((window * plan.restart_at, "db_restart"))
    # Stops, holds and web kills land while the queue is busy, away from the restart and the end.
    for kind, n in (("sigstop_worker", plan.stops), ("hold_rows", plan.holds), ("sigkill_web_worker", plan.web_kills),
                    ("sigterm_worker", plan.graceful_restarts), ("replay", plan.replays),
                    ("force_requeue", plan.force_requeues), ("read_only_flip", plan.read_only_flips),
                    ("partition_worker", plan.partitions), ("pause_queue", plan.pauses), ("cancel", plan.cancels),
                    ("take_back_prefetched", plan.take_backs), ("pause_stalled_claim", plan.stalled_pauses)):
        for j in range(n):
            lo, hi = window * (0.05 + 0.8 * j / n), window * (0.05 + 0.8 * (j + 1) / n)
            at = rng.uniform(lo, hi)
            if abs(at - window * plan.restart_at) < 4:
                at = (at + 5) if at >= window * plan.restart_at else (at - 5)
            events.append((max(0.5, min(at, window - plan.stop_seconds - 1)), kind))
    for _ in range(plan.two_primaries):   # after the others: the same seed keeps their schedule
        events.append((two_primaries_start(events, plan, rng), "two_primaries"))
    return sorted(events)


def two_primaries_start(events: list[tuple[float, str]], plan: Plan, rng: random.Random) -> float:
    """When a two_primaries spell may start: away from read-only flips and server restarts, each of
    which would leave the twin the only writable candidate (a real failover to it, where claiming
    on the twin is right), and after the twin server had time to start."""
    window = plan.fault_seconds
    span = plan.two_primaries_seconds + 5   # the twin's worker may take a few seconds to start
    busy = [t for t, kind in events if kind in ("read_only_flip", "db_restart", "two_primaries")]
    lo = max(15.0, window * 0.05)   # the twin and its worker start meanwhile
    for _ in range(200):
        at = rng.uniform(lo, max(lo, window * 0.9))
        if not any(at - 8 <= t <= at + span for t in busy):
            return at
    return max([window] + busy) + 8


# --- processes -----------------------------------------------------------------------------------

class Proc:
    def __init__(self, name: str, argv: list[str], env: dict, log_path: Path):
        self.name = name
        self.log_path = log_path
        self._log = open(log_path, "ab")
        self.proc = subprocess.Popen(argv, stdout=self._log, stderr=subprocess.STDOUT, env=env, cwd=REPO)
        self.pid = self.proc.pid
        self.fate = "running"          # running | killed | terminated | stopped-then-continued | exited
        self.stopped = False
        self.sigterm_sent = False
        self._started = False

    def alive(self) -> bool:
        return self.proc.poll() is None

    def started(self) -> bool:
        """The worker logged worker_started: its signal handlers are in place."""
        if not self._started:
            with open(self.log_path, "rb") as f:
                self._started = b"event=worker_started " in f.read()
        return self._started

    def signal(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def sigterm(self) -> None:
        """One SIGTERM. A second one could land while the interpreter is finalising, after Python
        has put the default handlers back, and kill a process that had already stopped cleanly."""
        if self.alive() and not self.sigterm_sent:
            self.sigterm_sent = True
            if self.stopped:
                self.proc.send_signal(signal.SIGCONT)
            self.proc.send_signal(signal.SIGTERM)

    def terminate(self, timeout: float) -> int | None:
        self.sigterm()
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
            return None
        finally:
            self._log.close()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


class NotNow(Exception):
    """A fault cannot be injected at this moment (say, every worker is still starting): try again
    a second later, a few times."""


def gunicorn_children(master_pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{master_pid}/task/{master_pid}/children").read_text()
    except OSError:
        return []
    return [int(p) for p in text.split()]


# --- the soak ------------------------------------------------------------------------------------

class Soak:
    def __init__(self, plan: Plan, seed: int, workdir: Path, log=print):
        self.plan = plan
        self.seed = seed
        self.rng = random.Random(seed)
        self.workdir = workdir
        self.say = log
        self.logs = workdir / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.exec_log = workdir / "executions.log"
        self.exec_log.write_text("")
        self.server = ThrowawayServer(workdir / "mariadb", flavour=plan.server)
        self.url = ""
        self.token = secrets.token_urlsafe(32)
        self.env: dict[str, str] = {}
        self.workers: list[Proc] = []
        self.all_workers: list[Proc] = []
        self.web: Proc | None = None
        self.web_port = 0
        self.worker_seq = 0
        self.lock = threading.Lock()
        # What the enqueuers learned.
        self.specs: dict[str, Spec] = {}
        self.payloads: dict[str, tuple[dict, float]] = {}
        self.acked: dict[str, int] = {}
        # Fresh keys whose acknowledgement said duplicate: true: an earlier try had committed and
        # its answer was lost (a 503, a killed gunicorn worker: after a client retry), or the
        # server's own retry after a COMMIT whose OK never arrived (in one request).
        self.fresh_duplicates: Counter = Counter()
        self.enqueue_retries = Counter()
        self.enqueue_gave_up: list[str] = []
        self.enqueue_rejected: list[str] = []
        self.enqueue_done = threading.Event()
        # What the faults did.
        self.faults = Counter()
        self.fault_errors: list[str] = []
        self.fault_log: list[str] = []
        self.killed_pids: set[int] = set()
        self.stopped_pids: set[int] = set()
        self.terminated_pids: set[int] = set()
        self.partitioned_pids: set[int] = set()
        self.forced: set[tuple[str, int]] = set()     # (task_key, attempt) an operator requeued while running
        self.proxy: PartitionProxy | None = None
        self.read_only_since: float | None = None
        self.read_only_grace_until = 0.0
        self.refused_while_read_only = 0
        self.replayed = 0
        self.replay_mismatches: list[str] = []
        self.held_touched: list[str] = []
        # Pauses and cancellations.
        self.pause_windows: list[list[float]] = []    # [claims forbidden from, until] (monotonic)
        self.paused_claims: list[dict] = []
        self.actions_gave_up: list[str] = []   # a resume or a cancel that never went through
        self.cancelled: set[str] = set()
        self.cancel_answers: Counter = Counter()
        self.unexpected_exits: list[str] = []
        self.own_connection_ids: set[int] = set()
        self.restart_outage = 0.0
        self.twin: TwinServer | None = None
        self.twin_worker: Proc | None = None
        # The monitor's view.
        self.monitor_stop = threading.Event()
        self.last_seen: dict[int, tuple[int, str]] = {}
        self.attempts_backwards: list[dict] = []
        self.terminal_regressions: list[dict] = []
        self.monitor_samples = 0
        self.status_counts: Counter = Counter()
        self.t0 = 0.0
        self.timeline: list[tuple[float, int]] = []   # (seconds since start, terminal jobs)
        # Operators taking back prefetched jobs (fault_take_back_prefetched).
        self.take_back_url = ""
        self.take_back_busy = False
        self.take_back_rounds: list[str] = []
        self.take_back_done = 0                   # rounds that got to take a job back
        self.take_back_late: list[str] = []       # a handler started after the action answered
        self.resumes_in_flight = 0                # resumes sent that have not answered yet

    # --- set-up ----------------------------------------------------------------------------------

    def start_database(self) -> None:
        self.server.start()
        self.url = self.server.create_database(DB_NAME)
        out = subprocess.run([sys.executable, "-m", "jobqueue.cli", "--database-url", self.url, "init-db"],
                             capture_output=True, text=True, env=self.base_env(), cwd=REPO, timeout=120)
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
        p = Proc(name, [sys.executable, "-m", "jobqueue.cli", "--database-url", url, "worker",
                        "--name", name, "--concurrency", str(self.plan.concurrency),
                        "--lease-seconds", str(LEASE_SECONDS), "--grace-seconds", str(self.plan.grace_seconds),
                        "--tasks", "soak.tasks", *queues],
                 self.base_env(), self.logs / f"worker-{name}.log")
        p.proxied = proxied
        self.workers.append(p)
        self.all_workers.append(p)
        return p

    def start_web(self) -> None:
        from werkzeug.security import generate_password_hash

        self.web_port = _free_port()
        env = self.base_env()
        env.update({
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
        })
        self.web = Proc("gunicorn", [sys.executable, "-m", "gunicorn", "-c", str(REPO / "jobqueue/web/gunicorn_conf.py")],
                        env, self.logs / "gunicorn.log")
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

    # --- enqueue ---------------------------------------------------------------------------------

    def _http(self, method: str, path: str, body: dict | None, timeout: float = 10,
              conn: http.client.HTTPConnection | None = None) -> tuple[int, dict]:
        own = conn is None
        conn = conn or http.client.HTTPConnection("127.0.0.1", self.web_port, timeout=timeout)
        try:
            headers = {"Authorization": f"Bearer {self.token}"}
            data = None
            if body is not None:
                data = json.dumps(body).encode()
                headers["Content-Type"] = "application/json"
            conn.request(method, path, body=data, headers=headers)
            resp = conn.getresponse()
            raw = resp.read()
            try:
                parsed = json.loads(raw) if raw else {}
            except ValueError:
                parsed = {"raw": raw[:200].decode(errors="replace")}
            return resp.status, parsed
        finally:
            if own:
                conn.close()

    def enqueue_api(self, spec: Spec, payload: dict, delay: float, conn_box: list, deadline_s: float = 180
                    ) -> tuple[str, dict | None]:
        """POST until the queue answers 200/201; the same task_key on every try. ('ok', body),
        ('rejected', body) for a 4xx, ('gave_up', None)."""
        body = {"task": "soak", "task_key": spec.task_key, "payload": payload, "max_attempts": spec.max_attempts}
        if delay:
            body["delay"] = delay
        deadline = time.monotonic() + deadline_s
        pause = 0.1
        tries = 0
        while True:
            tries += 1
            try:
                if conn_box[0] is None:
                    conn_box[0] = http.client.HTTPConnection("127.0.0.1", self.web_port, timeout=15)
                status, answer = self._http("POST", "/api/jobs", body, conn=conn_box[0])
                if status in (200, 201):
                    answer["_tries"] = tries
                    return "ok", answer
                if 400 <= status < 500:
                    return "rejected", {"status": status, **answer}
                self.enqueue_retries[f"api {status}"] += 1
            except (OSError, http.client.HTTPException) as exc:
                self.enqueue_retries[f"api {type(exc).__name__}"] += 1
                if conn_box[0] is not None:
                    conn_box[0].close()
                conn_box[0] = None
            if time.monotonic() > deadline:
                return "gave_up", None
            time.sleep(pause * random.uniform(0.5, 1.5))
            pause = min(pause * 2, 2.0)

    def enqueue_cli(self, spec: Spec, payload: dict, delay: float, deadline_s: float = 180) -> tuple[str, dict | None]:
        argv = [sys.executable, "-m", "jobqueue.cli", "--database-url", self.url, "--log-level", "WARNING",
                "enqueue", "soak", "--key", spec.task_key, "--payload", json.dumps(payload),
                "--max-attempts", str(spec.max_attempts), "--tasks", "soak.tasks"]
        if delay:
            argv += ["--delay", str(delay)]
        deadline = time.monotonic() + deadline_s
        pause = 0.2
        tries = 0
        while True:
            tries += 1
            try:
                out = subprocess.run(argv, capture_output=True, text=True, env=self.base_env(), cwd=REPO, timeout=60)
            except subprocess.TimeoutExpired:
                self.enqueue_retries["cli timeout"] += 1
            else:
                if out.returncode == 0:
                    answer = json.loads(out.stdout.strip().splitlines()[-1])
                    answer["_tries"] = tries
                    return "ok", answer
                if out.returncode not in (1, 75):   # 75: no writable primary right now, try again
                    return "rejected", {"code": out.returncode, "stderr": out.stderr[-500:]}
                self.enqueue_retries[f"cli exit {out.returncode}"] += 1
            if time.monotonic() > deadline:
                return "gave_up", None
            time.sleep(pause * random.uniform(0.5, 1.5))
            pause = min(pause * 2, 2.0)

    def _record_ack(self, spec: Spec, outcome: str, answer: dict | None) -> None:
        with self.lock:
            if outcome == "ok":
                self.acked[spec.task_key] = int(answer["id"])
                if answer.get("duplicate"):
                    self.fresh_duplicates["after a client retry" if answer.get("_tries", 1) > 1
                                          else "in one request"] += 1
            elif outcome == "rejected":
                self.enqueue_rejected.append(f"{spec.task_key} via {spec.via}: {answer}")
            else:
                self.enqueue_gave_up.append(f"{spec.task_key} via {spec.via}")

    def run_enqueuers(self, jobs: list[tuple[Spec, dict, float]]) -> list[threading.Thread]:
        api_q: queue_mod.Queue = queue_mod.Queue()
        cli_q: queue_mod.Queue = queue_mod.Queue()
        for item in jobs:
            self.specs[item[0].task_key] = item[0]
            self.payloads[item[0].task_key] = (item[1], item[2])
            (cli_q if item[0].via == "cli" else api_q).put(item)

        def api_loop():
            box = [None]
            while True:
                try:
                    spec, payload, delay = api_q.get_nowait()
                except queue_mod.Empty:
                    break
                self._record_ack(spec, *self.enqueue_api(spec, payload, delay, box))
            if box[0] is not None:
                box[0].close()

        def cli_loop():
            while True:
                try:
                    spec, payload, delay = cli_q.get_nowait()
                except queue_mod.Empty:
                    break
                self._record_ack(spec, *self.enqueue_cli(spec, payload, delay))

        threads = [threading.Thread(target=_guarded(api_loop, self), name=f"api-{i}", daemon=True)
                   for i in range(self.plan.api_threads)]
        threads += [threading.Thread(target=_guarded(cli_loop, self), name=f"cli-{i}", daemon=True)
                    for i in range(self.plan.cli_threads)]
        for t in threads:
            t.start()
        return threads

    # --- the monitor -----------------------------------------------------------------------------

    def _connect(self, own: bool = True) -> pymysql.Connection:
        conn = pymysql.connect(host="127.0.0.1", port=self.server.port, user="root", password="", database=DB_NAME,
                               autocommit=True, connect_timeout=5, read_timeout=30, write_timeout=30)
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
                if conn is not None:
                    try:
                        conn.close()
                    except Exception:
                        pass
                conn = None
                previous_start = None   # the next sample has no comparable predecessor
                self.monitor_stop.wait(0.5)
                continue
            # Both samples inside a pause window (after its notice time): any attempt started
            # between them was a claim from the paused queue.
            with self.lock:
                in_pause = previous_start is not None and any(
                    start <= previous_start and read_at <= end for start, end in self.pause_windows)
            counts: Counter = Counter()
            for job_id, attempts, status, owner, started_at in rows:
                counts[status] += 1
                before = self.last_seen.get(job_id)
                if before is not None:
                    if attempts < before[0]:
                        self.attempts_backwards.append({"id": job_id, "from": before[0], "to": attempts})
                    if attempts > before[0] and in_pause:
                        self.paused_claims.append({"id": job_id, "attempt": attempts, "owner": owner,
                                                   "started_at": str(started_at), "pause": self._pause_stamp(conn)})
                    # Finished jobs stay finished; only an operator's cancel turns failed into cancelled.
                    if before[1] in ("done", "failed", "cancelled") and status != before[1] \
                            and not (before[1] == "failed" and status == "cancelled"):
                        self.terminal_regressions.append({"id": job_id, "from": before[1], "to": status})
                elif in_pause and attempts > 0:
                    self.paused_claims.append({"id": job_id, "attempt": attempts, "new": True, "owner": owner,
                                               "started_at": str(started_at), "pause": self._pause_stamp(conn)})
                self.last_seen[job_id] = (attempts, status)
            previous_start = started
            self.monitor_samples += 1
            self.status_counts = counts
            self.timeline.append((time.monotonic() - self.t0, counts["done"] + counts["failed"]))
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

    def note(self, text: str) -> None:
        line = f"{time.monotonic() - self.t0:7.1f}s {text}"
        self.fault_log.append(line)

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

    def fault_sigkill_worker(self, later) -> None:
        choices = self.live_workers()
        if not choices:
            raise NotNow("no live worker to kill")
        victim = self.rng.choice(choices)
        victim.signal(signal.SIGKILL)
        victim.proc.wait(10)
        victim.fate = "killed"
        self.killed_pids.add(victim.pid)
        self.workers.remove(victim)
        new = self.start_worker(proxied=getattr(victim, "proxied", False))
        self.note(f"SIGKILL worker {victim.name} (pid {victim.pid}); started {new.name} (pid {new.pid})")

    def fault_sigterm_worker(self, later) -> None:
        """A deploy: SIGTERM one worker (it finishes or releases what it holds and exits 0) and
        start its replacement at once."""
        # A worker still importing has no SIGTERM handler yet (and holds nothing): it would just die.
        choices = self.live_workers(started=True)
        if not choices:
            raise NotNow("no started worker to restart")
        victim = self.rng.choice(choices)
        victim.sigterm()
        victim.fate = "terminated"
        self.terminated_pids.add(victim.pid)
        self.workers.remove(victim)
        new = self.start_worker(proxied=getattr(victim, "proxied", False))
        self.note(f"SIGTERM worker {victim.name} (pid {victim.pid}); started {new.name} (pid {new.pid})")

        def check_exit():
            code = victim.proc.poll()
            if code != 0:
                self.unexpected_exits.append(f"worker {victim.name} (pid {victim.pid}) after SIGTERM: "
                                             f"{'still running' if code is None else f'exit {code}'}")
            self.note(f"worker {victim.name} exited with {code} after SIGTERM")

        # A worker's shutdown is bounded by its grace, then the release writes and the last
        # completions, each retried up to finish_retry_seconds (max(5 s, lease)) while the
        # database is away: a worker SIGTERMed just after a SIGCONT, its leases lost and its
        # connections killed, legitimately takes more than 10 s (found by the soak).
        later(1.0 + 2 * max(5.0, LEASE_SECONDS) + 8.0, check_exit)

    def fault_sigstop_worker(self, later) -> None:
        choices = self.live_workers(started=True)
        if not choices:
            raise NotNow("no started worker to stop")
        victim = self.rng.choice(choices)
        victim.signal(signal.SIGSTOP)
        victim.stopped = True
        self.stopped_pids.add(victim.pid)
        self.note(f"SIGSTOP worker {victim.name} (pid {victim.pid}) for {self.plan.stop_seconds:g} s "
                  f"(lease {LEASE_SECONDS} s)")

        def resume():
            victim.signal(signal.SIGCONT)
            victim.stopped = False
            victim.fate = "stopped-then-continued"
            self.note(f"SIGCONT worker {victim.name} (pid {victim.pid})")

        later(self.plan.stop_seconds, resume)

    def fault_force_requeue(self, later) -> None:
        """An operator's forced requeue of a running job (preferably a long one): the old attempt's
        lease is fenced, its handler told within a renewal; the job runs again as attempt + 1."""
        conn = self._connect()
        try:
            with conn.cursor() as cur:
                cur.execute("SELECT id, task_key, attempts FROM job_queue WHERE status = 'running' "
                            "ORDER BY started_at LIMIT 20")
                running = cur.fetchall()
        finally:
            conn.close()
        if not running:
            raise NotNow("no running job to requeue")
        job_id, task_key, attempt = self.rng.choice(running)
        status, answer = self._http("POST", f"/api/jobs/{job_id}/requeue", {"force": True})
        if status != 200 or not answer.get("changed"):
            raise NotNow(f"requeue of job {job_id} answered {status} {answer}")
        self.forced.add((task_key, int(attempt)))
        self.note(f"forced requeue of running job {job_id} ({task_key}, attempt {attempt})")

    def fault_read_only_flip(self, later) -> None:
        """The primary turns read-only for a moment (a botched switchover): claims and writes
        pause everywhere, enqueues answer 503 / exit 75 and are retried, then all resumes."""
        self.server.execute("SET GLOBAL read_only = ON")
        self.read_only_since = time.monotonic()
        self.note(f"read_only = ON for {self.plan.read_only_seconds:g} s")

        def back():
            self.server.execute("SET GLOBAL read_only = OFF")
            self.note("read_only = OFF")
            self.read_only_since = None
            # A worker whose start-up check saw the read-only server exits 3 a moment later.
            self.read_only_grace_until = time.monotonic() + 5

        later(self.plan.read_only_seconds, back)

    def fault_two_primaries(self, later) -> None:
        """A failover that left the old primary writable, seen by one worker: its second
        candidate (the twin, a standby until now) turns writable for a spell, then read-only."""
        twin = self.twin
        if twin is None or twin.error:
            raise RuntimeError(twin.error if twin else "no twin server")
        if self.twin_worker is None or not self.twin_worker.started():
            raise NotNow("the twin server or its worker is still starting")
        spell = Spell(self._db_now(), time.time())
        twin.writable(True)
        self.note(f"two primaries: the twin is writable for {self.plan.two_primaries_seconds:g} s "
                  f"(worker {TWIN_WORKER} lists both)")

        def back():
            # Read before the flip: on a loaded host the read may take seconds, and claims after the
            # flip are the worker's right.
            spell.read_only_at = self._db_now()
            twin.writable(False)
            twin.spells.append(spell)
            self.note("two primaries: the twin is read-only again")
            if self.twin_worker not in self.workers:
                self.workers.append(self.twin_worker)   # a worker like the others from now on

        later(self.plan.two_primaries_seconds, back)

    def start_twin_worker(self) -> None:
        """The worker whose candidates are "<primary> <twin>", as soon as the twin is ready: it
        claims on the primary like the others until the two_primaries fault."""
        self.twin_worker = Proc(TWIN_WORKER, [
            sys.executable, "-m", "jobqueue.cli", "--database-url", f"{self.url} {self.twin.url()}", "worker",
            "--name", TWIN_WORKER, "--concurrency", str(self.plan.concurrency), "--lease-seconds",
            str(LEASE_SECONDS), "--grace-seconds", str(self.plan.grace_seconds), "--tasks", "soak.tasks"],
            self.base_env(), self.logs / f"worker-{TWIN_WORKER}.log")
        self.all_workers.append(self.twin_worker)

    def _db_now(self):
        conn = self._connect()
        try:
            with conn.cursor() as cur:
                cur.execute("SELECT UTC_TIMESTAMP(6)")
                return cur.fetchone()[0]
        finally:
            conn.close()

    def fault_partition_worker(self, later) -> None:
        """Cut the proxied worker off from the database for longer than its lease: its statements
        hang, its local deadline must tell its handlers the leases are gone, and its late writes
        must be fenced."""
        victims = [w for w in self.live_workers(started=True) if getattr(w, "proxied", False)]
        if not victims or self.proxy.cut_off:
            raise NotNow("no started proxied worker")
        for w in victims:
            self.partitioned_pids.add(w.pid)
        self.proxy.cut()
        self.note(f"partition: {', '.join(w.name for w in victims)} cut off from the database for "
                  f"{self.plan.partition_seconds:g} s (lease {LEASE_SECONDS} s)")

        def heal():
            self.proxy.heal()
            self.note("partition healed")

        later(self.plan.partition_seconds, heal)

    def fault_kill_connection(self, later) -> None:
        conn = self._connect()
        try:
            with conn.cursor() as cur:
                with self.lock:
                    own = set(self.own_connection_ids)
                cur.execute("SELECT ID FROM information_schema.PROCESSLIST WHERE DB = %s AND COMMAND <> 'Daemon'",
                            (DB_NAME,))
                ids = [r[0] for r in cur.fetchall() if r[0] not in own]
                if not ids:
                    raise NotNow("no connection to kill")
                n = min(len(ids), self.rng.randint(*self.plan.conn_kills_each))
                killed = []
                for cid in self.rng.sample(ids, n):
                    try:
                        cur.execute(f"KILL CONNECTION {int(cid)}")
                        killed.append(cid)
                    except pymysql.MySQLError:
                        pass  # it went away by itself
        finally:
            conn.close()
        if not killed:
            raise NotNow("every chosen connection was already gone")
        self.faults["connections_killed"] += len(killed)
        self.note(f"KILL CONNECTION {', '.join(map(str, killed))} (of {len(ids)})")

    def fault_db_restart(self, later) -> None:
        started = time.monotonic()
        if self.plan.crash_db:
            self.note("database: crashing it (SIGKILL; InnoDB recovers on start)")
            self.server.kill()
        else:
            self.note("database: stopping (SIGTERM)")
            self.server.stop()
        time.sleep(self.plan.restart_down_seconds)
        self.server.start()
        self.restart_outage = time.monotonic() - started
        self.note(f"database: back on port {self.server.port} after {self.restart_outage:.1f} s")

    def fault_hold_rows(self, later) -> None:
        conn = self._connect()
        try:
            with conn.cursor() as cur:
                cur.execute("BEGIN")
                # Locked by primary key: a locking read that sorts (ORDER BY priority, id over the
                # ready rows of every queue is a filesort) locks every row it reads, not the few
                # it returns, and so held all ready rows instead of hold_rows of them.
                cur.execute("SELECT id FROM job_queue WHERE status = 'ready' ORDER BY priority, id "
                            f"LIMIT {int(self.plan.hold_rows)}")
                ids = [row[0] for row in cur.fetchall()] or [0]
                cur.execute(f"SELECT id, attempts FROM job_queue FORCE INDEX (PRIMARY) WHERE id IN "
                            f"({','.join(map(str, ids))}) AND status = 'ready' FOR UPDATE SKIP LOCKED")
                held = cur.fetchall()
        except BaseException:
            conn.close()
            raise
        if not held:
            conn.close()
            raise NotNow("no ready rows to hold")
        self.note(f"holding {len(held)} ready rows {[r[0] for r in held]} in a paused transaction "
                  f"for {self.plan.hold_seconds:g} s")

        def release():
            try:
                conn.ping(reconnect=False)
            except pymysql.MySQLError:
                # The holding session is gone (the database restarted under it): its locks went
                # with it, so workers were free to take the rows since.
                conn.close()
                self.note(f"the hold of {len(held)} rows had ended with its session (database restart)")
                return
            try:
                check = self._connect()
                try:
                    with check.cursor() as cur:
                        ids = ",".join(str(r[0]) for r in held)
                        cur.execute(f"SELECT id, attempts, status FROM job_queue WHERE id IN ({ids})")
                        now = {r[0]: (r[1], r[2]) for r in cur.fetchall()}
                finally:
                    check.close()
                for job_id, attempts in held:
                    if now.get(job_id) != (attempts, "ready"):
                        self.held_touched.append(f"job {job_id}: held as ready/attempts {attempts}, "
                                                 f"now {now.get(job_id)}")
            except pymysql.MySQLError as exc:
                self.fault_errors.append(f"hold check: {exc}")
            try:
                conn.rollback()
            except pymysql.MySQLError:
                pass  # the server restarted under it: the hold ended then
            conn.close()
            self.note(f"released {len(held)} held rows")

        later(self.plan.hold_seconds, release)

    def fault_sigkill_web_worker(self, later) -> None:
        children = gunicorn_children(self.web.pid)
        if not children:
            raise NotNow("no gunicorn worker process found")
        pid = self.rng.choice(children)
        os.kill(pid, signal.SIGKILL)
        self.killed_pids.add(pid)
        self.note(f"SIGKILL gunicorn worker pid {pid} (the master starts another)")

    def fault_replay(self, later) -> None:
        with self.lock:
            known = sorted(self.acked.items())
        if len(known) < self.plan.replay_api_keys + self.plan.replay_cli_keys:
            raise NotNow("too few acknowledged keys to replay yet")
        sample = self.rng.sample(known, self.plan.replay_api_keys + self.plan.replay_cli_keys)

        def replay():
            box = [None]
            for n, (key, job_id) in enumerate(sample):
                spec = self.specs[key]
                payload, delay = self.payloads[key]
                if n < self.plan.replay_api_keys:
                    outcome, answer = self.enqueue_api(spec, payload, delay, box)
                else:
                    outcome, answer = self.enqueue_cli(spec, payload, delay)
                with self.lock:
                    self.replayed += 1
                    if outcome != "ok" or not answer.get("duplicate") or int(answer["id"]) != job_id:
                        self.replay_mismatches.append(f"{key} (id {job_id}): {outcome} {answer}")
            if box[0] is not None:
                box[0].close()

        t = threading.Thread(target=_guarded(replay, self), name="replay", daemon=True)
        t.start()
        self.action_threads.append(t)
        self.note(f"replaying {self.plan.replay_api_keys} task_keys via the API and {self.plan.replay_cli_keys} via the CLI")

    def _cli(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "jobqueue.cli", "--database-url", self.url, "--log-level", "WARNING",
                               *args], capture_output=True, text=True, env=self.base_env(), cwd=REPO, timeout=timeout)

    def _until_ok(self, what: str, attempt, deadline_s: float = 60, *, record: bool = True) -> bool:
        """Call `attempt()` (True when done) until it succeeds, through restarts and killed
        connections; False (and, with `record`, counted as a problem) if it never does."""
        deadline = time.monotonic() + deadline_s
        while time.monotonic() < deadline:
            try:
                if attempt():
                    return True
            except (OSError, http.client.HTTPException, subprocess.TimeoutExpired):
                pass
            time.sleep(0.3)
        if record:
            self.actions_gave_up.append(f"{what}: gave up after {deadline_s:g} s")
        return False

    def fault_pause_queue(self, later) -> None:
        """Pause the queue through the API; resume it `pause_seconds` later with `jobqueue resume`.
        From PAUSE_NOTICE_SECONDS after the pause answered until the resume is sent, the monitor
        must see no attempt start."""
        def pause() -> bool:
            status, answer = self._http("POST", f"/api/queues/{QUEUE}/pause", {})
            return status == 200 and answer.get("paused") is True

        # A pause refused for 20 s (the primary read-only, restarting, or cut off by another
        # fault) is not a problem: the fault is tried again later, like any fault whose moment
        # has not come. Only a resume that never goes through is (the queue would stay paused).
        if self._pause_open():
            raise NotNow("another pause is open")
        if not self._until_ok("pause", pause, 20, record=False):
            raise NotNow("the pause did not go through")
        window = [time.monotonic() + PAUSE_NOTICE_SECONDS, float("inf")]
        with self.lock:
            self.pause_windows.append(window)
        self.note(f"paused queue {QUEUE} (API) for {self.plan.pause_seconds:g} s")

        def resume():
            try:
                ok = self._until_ok("resume", lambda: self._cli("resume", QUEUE).returncode == 0)
            finally:
                with self.lock:
                    self.resumes_in_flight -= 1
            self.note(f"resumed queue {QUEUE} (CLI){'' if ok else ' FAILED'}")

        def start_resume():
            # On a thread of its own: the resume may have to wait for the database (read-only,
            # restarting), and the end of that fault is due in this same loop.
            with self.lock:
                window[1] = time.monotonic()
                self.resumes_in_flight += 1
            t = threading.Thread(target=_guarded(resume, self), name="resume", daemon=True)
            t.start()
            self.action_threads.append(t)

        later(self.plan.pause_seconds, start_resume)

    def fault_cancel(self, later) -> None:
        """Cancel a few acknowledged jobs, mostly recent ones (so some are ready, scheduled or
        running), through both doors. A job already done answers 409 / exit 3 and stays done."""
        with self.lock:
            known = sorted(self.acked.items(), key=lambda kv: kv[1])
        n = self.plan.cancel_api_keys + self.plan.cancel_cli_keys
        if len(known) < n * 3:
            raise NotNow("too few acknowledged keys to cancel yet")
        recent = known[-n * 5:]
        sample = self.rng.sample(recent, n - 2) + self.rng.sample(known[: -n * 5], 2)

        def cancel():
            box = [None]
            for i, (key, job_id) in enumerate(sample):
                via_api = i < self.plan.cancel_api_keys

                def attempt(key=key, job_id=job_id, via_api=via_api) -> bool:
                    if via_api:
                        if box[0] is None:
                            box[0] = http.client.HTTPConnection("127.0.0.1", self.web_port, timeout=15)
                        try:
                            status, answer = self._http("POST", f"/api/jobs/{job_id}/cancel", {"reason": "soak"},
                                                        conn=box[0])
                        except (OSError, http.client.HTTPException):
                            box[0].close()
                            box[0] = None
                            raise
                        outcome = ("ok" if status == 200 else "done" if status == 409 else "busy" if status == 423
                                   else f"http {status}")
                        changed = status == 200 and answer.get("changed")
                    else:
                        out = self._cli("cancel", str(job_id), "--reason", "soak")
                        outcome = {0: "ok", 3: "done", 75: "busy"}.get(out.returncode, f"exit {out.returncode}")
                        changed = out.returncode == 0 and json.loads(out.stdout).get("changed")
                    with self.lock:
                        self.cancel_answers[outcome] += 1
                        if changed:
                            self.cancelled.add(key)
                    return outcome in ("ok", "done")

                self._until_ok(f"cancel {key}", attempt, 60)
            if box[0] is not None:
                box[0].close()

        t = threading.Thread(target=_guarded(cancel, self), name="cancel", daemon=True)
        t.start()
        self.action_threads.append(t)
        self.note(f"cancelling {len(sample)} jobs ({self.plan.cancel_api_keys} via the API)")

    def _pause_open(self) -> bool:
        """A pause whose resume has not landed (it may wait for the database, or for a claim that
        a stopped worker holds open): another pause now would be ended by that resume."""
        with self.lock:
            return self.resumes_in_flight > 0 or any(w[1] == float("inf") for w in self.pause_windows)

    def fault_take_back_prefetched(self, later) -> None:
        """An operator takes back a job that waits in hand for a thread (issue 25): a worker of its
        own, `--concurrency 1 --prefetch 2`, holds three jobs, the first 12 s long
        (testkit.tasks.record_runs, which writes the wall-clock time its handler starts); while
        the first runs, the second is
        cancelled, failed or force-requeued (in turn) with the CLI. Its first attempt's handler
        must not start after the command answered. Its own database on the soak's server, so
        that the soak's workers and checks never see these jobs."""
        with self.lock:
            if self.take_back_busy:
                raise NotNow("the last round still runs")
            self.take_back_busy = True
        actions = (("cancel",), ("requeue", "--force"), ("fail",))
        action = actions[len(self.take_back_rounds) % len(actions)]
        self.take_back_rounds.append(" ".join(action))
        t = threading.Thread(target=_guarded(lambda: self._take_back_round(len(self.take_back_rounds), action), self),
                             name="take-back", daemon=True)
        t.start()
        self.action_threads.append(t)
        self.note(f"take back a prefetched job: round {len(self.take_back_rounds)}, `{' '.join(action)}`")

    def _take_back_round(self, n: int, action: tuple[str, ...]) -> None:
        """One round, tried again (each try its own queue) while another fault spoils it (the
        database restarting or read-only), for up to 120 s."""
        deadline = time.monotonic() + 120
        try:
            for attempt in range(1, 100):
                try:
                    self._take_back_once(f"tb{n}-{attempt}", action)
                    with self.lock:
                        self.take_back_done += 1
                    return
                except (RuntimeError, OSError, ValueError, KeyError, subprocess.TimeoutExpired, pymysql.MySQLError) as exc:
                    self.note(f"take back round {n}, try {attempt} spoilt: {str(exc)[:200]}")
                    if time.monotonic() > deadline:
                        return
                    time.sleep(1.0)
        finally:
            with self.lock:
                self.take_back_busy = False

    def _take_back_once(self, queue: str, action: tuple[str, ...]) -> None:
        folder = self.workdir / "take-back"
        folder.mkdir(exist_ok=True)
        if not self.take_back_url:
            # A database of its own, made from scratch: a restart may have cut the last init-db short.
            self.server.execute("DROP DATABASE IF EXISTS soak_take_back")
            self.take_back_url = self.server.create_database("soak_take_back")
            try:
                self._take_back_cli("init-db", timeout=120)
            except BaseException:
                self.take_back_url = ""
                raise
        ids = []
        for i in range(3):
            # The first runs long enough that the CLI's action lands while it runs, even on a loaded
            # machine (the CLI alone took over 6 s there); the others are short.
            payload = {"seconds": 12 if i == 0 else 1, "log": str(folder / f"{queue}-{i}.log")}
            out = self._take_back_cli("enqueue", "record_runs", "--key", f"{queue}-{i}", "--queue", queue,
                                      "--payload", json.dumps(payload), "--tasks", "testkit.tasks")
            ids.append(int(json.loads(out.stdout.strip().splitlines()[-1])["id"]))
        worker = Proc(f"take-back-{queue}", [sys.executable, "-m", "jobqueue.cli", "--database-url", self.take_back_url,
                                             "worker", "--name", queue, "--concurrency", "1", "--prefetch", "2",
                                             "--queues", queue, "--tasks", "testkit.tasks"],
                      self.base_env(), self.logs / f"worker-take-back-{queue}.log")

        def starts(i: int) -> list[tuple[int, float]]:
            path = folder / f"{queue}-{i}.log"
            lines = path.read_text().split("\n") if path.exists() else []
            return [(int(p[1]), float(p[3])) for p in (line.split() for line in lines) if p and p[0] == "start"]

        def all_running() -> bool:
            rows = self.server.execute(f"SELECT COUNT(*) FROM job_queue WHERE status = 'running' AND id IN "
                                       f"({','.join(map(str, ids))})", "soak_take_back")
            return rows[0][0] == 3

        try:
            deadline = time.monotonic() + 30
            while not (starts(0) and all_running()):
                if time.monotonic() > deadline or not worker.alive():
                    raise RuntimeError("the three jobs were not all claimed with the first one started")
                time.sleep(0.1)
            if starts(1):
                raise RuntimeError("the second job started before it could be taken back")
            self._take_back_cli(*action, str(ids[1]))
            answered = time.time()
            deadline = time.monotonic() + 30
            while not starts(2) and time.monotonic() < deadline:
                time.sleep(0.1)
            time.sleep(0.5)
            late = [at - answered for attempt, at in starts(1) if attempt == 1 and at >= answered]
            with self.lock:
                if late:
                    self.take_back_late.append(f"queue {queue} `{' '.join(action)}` job {ids[1]}: attempt 1 started "
                                               f"{late[0]:.3f} s after the command answered")
            self.note(f"take back in queue {queue}: {'LATE START' if late else 'no start after the action'}")
        finally:
            code = worker.terminate(30)
            if code == 3 and self.read_only_lately():
                # Refused to start on the read-only server (read_only_flip): the contract; this try
                # was spoilt by it (the jobs were never claimed) and the round tries again.
                self.note(f"take-back worker {worker.name} refused to start on the read-only server (exit 3)")
            elif code != 0:
                self.unexpected_exits.append(f"take-back worker {worker.name} exited with {code}")

    def _take_back_cli(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
        out = subprocess.run([sys.executable, "-m", "jobqueue.cli", "--database-url", self.take_back_url,
                              "--log-level", "WARNING", *args], capture_output=True, text=True, env=self.base_env(),
                             cwd=REPO, timeout=timeout)
        if out.returncode != 0:
            raise RuntimeError(f"jobqueue {' '.join(args[:2])}: exit {out.returncode}: {out.stderr[-300:]}")
        return out

    def fault_pause_stalled_claim(self, later) -> None:
        """A pause while claims stall inside their transaction (issue 25): the queue's queue_state
        row is held FOR UPDATE, so every claim of the queue waits there, after its worker read
        the queue open; one worker is SIGSTOPped while it waits; the pause is sent (through the
        API) and the hold released; the worker is continued after stop_seconds. The pause answers
        only once that claim committed, and from then on no claim of the queue commits: the
        monitor's pause window (from PAUSE_NOTICE_SECONDS after the answer) must see none."""
        if self._pause_open():
            raise NotNow("another pause is open")
        victims = [w for w in self.live_workers(started=True) if not getattr(w, "proxied", False)]
        if not victims:
            raise NotNow("no started worker to stop")
        hold = self._connect()
        try:
            with hold.cursor() as cur:
                cur.execute("BEGIN")
                cur.execute("SELECT paused FROM queue_state WHERE queue = %s FOR UPDATE", (QUEUE,))
                row = cur.fetchone()
                if row is None or row[0]:
                    raise NotNow("no queue_state row to hold yet" if row is None else "the queue is paused")
        except BaseException:
            hold.close()
            raise
        time.sleep(0.5)   # the workers' next claims reach the held row and wait there
        victim = self.rng.choice(victims)
        victim.signal(signal.SIGSTOP)
        victim.stopped = True
        self.stopped_pids.add(victim.pid)
        window = [float("inf"), float("inf")]
        with self.lock:
            self.pause_windows.append(window)   # open from the answer on, see pause() below

        def pause() -> None:
            def once() -> bool:
                status, answer = self._http("POST", f"/api/queues/{QUEUE}/pause", {}, timeout=30)
                return status == 200 and answer.get("paused") is True
            ok = self._until_ok("pause during a stalled claim", once, 60)
            with self.lock:
                if not ok:
                    window[1] = time.monotonic()   # never opened
                    return
                window[0] = time.monotonic() + PAUSE_NOTICE_SECONDS
            self.note(f"paused queue {QUEUE} during a stalled claim")
            time.sleep(self.plan.pause_seconds)
            with self.lock:
                window[1] = time.monotonic()
                self.resumes_in_flight += 1
            try:
                ok = self._until_ok("resume", lambda: self._cli("resume", QUEUE).returncode == 0)
            finally:
                with self.lock:
                    self.resumes_in_flight -= 1
            self.note(f"resumed queue {QUEUE} (CLI){'' if ok else ' FAILED'}")

        t = threading.Thread(target=_guarded(pause, self), name="stalled-pause", daemon=True)
        t.start()
        self.action_threads.append(t)
        time.sleep(0.3)   # the pause is queued behind the hold
        try:
            hold.rollback()
        except pymysql.MySQLError:
            pass   # the session is gone (a restart): its lock went with it
        hold.close()
        self.note(f"held the queue_state row of {QUEUE} 0.8 s, SIGSTOP worker {victim.name} (pid {victim.pid}) in "
                  f"its claim, paused, released the hold")

        def resume_worker():
            victim.signal(signal.SIGCONT)
            victim.stopped = False
            victim.fate = "stopped-then-continued"
            self.note(f"SIGCONT worker {victim.name} (pid {victim.pid})")

        later(self.plan.stop_seconds / 2, resume_worker)

    def run_faults(self, schedule: list[tuple[float, str]]) -> None:
        """Run the schedule in real time; durational faults (stops, holds) end from the same loop."""
        self.action_threads: list[threading.Thread] = []   # replays, cancels, resumes
        start = time.monotonic()
        heap: list[tuple[float, int, str, object]] = []
        seq = 0
        for at, kind in schedule:
            heap.append((start + at, seq, kind, 0))
            seq += 1
        heapq.heapify(heap)

        def later(seconds: float, fn) -> None:
            nonlocal seq
            seq += 1
            heapq.heappush(heap, (time.monotonic() + seconds, seq, "end", fn))

        last_progress = 0.0
        while heap:
            when, _, kind, fn = heap[0]
            now = time.monotonic()
            if now - last_progress >= 5:
                last_progress = now
                self.progress()
            if when > now:
                time.sleep(min(0.2, when - now))
                self.check_unexpected_exits()
                continue
            heapq.heappop(heap)
            try:
                if kind == "end":
                    fn()
                else:
                    getattr(self, f"fault_{kind}")(later)
                    self.faults[kind] += 1
            except NotNow as exc:
                if fn < 15:
                    seq += 1
                    heapq.heappush(heap, (time.monotonic() + 1.0, seq, kind, fn + 1))
                    continue
                self.fault_errors.append(f"{kind}: {exc} (15 tries)")
                self.note(f"{kind} not injected: {exc}")
            except Exception as exc:   # a fault that could not be injected is reported, not fatal
                self.fault_errors.append(f"{kind}: {type(exc).__name__}: {exc}")
                self.note(f"{kind} not injected: {exc}")
            self.check_unexpected_exits()

    def progress(self) -> None:
        c = self.status_counts
        self.say(f"[{time.monotonic() - self.t0:6.1f}s] acked {len(self.acked)}/{len(self.specs)}  "
                 + " ".join(f"{s} {c.get(s, 0)}" for s in ("ready", "scheduled", "running", "done", "failed"))
                 + f"  faults {sum(v for k, v in self.faults.items() if k in FAULT_KINDS)}")

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
        deadline = time.monotonic() + self.plan.drain_timeout
        last_progress = 0.0
        while time.monotonic() < deadline:
            self.check_unexpected_exits()
            if time.monotonic() - last_progress >= 5:
                last_progress = time.monotonic()
                self.progress()
            try:
                conn = self._connect()
                try:
                    with conn.cursor() as cur:
                        cur.execute("SELECT COUNT(*) FROM job_queue WHERE status IN ('ready', 'running', 'scheduled')")
                        open_jobs = cur.fetchone()[0]
                finally:
                    conn.close()
            except pymysql.MySQLError:
                open_jobs = -1
            if open_jobs == 0 and self.enqueue_done.is_set():
                return True
            time.sleep(0.5)
        return False

    def stop_all(self) -> dict[str, int | None]:
        codes: dict[str, int | None] = {}
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not all(w.started() for w in self.workers if w.alive()):
            time.sleep(0.2)   # a replacement still importing has no SIGTERM handler yet
        for w in self.workers:
            w.sigterm()
        for w in self.workers:
            codes[f"worker {w.name}"] = w.terminate(30)
            w.fate = "stopped" if w.fate == "running" else w.fate
        for w in self.all_workers:
            if not w._log.closed:
                w._log.close()
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
        finally:
            conn.close()
        executions = []
        for line in self.exec_log.read_text().splitlines():
            key, attempt, worker, pid = line.split(" ")
            executions.append(Execution(key, int(attempt), worker, int(pid)))
        return Observed(specs=self.specs, acked=dict(self.acked), rows=rows, results=results,
                        attempt_rows=attempt_rows, executions=executions,
                        attempts_backwards=self.attempts_backwards, terminal_regressions=self.terminal_regressions,
                        cancelled=set(self.cancelled), paused_claims=list(self.paused_claims),
                        killed_pids=self.killed_pids, stopped_pids=self.stopped_pids,
                        terminated_pids=self.terminated_pids, partitioned_pids=self.partitioned_pids,
                        forced=self.forced)

    def fenced_late_writes(self) -> int:
        """lease_lost lines in the logs of workers that were stopped or cut off past their lease:
        writes the fence refused after they woke up, and leases their keepers gave up on."""
        n = 0
        for w in self.all_workers:
            if w.pid in self.stopped_pids or w.pid in self.partitioned_pids:
                n += len(re.findall(r"event=lease_lost ", w.log()))
        return n

    def log_counts(self) -> Counter:
        counts: Counter = Counter()
        paths = [w.log_path for w in self.all_workers] + ([self.web.log_path] if self.web else [])
        for path in paths:
            text = path.read_text(errors="replace")
            for name in ("lease_lost", "reclaimed", "sql_error", "db_retry", "duplicate_result", "finish_abandoned",
                         "handler_lease_lost", "released", "claim_mismatch"):
                counts[name] += len(re.findall(rf"event={name} ", text))
            counts["Traceback"] += text.count("Traceback (most recent call last)")
        return counts


def _guarded(fn, soak: Soak):
    def run():
        try:
            fn()
        except Exception:
            soak.fault_errors.append(f"thread {threading.current_thread().name} crashed:\n{traceback.format_exc()}")
    return run


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --- the whole run ---------------------------------------------------------------------------------

@dataclass
class Outcome:
    passed: bool
    verdict: str
    table: str
    numbers: dict = field(default_factory=dict)


def run(plan: Plan, seed: int, workdir: Path, say=print) -> Outcome:
    soak = Soak(plan, seed, workdir, log=say)
    load_before = os.getloadavg()[0]
    jobs = job_specs(plan, soak.rng)
    schedule = fault_schedule(plan, soak.rng)
    (workdir / "schedule.json").write_text(json.dumps([{"at": round(t, 2), "fault": k} for t, k in schedule], indent=1))
    say(f"soak: {plan.jobs} jobs, seed {seed}, {len(schedule)} scheduled faults over {plan.fault_seconds:g} s; "
        f"logs in {workdir}")
    monitor = threading.Thread(target=soak.monitor, name="monitor", daemon=True)
    codes: dict[str, int | None] = {}
    drained = False
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
        enqueuers = soak.run_enqueuers(jobs)

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
            soak.workers.append(soak.twin_worker)   # the fault never ran: stopped like the others
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

    findings = check(obs)
    finished = sum(1 for r in obs.rows if r.status in ("done", "failed"))
    wall = drain_end - soak.t0
    numbers = {
        "seed": seed,
        "jobs": plan.jobs,
        "jobs_api": sum(1 for s in soak.specs.values() if s.via == "api"),
        "jobs_cli": sum(1 for s in soak.specs.values() if s.via == "cli"),
        "acked": len(soak.acked),
        "by_kind": {k: dict(v) for k, v in sorted(findings.by_kind.items())},
        "faults": {k: soak.faults.get(k, 0) for k in FAULT_KINDS},
        "connections_killed": soak.faults.get("connections_killed", 0),
        "replayed_keys": soak.replayed,
        "fault_errors": soak.fault_errors,
        "restart_outage_seconds": round(soak.restart_outage, 2),
        "db_crash": plan.crash_db,
        "server": plan.server,
        "lost": findings.get("lost"),
        "duplicate_results": findings.get("duplicate_results"),
        "duplicate_executions": findings.get("duplicate_executions"),
        "extra_executions": findings.get("extra_executions"),
        "duplicate_causes": dict(findings.duplicate_causes.most_common()),
        "executions": findings.get("executions"),
        "attempts_backwards": findings.get("attempts_backwards"),
        "terminal_regressions": findings.get("terminal_regressions"),
        "cancelled": findings.get("cancelled"),
        "cancel_answers": dict(soak.cancel_answers),
        "pause_windows_seconds": [round(end - start + PAUSE_NOTICE_SECONDS, 1) for start, end in soak.pause_windows],
        "claims_while_paused": findings.get("claims_while_paused"),
        "failed_not_doomed": findings.get("failed_not_doomed"),
        "results_of_reaped_attempts": findings.get("results_of_reaped_attempts"),
        "unexpected_failure_reasons": dict(findings.unexpected_failures.most_common(5)),
        "max_attempts_raised": findings.get("max_attempts_raised"),
        "fenced_late_writes": soak.fenced_late_writes(),
        "monitor_samples": soak.monitor_samples,
        "duration_seconds": round(wall, 1),
        "fault_window_seconds": round(fault_end - fault_start, 1),
        "enqueue_seconds": round(getattr(soak, "enqueue_seconds", float("nan")), 1),
        "throughput_under_faults": round((terminal_at_fault_end - terminal_at_fault_start)
                                         / max(1e-9, fault_end - fault_start), 1),
        "throughput_overall": round(finished / max(1e-9, wall), 1),
        "exit_codes": codes,
        "load_average_1min": [round(load_before, 1), round(os.getloadavg()[0], 1)],
        "enqueue_retries": dict(soak.enqueue_retries),
        "fresh_keys_acknowledged_as_duplicate": dict(soak.fresh_duplicates),
        "log_events": dict(soak.log_counts()),
        "violations": findings.violations(),
        "examples": {k: v for k, v in findings.examples.items() if k in findings.violations()},
    }
    numbers["two_primaries"] = twin_check["numbers"]
    problems = dict(findings.violations())
    problems.update(twin_check["problems"])
    if not drained:
        problems["drain_timed_out"] = 1
    if soak.enqueue_gave_up:
        problems["enqueue_gave_up"] = len(soak.enqueue_gave_up)
    if soak.enqueue_rejected:
        problems["enqueue_rejected"] = len(soak.enqueue_rejected)
    if soak.replay_mismatches:
        problems["replay_mismatches"] = len(soak.replay_mismatches)
    if soak.held_touched:
        problems["held_rows_touched"] = len(soak.held_touched)
    if soak.actions_gave_up:
        problems["actions_gave_up"] = len(soak.actions_gave_up)
    if soak.take_back_late:
        problems["started_after_take_back"] = len(soak.take_back_late)
    if soak.take_back_rounds and not soak.take_back_done:
        problems["take_back_never_done"] = len(soak.take_back_rounds)
    if soak.unexpected_exits:
        problems["unexpected_exits"] = len(soak.unexpected_exits)
    bad_codes = {k: v for k, v in codes.items() if v != 0}
    if bad_codes:
        problems["nonzero_exit_codes"] = len(bad_codes)
    missing = [k for k in FAULT_KINDS if soak.faults.get(k, 0) == 0 and any(kind == k for _, kind in schedule)]
    if missing:
        problems["faults_not_injected"] = len(missing)
    crashed = [e for e in soak.fault_errors if "crashed" in e]
    if crashed:
        problems["harness_thread_crashed"] = len(crashed)
    numbers["problems"] = problems
    numbers["details"] = {
        "enqueue_gave_up": soak.enqueue_gave_up[:10], "enqueue_rejected": soak.enqueue_rejected[:10],
        "replay_mismatches": soak.replay_mismatches[:10], "held_rows_touched": soak.held_touched[:10],
        "actions_gave_up": soak.actions_gave_up[:10],
        "take_back_rounds": soak.take_back_rounds, "take_back_done": soak.take_back_done,
        "started_after_take_back": soak.take_back_late,
        "unexpected_exits": soak.unexpected_exits, "nonzero_exit_codes": bad_codes, "faults_not_injected": missing,
    }
    passed = not problems
    verdict = (f"SOAK {'PASS' if passed else 'FAIL'}: {plan.jobs} jobs, "
               f"{sum(numbers['faults'].values())} faults, {numbers['lost']} lost, "
               f"{numbers['duplicate_results']} duplicate results, {numbers['duplicate_executions']} duplicate "
               f"executions, {numbers['throughput_under_faults']} jobs/s under faults"
               + ("" if passed else f"; problems: {', '.join(f'{k}={v}' for k, v in problems.items())}"))
    (workdir / "results.json").write_text(json.dumps({"verdict": verdict, "passed": passed, **numbers},
                                                     indent=1, default=str))
    (workdir / "faults.log").write_text("\n".join(soak.fault_log) + "\n")
    return Outcome(passed, verdict, table(numbers), numbers)


def table(n: dict) -> str:
    kinds = ", ".join(f"{k} {sum(v.values())} ({'/'.join(f'{s} {c}' for s, c in sorted(v.items()))})"
                      for k, v in n["by_kind"].items())
    faults = ", ".join(f"{k} {v}" for k, v in n["faults"].items())
    causes = "; ".join(f"{k}: {v}" for k, v in n["duplicate_causes"].items()) or "none"
    codes = ", ".join(f"{k} {v}" for k, v in n["exit_codes"].items())
    rows = [
        ("jobs enqueued", f"{n['jobs']} ({n['jobs_api']} via HTTP API, {n['jobs_cli']} via CLI), {n['acked']} acknowledged"),
        ("jobs by kind (final status)", kinds),
        ("faults injected", f"{faults}; {n['connections_killed']} connections killed, "
                            f"{n['replayed_keys']} task_keys replayed, database {'crash' if n['db_crash'] else 'restart'} "
                            f"outage {n['restart_outage_seconds']} s"),
        ("**lost** (must be 0)", str(n["lost"])),
        ("**duplicate results** (must be 0)", str(n["duplicate_results"])),
        ("duplicate executions", f"{n['duplicate_executions']} task_keys ({n['extra_executions']} extra runs of "
                                 f"{n['executions']}); superseded runs by cause: {causes}"),
        ("late writes refused by the fence (stopped workers)", str(n["fenced_late_writes"])),
        ("pauses (claims while paused, must be 0)", f"{len(n['pause_windows_seconds'])} pauses of "
                                                    f"{'/'.join(f'{s:g}' for s in n['pause_windows_seconds'])} s; "
                                                    f"{n['claims_while_paused']} claims"),
        ("cancellations", f"{n['cancelled']} jobs cancelled; answers {json.dumps(n['cancel_answers'], sort_keys=True)}"),
        ("attempts went backwards (must be 0)", f"{n['attempts_backwards']} in {n['monitor_samples']} samples"),
        ("other invariants (must be 0)", ", ".join(f"{k} {v}" for k, v in n["violations"].items()) or "all 0"),
        ("failed but not doomed", f"{n['failed_not_doomed']}"
                                  + (f" ({'; '.join(f'{k[:60]}: {v}' for k, v in n['unexpected_failure_reasons'].items())})"
                                     if n["unexpected_failure_reasons"] else "")
                                  + (f"; {n['results_of_reaped_attempts']} of them with a result recorded by an attempt "
                                     "whose lease then ran out" if n.get("results_of_reaped_attempts") else "")),
        ("throughput", f"{n['throughput_under_faults']} jobs/s under faults ({n['fault_window_seconds']} s window), "
                       f"{n['throughput_overall']} jobs/s overall"),
        ("duration", f"{n['duration_seconds']} s (enqueue {n['enqueue_seconds']} s)"),
        ("exit codes after SIGTERM", codes),
        ("problems", ", ".join(f"{k}={v}" + (f" ({'; '.join(map(str, n['details'][k][:3]))})"
                                             if isinstance(n["details"].get(k), list) and n["details"][k] else "")
                               for k, v in n["problems"].items()) or "none"),
    ]
    width = max(len(r[0]) for r in rows)
    return "\n".join([f"| {'measure':<{width}} | value |", f"|{'-' * (width + 2)}|-------|"]
                     + [f"| {a:<{width}} | {b} |" for a, b in rows])


def markdown(outcome: Outcome, command: str, plan: Plan) -> str:
    n = outcome.numbers
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return f"""# Soak: last result

`{command}` on {when} ({platform.machine()}, {os.cpu_count()} cores shared with other work: load
average {n['load_average_1min'][0]} at the start, {n['load_average_1min'][1]} at the end; Python
{platform.python_version()}, {describe_flavour(plan.server)}), seed {n['seed']}.

**{outcome.verdict}**

{outcome.table}

Set-up: a throwaway server ({plan.server}); {plan.workers} `jobqueue worker --concurrency {plan.concurrency}
--lease-seconds {LEASE_SECONDS}` processes and gunicorn with {plan.web_workers} web processes of
{plan.embedded_workers} embedded workers each; faults for {plan.fault_seconds:g} s on a seeded
schedule, then a drain. See docs/soak-and-drill.md for what each check means.

Enqueue retries (same task_key): {json.dumps(n['enqueue_retries'], sort_keys=True)}. Fresh keys
acknowledged with `duplicate: true` because an earlier try had committed but its answer was lost
(the job exists once either way): {json.dumps(n['fresh_keys_acknowledged_as_duplicate'], sort_keys=True)}.
Log events across all processes:
{json.dumps(n['log_events'], sort_keys=True)}. Exit codes: {json.dumps(n['exit_codes'], sort_keys=True)}.
Faults that could not be injected when due: {len(n['fault_errors'])}{(': ' + '; '.join(n['fault_errors'][:5])) if n['fault_errors'] else ''}.
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m soak.run", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="about a minute: 1,200 jobs, 30 s of faults")
    parser.add_argument("--jobs", type=int, default=None)
    parser.add_argument("--seed", type=int, default=None, help="fault schedule and job mix (default: random)")
    parser.add_argument("--fault-seconds", type=float, default=None)
    parser.add_argument("--db-crash", action="store_true",
                        help="restart the database by SIGKILL (crash recovery) instead of a clean stop")
    parser.add_argument("--server", choices=sorted(FLAVOURS), default="mariadb",
                        help="the throwaway server: the machine's MariaDB, or the MySQL or MariaDB 11.8 root")
    parser.add_argument("--out", default=None,
                        help="markdown report (default docs/soak.md; with --quick, none)")
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
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1, 1_000_000)
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    workdir = Path(args.workdir or REPO / "test-artifacts" / f"soak-{stamp}")
    workdir.mkdir(parents=True, exist_ok=True)
    out = args.out if args.out is not None else (None if args.quick else str(REPO / "docs" / "soak.md"))

    outcome = run(plan, seed, workdir, say=lambda s: print(s, flush=True))
    print(outcome.verdict)
    print(outcome.table)
    if out:
        given = list(argv if argv is not None else sys.argv[1:])
        command = " ".join(["python -m soak.run", *given] + ([] if "--seed" in given else ["--seed", str(seed)]))
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(markdown(outcome, command, plan))
        print(f"report written to {out}")
    return 0 if outcome.passed else 1


if __name__ == "__main__":
    sys.exit(main())
