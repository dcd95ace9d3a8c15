"""The dashboard bench at scale: every page and fragment timed idle and with a worker at each table
size, the database cost of the overview's polling, EXPLAIN of the slow pages, the claim rate
against an empty table; and the markdown it writes (docs/bench/dashboard.md)."""

from __future__ import annotations

import os
import re
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

import sqlalchemy as sa
from sqlalchemy.pool import NullPool
from werkzeug.security import generate_password_hash

from bench import common
from bench.common import log
from bench.dashboard_data import PASSWORD, RARE, TARGET_P95_MS, TOKEN, Client, load
from jobqueue.core import repository, service
from jobqueue.core.db import create_engine
from jobqueue.core.models import Status
from jobqueue.core.repository.operator import JobFilter
from testkit.procs import GunicornServer

# --- scale: every page at 1M / 5M rows, idle and with a worker running (`python -m bench.dashboard`) ---


def targets(url: str) -> dict[str, Any]:
    """Ids and keys the pages need: a job, the last page of each sparse filter (the 20th-oldest
    match: fewer than a page below it), a week-old hour and day of one task's keys."""
    engine = sa.create_engine(url, poolclass=NullPool)
    with engine.connect() as conn:

        def nth_oldest(where: str, n: int = 20) -> int:
            ids = conn.exec_driver_sql(f"SELECT id FROM job_queue WHERE {where} ORDER BY id LIMIT {n}").scalars().all()
            return ids[-1]

        oldest_key = conn.exec_driver_sql("SELECT task_key FROM job_queue ORDER BY id LIMIT 5000, 1").scalar()
        hour = oldest_key.rsplit(":", 2)[0]  # send_email:2026-11-25T13 (an hour of one task)
        day = hour.rsplit("T", 1)[0]  # send_email:2026-11-25
        t = {
            "hour_prefix": hour,
            "day_prefix": day,
            "job": conn.exec_driver_sql("SELECT MAX(id) DIV 2 FROM job_queue").scalar(),
            "hour_last": nth_oldest(f"task_key LIKE '{hour}%%'"),
            "scheduled_last": nth_oldest("status = 'scheduled'"),
            "ready_last": nth_oldest("status = 'ready'"),
            "running_last": nth_oldest("status = 'running'"),
            "failed_last": nth_oldest("status = 'failed'"),
        }
    engine.dispose()
    return t


def scale_pages(t: dict[str, Any]) -> dict[str, str]:
    job = t["job"]
    return {
        "overview": "/",
        "overview poll (/overview/panels)": "/overview/panels",
        "jobs": "/jobs",
        "jobs status=ready": "/jobs?status=ready",
        "jobs status=scheduled": "/jobs?status=scheduled",
        "jobs status=running": "/jobs?status=running",
        "jobs status=failed": "/jobs?status=failed",
        "jobs status=done": "/jobs?status=done",
        "jobs queue=mail": "/jobs?queue=mail",
        "jobs queue=mail status=ready": "/jobs?queue=mail&status=ready",
        "jobs task=export_orders": "/jobs?task=export_orders",
        "jobs queue=mail task=export_orders (a pair that never goes together)": "/jobs?queue=mail&task=export_orders",
        f"jobs key=<week-old hour> ({t['hour_prefix']})": f"/jobs?key={t['hour_prefix']}",
        f"jobs key=<week-old day> ({t['day_prefix']})": f"/jobs?key={t['day_prefix']}",
        "jobs key=<week-old hour>, last page": f"/jobs?key={t['hour_prefix']}&before={t['hour_last']}",
        "jobs status=scheduled, last page": f"/jobs?status=scheduled&before={t['scheduled_last']}",
        "jobs status=ready, last page": f"/jobs?status=ready&before={t['ready_last']}",
        "jobs status=running, last page": f"/jobs?status=running&before={t['running_last']}",
        "jobs status=failed, last page": f"/jobs?status=failed&before={t['failed_last']}",
        "jobs a page deep in the keyset": f"/jobs?before={job}",
        f"search q={RARE}": f"/jobs?q={RARE}",
        "search status=failed q=said 503": "/jobs?status=failed&q=said+503",
        "jobs live refresh (50 rows)": "/jobs/live?" + "&".join(f"live={i}:0.x" for i in range(job, job + 50)),
        "job detail": f"/jobs/{job}",
        "job row": f"/jobs/{job}/row",
        "job summary": f"/jobs/{job}/summary",
        "workers": "/workers",
        "workers panel": "/workers/panel",
        "audit": "/audit",
        "recurring": "/recurring",
        "metrics": "/metrics",
        "GET /api/stats": "/api/stats",
        "GET /api/queues": "/api/queues",
        "GET /api/jobs": "/api/jobs",
        "GET /api/jobs?status=scheduled, last page": f"/api/jobs?status=scheduled&before={t['scheduled_last']}",
        "GET /api/jobs/<id>/explain, a ready job": f"/api/jobs/{t['ready_last']}/explain",
        "GET /api/jobs/<id>/explain, a running job": f"/api/jobs/{t['running_last']}/explain",
        "locks": "/locks",
    }


