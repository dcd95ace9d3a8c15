"""What every scenario shares: throwaway databases, enqueueing, worker subprocesses, the
processing window read from the database, CPU accounting and small statistics helpers."""

from __future__ import annotations

import contextlib
import json
import os
import platform
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.pool import NullPool

from bench.gate import Gate
from jobqueue.core import service
from jobqueue.core.db import create_engine
from jobqueue.core.migrate import init_db
from jobqueue.core.task_modules import load_task_modules

REPO = Path(__file__).resolve().parents[1]
MYSQL_SERVER = os.environ.get("BENCH_MYSQL", "mysql+pymysql://root@127.0.0.1:3306")
PG_SERVER = os.environ.get("BENCH_PG", "postgresql://postgres@127.0.0.1:5432")
REDIS_URL = os.environ.get("BENCH_REDIS", "redis://127.0.0.1:6379/0")
RUN_TAG = f"jqb{uuid.uuid4().hex[:8]}"  # every database/key this run creates starts with it

load_task_modules()


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# --- statistics -----------------------------------------------------------------------------------


def median(xs: list[float]) -> float:
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else float("nan")


def percentile(xs: list[float], p: float) -> float:
    """Nearest-rank percentile (p in 0..100)."""
    xs = sorted(x for x in xs if x is not None)
    if not xs:
        return float("nan")
    k = max(0, min(len(xs) - 1, int(round(p / 100 * len(xs) + 0.5)) - 1))
    return xs[k]


def ratio(a: float, b: float) -> float:
    return a / b if b else float("nan")


# --- MariaDB databases ------------------------------------------------------------------------------

_created_mysql: set[str] = set()


def _admin(server: str | None = None) -> sa.Engine:
    return sa.create_engine((server or MYSQL_SERVER) + "/", poolclass=NullPool)


def mysql_url(name: str, server: str | None = None) -> str:
    return f"{server or MYSQL_SERVER}/{name}"


