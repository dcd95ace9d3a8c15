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
import heapq
import http.client
import json
import os
import queue as queue_mod
import random
import re
import secrets
import shutil
import signal
import sys
import threading
import time
import traceback
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import pymysql

from drill import readonly
from drill.topology import APP_USER, REPO, AppHost, Topology, base_env, run_in, semi_sync_counts
from soak.checks import Execution, Observed, Row, Spec, check
from soak.run import NotNow, Proc

DB_NAME = "drill"
LEASE_SECONDS = 5
FAULT_KINDS = ("sigkill_worker", "sigkill_web_worker", "link_down", "replay", "failover")


@dataclass
class Plan:
    jobs: int = 20_000
    cli_jobs: int = 200
    hosts: int = 3
    web_workers: int = 2
    embedded_workers: int = 2
    concurrency: int = 4
    window_seconds: float = 300.0    # enqueues spread over it (at most: a busy machine is slower); faults inside it
    failover_at: float = 0.6         # fraction of the window
    worker_kills: int = 6
    web_kills: int = 2
    link_downs: int = 2
    link_down_seconds: float = 2 * LEASE_SECONDS + 2
    replays: int = 3
    replay_api_keys: int = 30
    replay_cli_keys: int = 3
    kills_after_failover: int = 1
    api_threads_per_host: int = 3
    cli_threads_per_host: int = 2     # a CLI enqueue is a process start: seconds each on a busy machine
    grace_seconds: float = 8.0
    drain_timeout: float = 300.0
    server: str = "mariadb"          # the throwaway servers' flavour: mariadb, mysql, mariadb11

    @classmethod
    def quick(cls) -> Plan:
        return cls(jobs=1500, cli_jobs=24, window_seconds=60.0, worker_kills=2, web_kills=1, link_downs=1,
                   replays=1, replay_api_keys=15, replay_cli_keys=1, drain_timeout=120.0, api_threads_per_host=2)