def time_scale_pages(client: Client, pages: dict[str, str], rounds: int, warmups: int) -> dict[str, dict[str, Any]]:
    """Each page `warmups` times, then `rounds` times in a row; p50/p95/max of those."""
    out = {}
    for name, path in pages.items():
        errors: list[int] = []

        def get() -> None:
            try:
                status, _ = client.get(path)
            except urllib.error.HTTPError as exc:  # 503: a statement over the request's 5 s limit
                errors.append(exc.code)

        for _ in range(warmups):
            get()
        errors.clear()
        xs = []
        for _ in range(rounds):
            t0 = time.perf_counter()
            get()
            xs.append((time.perf_counter() - t0) * 1000)
        out[name] = {
            "path": path,
            "p50_ms": common.median(xs),
            "p95_ms": common.percentile(xs, 95),
            "max_ms": max(xs),
            "n": len(xs),
            "errors": errors,
            "pass": common.percentile(xs, 95) < TARGET_P95_MS and not errors,
        }
    return out


class Feeder:
    """Keeps about `backlog` no-op jobs ready in queue `bench` for the worker (a producer beside
    it), so the table's live shape stays that of the load."""

    def __init__(self, url: str, backlog: int = 2000):
        import threading

        self.engine = create_engine(url, pool_size=1)
        self.backlog, self.stop_flag, self.n = backlog, threading.Event(), 0
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        with self.engine.connect() as conn:
            while not self.stop_flag.is_set():
                ready = conn.exec_driver_sql(
                    "SELECT COUNT(*) FROM job_queue WHERE status = 'ready' AND queue = 'bench'"
                ).scalar()
                conn.commit()
                if ready < self.backlog:
                    service.enqueue_many(
                        conn, [{"task": "noop", "queue": "bench", "task_key": f"feed-{self.n + i}"} for i in range(500)]
                    )
                    self.n += 500
                else:
                    self.stop_flag.wait(0.2)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop_flag.set()
        self.thread.join(10)
        self.engine.dispose()


def poll_db_cost(url: str, polls: int, interval: float, env: dict[str, str]) -> dict[str, Any]:
    """What one overview poll costs the database: GET /overview/panels in-process (the app's own
    settings, so its counts cache too), every `interval` s like an open tab, summing the time of
    each statement round trip on its engine from one poll to the next (the history counts the
    cache reads on a thread of its own belong to the poll that started them)."""
    from sqlalchemy import event

    from jobqueue.web import create_app

    old = dict(os.environ)
    os.environ.update({k: v for k, v in env.items()})
    try:
        app = create_app({"DATABASE_URL": url, "EMBEDDED_WORKERS": 0, "TESTING": True})
    finally:
        os.environ.clear()
        os.environ.update(old)
    engine = app.extensions["jobqueue"].engine
    spent: list[float] = []

    @event.listens_for(engine, "before_cursor_execute")
    def before(conn, cursor, statement, params, context, executemany):
        conn.info["t0"] = time.perf_counter()

    @event.listens_for(engine, "after_cursor_execute")
    def after(conn, cursor, statement, params, context, executemany):
        spent.append(time.perf_counter() - conn.info.pop("t0"))

    client = app.test_client()
    results = []
    client.post(
        "/login",
        data={
            "username": "bench",
            "password": PASSWORD,
            "csrf_token": re.search(
                r'name="csrf_token" value="([^"]+)"', client.get("/login").get_data(as_text=True)
            ).group(1),
        },
    )
    for i in range(polls + 1):
        spent.clear()
        t0 = time.perf_counter()
        r = client.get("/overview/panels")
        wall = time.perf_counter() - t0
        assert r.status_code == 200, r.status_code
        time.sleep(interval)  # what the cache counts behind the request lands here
        if i:  # the first fills the caches
            results.append({"db_ms": sum(spent) * 1000, "statements": len(spent), "wall_ms": wall * 1000})
    app.extensions["jobqueue"].runtime.engine.dispose()
    engine.dispose()
    db = [r["db_ms"] for r in results]
    return {
        "polls": len(results),
        "interval_s": interval,
        "db_ms_p50": common.median(db),
        "db_ms_max": max(db),
        "db_ms_mean": sum(db) / len(db),
        "statements_p50": common.median([r["statements"] for r in results]),
        "statements_max": max(r["statements"] for r in results),
        "samples": results,
    }


