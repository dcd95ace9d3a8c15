"""6. Dashboard at scale: page latency with 1,000,000 rows in job_queue (pages, search, the live
refresh and GET /api/jobs), a bulk requeue of 100,000 failed jobs with a worker running beside
it, and search by a bounded scan against a FULLTEXT index.

The table is filled the way a long-lived install looks (issue 17's shape): a week of history
over 5 queues and 5 tasks (done, 1 in 19 failed), then 40,000 ready, 9,000 scheduled and 1,000
running jobs of the last hour above it, a backlog of audit entries, worker processes and 15
minutes of per-minute activity. Loading uses multi-row `INSERT ... SELECT` from a table of
numbers (1,000,000 rows in about 35 s here on a quiet machine; see load).

`python -m bench.dashboard --rows 1000000,5000000` (see main) measures every dashboard page and
fragment, /metrics and the read API at those sizes, idle and with a worker running, each page 2
warm-ups then 20 requests, plus the database time of one overview poll, and writes
docs/bench/dashboard.md.

Pages are fetched over HTTP from the real app under gunicorn (1 process, no embedded workers),
signed in, each page in turn, `rounds` times after a warm-up; p50/p95 per page. Target: p95 <
150 ms for every page, whatever the table size.

Search: `q` reads at most the newest 50,000 rows matching the other filters (a LIKE over payload,
last error and task_key); measured for a common term (the page fills at once, the capped count
reads the whole window), a rare one (nothing to stop early: the whole window) and one among the
failed jobs' errors. Against it, after the other measurements: a FULLTEXT index on (payload,
last_error): its build time, MATCH ... AGAINST for the same terms (newest first, so every match
is sorted), what it cannot find (substrings, tokens under 3 characters), and batch-enqueue
throughput with and without it.

Bulk requeue: 100,000 rows set to `failed`, then `service.bulk_action("requeue", filter
status=failed)` (what the dashboard's "every job matching the filter" runs, in batches of 500,
each its own transaction). Meanwhile a `jobqueue worker --concurrency 4 --queues bench` works
through no-op jobs in another queue; its throughput during the bulk is compared with the same
worker alone for the same length of time, measured just before.
"""

from __future__ import annotations

import os
import time
from typing import Any

import sqlalchemy as sa
from sqlalchemy.pool import NullPool
from werkzeug.security import generate_password_hash

from bench import common
from bench.common import log
from bench.dashboard_data import COMMON, ERROR_TERM, PASSWORD, RARE, TARGET_P95_MS, TOKEN, Client, load
from bench.dashboard_scale import scale, targets, write_md
from jobqueue.core import repository, service
from jobqueue.core.db import create_engine
from jobqueue.core.models import Status
from jobqueue.core.repository.operator import JobFilter
from jobqueue.core.schema import job_queue
from testkit.procs import GunicornServer

EXPLAIN_P95_MS = 50.0
FT_LIMIT_S = 20


def time_pages(client: Client, pages: dict[str, str], rounds: int) -> dict[str, dict[str, Any]]:
    samples: dict[str, list[float]] = {name: [] for name in pages}
    for _ in range(3):  # warm-up: pools, caches, the doctor's minute cache
        for path in pages.values():
            client.get(path)
    for _ in range(rounds):
        for name, path in pages.items():
            t0 = time.perf_counter()
            status, body = client.get(path)
            samples[name].append((time.perf_counter() - t0) * 1000)
            assert status == 200 and len(body) > 100, (name, status)
    return {
        name: {
            "path": pages[name],
            "p50_ms": common.median(xs),
            "p95_ms": common.percentile(xs, 95),
            "max_ms": max(xs),
            "n": len(xs),
            "pass": common.percentile(xs, 95) < TARGET_P95_MS,
        }
        for name, xs in samples.items()
    }


def worker_rate(url: str, ctx, seconds: float, during=None) -> tuple[float, Any]:
    """Jobs/s of a 4-thread worker on queue `bench` over `seconds` (after 1 s of warm-up), while
    `during()` runs (its result is returned too)."""
    engine = sa.create_engine(url, poolclass=NullPool)

    def done() -> int:
        with engine.connect() as conn:
            return conn.exec_driver_sql(
                "SELECT COUNT(*) FROM job_queue WHERE queue = 'bench' AND status = 'done'"
            ).scalar()

    run = common.ProcRun([common.worker_cmd(url, 4, "--queues", "bench", burst=False)])
    run.start(ctx.log_dir)
    result = None
    try:
        time.sleep(1.5)
        d0, t0 = done(), time.perf_counter()
        if during is not None:
            result = during()
        else:
            time.sleep(seconds)
        d1, t1 = done(), time.perf_counter()
    finally:
        run.stop()
        engine.dispose()
    return (d1 - d0) / (t1 - t0), (result, t1 - t0)


