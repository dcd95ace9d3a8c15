"""The drill's failover: the primary killed, the replica promoted, the old primary back as its
read-only replica; and the figures of how fast every process found the new primary."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime

import pymysql

from drill.plan import DB_NAME
from drill.topology import AppHost, semi_sync_counts


def utc(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, UTC).replace(tzinfo=None)


class Failover:
    """The failover fault of `Drill` (drill/run.py) and its figures."""

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
                writable.append(sent)  # no claim can run on it before this
            return out

        new.execute = traced  # promote() runs its statements through it
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
        self.failover = {
            "killed_at": killed_at,
            "promoted_at": promoted_at,
            "demoted_at": demoted_at,
            "writable_at": writable[0] if writable else None,
            "general_log_at_kill": general_log_at_kill,
            "poller": poller,
            "semi_sync_before_kill": semi_sync,
            "processes_at_kill": self.process_ids(),
        }

    def process_ids(self) -> dict[int, str]:
        """pid -> host of every application process running now."""
        out = {}
        for h in self.hosts:
            for pid in h.pids():
                out[pid] = h.name
        return out

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
                cur.execute(
                    "SELECT lease_owner, started_at FROM job_queue WHERE started_at >= %s "
                    "UNION ALL SELECT worker, started_at FROM job_attempt WHERE started_at >= %s",
                    (utc(writable or promoted), utc(writable or promoted)),
                )
                claims = cur.fetchall()
                cur.execute("SELECT id, pid, last_heartbeat, stopped_at FROM worker_process")
                beats = cur.fetchall()
        finally:
            conn.close()
        first_by_pid: dict[int, float] = {}
        for owner, started in claims:
            if not owner or started is None:
                continue  # a retried job waits with no owner
            pid = int(owner.split(":")[1])
            seconds = started.replace(tzinfo=UTC).timestamp() - killed
            first_by_pid[pid] = min(first_by_pid.get(pid, seconds), seconds)
        survivors = {
            pid: host
            for pid, host in f["processes_at_kill"].items()
            if pid not in self.killed_pids and _is_worker_pid(pid, self.hosts)
        }
        heard = {pid for _, pid, last, _ in beats if last.replace(tzinfo=UTC).timestamp() > promoted}
        missing = sorted(f"{host}:{pid}" for pid, host in survivors.items() if pid not in first_by_pid)
        per_process = sorted(
            (round(first_by_pid[pid], 2), f"{host}:{pid}") for pid, host in survivors.items() if pid in first_by_pid
        )
        reactions = sorted(first_by_pid[pid] for pid in survivors if pid in first_by_pid)
        return {
            "promoted_seconds": round(promoted - killed, 2),
            "writable_seconds": round(writable - killed, 2) if writable else None,
            "first_claim_after_writable_seconds": round(first_claim - writable, 2)
            if first_claim and writable
            else None,
            "demoted_seconds": round(f["demoted_at"] - killed, 2),
            "old_primary_rebuilt_without": self.topo.cluster.discarded.get(self.topo.db1),
            "first_claim_seconds": round(first_claim - killed, 2) if first_claim else None,
            "first_ack_seconds": round(min(after) - killed, 2) if after else None,
            "enqueue_gap_seconds": round(gap, 2) if gap is not None else None,
            "processes_through_failover": len(survivors),
            "processes_claiming_on_new_primary": len(reactions),
            "processes_never_claimed_on_new_primary": missing,
            "processes_without_heartbeat_on_new_primary": sorted(
                f"{host}:{pid}" for pid, host in survivors.items() if pid not in heard
            ),
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
                    f"'{since}'), '9999-01-01'))",
                    database=self.database,
                )
                value = rows[0][0]
                if isinstance(value, str):
                    value = datetime.fromisoformat(value)
                if value is not None and value.year < 9999:
                    ts = value.replace(tzinfo=UTC).timestamp()
                    self._found = ts if self._found is None else min(self._found, ts)
                    found_at = found_at or time.monotonic()
                    if time.monotonic() - found_at > 2:  # a claim committed a moment later may have started earlier
                        return
            except pymysql.MySQLError:
                pass
            self._stop.wait(0.1)

    def result(self) -> tuple[float | None, float | None]:
        """(first claim on the new primary, when it was made writable), as time.time() values."""
        if self._thread is not None:
            self._thread.join(5)
        return self._found, (self.writable[0] if self.writable else None)