def job_specs(plan: Plan, rng: random.Random) -> list[tuple[Spec, dict]]:
    """(spec, payload) per job, the CLI ones spread evenly among the API ones."""
    out = []
    cli_every = max(1, plan.jobs // max(1, plan.cli_jobs)) if plan.cli_jobs else 0
    for i in range(plan.jobs):
        kind = rng.choices(("noop", "sleep", "flaky", "doomed"), weights=(45, 35, 12, 8))[0]
        payload: dict = {"kind": kind}
        if kind == "sleep":
            # A few outlast the lease (5 s): their leases must be renewed through the faults.
            payload["seconds"] = round(rng.uniform(5.5, 7.0) if rng.random() < 0.03 else rng.uniform(0.01, 0.3), 3)
        elif kind == "flaky":
            payload["fail_times"] = rng.randint(1, 2)
        via = "cli" if cli_every and i % cli_every == 0 and i // cli_every < plan.cli_jobs else "api"
        out.append((Spec(f"drill-{i:06d}-{kind}", kind, via, 2 if kind == "doomed" else 4), payload))
    return out


def fault_schedule(plan: Plan, rng: random.Random) -> list[tuple[float, str]]:
    """(seconds into the window, fault), sorted; the failover at plan.failover_at, the rest of the
    faults before it (so each is judged on its own), a few SIGKILLs after it."""
    window, failover = plan.window_seconds, plan.window_seconds * plan.failover_at
    before = failover - plan.link_down_seconds - 4
    events = [(failover, "failover")]
    for kind, n in (("sigkill_worker", plan.worker_kills), ("sigkill_web_worker", plan.web_kills),
                    ("link_down", plan.link_downs), ("replay", plan.replays)):
        for j in range(n):
            lo, hi = before * (0.1 + 0.9 * j / n), before * (0.1 + 0.9 * (j + 1) / n)
            events.append((rng.uniform(lo, hi), kind))
    for j in range(plan.kills_after_failover):
        events.append((rng.uniform(failover + 8, max(failover + 9, window * 0.85)), "sigkill_worker"))
    return sorted(events)


def utc(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, timezone.utc).replace(tzinfo=None)


class Drill:
    def __init__(self, plan: Plan, seed: int, workdir: Path, say=print):
        self.plan = plan
        self.seed = seed
        self.rng = random.Random(seed)
        self.workdir = workdir
        self.say = say
        self.logs = workdir / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.exec_log = workdir / "executions.log"
        self.exec_log.write_text("")
        self.token = secrets.token_urlsafe(32)
        self.topo: Topology | None = None
        self.hosts: list[AppHost] = []
        self.lock = threading.Lock()
        self.t0 = 0.0
        # What the enqueuers learned.
        self.specs: dict[str, Spec] = {}
        self.payloads: dict[str, dict] = {}
        self.acked: dict[str, int] = {}
        self.ack_times: list[float] = []
        self.fresh_duplicates: Counter = Counter()
        self.enqueue_retries: Counter = Counter()
        self.enqueue_gave_up: list[str] = []
        self.enqueue_rejected: list[str] = []
        self.replayed = 0
        self.replay_mismatches: list[str] = []
        self.replay_threads: list[threading.Thread] = []
        # What the faults did.
        self.faults: Counter = Counter()
        self.fault_errors: list[str] = []
        self.fault_log: list[str] = []
        self.killed_pids: set[int] = set()
        self.partitioned_pids: set[int] = set()
        self.down: set[str] = set()
        self.unexpected_exits: list[str] = []
        self.failover: dict = {}
        # The monitor's view.
        self.monitor_stop = threading.Event()
        self.last_seen: dict[int, tuple[int, str]] = {}
        self.attempts_backwards: list[dict] = []
        self.terminal_regressions: list[dict] = []
        self.monitor_samples = 0
        self.status_counts: Counter = Counter()

    # --- set-up ----------------------------------------------------------------------------------

    def host_env(self) -> dict[str, str]:
        from werkzeug.security import generate_password_hash

        return base_env(
            JOBQUEUE_DATABASE_URL=self.topo.candidate_urls(DB_NAME), JOBQUEUE_TASKS="soak.tasks",
            JOBQUEUE_API_TOKENS=f"drill:admin:{self.token}", JOBQUEUE_SECRET_KEY=secrets.token_hex(32),
            JOBQUEUE_USERS=f"drill:admin:{generate_password_hash(secrets.token_urlsafe(16))}",
            JOBQUEUE_SECURE_COOKIES="0", JOBQUEUE_LEASE_SECONDS=str(LEASE_SECONDS), JOBQUEUE_GRACE_SECONDS="2",
            SOAK_EXEC_LOG=str(self.exec_log))

    def worker_args(self) -> list[str]:
        return ["--concurrency", str(self.plan.concurrency), "--lease-seconds", str(LEASE_SECONDS),
                "--grace-seconds", str(self.plan.grace_seconds)]

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

    # --- enqueue ---------------------------------------------------------------------------------

    def _http(self, host: AppHost, method: str, path: str, body: dict | None, conn: http.client.HTTPConnection
              ) -> tuple[int, dict]:
        headers = {"Authorization": f"Bearer {self.token}"}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        conn.request(method, path, body=data, headers=headers)
        resp = conn.getresponse()
        raw = resp.read()
        try:
            return resp.status, (json.loads(raw) if raw else {})
        except ValueError:
            return resp.status, {"raw": raw[:200].decode(errors="replace")}

    def enqueue_api(self, spec: Spec, payload: dict, start_host: int, deadline_s: float = 240) -> tuple[str, dict | None]:
        """POST until a host answers 200/201, the same task_key on every try; on a host that does
        not answer, the next host (what a load balancer does)."""
        body = {"task": "soak", "task_key": spec.task_key, "payload": payload, "max_attempts": spec.max_attempts}
        deadline = time.monotonic() + deadline_s
        pause, tries, h = 0.1, 0, start_host
        while True:
            tries += 1
            host = self.hosts[h % len(self.hosts)]
            conn = http.client.HTTPConnection(host.address, 8000, timeout=8)
            try:
                sent = time.time()
                status, answer = self._http(host, "POST", "/api/jobs", body, conn)
                if status in (200, 201):
                    answer["_sent"] = sent
                    answer["_tries"] = tries
                    answer["_host"] = host.name
                    return "ok", answer
                if 400 <= status < 500:
                    return "rejected", {"status": status, **answer}
                self.enqueue_retries[f"api {status}"] += 1
            except (OSError, http.client.HTTPException) as exc:
                self.enqueue_retries[f"api {type(exc).__name__}"] += 1
                h += 1
            finally:
                conn.close()
            if time.monotonic() > deadline:
                return "gave_up", None
            time.sleep(pause * random.uniform(0.5, 1.5))
            pause = min(pause * 2, 2.0)

    def enqueue_cli(self, spec: Spec, payload: dict, start_host: int, deadline_s: float = 240) -> tuple[str, dict | None]:
        """`jobqueue enqueue` on a host, with the candidate URLs; exit 1 (database) or 75 (no
        writable primary) is tried again, on the next host after a timeout or exit 1."""
        argv = [sys.executable, "-m", "jobqueue.cli", "--log-level", "WARNING", "enqueue", "soak",
                "--key", spec.task_key, "--payload", json.dumps(payload), "--max-attempts", str(spec.max_attempts)]
        deadline = time.monotonic() + deadline_s
        pause, tries, h = 0.2, 0, start_host
        while True:
            tries += 1
            host = self.hosts[h % len(self.hosts)]
            try:
                sent = time.time()
                out = run_in(host.prefix, argv, host.env, timeout=45)
            except Exception as exc:   # subprocess.TimeoutExpired
                self.enqueue_retries[f"cli {type(exc).__name__}"] += 1
                h += 1
            else:
                if out.returncode == 0:
                    answer = json.loads(out.stdout.strip().splitlines()[-1])
                    answer["_sent"] = sent
                    answer["_tries"] = tries
                    answer["_host"] = host.name
                    return "ok", answer
                if out.returncode not in (1, 75):
                    return "rejected", {"code": out.returncode, "stderr": out.stderr[-500:]}
                self.enqueue_retries[f"cli exit {out.returncode}"] += 1
                if out.returncode == 1:
                    h += 1
            if time.monotonic() > deadline:
                return "gave_up", None
            time.sleep(pause * random.uniform(0.5, 1.5))
            pause = min(pause * 2, 2.0)

    def _record_ack(self, spec: Spec, outcome: str, answer: dict | None) -> None:
        with self.lock:
            if outcome == "ok":
                self.acked[spec.task_key] = int(answer["id"])
                self.ack_times.append((answer["_sent"], time.time()))
                if answer.get("duplicate"):
                    self.fresh_duplicates["after a client retry" if answer.get("_tries", 1) > 1
                                          else "in one request"] += 1
            elif outcome == "rejected":
                self.enqueue_rejected.append(f"{spec.task_key} via {spec.via}: {answer}")
            else:
                self.enqueue_gave_up.append(f"{spec.task_key} via {spec.via}")

    def run_enqueuers(self, jobs: list[tuple[Spec, dict]]) -> list[threading.Thread]:
        """Job i is due at i * pace: the enqueues span the window, failover included."""
        pace = self.plan.window_seconds * 0.9 / max(1, len(jobs))
        api_q: queue_mod.Queue = queue_mod.Queue()
        cli_q: queue_mod.Queue = queue_mod.Queue()
        for i, (spec, payload) in enumerate(jobs):
            self.specs[spec.task_key] = spec
            self.payloads[spec.task_key] = payload
            (cli_q if spec.via == "cli" else api_q).put((self.t0 + i * pace, spec, payload))

        def loop(q: queue_mod.Queue, enqueue, home: int):
            while True:
                try:
                    due, spec, payload = q.get_nowait()
                except queue_mod.Empty:
                    return
                wait = due - time.monotonic()
                if wait > 0:
                    time.sleep(wait)
                self._record_ack(spec, *enqueue(spec, payload, home))

        threads = []
        for h in range(len(self.hosts)):
            for n in range(self.plan.api_threads_per_host):
                threads.append(threading.Thread(target=_guarded(lambda h=h: loop(api_q, self.enqueue_api, h), self),
                                                name=f"api-{h}-{n}", daemon=True))
            for n in range(self.plan.cli_threads_per_host):
                threads.append(threading.Thread(target=_guarded(lambda h=h: loop(cli_q, self.enqueue_cli, h), self),
                                                name=f"cli-{h}-{n}", daemon=True))
        for t in threads:
            t.start()
        return threads

    # --- reading the primary ---------------------------------------------------------------------

    def connect_primary(self) -> pymysql.Connection:
        primary = self.topo.cluster.primary
        conn = pymysql.connect(host=primary.host, port=primary.port, user="root", password="", database=DB_NAME,
                               autocommit=True, connect_timeout=3, read_timeout=30, write_timeout=30, ssl_disabled=True)
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
                if conn is not None:
                    try:
                        conn.close()
                    except Exception:
                        pass
                conn = None
                self.monitor_stop.wait(0.5)
                continue
            counts: Counter = Counter()
            for job_id, attempts, status in rows:
                counts[status] += 1
                before = self.last_seen.get(job_id)
                if before is not None:
                    if attempts < before[0]:
                        self.attempts_backwards.append({"id": job_id, "from": before[0], "to": attempts})
                    if before[1] in ("done", "failed") and status != before[1]:
                        self.terminal_regressions.append({"id": job_id, "from": before[1], "to": status})
                self.last_seen[job_id] = (attempts, status)
            self.monitor_samples += 1
            self.status_counts = counts
            self.monitor_stop.wait(max(0.1, 1.0 - (time.monotonic() - started)))
        if conn is not None:
            conn.close()

    # --- faults ----------------------------------------------------------------------------------

    def note(self, text: str) -> None:
        self.fault_log.append(f"{time.monotonic() - self.t0:7.1f}s {text}")

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
            host.web_pids()   # remember every web process's pid, for the lease owners

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
        self.note(f"link down: {host.name} cut off for {self.plan.link_down_seconds:g} s (lease {LEASE_SECONDS} s), "
                  f"pids {sorted(pids)}")

        def back():
            self.topo.net.link_up(host.name)
            self.down.discard(host.name)
            self.note(f"link up: {host.name}")

        later(self.plan.link_down_seconds, back)

    def fault_replay(self, later) -> None:
        with self.lock:
            known = sorted(self.acked.items())
        n_api, n_cli = self.plan.replay_api_keys, self.plan.replay_cli_keys
        if len(known) < n_api + n_cli:
            raise NotNow("too few acknowledged keys to replay yet")
        sample = self.rng.sample(known, n_api + n_cli)

        def replay():
            for n, (key, job_id) in enumerate(sample):
                enqueue = self.enqueue_api if n < n_api else self.enqueue_cli
                outcome, answer = enqueue(self.specs[key], self.payloads[key], n)
                with self.lock:
                    self.replayed += 1
                    if outcome != "ok" or not answer.get("duplicate") or int(answer["id"]) != job_id:
                        self.replay_mismatches.append(f"{key} (id {job_id}): {outcome} {answer}")

        t = threading.Thread(target=_guarded(replay, self), name="replay", daemon=True)
        t.start()
        self.replay_threads.append(t)
        self.note(f"replaying {n_api} task_keys via the API and {n_cli} via the CLI, on every host")

    def fault_failover(self, later) -> None:
        """SIGKILL the primary, promote the replica, bring the old primary back read-only as the
        new primary's replica. The processes are told nothing."""
        cluster, old, new = self.topo.cluster, self.topo.db1, self.topo.db2
        semi_sync = {k: v - self.semi_sync_at_start.get(k, 0) for k, v in semi_sync_counts(old).items()}
        writable: list[float] = []
        execute = new.execute

        def traced(sql: str, database: str | None = None):
            sent = time.time()
            out = execute(sql, database)
            if sql.startswith("SET GLOBAL read_only = OFF"):
                writable.append(sent)     # no claim can run on it before this
            return out

        new.execute = traced   # promote() runs its statements through it
        poller = FirstClaim(new, DB_NAME, writable)
        killed_at = time.time()
        poller.start(killed_at)
        old.kill()
        general_log_at_kill = old.general_log_file.stat().st_size
        self.note("failover: SIGKILL the primary db1")
        new_primary = cluster.promote(new)
        promoted_at = time.time()
        self.note(f"failover: db2 promoted {promoted_at - killed_at:.2f} s after the kill")
        new.execute = execute
        # On MySQL the killed primary may hold a transaction it binlogged that the replica never
        # acknowledged: it is rebuilt from the new primary then, and the drill says so.
        cluster.demote(old, new_primary, rebuild=True)
        demoted_at = time.time()
        if old in cluster.discarded:
            self.note(f"failover: db1 held {cluster.discarded[old]} that db2 never got: rebuilt by CLONE from db2")
        self.note(f"failover: db1 back as a read-only replica of db2 {demoted_at - killed_at:.2f} s after the kill")
        self.failover = {"killed_at": killed_at, "promoted_at": promoted_at, "demoted_at": demoted_at,
                         "writable_at": writable[0] if writable else None,
                         "general_log_at_kill": general_log_at_kill,
                         "poller": poller, "semi_sync_before_kill": semi_sync,
                         "processes_at_kill": self.process_ids()}

    def process_ids(self) -> dict[int, str]:
        """pid -> host of every application process running now."""
        out = {}
        for h in self.hosts:
            for pid in h.pids():
                out[pid] = h.name
        return out

    def run_faults(self, schedule: list[tuple[float, str]]) -> None:
        """The schedule in real time; durational faults end from the same loop."""
        start = self.t0
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
            except Exception as exc:
                self.fault_errors.append(f"{kind}: {type(exc).__name__}: {exc}\n{traceback.format_exc()}")
                self.note(f"{kind} not injected: {exc}")
            self.check_unexpected_exits()

    def progress(self) -> None:
        c = self.status_counts
        self.say(f"[{time.monotonic() - self.t0:6.1f}s] acked {len(self.acked)}/{len(self.specs)}  "
                 + " ".join(f"{s} {c.get(s, 0)}" for s in ("ready", "scheduled", "running", "done", "failed"))
                 + f"  faults {sum(self.faults.values())}" + (f"  down {','.join(sorted(self.down))}" if self.down else ""))

    # --- drain and stop --------------------------------------------------------------------------

    def drain(self, enqueuers_done: threading.Event) -> bool:
        """Until every acknowledged job is finished; first, until the enqueuers are done (stopping
        the workers under a late enqueue would leave its job ready)."""
        deadline = time.monotonic() + self.plan.drain_timeout
        while not enqueuers_done.wait(5):
            self.progress()
            if time.monotonic() > deadline:
                return False
        deadline = time.monotonic() + self.plan.drain_timeout
        last_progress = 0.0
        while time.monotonic() < deadline:
            self.check_unexpected_exits()
            if time.monotonic() - last_progress >= 5:
                last_progress = time.monotonic()
                self.progress()
            try:
                conn = self.connect_primary()
                try:
                    with conn.cursor() as cur:
                        cur.execute("SELECT COUNT(*) FROM job_queue WHERE status IN ('ready', 'running', 'scheduled')")
                        open_jobs = cur.fetchone()[0]
                finally:
                    conn.close()
            except pymysql.MySQLError:
                open_jobs = -1
            if open_jobs == 0 and enqueuers_done.is_set():
                return True
            time.sleep(0.5)
        return False

    def stop_all(self) -> dict[str, int | None]:
        codes: dict[str, int | None] = {}
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not all(w.started() for h in self.hosts for w in h.workers if w.alive()):
            time.sleep(0.2)   # a replacement still importing has no SIGTERM handler yet
        for h in self.hosts:
            for w in h.workers:
                w.sigterm()
            if h.web is not None:
                h.web.sigterm()
        for h in self.hosts:
            for w in h.workers:
                codes[f"worker {w.name}"] = w.terminate(40)
            for w in h.all_workers:
                if not w._log.closed:
                    w._log.close()
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
        executions = []
        for line in self.exec_log.read_text().splitlines():
            key, attempt, worker, pid = line.split(" ")
            executions.append(Execution(key, int(attempt), worker, int(pid)))
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
                    explained[(key_of.get(job_id), attempt)] = ("in flight at the failover: its lease ran out "
                                                                "before its worker reached the new primary")
        return Observed(specs=self.specs, acked=dict(self.acked), rows=rows, results=results,
                        attempt_rows=[(r[0], r[1], r[2], r[3] or "") for r in attempt_rows], executions=executions,
                        attempts_backwards=self.attempts_backwards, terminal_regressions=self.terminal_regressions,
                        killed_pids=self.killed_pids, partitioned_pids=self.partitioned_pids, explained=explained)

    def failover_figures(self) -> dict:
        """Seconds from the primary's death: replica promoted, first claim on it, first
        acknowledged enqueue; and when each process that lived through it first claimed there."""
        f = self.failover
        if not f:
            return {}
        killed, promoted = f["killed_at"], f["promoted_at"]
        first_claim, writable = f["poller"].result()
        # Acknowledgements of requests sent after the kill, and the longest silence around it.
        after = [acked for sent, acked in self.ack_times if sent > killed]
        acks = sorted(acked for _, acked in self.ack_times if killed - 5 <= acked <= killed + 60)
        gap = max((b - a for a, b in zip(acks, acks[1:])), default=None)
        conn = self.connect_primary()
        try:
            with conn.cursor() as cur:
                cur.execute("SELECT lease_owner, started_at FROM job_queue WHERE started_at >= %s "
                            "UNION ALL SELECT worker, started_at FROM job_attempt WHERE started_at >= %s",
                            (utc(writable or promoted), utc(writable or promoted)))
                claims = cur.fetchall()
                cur.execute("SELECT id, pid, last_heartbeat, stopped_at FROM worker_process")
                beats = cur.fetchall()
        finally:
            conn.close()
        first_by_pid: dict[int, float] = {}
        for owner, started in claims:
            if not owner or started is None:
                continue            # a retried job waits with no owner
            pid = int(owner.split(":")[1])
            seconds = started.replace(tzinfo=timezone.utc).timestamp() - killed
            first_by_pid[pid] = min(first_by_pid.get(pid, seconds), seconds)
        survivors = {pid: host for pid, host in f["processes_at_kill"].items()
                     if pid not in self.killed_pids and _is_worker_pid(pid, self.hosts)}
        heard = {pid for _, pid, last, _ in beats if last.replace(tzinfo=timezone.utc).timestamp() > promoted}
        missing = sorted(f"{host}:{pid}" for pid, host in survivors.items() if pid not in first_by_pid)
        per_process = sorted((round(first_by_pid[pid], 2), f"{host}:{pid}") for pid, host in survivors.items()
                             if pid in first_by_pid)
        reactions = sorted(first_by_pid[pid] for pid in survivors if pid in first_by_pid)
        return {
            "promoted_seconds": round(promoted - killed, 2),
            "writable_seconds": round(writable - killed, 2) if writable else None,
            "first_claim_after_writable_seconds": round(first_claim - writable, 2) if first_claim and writable else None,
            "demoted_seconds": round(f["demoted_at"] - killed, 2),
            "old_primary_rebuilt_without": self.topo.cluster.discarded.get(self.topo.db1),
            "first_claim_seconds": round(first_claim - killed, 2) if first_claim else None,
            "first_ack_seconds": round(min(after) - killed, 2) if after else None,
            "enqueue_gap_seconds": round(gap, 2) if gap is not None else None,
            "processes_through_failover": len(survivors),
            "processes_claiming_on_new_primary": len(reactions),
            "processes_never_claimed_on_new_primary": missing,
            "processes_without_heartbeat_on_new_primary": sorted(
                f"{host}:{pid}" for pid, host in survivors.items() if pid not in heard),
            "slowest_process_first_claim_seconds": round(reactions[-1], 2) if reactions else None,
            "median_process_first_claim_seconds": round(reactions[len(reactions) // 2], 2) if reactions else None,
            "semi_sync_before_kill": f["semi_sync_before_kill"],
            "first_claim_by_process": per_process,
        }


def _is_worker_pid(pid: int, hosts: list[AppHost]) -> bool:
    """A process that claims: a standalone worker or a gunicorn web process (not a master)."""
    return not any(h.web is not None and h.web.pid == pid for h in hosts)


class FirstClaim:
    """Polls the new primary from the moment the old one dies for the first job claimed on it:
    the earliest started_at (the database clock at the claim; all servers share this machine's
    clock) not before the promotion's `SET GLOBAL read_only = OFF` was sent (`writable`, filled
    in by the failover when it is). Claims the old primary made just before its death replicate
    too, with earlier times."""

    def __init__(self, server, database: str, writable: list[float]):
        self.server = server
        self.database = database
        self.writable = writable
        self._found: float | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, since: float) -> None:
        self._thread = threading.Thread(target=self._run, name="first-claim", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        deadline = time.monotonic() + 120
        found_at = None
        while not self._stop.is_set() and time.monotonic() < deadline:
            if not self.writable:
                self._stop.wait(0.05)
                continue
            since = utc(self.writable[0])
            try:
                rows = self.server.execute(
                    f"SELECT LEAST(COALESCE((SELECT MIN(started_at) FROM job_queue WHERE started_at >= '{since}'), "
                    f"'9999-01-01'), COALESCE((SELECT MIN(started_at) FROM job_attempt WHERE started_at >= "
                    f"'{since}'), '9999-01-01'))", database=self.database)
                value = rows[0][0]
                if isinstance(value, str):
                    value = datetime.fromisoformat(value)
                if value is not None and value.year < 9999:
                    ts = value.replace(tzinfo=timezone.utc).timestamp()
                    self._found = ts if self._found is None else min(self._found, ts)
                    found_at = found_at or time.monotonic()
                    if time.monotonic() - found_at > 2:   # a claim committed a moment later may have started earlier
                        return
            except pymysql.MySQLError:
                pass
            self._stop.wait(0.1)

    def result(self) -> tuple[float | None, float | None]:
        """(first claim on the new primary, when it was made writable), as time.time() values."""
        if self._thread is not None:
            self._thread.join(5)
        return self._found, (self.writable[0] if self.writable else None)


def _guarded(fn, drill: Drill):
    def run():
        try:
            fn()
        except Exception:
            drill.fault_errors.append(f"thread {threading.current_thread().name} crashed:\n{traceback.format_exc()}")
    return run


# --- the whole run ---------------------------------------------------------------------------------

@dataclass
class Outcome:
    passed: bool
    verdict: str
    table: str
    numbers: dict = field(default_factory=dict)


def run(plan: Plan, seed: int, workdir: Path, say=print, throughput_steps=None) -> Outcome:
    drill = Drill(plan, seed, workdir, say=say)
    load_before = os.getloadavg()[0]
    jobs = job_specs(plan, drill.rng)
    schedule = fault_schedule(plan, drill.rng)
    (workdir / "schedule.json").write_text(json.dumps([{"at": round(t, 2), "fault": k} for t, k in schedule], indent=1))
    say(f"drill: {plan.jobs} jobs, seed {seed}, {len(schedule)} scheduled faults over {plan.window_seconds:g} s; "
        f"logs in {workdir}")
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
        drill.run_faults(schedule)
        fault_end = time.monotonic()
        for t in drill.replay_threads:
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
                read_only_windows = [readonly.replica_before_promotion(drill.topo.db2, APP_USER),
                                     readonly.old_primary_after_demotion(
                                         drill.topo.db1, APP_USER, drill.failover["general_log_at_kill"],
                                         workdir / "db1-general-after-demotion.log")]
                binlog = readonly.binlog_verdict(drill.topo.db1, drill.topo.db2)
        except Exception:
            drill.fault_errors.append(f"reading the failover figures crashed:\n{traceback.format_exc()}")
    finally:
        drill.monitor_stop.set()
        drill.kill_everything()
        if drill.topo is not None:
            drill.topo.cleanup()
            for name in ("db1", "db2"):   # the data (hundreds of MB); the logs stay
                shutil.rmtree(workdir / "servers" / name / "data", ignore_errors=True)

    findings = check(obs)
    duplicates = duplicate_runs(obs)
    wall = drain_end - drill.t0
    finished = sum(1 for r in obs.rows if r.status in ("done", "failed"))
    numbers = {
        "seed": seed, "jobs": plan.jobs, "hosts": plan.hosts, "server": plan.server,
        "jobs_api": sum(1 for s in drill.specs.values() if s.via == "api"),
        "jobs_cli": sum(1 for s in drill.specs.values() if s.via == "cli"),
        "acked": len(drill.acked),
        "by_kind": {k: dict(v) for k, v in sorted(findings.by_kind.items())},
        "faults": {k: drill.faults.get(k, 0) for k in FAULT_KINDS},
        "replayed_keys": drill.replayed,
        "lost": findings.get("lost"),
        "duplicate_results": findings.get("duplicate_results"),
        "duplicate_executions": findings.get("duplicate_executions"),
        "extra_executions": findings.get("extra_executions"),
        "duplicate_causes": dict(findings.duplicate_causes.most_common()),
        "executions": findings.get("executions"),
        "attempts_backwards": findings.get("attempts_backwards"),
        "failed_not_doomed": findings.get("failed_not_doomed"),
        "unexpected_failure_reasons": dict(findings.unexpected_failures.most_common(5)),
        "failover": failover,
        "read_only": [vars(w) for w in read_only_windows],
        "binlog": vars(binlog) if binlog else None,
        "monitor_samples": drill.monitor_samples,
        "setup_seconds": round(getattr(drill, "setup_seconds", 0.0), 1),
        "duration_seconds": round(wall, 1),
        "enqueue_seconds": round(getattr(drill, "enqueue_seconds", float("nan")), 1),
        "throughput_overall": round(finished / max(1e-9, wall), 1),
        "exit_codes": codes,
        "load_average_1min": [round(load_before, 1), round(os.getloadavg()[0], 1)],
        "enqueue_retries": dict(drill.enqueue_retries),
        "fresh_keys_acknowledged_as_duplicate": dict(drill.fresh_duplicates),
        "log_events": dict(log_counts(drill)),
        "fault_errors": drill.fault_errors,
        "violations": findings.violations(),
        "examples": {k: v for k, v in findings.examples.items() if k in findings.violations()},
        "duplicate_runs": duplicates[:40],
        "throughput": throughput,
        "finished_at": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
    }
    problems = dict(findings.violations())
    if not drained:
        problems["drain_timed_out"] = 1
    for name, items in (("enqueue_gave_up", drill.enqueue_gave_up), ("enqueue_rejected", drill.enqueue_rejected),
                        ("replay_mismatches", drill.replay_mismatches), ("unexpected_exits", drill.unexpected_exits)):
        if items:
            problems[name] = len(items)
    bad_codes = {k: v for k, v in codes.items() if v != 0}
    if bad_codes:
        problems["nonzero_exit_codes"] = len(bad_codes)
    missing = [k for k in FAULT_KINDS if drill.faults.get(k, 0) == 0 and any(kind == k for _, kind in schedule)]
    if missing:
        problems["faults_not_injected"] = len(missing)
    if any("crashed" in e for e in drill.fault_errors):
        problems["harness_thread_crashed"] = 1
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
        "enqueue_gave_up": drill.enqueue_gave_up[:10], "enqueue_rejected": drill.enqueue_rejected[:10],
        "replay_mismatches": drill.replay_mismatches[:10], "unexpected_exits": drill.unexpected_exits,
        "nonzero_exit_codes": bad_codes, "faults_not_injected": missing,
    }
    passed = not problems
    first_claim = failover.get("first_claim_seconds") if failover else None
    verdict = (f"DRILL {'PASS' if passed else 'FAIL'}: {plan.jobs} jobs on {plan.hosts} hosts, "
               f"{sum(numbers['faults'].values())} faults and a failover, {numbers['lost']} lost, "
               f"{numbers['duplicate_results']} duplicate results, {numbers['duplicate_executions']} duplicate "
               f"executions, first claim on the new primary {first_claim} s after the old one died"
               + ("" if passed else f"; problems: {', '.join(f'{k}={v}' for k, v in problems.items())}"))
    (workdir / "results.json").write_text(json.dumps({"verdict": verdict, "passed": passed, **numbers},
                                                     indent=1, default=str))
    (workdir / "faults.log").write_text("\n".join(drill.fault_log) + "\n")
    from drill.report import table
    return Outcome(passed, verdict, table(numbers), numbers)


def duplicate_runs(obs: Observed) -> list[dict]:
    """Every run of the task_keys that ran more than once, with the cause soak/checks.py gives
    the superseded ones: what the report's causes are made of."""
    from soak.checks import _cause

    by_key = {r.task_key: r for r in obs.rows}
    outcome_of = {(job_id, attempt): (outcome, error) for job_id, attempt, outcome, error in obs.attempt_rows}
    runs: dict[str, list[Execution]] = {}
    for ex in obs.executions:
        runs.setdefault(ex.task_key, []).append(ex)
    out = []
    for key, items in sorted(runs.items()):
        if len(items) < 2 or key not in by_key:
            continue
        row = by_key[key]
        out.append({"task_key": key, "final": f"{row.status} at attempt {row.attempts}", "runs": [
            {"attempt": ex.attempt, "worker": ex.worker,
             "cause": None if row.status == "done" and ex.attempt == row.attempts
             else _cause(ex, outcome_of.get((row.id, ex.attempt)), obs)} for ex in items]})
    return out


def log_counts(drill: Drill) -> Counter:
    counts: Counter = Counter()
    paths = [w.log_path for h in drill.hosts for w in h.all_workers] + [h.web.log_path for h in drill.hosts if h.web]
    for path in paths:
        try:
            text = path.read_text(errors="replace")
        except OSError:
            continue
        for name in ("lease_lost", "reclaimed", "sql_error", "db_retry", "duplicate_result", "finish_abandoned",
                     "not_primary", "primary_found", "claiming_resumed", "write_refused", "claim_mismatch"):
            counts[name] += len(re.findall(rf"event={name} ", text))
        counts["Traceback"] += text.count("Traceback (most recent call last)")
    return counts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m drill.run", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a few minutes: 1,500 jobs, 60 s window, no throughput steps")
    parser.add_argument("--jobs", type=int, default=None)
    parser.add_argument("--seed", type=int, default=None, help="job mix and fault schedule (default: random)")
    parser.add_argument("--window-seconds", type=float, default=None)
    parser.add_argument("--skip-throughput", action="store_true", help="no throughput steps (1, 2, 3 hosts)")
    parser.add_argument("--throughput-jobs", type=int, default=None, help="jobs per throughput step")
    parser.add_argument("--server", choices=("mariadb", "mysql", "mariadb11"), default="mariadb",
                        help="the database hosts' server: the machine's MariaDB, or the MySQL or MariaDB 11.8 root")
    parser.add_argument("--out", default=None, help="markdown report (default docs/scale-out.md; with --quick, none)")
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
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1, 1_000_000)
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    workdir = Path(args.workdir or REPO / "test-artifacts" / f"drill-{stamp}")
    workdir.mkdir(parents=True, exist_ok=True)
    out = args.out if args.out is not None else (None if args.quick else str(REPO / "docs" / "scale-out.md"))
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
        if "--workdir" in given:   # where the logs went: not part of what to run again
            i = given.index("--workdir")
            del given[i:i + 2]
        command = " ".join(["python -m drill.run", *given] + ([] if "--seed" in given else ["--seed", str(seed)]))
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(markdown(outcome, command, plan, Path(out).parent))
        print(f"report written to {out}")
    return 0 if outcome.passed else 1


if __name__ == "__main__":
    sys.exit(main())