def run(ctx) -> dict[str, Any]:
    rows = 110_000 if ctx.quick else 1_000_000
    bulk_rows = 5_000 if ctx.quick else 100_000
    rounds = 10 if ctx.quick else 40
    with common.mysql_db("dash") as url:
        load_s = load(url, rows)
        log(f"dashboard: loaded {rows:,} finished rows (+ failed/ready/running) in {load_s:.0f}s")
        engine = create_engine(url)
        with engine.connect() as conn:
            total = conn.execute(sa.select(sa.func.count()).select_from(job_queue)).scalar()
            t = targets(url)
            some_job = repository.reads.get_job(conn, t["job"])
            # A ready job with others ahead of it in its queue, and a running one.
            explained = [t["ready_last"], t["running_last"]]
            plan = repository.claim.explain_claim(conn, "default", 8)
        env = {
            "JOBQUEUE_USERS": f"bench:admin:{generate_password_hash(PASSWORD)}",
            "JOBQUEUE_SECRET_KEY": "bench",
            "JOBQUEUE_SECURE_COOKIES": "0",
            "JOBQUEUE_API_TOKENS": f"bench:viewer:{TOKEN}",
            **common.KEEP_EVERYTHING,
        }
        server = GunicornServer(url, ctx.log_dir, web_workers=1, embedded_workers=0, extra_env=env)
        try:
            client = Client(server.base)
            client.login()
            pages = {
                "overview": "/",
                "overview (the 3 s poll)": "/overview/panels",
                "jobs: first page": "/jobs",
                "jobs: a page deep in the keyset": f"/jobs?before={some_job.id}",
                "jobs: filtered status=failed": "/jobs?status=failed",
                "jobs: filtered queue=mail task=export_orders": "/jobs?queue=mail&task=export_orders",
                "jobs: task_key prefix (a week-old hour)": f"/jobs?key={t['hour_prefix']}",
                "jobs: status=scheduled, last page": f"/jobs?status=scheduled&before={t['scheduled_last']}",
                "jobs: a newer page": f"/jobs?after={some_job.id}",
                f"search, common term (q={COMMON})": f"/jobs?q={COMMON}",
                f"search, rare term (q={RARE})": f"/jobs?q={RARE}",
                f"search in errors (status=failed q={ERROR_TERM})": "/jobs?status=failed&q=said+503",
                "search, a window deep in the keyset": f"/jobs?q={RARE}&before={some_job.id}",
                "jobs: the live refresh of 50 rows": "/jobs/live?"
                + "&".join(f"live={i}:0.x" for i in range(some_job.id, some_job.id + 50)),
                "job detail": f"/jobs/{some_job.id}",
                "workers": "/workers",
                "audit log": "/audit",
                "GET /api/jobs": "/api/jobs",
                "GET /api/jobs/<id>/explain, a ready job": f"/api/jobs/{explained[0]}/explain",
                "GET /api/jobs/<id>/explain, a running job": f"/api/jobs/{explained[1]}/explain",
                "GET /api/jobs?limit=500": "/api/jobs?limit=500",
                "GET /api/jobs?status=failed&limit=500": "/api/jobs?status=failed&limit=500",
                "GET /api/jobs a page deep in the keyset": f"/api/jobs?before={some_job.id}&limit=100",
                f"GET /api/jobs?q={RARE}": f"/api/jobs?q={RARE}",
            }
            page_results = time_pages(client, pages, rounds)
        finally:
            server.stop()
        for name, r in page_results.items():
            log(f"dashboard: {name}: p50 {r['p50_ms']:.1f} ms, p95 {r['p95_ms']:.1f} ms")

        search = compare_search(url, engine, rounds)

        # Bulk requeue beside a working worker.
        with engine.begin() as conn:
            conn.exec_driver_sql(
                f"UPDATE job_queue SET status = 'failed', last_error = 'bench' "
                f"WHERE status = 'done' AND id <= {bulk_rows}"
            )
            conn.exec_driver_sql(f"UPDATE job_queue SET status = 'done' WHERE status = 'failed' AND id > {bulk_rows}")
        common.enqueue_noops(url, 40_000 if not ctx.quick else 8_000, prefix="w")
        with engine.begin() as conn:
            conn.exec_driver_sql("UPDATE job_queue SET queue = 'bench' WHERE task_key LIKE 'w%%'")

        def bulk():
            with engine.connect() as conn:
                t0 = time.perf_counter()
                res = service.bulk_action(conn, "requeue", actor="bench", job_filter=JobFilter(status=Status.FAILED))
                return res, time.perf_counter() - t0

        alone, _ = worker_rate(url, ctx, 6 if ctx.quick else 10)
        during, ((bulk_res, bulk_s), window) = worker_rate(url, ctx, 0, during=bulk)
        engine.dispose()
    log(
        f"dashboard: bulk requeue of {bulk_res.changed:,} jobs in {bulk_s:.1f}s; worker {alone:.0f} -> {during:.0f} jobs/s"
    )
    return {
        "search": search,
        "rows": total,
        "load_s": load_s,
        "rounds": rounds,
        "pages": page_results,
        "claim_plan": plan,
        "bulk": {
            "jobs": bulk_res.changed,
            "busy": bulk_res.busy,
            "skipped": bulk_res.skipped,
            "seconds": bulk_s,
            "jobs_per_s": bulk_res.changed / bulk_s if bulk_s else None,
        },
        "worker_alone_jobs_per_s": alone,
        "worker_during_bulk_jobs_per_s": during,
        "worker_ratio": common.ratio(during, alone),
        # explain has a tighter target of its own (issue 14): p95 < 50 ms.
        "explain_pass": all(r["p95_ms"] < EXPLAIN_P95_MS for n, r in page_results.items() if "explain" in n),
        "pass": all(r["pass"] for r in page_results.values()),
    }