def create_mysql_db(label: str, *, schema: bool = True, server: str | None = None) -> str:
    """A fresh database on `server` (MYSQL_SERVER by default) with the real schema (`init-db`;
    empty with schema=False); returns its URL."""
    name = f"{RUN_TAG}_{label}_{uuid.uuid4().hex[:6]}"[:64]
    url = mysql_url(name, server)
    admin = _admin(server)
    with admin.connect() as conn:
        conn.exec_driver_sql(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4 COLLATE utf8mb4_bin")
    admin.dispose()
    _created_mysql.add(url)
    if not schema:
        return url
    engine = create_engine(url, pool_size=1)
    try:
        init_db(engine)
    finally:
        engine.dispose()
    return url


def drop_mysql_db(url: str) -> None:
    server, name = url.rsplit("/", 1)
    admin = _admin(server)
    with admin.connect() as conn:
        conn.exec_driver_sql(f"DROP DATABASE IF EXISTS `{name}`")
    admin.dispose()
    _created_mysql.discard(url)


@contextlib.contextmanager
def mysql_db(label: str, server: str | None = None) -> Iterator[str]:
    url = create_mysql_db(label, server=server)
    try:
        yield url
    finally:
        drop_mysql_db(url)


def drop_leftovers() -> None:
    """After an interrupted run: stop our subprocesses still running, drop our databases."""
    for run in list(_live_runs):
        with contextlib.suppress(Exception):
            run.stop(signal.SIGTERM, timeout=10)
    for url in list(_created_mysql):
        with contextlib.suppress(Exception):
            drop_mysql_db(url)


def enqueue_noops(
    url: str, n: int, *, batch: int = 1000, prefix: str = "b", start: int = 0, task: str = "noop"
) -> float:
    """Enqueue n jobs with service.enqueue_many in batches; returns the seconds it took."""
    engine = create_engine(url, pool_size=1)
    try:
        with engine.connect() as conn:
            t0 = time.perf_counter()
            for lo in range(start, start + n, batch):
                hi = min(start + n, lo + batch)
                service.enqueue_many(conn, [{"task": task, "task_key": f"{prefix}{i}"} for i in range(lo, hi)])
            return time.perf_counter() - t0
    finally:
        engine.dispose()


def enqueue_one_by_one(url: str, n: int, *, prefix: str = "s", start: int = 0, task: str = "noop") -> float:
    """Enqueue n jobs with service.enqueue, one call (one transaction) each."""
    engine = create_engine(url, pool_size=1)
    try:
        with engine.connect() as conn:
            t0 = time.perf_counter()
            for i in range(start, start + n):
                service.enqueue(conn, task, f"{prefix}{i}")
            return time.perf_counter() - t0
    finally:
        engine.dispose()


@dataclass
class Window:
    """The processing window read from the database: first claim to last completion."""

    done: int
    first_start: datetime | None
    last_finish: datetime | None
    claims: int = 0  # distinct claim transactions (same started_at and claimer)

    @property
    def seconds(self) -> float:
        if not self.first_start or not self.last_finish:
            return float("nan")
        return (self.last_finish - self.first_start).total_seconds()

    @property
    def jobs_per_s(self) -> float:
        s = self.seconds
        return self.done / s if s and s > 0 else float("nan")

    @property
    def mean_batch(self) -> float:
        return self.done / self.claims if self.claims else float("nan")


def db_window(url: str, *, claimer_parts: int = 2, min_id: int = 0) -> Window:
    """MIN(started_at)..MAX(finished_at) of the done jobs. A claim sets started_at to one
    UTC_TIMESTAMP(6) for all its rows, so rows sharing started_at and claimer (the first
    `claimer_parts` ':'-separated parts of lease_owner: host:pid for our worker, whose slots share
    claims; the whole owner for the raw loop's threads) are one claim. Rows with id <= min_id
    (preloaded history) are left out."""
    engine = sa.create_engine(url, poolclass=NullPool)
    try:
        with engine.connect() as conn:
            row = conn.exec_driver_sql(
                "SELECT COUNT(*), MIN(started_at), MAX(finished_at) FROM job_queue "
                f"WHERE status='done' AND id > {int(min_id)}"
            ).one()
            claims = conn.exec_driver_sql(
                f"SELECT COUNT(*) FROM (SELECT 1 FROM job_queue WHERE status='done' AND id > {int(min_id)} "
                f"GROUP BY started_at, SUBSTRING_INDEX(lease_owner, ':', {int(claimer_parts)})) t"
            ).scalar()
        return Window(row[0], row[1], row[2], claims)
    finally:
        engine.dispose()


def count_status(url: str) -> dict[str, int]:
    engine = sa.create_engine(url, poolclass=NullPool)
    try:
        with engine.connect() as conn:
            return dict(conn.exec_driver_sql("SELECT status, COUNT(*) FROM job_queue GROUP BY status").all())
    finally:
        engine.dispose()


# --- subprocesses -----------------------------------------------------------------------------------

# The workers' own retention would delete the finished rows some scenarios load on purpose (claim
# cost at 1,000,000 done rows, the dashboard at a million rows): benchmarks keep everything
# unless a scenario says otherwise (bench/mature.py measures pruning with its own prune).
KEEP_EVERYTHING = {"JOBQUEUE_KEEP_DONE_DAYS": "0", "JOBQUEUE_KEEP_FAILED_DAYS": "0"}


def child_env(**extra: str) -> dict[str, str]:
    env = {**KEEP_EVERYTHING, **os.environ}
    # As installed for users: Python writes and reuses bytecode. A session that sets
    # PYTHONDONTWRITEBYTECODE would have every child compile our modules anew (about 0.1 s of each
    # start-up here), which no operator's process pays after its first run.
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPATH"] = str(REPO) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


def jobqueue_cmd() -> list[str]:
    """The installed `jobqueue` console script next to this interpreter (what operators run)."""
    script = Path(sys.executable).with_name("jobqueue")
    return [str(script)] if script.exists() else [sys.executable, "-m", "jobqueue.cli"]


def worker_cmd(
    url: str,
    concurrency: int,
    *extra: str,
    burst: bool = True,
    tasks: str = "bench.gate_tasks",
    log_level: str | None = None,
) -> list[str]:
    """`jobqueue worker` as an operator runs it: at the default log level (INFO: one line per
    finished attempt) unless `log_level` says otherwise."""
    level = ["--log-level", log_level] if log_level else []
    return [
        *jobqueue_cmd(),
        "--database-url",
        url,
        *level,
        "worker",
        "--concurrency",
        str(concurrency),
        *(["--burst"] if burst else []),
        "--tasks",
        tasks,
        *extra,
    ]


def cpu_seconds(pid: int) -> float:
    import psutil

    try:
        t = psutil.Process(pid).cpu_times()
        return t.user + t.system
    except psutil.Error:
        return float("nan")


_mariadbd_pid: int | None = None


def mariadbd_pid() -> int | None:
    """The pid of the server on MYSQL_SERVER, if it runs on this machine and we can see it."""
    global _mariadbd_pid
    if _mariadbd_pid is None:
        engine = _admin()
        try:
            with engine.connect() as conn:
                pid_file = conn.exec_driver_sql("SELECT @@pid_file").scalar()
            _mariadbd_pid = int(Path(pid_file).read_text().strip())
        except Exception:
            _mariadbd_pid = -1
        finally:
            engine.dispose()
    return _mariadbd_pid if _mariadbd_pid and _mariadbd_pid > 0 else None


_live_runs: set[ProcRun] = set()


@dataclass(eq=False)
class ProcRun:
    """Processes started together behind a start gate; CPU counted from the gate to their exit."""

    cmds: list[list[str]]
    env: dict[str, str] = field(default_factory=dict)
    cwd: Path = REPO  # bench.ab runs another commit's tree (its PYTHONPATH in env)
    procs: list[subprocess.Popen] = field(default_factory=list)
    logs: list[Path] = field(default_factory=list)
    cpu_at_gate: list[float] = field(default_factory=list)
    cpu_total: list[float] = field(default_factory=list)
    db_cpu_at_gate: float = float("nan")
    db_cpu: float = float("nan")
    gated: bool = True  # False: no start gate, the clock starts before the first spawn
    # Each process leads a session (process group) of its own: stop() signals the leader, and
    # a SIGKILL (stop()'s last resort, and _finish() for any left behind) goes to the whole group,
    # for supervisors that fork workers, which would outlive a killed parent.
    new_session: bool = False
    t_spawn: float = 0.0
    t_gate: float = 0.0
    t_end: float = 0.0
    commits: int | None = None  # COMMITs the processes counted (bench/gate.py), None if any did not
    returncodes: list[int | None] = field(default_factory=list)

    def start(self, log_dir: Path, before_open=None) -> None:
        """Start the processes, wait until all reached the gate, call `before_open(pids)` (say, to
        attach a profiler), then open the gate."""
        self._tmp = tempfile.mkdtemp(prefix="gate-", dir=log_dir)
        self.gate = Gate(self._tmp)
        self._counts = tempfile.mkdtemp(prefix="counts-", dir=log_dir)
        env = child_env(**self.env, **(self.gate.env if self.gated else {}), BENCH_COUNT_DIR=self._counts)
        _live_runs.add(self)
        self.t_spawn = time.perf_counter()
        for i, cmd in enumerate(self.cmds):
            path = log_dir / f"proc-{os.getpid()}-{time.monotonic_ns()}-{i}.log"
            self.logs.append(path)
            with open(path, "w") as fh:
                self.procs.append(
                    subprocess.Popen(
                        cmd,
                        stdout=fh,
                        stderr=subprocess.STDOUT,
                        env=env,
                        cwd=self.cwd,
                        start_new_session=self.new_session,
                    )
                )
        if not self.gated:
            self.cpu_at_gate = [0.0] * len(self.procs)
            pid = mariadbd_pid()
            self.db_cpu_at_gate = cpu_seconds(pid) if pid else float("nan")
            self.t_gate = self.t_spawn
            return
        self.gate.wait_ready(len(self.procs), alive=lambda: not any(p.poll() is not None for p in self.procs))
        time.sleep(0.2)  # let every process get from the gate file to its wait loop
        if before_open:
            before_open([p.pid for p in self.procs])
        self.cpu_at_gate = [cpu_seconds(p.pid) for p in self.procs]
        pid = mariadbd_pid()
        self.db_cpu_at_gate = cpu_seconds(pid) if pid else float("nan")
        self.t_gate = time.perf_counter()
        self.gate.open()

    def poll(self) -> bool:
        """Reap the processes that exited (rusage from os.wait4); True while any still runs.
        (Never call Popen.poll/wait on these: they would reap the child and lose its rusage.)"""
        if not self.cpu_total:
            self.cpu_total = [float("nan")] * len(self.procs)
            self.returncodes = [None] * len(self.procs)
        for i, p in enumerate(self.procs):
            if self.returncodes[i] is None:
                pid, status, ru = os.wait4(p.pid, os.WNOHANG)
                if pid:
                    self.cpu_total[i] = ru.ru_utime + ru.ru_stime
                    self.returncodes[i] = p.returncode = os.waitstatus_to_exitcode(status)
        return any(rc is None for rc in self.returncodes)

    def wait(self, timeout: float) -> None:
        """Wait for every process to exit by itself."""
        deadline = time.monotonic() + timeout
        while self.poll():
            if time.monotonic() > deadline:
                self.stop(signal.SIGKILL)
                raise RuntimeError(f"processes still running after {timeout:.0f}s:\n{self.log_tail()}")
            time.sleep(0.01)
        self._finish()

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30.0) -> None:
        """Stop the processes still running (workers that would not exit by themselves)."""
        if self.poll():
            for p, rc in zip(self.procs, self.returncodes):
                if rc is None:
                    self._signal(p, sig)
        deadline = time.monotonic() + timeout
        while self.poll():
            if time.monotonic() > deadline:
                for p, rc in zip(self.procs, self.returncodes):
                    if rc is None:
                        self._signal(p, signal.SIGKILL)
                deadline = float("inf")
            time.sleep(0.01)
        self._finish()

    def _signal(self, p: subprocess.Popen, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if self.new_session and sig == signal.SIGKILL:
                os.killpg(p.pid, sig)
            else:
                p.send_signal(sig)

    def _finish(self) -> None:
        if self.new_session:
            for p in self.procs:  # whatever the leaders left behind in their groups
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(p.pid, signal.SIGKILL)
        _live_runs.discard(self)
        self.t_end = time.perf_counter()
        pid = mariadbd_pid()
        if pid:
            self.db_cpu = cpu_seconds(pid) - self.db_cpu_at_gate
        counted = list(Path(self._counts).glob("commits-*"))
        self.commits = sum(int(p.read_text() or 0) for p in counted) if len(counted) == len(self.procs) else None
        shutil.rmtree(self._tmp, ignore_errors=True)
        shutil.rmtree(self._counts, ignore_errors=True)

    @property
    def cpu(self) -> float:
        return sum(t - g for t, g in zip(self.cpu_total, self.cpu_at_gate))

    def log_tail(self, n: int = 2000) -> str:
        return "\n".join(p.read_text()[-n:] for p in self.logs if p.exists())

    def check(self, ok_codes=(0,)) -> None:
        bad = [(i, rc) for i, rc in enumerate(self.returncodes) if rc not in ok_codes]
        if bad:
            raise RuntimeError(f"process exit codes {bad}:\n{self.log_tail()}")


# --- machine info -----------------------------------------------------------------------------------


def machine_info() -> dict[str, Any]:
    info: dict[str, Any] = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cores": os.cpu_count(),
    }
    with contextlib.suppress(Exception):
        cpuinfo = Path("/proc/cpuinfo").read_text()
        m = re.search(r"model name\s*:\s*(.+)", cpuinfo)
        info["cpu"] = m.group(1).strip() if m else "?"
    with contextlib.suppress(Exception):
        import psutil

        info["memory_gib"] = round(psutil.virtual_memory().total / 2**30, 1)
    info["loadavg_start"] = os.getloadavg()
    engine = _admin()
    with contextlib.suppress(Exception), engine.connect() as conn:
        info["mariadb"] = conn.exec_driver_sql("SELECT VERSION()").scalar()
        for var in ("innodb_flush_log_at_trx_commit", "innodb_buffer_pool_size", "sync_binlog", "log_bin"):
            info[f"mariadb.{var}"] = conn.exec_driver_sql(f"SELECT @@{var}").scalar()
    engine.dispose()
    versions = {}
    for pkg in ("SQLAlchemy", "PyMySQL", "procrastinate", "pgqueuer", "rq", "redis", "asyncpg", "psycopg"):
        with contextlib.suppress(Exception):
            from importlib.metadata import version

            versions[pkg] = version(pkg)
    info["packages"] = versions
    return info


def other_load() -> dict[str, Any]:
    """What else is running: load average and the busiest other processes (the machine is shared)."""
    out: dict[str, Any] = {"loadavg": os.getloadavg()}
    with contextlib.suppress(Exception):
        import psutil

        me = os.getpid()
        procs = []
        for p in psutil.process_iter(["pid", "name", "cmdline"]):
            with contextlib.suppress(psutil.Error):
                if p.pid == me:
                    continue
                procs.append((p.cpu_percent(None), p))
        time.sleep(1.0)
        busy = []
        for _, p in procs:
            with contextlib.suppress(psutil.Error):
                pct = p.cpu_percent(None)
                if pct >= 5:
                    busy.append((pct, " ".join(p.info["cmdline"] or [p.info["name"] or "?"])[:100]))
        out["busy_processes"] = sorted(busy, reverse=True)[:8]
    return out


def dump_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1, default=str))
