"""2. Against peers, same machine, same run: procrastinate and pgqueuer on the machine's
PostgreSQL, RQ on its Redis, our worker on MariaDB; the same N no-op jobs and, where the system
has the knob, the same concurrency. Systems alternate inside each round.

Enqueue and processing are timed separately. Enqueue: the first 1,000 jobs one call at a time (each
call its own transaction / round trip), the rest in batches of 1,000 with each system's batch API.
Processing: the workers start together behind the start gate after everything is enqueued, and
jobs/s is taken from each system's own timestamps (first job started .. last job finished):
job_queue.started_at/finished_at, procrastinate_events 'started'/'succeeded', pgqueuer_log
'picked'/'successful', RQ's job hashes started_at/ended_at.
"""

from __future__ import annotations

import contextlib
import sys
import time
import uuid
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

from bench import common
from bench.common import log

SINGLE = 1000  # enqueued one call at a time (at most a fifth of the jobs)
BATCH = 1000  # batch size for the rest


def single_count(jobs: int) -> int:
    return min(SINGLE, jobs // 5)


# --- PostgreSQL helpers -----------------------------------------------------------------------------


def _pg_admin():
    import psycopg

    return psycopg.connect(common.PG_SERVER + "/postgres", autocommit=True)


@contextlib.contextmanager
def pg_db(label: str):
    name = f"{common.RUN_TAG}_{label}_{uuid.uuid4().hex[:6]}"
    with _pg_admin() as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield f"{common.PG_SERVER}/{name}"
    finally:
        with _pg_admin() as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _pg_query(dsn: str, sql: str) -> list[tuple]:
    import psycopg

    with psycopg.connect(dsn) as conn:
        return conn.execute(sql).fetchall()


# --- result ------------------------------------------------------------------------------------------


def _result(
    system: str,
    jobs: int,
    single_s: float,
    batch_s: float,
    batch_jobs: int,
    done: int,
    first: datetime | None,
    last: datetime | None,
    run: common.ProcRun,
) -> dict[str, Any]:
    window = (last - first).total_seconds() if first and last else float("nan")
    if done != jobs:
        raise RuntimeError(f"{system}: {done} of {jobs} jobs finished\n{run.log_tail()}")
    return {
        "system": system,
        "jobs": jobs,
        "jobs_per_s": done / window if window > 0 else float("nan"),
        "window_s": window,
        "enqueue_single_jobs_per_s": single_count(jobs) / single_s,
        "enqueue_batch_jobs_per_s": batch_jobs / batch_s,
        "cpu_ms_per_job": run.cpu / jobs * 1000,
        "wall_s": run.t_end - run.t_gate,
    }


# --- our worker (MariaDB) ----------------------------------------------------------------------------


def ours(procs: int, threads: int) -> Callable[[int, Path], dict[str, Any]]:
    def _run(jobs: int, log_dir: Path) -> dict[str, Any]:
        with common.mysql_db("peer") as url:
            single = single_count(jobs)
            single_s = common.enqueue_one_by_one(url, single)
            batch_s = common.enqueue_noops(url, jobs - single, batch=BATCH)
            run = common.ProcRun([common.worker_cmd(url, threads)] * procs)
            run.start(log_dir)
            run.wait(max(120.0, jobs / 50))
            run.check()
            win = common.db_window(url)
        return _result(
            f"ours p{procs} t{threads}",
            jobs,
            single_s,
            batch_s,
            jobs - single_count(jobs),
            win.done,
            win.first_start,
            win.last_finish,
            run,
        )

    return _run


# --- procrastinate ------------------------------------------------------------------------------------


def procrastinate(concurrency: int) -> Callable[[int, Path], dict[str, Any]]:
    def _run(jobs: int, log_dir: Path) -> dict[str, Any]:
        with pg_db("pro") as dsn:
            code = (
                "import sys, time, json\n"
                "from bench.peer_apps.procrastinate_app import app, noop\n"
                "n, single = int(sys.argv[1]), int(sys.argv[2])\n"
                "with app.open():\n"
                "    app.schema_manager.apply_schema()\n"
                "    t = time.perf_counter()\n"
                "    for i in range(single): noop.defer()\n"
                "    t1 = time.perf_counter()\n"
                f"    for lo in range(single, n, {BATCH}): noop.batch_defer(*[{{}}] * min({BATCH}, n - lo))\n"
                "    t2 = time.perf_counter()\n"
                "print(json.dumps([t1 - t, t2 - t1]))\n"
            )
            single_s, batch_s = _enqueue_subprocess(code, dsn, jobs)
            run = common.ProcRun(
                [[sys.executable, "-m", "bench.peer_apps.procrastinate_worker", "--concurrency", str(concurrency)]],
                env={"BENCH_PG_DSN": dsn},
            )
            run.start(log_dir)
            run.wait(max(180.0, jobs / 20))
            run.check()
            ((done, first, last),) = _pg_query(
                dsn,
                (
                    "SELECT (SELECT COUNT(*) FROM procrastinate_jobs WHERE status = 'succeeded'), "
                    "(SELECT MIN(at) FROM procrastinate_events WHERE type = 'started'), "
                    "(SELECT MAX(at) FROM procrastinate_events WHERE type = 'succeeded')"
                ),
            )
        return _result(
            f"procrastinate c{concurrency}", jobs, single_s, batch_s, jobs - single_count(jobs), done, first, last, run
        )

    return _run


def _enqueue_subprocess(code: str, dsn: str, jobs: int) -> tuple[float, float]:
    """Enqueue from a fresh process (keeps the peers' libraries and event loops out of ours)."""
    import json
    import subprocess

    out = subprocess.run(
        [sys.executable, "-c", code, str(jobs), str(single_count(jobs))],
        capture_output=True,
        text=True,
        env=common.child_env(BENCH_PG_DSN=dsn),
        cwd=common.REPO,
        timeout=600,
    )
    if out.returncode != 0:
        raise RuntimeError(f"enqueue failed:\n{out.stderr[-3000:]}")
    single_s, batch_s = json.loads(out.stdout.strip().splitlines()[-1])
    return single_s, batch_s


# --- pgqueuer -----------------------------------------------------------------------------------------


def pgqueuer(procs: int, batch_size: int) -> Callable[[int, Path], dict[str, Any]]:
    def _run(jobs: int, log_dir: Path) -> dict[str, Any]:
        with pg_db("pgq") as dsn:
            code = (
                "import sys, time, json, asyncio, asyncpg\n"
                "from pgqueuer import AsyncpgDriver, Queries\n"
                "n, single = int(sys.argv[1]), int(sys.argv[2])\n"
                "async def main():\n"
                "    import os\n"
                "    conn = await asyncpg.connect(os.environ['BENCH_PG_DSN'])\n"
                "    q = Queries(AsyncpgDriver(conn))\n"
                "    await q.install()\n"
                "    t = time.perf_counter()\n"
                "    for i in range(single): await q.enqueue('noop', None)\n"
                "    t1 = time.perf_counter()\n"
                f"    for lo in range(single, n, {BATCH}):\n"
                f"        k = min({BATCH}, n - lo)\n"
                "        await q.enqueue(['noop'] * k, [None] * k, [0] * k)\n"
                "    t2 = time.perf_counter()\n"
                "    await conn.close()\n"
                "    print(json.dumps([t1 - t, t2 - t1]))\n"
                "asyncio.run(main())\n"
            )
            single_s, batch_s = _enqueue_subprocess(code, dsn, jobs)
            run = common.ProcRun(
                [[sys.executable, "-m", "bench.peer_apps.pgqueuer_app", "--batch-size", str(batch_size)]] * procs,
                env={"BENCH_PG_DSN": dsn},
            )
            run.start(log_dir)
            run.wait(max(180.0, jobs / 20))
            run.check()
            ((done, first, last),) = _pg_query(
                dsn,
                (
                    "SELECT (SELECT COUNT(*) FROM pgqueuer_log WHERE status = 'successful'), "
                    "(SELECT MIN(created) FROM pgqueuer_log WHERE status = 'picked'), "
                    "(SELECT MAX(created) FROM pgqueuer_log WHERE status = 'successful')"
                ),
            )
        return _result(
            f"pgqueuer p{procs} b{batch_size}",
            jobs,
            single_s,
            batch_s,
            jobs - single_count(jobs),
            done,
            first,
            last,
            run,
        )

    return _run


# --- RQ -----------------------------------------------------------------------------------------------


def rq_pool(workers: int) -> Callable[[int, Path], dict[str, Any]]:
    def _run(jobs: int, log_dir: Path) -> dict[str, Any]:
        from redis import Redis
        from rq import Queue

        from bench.peer_apps.rq_app import noop

        redis = Redis.from_url(common.REDIS_URL)
        qname = f"{common.RUN_TAG}_rq_{uuid.uuid4().hex[:6]}"
        q = Queue(qname, connection=redis)
        ids: list[str] = []
        try:
            t = time.perf_counter()
            for _ in range(single_count(jobs)):
                ids.append(q.enqueue(noop).id)
            t1 = time.perf_counter()
            for lo in range(single_count(jobs), jobs, BATCH):
                ids.extend(
                    j.id for j in q.enqueue_many([Queue.prepare_data(noop) for _ in range(min(BATCH, jobs - lo))])
                )
            t2 = time.perf_counter()
            run = common.ProcRun(
                [
                    [
                        sys.executable,
                        "-m",
                        "bench.peer_apps.rq_app",
                        "--url",
                        common.REDIS_URL,
                        "--queue",
                        qname,
                        "--workers",
                        str(workers),
                    ]
                ]
            )
            run.start(log_dir)
            run.wait(max(180.0, jobs / 20))
            run.check()
            pipe = redis.pipeline()
            for jid in ids:
                pipe.hmget(f"rq:job:{jid}", "status", "started_at", "ended_at", "worker_name")
            rows = pipe.execute()
            done = sum(1 for r in rows if r[0] == b"finished")
            starts = [_rq_ts(r[1]) for r in rows if r[1]]
            ends = [_rq_ts(r[2]) for r in rows if r[2]]
            workers_seen = {r[3].decode() for r in rows if r[3]}
        finally:
            _rq_cleanup(redis, qname, ids, locals().get("workers_seen", set()))
        return _result(
            f"rq pool {workers} SimpleWorker",
            jobs,
            t1 - t,
            t2 - t1,
            jobs - single_count(jobs),
            done,
            min(starts) if starts else None,
            max(ends) if ends else None,
            run,
        )

    return _run


def _rq_ts(raw: bytes) -> datetime:
    return datetime.fromisoformat(raw.decode().replace("Z", "+00:00"))


def _rq_cleanup(redis, qname: str, ids: list[str], workers: set[str]) -> None:
    with contextlib.suppress(Exception):
        pipe = redis.pipeline()
        for jid in ids:
            pipe.delete(f"rq:job:{jid}", f"rq:results:{jid}", f"rq:job:{jid}:dependents")
        for w in workers:
            pipe.delete(f"rq:worker:{w}")
            pipe.srem("rq:workers", f"rq:worker:{w}")
        pipe.srem("rq:queues", f"rq:queue:{qname}")
        pipe.execute()
        for key in redis.scan_iter(match=f"*{qname}*", count=1000):
            redis.delete(key)


# --- the scenario -------------------------------------------------------------------------------------


def systems(ctx) -> dict[str, Callable[[int, Path], dict[str, Any]]]:
    conc = 4
    out = {
        f"ours p1 t{conc}": ours(1, conc),
        f"procrastinate c{conc}": procrastinate(conc),
        "pgqueuer p1 b10": pgqueuer(1, 10),
        "pgqueuer p4 b10": pgqueuer(4, 10),
        f"rq pool {conc} SimpleWorker": rq_pool(conc),
    }
    for procs, threads in ctx.best_candidates:
        out[f"ours p{procs} t{threads}"] = ours(procs, threads)
    return out


def run(ctx) -> dict[str, Any]:
    table = systems(ctx)
    samples: dict[str, list[dict]] = {k: [] for k in table}
    problems: dict[str, str] = {}
    for r in range(ctx.rounds):
        names = list(table) if r % 2 == 0 else list(reversed(table))
        for name in names:
            if name in problems:
                continue
            try:
                res = table[name](ctx.jobs, ctx.log_dir)
            except Exception as exc:  # a peer that cannot run here is reported, not faked
                problems[name] = f"{type(exc).__name__}: {str(exc)[:600]}"
                log(f"peers: {name} failed: {problems[name]}")
                continue
            res["round"] = r
            samples[name].append(res)
            log(
                f"peers round {r + 1}/{ctx.rounds} {name}: process {res['jobs_per_s']:.0f} jobs/s, enqueue "
                f"single {res['enqueue_single_jobs_per_s']:.0f}/s batch {res['enqueue_batch_jobs_per_s']:.0f}/s"
            )
    summary = {}
    for name, ss in samples.items():
        if not ss:
            continue
        summary[name] = {
            k: common.median([s[k] for s in ss])
            for k in ("jobs_per_s", "enqueue_single_jobs_per_s", "enqueue_batch_jobs_per_s", "cpu_ms_per_job")
        }
        summary[name]["runs"] = [round(s["jobs_per_s"]) for s in ss]
    return {
        "jobs": ctx.jobs,
        "rounds": ctx.rounds,
        "concurrency": 4,
        "summary": summary,
        "problems": problems,
        "samples": samples,
        "single_enqueue_jobs": single_count(ctx.jobs),
        "batch_size": BATCH,
    }