def _timed(fn, rounds: int) -> dict[str, float]:
    fn()
    xs = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        fn()
        xs.append((time.perf_counter() - t0) * 1000)
    return {"p50_ms": common.median(xs), "p95_ms": common.percentile(xs, 95), "max_ms": max(xs)}


def compare_search(url: str, engine, rounds: int) -> dict[str, Any]:
    """The bounded scan the dashboard runs against a FULLTEXT index on (payload, last_error), on
    the same table: query times, build time, what each finds, and enqueue cost."""
    terms = {"common": (COMMON, None), "rare": (RARE, None), "errors": (ERROR_TERM, Status.FAILED)}
    out: dict[str, Any] = {"window": repository.operator.SEARCH_WINDOW, "bounded": {}, "fulltext": {}}
    with engine.connect() as conn:
        for name, (term, status) in terms.items():
            f = JobFilter(search=term, status=status)
            page = repository.reads.page_jobs(conn, f)
            out["bounded"][name] = {
                "term": term,
                "found": len(page.jobs),
                "matches": page.matches,
                "capped": page.capped,
                **_timed(lambda: repository.reads.page_jobs(conn, f), rounds),
            }
        # What ignoring case costs: the same window scan compared byte for byte (this database is
        # utf8mb4_bin), without COLLATE utf8mb4_general_ci.
        floor = repository.reads.page_jobs(conn, JobFilter(search=RARE)).window_floor or 0
        binary = (
            "SELECT id FROM job_queue WHERE id >= %s AND (payload LIKE %s OR last_error LIKE %s OR task_key LIKE %s)"
            " ORDER BY id DESC LIMIT 10001"
        )
        needle = f"%{RARE}%"
        out["bounded"]["rare_case_sensitive"] = {
            "term": RARE,
            **_timed(lambda: conn.exec_driver_sql(binary, (floor, needle, needle, needle)).all(), rounds),
        }
    # Enqueue cost, without the index before it is built and after it is dropped, with it twice.
    plain = [common.enqueue_noops(url, 20_000, prefix="ft-before-")]
    raw = sa.create_engine(url, poolclass=NullPool)
    with raw.connect() as conn:
        t0 = time.perf_counter()
        conn.exec_driver_sql("ALTER TABLE job_queue ADD FULLTEXT INDEX ft_search (payload, last_error)")
        out["fulltext"]["build_s"] = time.perf_counter() - t0

        def match(term: str, status: Status | None):
            where = "MATCH(payload, last_error) AGAINST (%s IN BOOLEAN MODE)"
            if status is not None:
                where += f" AND status = '{status.value}'"
            # MariaDB's statement limit: a phrase whose words are in every row takes many seconds.
            return conn.exec_driver_sql(
                f"SET STATEMENT max_statement_time={FT_LIMIT_S} FOR "
                f"SELECT id FROM job_queue WHERE {where} ORDER BY id DESC LIMIT 51",
                (f'"{term}"',),
            ).all()

        for name, (term, status) in terms.items():
            try:
                rows = match(term, status)
                out["fulltext"][name] = {
                    "term": term,
                    "found": len(rows),
                    **_timed(lambda: match(term, status), min(rounds, 3)),
                }
            except sa.exc.DBAPIError as exc:  # 1969: max_statement_time exceeded
                conn.rollback()
                out["fulltext"][name] = {
                    "term": term,
                    "found": None,
                    "timed_out_s": FT_LIMIT_S,
                    "error": str(exc.orig)[:120],
                }
        # Substrings: a LIKE finds "ustomer" and "eedle-7"; FULLTEXT matches whole tokens only.
        out["fulltext"]["substring_found"] = len(match("eedle", None))
        conn.commit()
        with_ft = [common.enqueue_noops(url, 20_000, prefix=f"ft-with-{i}-") for i in range(2)]
        conn.exec_driver_sql("ALTER TABLE job_queue DROP INDEX ft_search")
        conn.commit()
    raw.dispose()
    plain.append(common.enqueue_noops(url, 20_000, prefix="ft-after-"))
    out["enqueue_jobs_per_s"] = {
        "without_fulltext": 20_000 / common.median(plain),
        "with_fulltext": 20_000 / common.median(with_ft),
        "runs_without": [20_000 / x for x in plain],
        "runs_with": [20_000 / x for x in with_ft],
    }
    log(f"dashboard: search bounded {out['bounded']} fulltext {out['fulltext']} enqueue {out['enqueue_jobs_per_s']}")
    return out