def explain_slow(url: str, t: dict[str, Any]) -> dict[str, Any]:
    """The page statements that were slow, run and explained (rows read, time, index): ANALYZE
    FORMAT=JSON on MariaDB, EXPLAIN ANALYZE (its tree) on MySQL."""
    engine = create_engine(url, pool_size=1)
    out = {}
    with engine.connect() as conn:
        analyze = "ANALYZE FORMAT=JSON " if getattr(conn.dialect, "is_mariadb", False) else "EXPLAIN ANALYZE "
        for name, f, before in (
            ("key prefix (hour)", JobFilter(key_prefix=t["hour_prefix"]), None),
            ("scheduled, last page", JobFilter(status=Status.SCHEDULED), t["scheduled_last"]),
        ):
            captured: list[str] = []
            from sqlalchemy import event

            def grab(c, cursor, statement, params, context, executemany):
                if statement.lstrip().upper().startswith("SELECT") and "ORDER BY" in statement and "LIMIT" in statement:
                    captured.append(cursor.mogrify(statement, params))

            event.listen(engine, "before_cursor_execute", grab)
            repository.reads.page_jobs(conn, f, before=before)
            event.remove(engine, "before_cursor_execute", grab)
            conn.commit()
            analyzed = []
            for stmt in captured[:2]:
                doc = conn.exec_driver_sql(analyze + stmt.replace("%", "%%")).scalar()
                analyzed.append({"statement": stmt[:400], "analyze": doc})
            out[name] = analyzed
    engine.dispose()
    return out


def claim_rate(url: str, log_dir, jobs: int = 10_000) -> float:
    """Jobs/s of `jobqueue worker --burst --concurrency 4` over `jobs` no-op jobs in queue
    `bench` (start-up included, the same for every size)."""
    common.enqueue_noops(url, jobs, prefix=f"claim-{time.monotonic_ns()}-")
    engine = sa.create_engine(url, poolclass=NullPool)
    with engine.begin() as conn:
        conn.exec_driver_sql("UPDATE job_queue SET queue = 'bench' WHERE task_key LIKE 'claim-%%' AND status = 'ready'")
    engine.dispose()
    run = common.ProcRun([common.worker_cmd(url, 4, "--queues", "bench")])
    run.start(log_dir)
    run.wait(600)
    return jobs / (run.t_end - run.t_gate)


def claim_rounds(empty_url: str, url: str, log_dir, rounds: int = 3) -> dict[str, Any]:
    """Claim throughput on the loaded table against an empty one, alternating, `rounds` of each
    (medians). One run of each, the loaded one right after the load, read the server flushing
    the load's pages as a slower table (0.73x-3.2x from one run to the next)."""
    empty, loaded = [], []
    engine = sa.create_engine(empty_url, poolclass=NullPool)
    for _ in range(rounds):
        empty.append(claim_rate(empty_url, log_dir))
        with engine.begin() as conn:
            conn.exec_driver_sql("DELETE FROM job_queue")
        loaded.append(claim_rate(url, log_dir))
    engine.dispose()
    log(f"dashboard: claim throughput, empty table {empty}, loaded {loaded} jobs/s")
    return {
        "claim_empty_runs": empty,
        "claim_runs": loaded,
        "claim_empty_jobs_per_s": common.median(empty),
        "claim_jobs_per_s": common.median(loaded),
    }


def scale(
    url: str, rows: int, rounds: int, warmups: int, log_dir, polls: int = 10, empty_url: str | None = None
) -> dict[str, Any]:
    loadavg_start = os.getloadavg()
    load_s = load(url, rows)
    log(f"dashboard: loaded {rows:,} rows in {load_s:.0f}s")
    t = targets(url)
    pages = scale_pages(t)
    env = {
        "JOBQUEUE_USERS": f"bench:admin:{generate_password_hash(PASSWORD)}",
        "JOBQUEUE_SECRET_KEY": "bench",
        "JOBQUEUE_SECURE_COOKIES": "0",
        "JOBQUEUE_API_TOKENS": f"bench:viewer:{TOKEN}",
        **common.KEEP_EVERYTHING,
    }
    out: dict[str, Any] = {"rows": rows, "load_s": load_s, "targets": t, "rounds": rounds, "warmups": warmups}
    server = GunicornServer(url, log_dir, web_workers=2, embedded_workers=0, extra_env=env)
    try:
        client = Client(server.base)
        client.login()
        out["idle"] = time_scale_pages(client, pages, rounds, warmups)
        out["poll_idle"] = poll_db_cost(url, polls, 3.0, env)
        run = common.ProcRun([common.worker_cmd(url, 4, "--queues", "bench", burst=False)])
        with Feeder(url) as feeder:
            run.start(log_dir)
            try:
                time.sleep(2)
                t0 = time.perf_counter()
                out["worker"] = time_scale_pages(client, pages, rounds, warmups)
                out["poll_worker"] = poll_db_cost(url, polls, 3.0, env)
                seconds = time.perf_counter() - t0
            finally:
                run.stop()
            out["worker_jobs"] = feeder.n
        engine = sa.create_engine(url, poolclass=NullPool)
        with engine.connect() as conn:
            done = conn.exec_driver_sql(
                "SELECT COUNT(*) FROM job_queue WHERE queue = 'bench' AND status = 'done'"
            ).scalar()
        engine.dispose()
        out["worker_jobs_per_s"] = done / seconds
    finally:
        server.stop()
    out.update(claim_rounds(empty_url, url, log_dir))
    out["explain"] = explain_slow(url, t)
    out["loadavg_start"], out["loadavg_end"] = loadavg_start, os.getloadavg()
    return out


