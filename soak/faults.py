"""The soak's faults on processes and the server: signals to workers and gunicorn, a partition,
killed connections, a restart, a read-only spell, held rows, an operator's forced requeue, and
two writable primaries."""

from __future__ import annotations

import os
import signal
import sys
import time

import pymysql

from soak.plan import DB_NAME, LEASE_SECONDS
from soak.two_primaries import NAME as TWIN_WORKER
from soak.two_primaries import Spell
from testkit.faults import NotNow, Proc, gunicorn_children


class ProcessFaults:
    """The `fault_<kind>` methods of `Soak` (soak/run.py) that hit its processes and its server."""

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
                self.unexpected_exits.append(
                    f"worker {victim.name} (pid {victim.pid}) after SIGTERM: "
                    f"{'still running' if code is None else f'exit {code}'}"
                )
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
        self.stop_worker(victim)
        self.note(
            f"SIGSTOP worker {victim.name} (pid {victim.pid}) for {self.plan.stop_seconds:g} s "
            f"(lease {LEASE_SECONDS} s)"
        )
        later(self.plan.stop_seconds, lambda: self.continue_worker(victim))

    def stop_worker(self, victim: Proc) -> None:
        victim.signal(signal.SIGSTOP)
        victim.stopped = True
        self.stopped_pids.add(victim.pid)

    def continue_worker(self, victim: Proc) -> None:
        victim.signal(signal.SIGCONT)
        victim.stopped = False
        victim.fate = "stopped-then-continued"
        self.note(f"SIGCONT worker {victim.name} (pid {victim.pid})")

    def fault_force_requeue(self, later) -> None:
        """An operator's forced requeue of a running job (preferably a long one): the old attempt's
        lease is fenced, its handler told within a renewal; the job runs again as attempt + 1."""
        conn = self._connect()
        try:
            with conn.cursor() as cur:
                cur.execute(
                    "SELECT id, task_key, attempts FROM job_queue WHERE status = 'running' ORDER BY started_at LIMIT 20"
                )
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
        self.note(
            f"two primaries: the twin is writable for {self.plan.two_primaries_seconds:g} s "
            f"(worker {TWIN_WORKER} lists both)"
        )

        def back():
            # Read before the flip: on a loaded host the read may take seconds, and claims after the
            # flip are the worker's right.
            spell.read_only_at = self._db_now()
            twin.writable(False)
            twin.spells.append(spell)
            self.note("two primaries: the twin is read-only again")
            if self.twin_worker not in self.workers:
                self.workers.append(self.twin_worker)  # a worker like the others from now on

        later(self.plan.two_primaries_seconds, back)

    def start_twin_worker(self) -> None:
        """The worker whose candidates are "<primary> <twin>", as soon as the twin is ready: it
        claims on the primary like the others until the two_primaries fault."""
        self.twin_worker = Proc(
            TWIN_WORKER,
            [
                sys.executable,
                "-m",
                "jobqueue.cli",
                "--database-url",
                f"{self.url} {self.twin.url()}",
                "worker",
                "--name",
                TWIN_WORKER,
                "--concurrency",
                str(self.plan.concurrency),
                "--lease-seconds",
                str(LEASE_SECONDS),
                "--grace-seconds",
                str(self.plan.grace_seconds),
                "--tasks",
                "soak.tasks",
            ],
            self.base_env(),
            self.logs / f"worker-{TWIN_WORKER}.log",
        )
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
        self.note(
            f"partition: {', '.join(w.name for w in victims)} cut off from the database for "
            f"{self.plan.partition_seconds:g} s (lease {LEASE_SECONDS} s)"
        )

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
                cur.execute(
                    "SELECT ID FROM information_schema.PROCESSLIST WHERE DB = %s AND COMMAND <> 'Daemon'", (DB_NAME,)
                )
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
                cur.execute(
                    "SELECT id FROM job_queue WHERE status = 'ready' ORDER BY priority, id "
                    f"LIMIT {int(self.plan.hold_rows)}"
                )
                ids = [row[0] for row in cur.fetchall()] or [0]
                cur.execute(
                    f"SELECT id, attempts FROM job_queue FORCE INDEX (PRIMARY) WHERE id IN "
                    f"({','.join(map(str, ids))}) AND status = 'ready' FOR UPDATE SKIP LOCKED"
                )
                held = cur.fetchall()
        except BaseException:
            conn.close()
            raise
        if not held:
            conn.close()
            raise NotNow("no ready rows to hold")
        self.note(
            f"holding {len(held)} ready rows {[r[0] for r in held]} in a paused transaction "
            f"for {self.plan.hold_seconds:g} s"
        )

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
                        self.held_touched.append(
                            f"job {job_id}: held as ready/attempts {attempts}, now {now.get(job_id)}"
                        )
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
