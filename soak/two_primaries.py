"""The two_primaries fault (issue 25): a second writable server in one worker's candidate list for
a spell, as after a failover that left the old primary writable.

A twin server (a throwaway mariadbd with the schema and a few ready decoy jobs) starts read-only,
as a standby would, and a worker named `twin` is given "<primary> <twin>". The fault makes the
twin writable for a spell, then read-only again. What must hold:

- nothing is claimed or written on the twin, ever (the worker uses one server at a time: the
  primary it chose; its decoys stay ready, no worker registers there);
- the twin worker sees both writable within its detection delay (it looks at every candidate every
  PEER_CHECK_SECONDS; MAX_DETECTION_SECONDS allows for a loaded machine) and says so in its log
  (event=split_brain); from that line until the twin is read-only again it claims nothing on the
  primary either (a claim cycle that was under way when the look found the twin may commit);
- after the spell it claims like any other worker (the soak then treats it as one).
"""

from __future__ import annotations

import re
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from jobqueue.core.db import PEER_CHECK_SECONDS
from testkit.throwaway import ThrowawayServer

NAME = "twin"  # the worker's --name: its lease owners read host:pid:twin:slot
DECOYS = 20
MAX_DETECTION_SECONDS = 2 * PEER_CHECK_SECONDS + 2  # a look's period, and a loaded machine's slowness
SEEN = re.compile(r"^(\S+ \S+),(\d+) ERROR jobqueue.worker event=split_brain ", re.M)


@dataclass
class Spell:
    writable_at: datetime  # the primary's clock, when the twin was made writable
    writable_wall: float  # time.time() after that read, before the twin is made writable
    read_only_at: datetime | None = None


def seen_at(log: str, after_wall: float) -> float | None:
    """time.time() of the worker's first split_brain line after `after_wall` (its log's local time)."""
    for m in SEEN.finditer(log):
        stamp = time.mktime(time.strptime(m.group(1), "%Y-%m-%d %H:%M:%S")) + int(m.group(2)) / 1000
        if stamp >= after_wall - 0.5:
            return stamp
    return None


def claims_stop_at(spell: Spell, log: str) -> tuple[datetime, float | None]:
    """From when the twin worker may start no claim in this spell (naive UTC, as the primary
    stamps started_at), and how long after the twin turned writable it said so (None: never): its
    split_brain line, or MAX_DETECTION_SECONDS after the spell began if it said so later or never.

    On the wall clock: the primary runs on this host, so its UTC_TIMESTAMP(6) is this clock. (Moving
    the line onto a clock read with the fault's own query, whose round trip took a while on a
    loaded machine, began the window before the line, where the worker still claimed, rightly.)
    The line's stamp is cut to the millisecond: it was written within the millisecond after it."""
    seen = seen_at(log, spell.writable_wall)
    delay = None if seen is None else seen - spell.writable_wall
    if seen is None or delay > MAX_DETECTION_SECONDS:
        since = spell.writable_wall + MAX_DETECTION_SECONDS
    else:
        since = seen + 0.001
    return datetime.fromtimestamp(since, UTC).replace(tzinfo=None), delay


class TwinServer:
    def __init__(self, workdir: Path, database: str, flavour: str = "mariadb"):
        self.server = ThrowawayServer(workdir / "twin", flavour=flavour)
        self.database = database
        self.ready = threading.Event()
        self.error: str | None = None
        self.spells: list[Spell] = []

    def start(self, env: dict, repo: Path, then) -> None:
        """Start, migrate and seed the twin in a thread of its own (it takes seconds), read-only;
        then call `then()`."""

        def run() -> None:
            try:
                self.server.start()
                url = self.server.create_database(self.database)
                out = subprocess.run(
                    [sys.executable, "-m", "jobqueue.cli", "--database-url", url, "init-db"],
                    capture_output=True,
                    text=True,
                    env=env,
                    cwd=repo,
                    timeout=120,
                )
                if out.returncode != 0:
                    raise RuntimeError(f"init-db on the twin failed: {out.stdout}{out.stderr}")
                values = ", ".join(
                    f"('twin-decoy-{n}', 'soak', 'default', 0, '{{\"kind\": \"noop\"}}', 'ready', "
                    "UTC_TIMESTAMP(6), 0, 4, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6))"
                    for n in range(DECOYS)
                )
                self.server.execute(
                    "INSERT INTO job_queue (task_key, task_name, queue, priority, payload, status, "
                    f"run_at, attempts, max_attempts, created_at, updated_at) VALUES {values}",
                    database=self.database,
                )
                self.server.execute("SET GLOBAL read_only = ON")
                then()
            except Exception as exc:
                self.error = f"{type(exc).__name__}: {exc}"
            finally:
                self.ready.set()

        threading.Thread(target=run, name="twin-server", daemon=True).start()

    def url(self) -> str:
        return self.server.url(self.database)

    def writable(self, on: bool) -> None:
        self.server.execute(f"SET GLOBAL read_only = {'OFF' if on else 'ON'}")

    def check(self, primary, worker_log: str) -> dict:
        """Numbers and problems, read from the primary (a pymysql connection) and the twin."""
        claimed_on_twin = self.server.execute(
            "SELECT COUNT(*) FROM job_queue WHERE attempts > 0 OR status <> 'ready'", database=self.database
        )[0][0]
        registered_on_twin = self.server.execute("SELECT COUNT(*) FROM worker_process", database=self.database)[0][0]
        owner = f"%:{NAME}:%"
        forbidden, delays, late, windows = [], [], 0, []
        with primary.cursor() as cur:
            for spell in self.spells:
                since, delay = claims_stop_at(spell, worker_log)
                delays.append(None if delay is None else round(delay, 1))
                if delay is None or delay > MAX_DETECTION_SECONDS:
                    late += 1
                until = spell.read_only_at
                windows.append(f"{since:%H:%M:%S.%f} - {until:%H:%M:%S.%f}")
                for sql in (
                    "SELECT id, started_at FROM job_queue WHERE lease_owner LIKE %s AND started_at BETWEEN %s AND %s",
                    "SELECT job_id, started_at FROM job_attempt WHERE worker LIKE %s AND started_at BETWEEN %s AND %s",
                ):
                    cur.execute(sql, (owner, since, until))
                    forbidden += [f"job {job_id} at {at:%H:%M:%S.%f}" for job_id, at in cur.fetchall()]
            cur.execute("SELECT COUNT(*) FROM job_queue WHERE lease_owner LIKE %s", (owner,))
            claimed_by_twin_worker = cur.fetchone()[0]
        problems = {}
        if claimed_on_twin or registered_on_twin:
            problems["written_on_the_twin"] = claimed_on_twin + registered_on_twin
        if forbidden:
            problems["claimed_while_two_primaries"] = len(forbidden)
        if late:
            problems["split_brain_not_seen_in_time"] = late
        return {
            "problems": problems,
            "numbers": {
                "spells": len(self.spells),
                "detection_seconds": delays,
                "writable_seconds": [round((s.read_only_at - s.writable_at).total_seconds(), 1) for s in self.spells],
                "claimed_on_twin": claimed_on_twin,
                "registered_on_twin": registered_on_twin,
                "claimed_on_primary_while_both_writable": len(forbidden),
                "claims_forbidden_utc": windows,  # from the worker's split_brain line to read-only again
                "claims_in_them": forbidden[:10],
                "jobs_last_claimed_by_the_twin_worker": claimed_by_twin_worker,
                "split_brain_log_lines": worker_log.count("event=split_brain "),
            },
        }

    def cleanup(self) -> None:
        self.server.cleanup()