def _load(xs) -> str:
    return ", ".join(f"{x:.2f}" for x in xs)


def write_md(results: list[dict[str, Any]], path, run: dict[str, Any]) -> None:
    server = run["server"]
    lines = [
        "# Dashboard at scale",
        "",
        f"Written by `{run['command']}` from {run['started']} to {run['finished']}, against "
        f"{server['version']} (InnoDB buffer pool {server['innodb_buffer_pool_mib']} MiB); load average "
        f"(1, 5, 15 min) at start {_load(run['loadavg_start'])}, at end {_load(run['loadavg_end'])}. "
        "The 2 CPUs are shared by the server, gunicorn, the worker and the client: read these as upper "
        "bounds. The sections after the tables are written by hand (this command replaces the file: "
        "give `--out` elsewhere to keep them).",
        "",
        "Shape (issue 17): a week of history over 5 queues (done, 1 in 19 failed), then 40,000 ready, 9,000 "
        "scheduled and 1,000 running jobs of the last hour above it; more rows grow the history only. Pages "
        "over HTTP from gunicorn (2 processes x 4 threads, no embedded workers), signed in, each page "
        f'{results[0]["warmups"]} warm-ups then {results[0]["rounds"]} requests; "with a worker": a '
        "`jobqueue worker --concurrency 4` on queue `bench` fed with no-op jobs meanwhile. Target: p95 < 150 ms.",
        "",
    ]
    for r in results:
        lines += [
            f"## {r['rows']:,} rows",
            "",
            f"Loaded in {r['load_s']:.0f} s. Claim throughput (`jobqueue worker --burst --concurrency 4`, "
            f"10,000 no-op jobs, start-up included; after the pages, medians of "
            f"{len(r['claim_runs'])} runs alternating with an empty table) {r['claim_jobs_per_s']:.0f} jobs/s against "
            f"{r['claim_empty_jobs_per_s']:.0f} on an empty table (**{r['claim_jobs_per_s'] / r['claim_empty_jobs_per_s']:.2f}x**; "
            f"runs {', '.join(f'{x:.0f}' for x in r['claim_runs'])} against "
            f"{', '.join(f'{x:.0f}' for x in r['claim_empty_runs'])}; "
            f"target 0.8x). The worker during the page requests: {r['worker_jobs_per_s']:.0f} jobs/s. "
            f"Load average at the start of this size {_load(r['loadavg_start'])}, at its end "
            f"{_load(r['loadavg_end'])}.",
            "",
            "| page | p50 idle | p95 idle | p50 worker | p95 worker | p95 < 150 ms |",
            "|---|---|---|---|---|---|",
        ]
        for name, i in r["idle"].items():
            w = r["worker"][name]
            ok = "PASS" if i["pass"] and w["pass"] else "**FAIL**"
            errs = i.get("errors", []) + w.get("errors", [])
            if errs:
                ok += f" ({len(errs)} answered {sorted(set(errs))})"
            lines.append(
                f"| {name} | {i['p50_ms']:.0f} | {i['p95_ms']:.0f} | {w['p50_ms']:.0f} | {w['p95_ms']:.0f} | {ok} |"
            )
        for label, key in (("idle", "poll_idle"), ("with a worker", "poll_worker")):
            p = r[key]
            lines += [
                "",
                f"Overview poll, {label}: database time per refresh (sum of statement round trips, "
                f"{p['polls']} polls {p['interval_s']:.0f} s apart, in-process app with its default settings): "
                f"p50 {p['db_ms_p50']:.1f} ms, mean {p['db_ms_mean']:.1f} ms, max {p['db_ms_max']:.1f} ms; "
                f"{p['statements_p50']:.0f}-{p['statements_max']} statements.",
            ]
        lines.append("")
    path.write_text("\n".join(lines) + "\n")