# The servers of scripts/ensure-services (tests/conftest.py names them the same way).
SERVERS = {
    "mariadb": "mysql+pymysql://root@127.0.0.1:3306",
    "mysql": "mysql+pymysql://root@127.0.0.1:3307",
    "mariadb11": "mysql+pymysql://root@127.0.0.1:3308",
}


def server_info(server_url: str) -> dict[str, Any]:
    engine = sa.create_engine(server_url + "/", poolclass=NullPool)
    with engine.connect() as conn:
        version, pool = conn.exec_driver_sql("SELECT VERSION(), @@innodb_buffer_pool_size").one()
    engine.dispose()
    return {"version": version, "innodb_buffer_pool_mib": int(pool) // 2**20}


def main(argv: list[str] | None = None) -> int:
    import argparse
    import json
    import shlex
    import sys
    from pathlib import Path

    try:
        import psutil  # noqa: F401 - the run's CPU figures; fail now, not after loading millions of rows
    except ImportError:
        sys.exit(
            "bench.dashboard needs the bench extra: .venv/bin/pip install -e '.[test,bench]' (scripts/bench does it)"
        )

    p = argparse.ArgumentParser(description="dashboard pages at scale (issue 17's shape)")
    p.add_argument("--rows", default="1000000", help="comma-separated table sizes, e.g. 1000000,5000000")
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--warmups", type=int, default=2)
    p.add_argument("--polls", type=int, default=10)
    where = p.add_mutually_exclusive_group()
    where.add_argument(
        "--server",
        choices=SERVERS,
        help="one of the servers of scripts/ensure-services (default: $BENCH_MYSQL, else mariadb)",
    )
    where.add_argument(
        "--database-url",
        help="a server URL without a database name, mysql+pymysql://user@host:port; "
        "the benchmark creates its own databases there and drops them",
    )
    p.add_argument(
        "--out",
        help="default docs/bench/dashboard.md, dashboard-mysql.md with --server mysql, "
        "dashboard-mariadb11.md with --server mariadb11",
    )
    a = p.parse_args(argv)
    command = "python -m bench.dashboard " + " ".join(
        shlex.quote(x) for x in (argv if argv is not None else sys.argv[1:])
    )
    # Every database of the run, and the server pid whose CPU ProcRun reads, come from common's server.
    common.MYSQL_SERVER = a.database_url or SERVERS.get(a.server) or common.MYSQL_SERVER
    suffix = "" if a.server in (None, "mariadb") else f"-{a.server}"
    out = Path(a.out or common.REPO / f"docs/bench/dashboard{suffix}.md")
    log_dir = Path("/tmp") / f"{common.RUN_TAG}-logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    run_info = {
        "command": command.strip(),
        "server": server_info(common.MYSQL_SERVER),
        "started": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "loadavg_start": os.getloadavg(),
    }
    results = []
    try:
        with common.mysql_db("dash0") as empty_url:
            for rows in (int(x) for x in a.rows.split(",")):
                with common.mysql_db("dash") as url:
                    results.append(scale(url, rows, a.rounds, a.warmups, log_dir, a.polls, empty_url))
                run_info.update(
                    finished=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), loadavg_end=os.getloadavg()
                )
                for r in results:
                    r["run"] = run_info
                out.parent.mkdir(parents=True, exist_ok=True)
                write_md(results, out, run_info)
                out.with_suffix(".json").write_text(json.dumps(results, indent=1, default=str))
                log(f"dashboard: wrote {out}")
    finally:
        common.drop_leftovers()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
