"""5. Idle cost and wake-up latency.

Idle cost: statements an idle worker sends once its backoff has settled, counted on a throwaway
mariadbd that this scenario starts for itself (nothing else talks to it, so the server's own
global counters are exact): SHOW GLOBAL STATUS before and after a quiet window, minus the SHOW
itself. Measured for 1 and 3 idle `jobqueue worker --concurrency 4` processes (all queues, the
default), and for 1 process with `--queues default`. Target: <= 1 statement per worker per second.

Statements per job: on the same private server, a burst run of `jobqueue worker --concurrency 4`
and of the raw loop (4 threads, claim 1), counting everything the server received per job.

Wake-up latency (on the shared server, like the rest):
- same process: a Worker (4 threads, default idle cap 2 s) runs in a thread; after it idled 2-4 s
  the harness enqueues one `wake` job with service.enqueue and times enqueue -> handler start.
  Target p95 < 50 ms.
- another process: the same with the worker as a `jobqueue worker` subprocess, woken by the
  doorbell (the enqueue ends the idle worker's marked SLEEP with KILL QUERY: jobqueue/core/doorbell.py).
  Target p95 < 500 ms. Also with --no-doorbell, where the worker only learns of the job at its
  next poll (bounded by the idle cap, 2 s by default). The idle cost above includes the
  doorbell's own statement (one SLEEP per 10 s, and its ROLLBACK).
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import pymysql

import bench.wake_tasks as wake_tasks
from bench import common
from bench.common import log
from jobqueue.core import service
from jobqueue.core.db import create_engine
from jobqueue.core.migrate import init_db
from jobqueue.core.tasks import TASKS
from jobqueue.core.worker import Worker, WorkerConfig

COUNTERS = (
    "Questions",
    "Com_select",
    "Com_update",
    "Com_insert",
    "Com_delete",
    "Com_commit",
    "Com_rollback",
    "Com_show_status",
    "Com_set_option",
    "Connections",
)


# --- a throwaway server -------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def throwaway_mariadb():
    """A private mariadbd on a free port with its own datadir; yields its server URL (no db)."""
    base = Path(tempfile.mkdtemp(prefix="jqb-mariadb-"))
    port = free_port()
    proc = None
    try:
        subprocess.run(
            [
                "mariadb-install-db",
                "--no-defaults",
                f"--datadir={base / 'data'}",
                "--user=root",
                "--auth-root-authentication-method=normal",
                "--skip-test-db",
                "--skip-name-resolve",
            ],
            check=True,
            capture_output=True,
            timeout=120,
        )
        server_log = open(base / "server.log", "w")
        proc = subprocess.Popen(
            [
                "/usr/sbin/mariadbd",
                "--no-defaults",
                "--user=root",
                f"--datadir={base / 'data'}",
                f"--socket={base / 'sock'}",
                f"--port={port}",
                "--bind-address=127.0.0.1",
                "--skip-log-bin",
                "--innodb-buffer-pool-size=64M",
                f"--pid-file={base / 'pid'}",
            ],
            stdout=server_log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 60
        while True:
            try:
                pymysql.connect(host="127.0.0.1", port=port, user="root").close()
                break
            except pymysql.err.OperationalError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError(
                        f"throwaway mariadbd did not start:\n{(base / 'server.log').read_text()[-2000:]}"
                    ) from None
                time.sleep(0.1)
        yield f"mysql+pymysql://root@127.0.0.1:{port}", port
    finally:
        if proc and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        shutil.rmtree(base, ignore_errors=True)


def _status(conn) -> dict[str, int]:
    with conn.cursor() as cur:
        cur.execute("SHOW GLOBAL STATUS WHERE Variable_name IN (" + ",".join(["%s"] * len(COUNTERS)) + ")", COUNTERS)
        return {k: int(v) for k, v in cur.fetchall()}


def idle_cost(
    server: str, port: int, procs: int, extra: list[str], settle: float, window: float, log_dir: Path
) -> dict[str, Any]:
    name = f"idle_{procs}_{len(extra)}"
    admin = pymysql.connect(host="127.0.0.1", port=port, user="root", autocommit=True)
    try:
        with admin.cursor() as cur:
            cur.execute(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4 COLLATE utf8mb4_bin")
        url = f"{server}/{name}"
        eng = create_engine(url, pool_size=1)
        init_db(eng)
        eng.dispose()
        # Baseline: our own SHOW with nothing else running.
        a = _status(admin)
        time.sleep(1.0)
        b = _status(admin)
        own = {k: b[k] - a[k] for k in COUNTERS}
        run = common.ProcRun([common.worker_cmd(url, 4, *extra, burst=False)] * procs)
        run.start(log_dir)
        try:
            time.sleep(settle)
            s0 = _status(admin)
            t0 = time.perf_counter()
            time.sleep(window)
            s1 = _status(admin)
            t1 = time.perf_counter()
            if not run.poll():
                raise RuntimeError(f"idle workers exited early:\n{run.log_tail()}")
        finally:
            run.stop(signal.SIGTERM)
        secs = t1 - t0
        delta = {k: s1[k] - s0[k] - own[k] for k in COUNTERS}
        per = {k: v / secs / procs for k, v in delta.items() if k not in ("Com_show_status", "Connections")}
        with admin.cursor() as cur:
            cur.execute(f"DROP DATABASE `{name}`")
        return {
            "procs": procs,
            "args": " ".join(extra) or "(all queues)",
            "window_s": secs,
            "per_worker_per_s": per,
            "questions_per_worker_per_s": per["Questions"],
            "new_connections": delta["Connections"],
        }
    finally:
        admin.close()


def statements_per_job(server: str, port: int, kind: str, jobs: int, log_dir: Path) -> dict[str, Any]:
    """Statements the server receives per processed job (burst run over `jobs` no-op jobs)."""
    import sys

    name = f"spj_{kind}"
    admin = pymysql.connect(host="127.0.0.1", port=port, user="root", autocommit=True)
    try:
        with admin.cursor() as cur:
            cur.execute(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4 COLLATE utf8mb4_bin")
        url = f"{server}/{name}"
        eng = create_engine(url, pool_size=1)
        init_db(eng)
        eng.dispose()
        common.enqueue_noops(url, jobs)
        cmd = (
            common.worker_cmd(url, 4)
            if kind == "ours"
            else [sys.executable, "-m", "bench.raw_loop", "--url", url, "--threads", "4", "--batch", "1"]
        )
        before: dict[str, int] = {}
        run = common.ProcRun([cmd])
        run.start(log_dir, before_open=lambda pids: before.update(_status(admin)))
        run.wait(300)
        run.check()
        s1 = _status(admin)
        win = common.db_window(url, claimer_parts=2 if kind == "ours" else 3)
        with admin.cursor() as cur:
            cur.execute(f"DROP DATABASE `{name}`")
    finally:
        admin.close()
    delta = {k: s1[k] - before[k] for k in COUNTERS if k not in ("Com_show_status", "Connections")}
    delta["Questions"] -= 1
    return {
        "kind": kind,
        "jobs": jobs,
        "per_job": {k: v / jobs for k, v in delta.items()},
        "mean_claim_batch": win.mean_batch,
    }


def statements_per_enqueued_job(server: str, port: int, jobs: int) -> dict[str, Any]:
    """Statements the server receives per job enqueued with enqueue_many (batches of 1,000)."""
    name = "spj_enqueue"
    admin = pymysql.connect(host="127.0.0.1", port=port, user="root", autocommit=True)
    try:
        with admin.cursor() as cur:
            cur.execute(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4 COLLATE utf8mb4_bin")
        url = f"{server}/{name}"
        eng = create_engine(url, pool_size=1)
        init_db(eng)
        with eng.connect() as conn:  # connect (and its set-up queries) before counting
            conn.exec_driver_sql("SELECT 1").all()
            conn.rollback()
            before = _status(admin)
            for lo in range(0, jobs, 1000):
                service.enqueue_many(
                    conn, [{"task": "noop", "task_key": f"e{i}"} for i in range(lo, min(jobs, lo + 1000))]
                )
            after = _status(admin)
        eng.dispose()
        with admin.cursor() as cur:
            cur.execute(f"DROP DATABASE `{name}`")
    finally:
        admin.close()
    delta = {k: after[k] - before[k] for k in COUNTERS if k not in ("Com_show_status", "Connections")}
    delta["Questions"] -= 1
    return {
        "kind": "enqueue_many",
        "jobs": jobs,
        "per_job": {k: v / jobs for k, v in delta.items()},
        "mean_claim_batch": float("nan"),
    }


# --- wake-up latency ----------------------------------------------------------------------------------


def wake_in_process(url: str, trials: int, idle: tuple[float, float]) -> dict[str, Any]:
    engine = create_engine(url, pool_size=8)
    worker = Worker(engine, WorkerConfig(concurrency=4, lease_seconds=60), registry=TASKS)
    t = threading.Thread(target=worker.run, daemon=True)
    t.start()
    from_call, from_commit = [], []
    try:
        with engine.connect() as conn:
            for i in range(trials):
                time.sleep(random.uniform(*idle))
                key = f"wake-in-{i}"
                t0 = time.time()
                service.enqueue(conn, "wake", key)
                t1 = time.time()
                with wake_tasks.CHANGED:
                    if not wake_tasks.CHANGED.wait_for(lambda: key in wake_tasks.STARTED, timeout=30):
                        raise RuntimeError(f"in-process wake: {key} never started")
                    started = wake_tasks.STARTED[key]
                from_call.append((started - t0) * 1000)
                from_commit.append((started - t1) * 1000)
    finally:
        worker.stop()
        t.join(30)
        engine.dispose()
    return _latency(from_call, from_commit)


def wake_cross_process(
    url: str, trials: int, idle: tuple[float, float], log_dir: Path, doorbell: bool = True
) -> dict[str, Any]:
    fd, path = tempfile.mkstemp(prefix="wake-", suffix=".txt", dir=log_dir)
    os.close(fd)
    extra = [] if doorbell else ["--no-doorbell"]
    run = common.ProcRun(
        [common.worker_cmd(url, 4, *extra, burst=False, tasks="bench.gate_tasks,bench.wake_tasks")],
        env={"BENCH_WAKE_FILE": path},
    )
    run.start(log_dir)
    engine = create_engine(url, pool_size=1)
    from_call, from_commit = [], []
    try:
        time.sleep(1.0)
        with engine.connect() as conn:
            for i in range(trials):
                time.sleep(random.uniform(*idle))
                key = f"wake-x{int(doorbell)}-{i}"
                t0 = time.time()
                service.enqueue(conn, "wake", key)
                t1 = time.time()
                started = _wait_for_line(path, key, 30)
                from_call.append((started - t0) * 1000)
                from_commit.append((started - t1) * 1000)
    finally:
        run.stop(signal.SIGTERM)
        engine.dispose()
        os.unlink(path)
    return {**_latency(from_call, from_commit), "doorbell": doorbell}


def _wait_for_line(path: str, key: str, timeout: float) -> float:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with open(path) as fh:
            for line in fh:
                k, _, ts = line.strip().partition(" ")
                if k == key:
                    return float(ts)
        time.sleep(0.002)
    raise RuntimeError(f"cross-process wake: {key} never started")


def _latency(from_call: list[float], from_commit: list[float]) -> dict[str, Any]:
    return {
        "trials": len(from_call),
        "p50_ms": common.percentile(from_call, 50),
        "p95_ms": common.percentile(from_call, 95),
        "max_ms": max(from_call),
        "p50_from_commit_ms": common.percentile(from_commit, 50),
        "p95_from_commit_ms": common.percentile(from_commit, 95),
        "samples_ms": [round(x, 2) for x in from_call],
    }


def run(ctx) -> dict[str, Any]:
    # A minute: the heartbeat (15 s) and the idle sweep (60 s) come round within it.
    # Settle: the backoff reaches its cap and the pool has the connections its threads use at
    # once (each new one costs five SET statements), so the window sees the steady state.
    settle, window = (3.0, 3.0) if ctx.quick else (30.0, 60.0)
    configs = [(1, []), (1, ["--queues", "default"]), (3, [])] if not ctx.quick else [(1, [])]
    costs = []
    with throwaway_mariadb() as (server, port):
        for procs, extra in configs:
            res = idle_cost(server, port, procs, extra, settle, window, ctx.log_dir)
            costs.append(res)
            log(f"idle: {procs} worker(s) {res['args']}: {res['questions_per_worker_per_s']:.2f} statements/s each")
        per_job = []
        for kind in ("ours", "raw"):
            res = statements_per_job(server, port, kind, ctx.jobs // 2 if not ctx.quick else ctx.jobs, ctx.log_dir)
            per_job.append(res)
            log(f"statements per job, {kind}: {res['per_job']['Questions']:.2f}")
        res = statements_per_enqueued_job(server, port, 2000 if not ctx.quick else 500)
        per_job.append(res)
        log(f"statements per enqueued job (enqueue_many): {res['per_job']['Questions']:.3f}")
    trials = ctx.wake_trials
    idle = ctx.wake_idle
    with common.mysql_db("wake") as url:
        inproc = wake_in_process(url, trials, idle)
        log(f"wake in-process: p50 {inproc['p50_ms']:.1f} ms p95 {inproc['p95_ms']:.1f} ms")
        cross = wake_cross_process(url, trials, idle, ctx.log_dir)
        log(f"wake cross-process: p50 {cross['p50_ms']:.0f} ms p95 {cross['p95_ms']:.0f} ms")
        polling = wake_cross_process(url, max(5, trials // 2), idle, ctx.log_dir, doorbell=False)
        log(f"wake cross-process (--no-doorbell): p50 {polling['p50_ms']:.0f} ms p95 {polling['p95_ms']:.0f} ms")
    return {
        "idle_cost": costs,
        "statements_per_job": per_job,
        "settle_s": settle,
        "window_s": window,
        "wake_in_process": inproc,
        "wake_cross_process": cross,
        "wake_cross_process_polling": polling,
        "idle_between_trials_s": idle,
        "targets": {"statements_per_worker_per_s": 1.0, "in_process_p95_ms": 50.0, "cross_process_p95_ms": 500.0},
    }
