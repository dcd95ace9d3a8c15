"""Enqueue speed (issue 17): batch enqueue against a hand-written PyMySQL INSERT and pgqueuer,
`jobqueue enqueue-many` as a whole process, validation per job, and single enqueue over HTTP.

In one run, on the same servers, rounds alternating (medians over rounds), each round on a fresh
database:

a. `service.enqueue_many`, batches of 1,000 (validation, idempotency, ids) against a
   hand-written PyMySQL multi-row INSERT of the same rows (every value a parameter, batches of
   1,000, one COMMIT each): rows/s and their ratio.
b. `jobqueue enqueue-many FILE` of the same number of JSON lines, the whole process (start-up,
   reading, printing), minus the time of an empty file's run: rows/s, against (a)'s raw rate.
c. pgqueuer's batch enqueue (`Queries.enqueue` of 1,000 at a time) on the local PostgreSQL 15,
   from a fresh process, when pgqueuer and asyncpg are installed (`pip install -e .[bench]`).
d. One job per `POST /api/jobs` against a real gunicorn (1 process, no embedded workers), one
   client, sequential: p50 / p95 / p99 latency.

Plus validation alone (validate_jobs), microseconds per job, with and without a small payload.
Nothing here asserts a speed; it prints what it measured (stderr: progress; stdout: one JSON
document), and `--markdown` prints the table for docs/bench/enqueue.md.

    python -m bench.enqueue                     # 100,000 rows, 3 rounds, 500 requests
    python -m bench.enqueue --rows 5000 --rounds 1 --requests 50 --no-pgqueuer   # a smoke run
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import pymysql

from bench import common
from bench.common import log, median, percentile, ratio
from bench.raw_loop import connect_args
from jobqueue.core import repository, service
from jobqueue.core.db import create_engine

BATCH = 1000
RAW_COLUMNS = (
    "task_key",
    "task_name",
    "queue",
    "priority",
    "payload",
    "status",
    "run_at",
    "attempts",
    "max_attempts",
    "created_at",
    "updated_at",
)
TOKEN = "bench-token-0123456789abcdef"


def jobs(n: int, prefix: str) -> list[dict[str, Any]]:
    return [{"task": "noop", "task_key": f"{prefix}{i}"} for i in range(n)]


def ours(url: str, n: int) -> float:
    """enqueue_many in batches of BATCH; seconds."""
    specs = jobs(n, "o")
    engine = create_engine(url, pool_size=1)
    try:
        with engine.connect() as conn:
            t0 = time.perf_counter()
            for lo in range(0, n, BATCH):
                service.enqueue_many(conn, specs[lo : lo + BATCH])
            return time.perf_counter() - t0
    finally:
        engine.dispose()


def raw(url: str, n: int) -> float:
    """The same rows by a hand-written multi-row INSERT, every value a parameter; seconds."""
    conn = pymysql.connect(**connect_args(url))
    row = "(" + ",".join(["%s"] * len(RAW_COLUMNS)) + ")"
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT UTC_TIMESTAMP(6)")
            (now,) = cur.fetchone()
            conn.commit()
            t0 = time.perf_counter()
            for lo in range(0, n, BATCH):
                k = min(BATCH, n - lo)
                params: list[Any] = []
                for i in range(lo, lo + k):
                    params += (f"r{i}", "noop", "default", 0, "{}", "ready", now, 0, 25, now, now)
                cur.execute(f"INSERT INTO job_queue ({', '.join(RAW_COLUMNS)}) VALUES " + ",".join([row] * k), params)
                conn.commit()
            return time.perf_counter() - t0
    finally:
        conn.close()


def cli_run(url: str, path: Path) -> float:
    """`jobqueue enqueue-many PATH` as a process; seconds, start to exit."""
    t0 = time.perf_counter()
    out = subprocess.run(
        [sys.executable, "-m", "jobqueue.cli", "--database-url", url, "enqueue-many", str(path)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=common.child_env(),
        cwd=common.REPO,
        timeout=1800,
    )
    elapsed = time.perf_counter() - t0
    if out.returncode != 0:
        raise RuntimeError(f"enqueue-many failed ({out.returncode}):\n{out.stderr[-3000:]}")
    return elapsed


PGQUEUER_ENQUEUE = """
import asyncio, json, os, sys, time
import asyncpg
from pgqueuer import AsyncpgDriver, Queries
n, batch = int(sys.argv[1]), int(sys.argv[2])
async def main():
    conn = await asyncpg.connect(os.environ["BENCH_PG_DSN"])
    q = Queries(AsyncpgDriver(conn))
    await q.install()
    t0 = time.perf_counter()
    for lo in range(0, n, batch):
        k = min(batch, n - lo)
        await q.enqueue(["noop"] * k, [None] * k, [0] * k)
    elapsed = time.perf_counter() - t0
    await conn.close()
    print(json.dumps(elapsed))
asyncio.run(main())
"""


def pgqueuer_available() -> str | None:
    """None if pgqueuer's batch enqueue can run here, else why not."""
    try:
        import asyncpg  # noqa: F401
        import pgqueuer  # noqa: F401
        import psycopg  # noqa: F401  (bench.peers creates the databases with it)
    except ImportError as exc:
        return f"not installed ({exc.name}); pip install -e '.[bench]'"
    try:
        from bench.peers import _pg_admin

        _pg_admin().close()
    except Exception as exc:  # noqa: BLE001 - reported
        return f"PostgreSQL at {common.PG_SERVER} not reachable: {exc}"
    return None


def pgqueuer_run(n: int) -> float:
    from bench.peers import pg_db

    with pg_db("pgqenq") as dsn:
        out = subprocess.run(
            [sys.executable, "-c", PGQUEUER_ENQUEUE, str(n), str(BATCH)],
            capture_output=True,
            text=True,
            env=common.child_env(BENCH_PG_DSN=dsn),
            cwd=common.REPO,
            timeout=1800,
        )
        if out.returncode != 0:
            raise RuntimeError(f"pgqueuer enqueue failed:\n{out.stderr[-3000:]}")
        return float(out.stdout.strip().splitlines()[-1])


def validation_us(n: int = 20000) -> dict[str, float]:
    """validate_jobs alone, best of 5, microseconds per job."""
    shapes = {"no payload": None, "small payload": {"order": 12345, "email": "someone@example.com", "lines": [1, 2, 3]}}
    out = {}
    for name, payload in shapes.items():
        specs = [{"task": "noop", "task_key": f"order-{i:08d}", "payload": payload} for i in range(n)]
        best = float("inf")
        for _ in range(5):
            t0 = time.perf_counter()
            repository.enqueue.validate_jobs(specs)
            best = min(best, time.perf_counter() - t0)
        out[name] = best / n * 1e6
    return out


def http_latency(url: str, requests: int, log_dir: Path) -> dict[str, Any]:
    """Sequential single-job POST /api/jobs against gunicorn; milliseconds."""
    from werkzeug.security import generate_password_hash

    from testkit.procs import GunicornServer

    # The default log level (INFO), as users run it.
    env = {
        "JOBQUEUE_API_TOKENS": f"bench:admin:{TOKEN}",
        "JOBQUEUE_SECRET_KEY": "bench",
        "JOBQUEUE_USERS": f"bench:admin:{generate_password_hash('bench-password-1')}",
        "JOBQUEUE_LOG_LEVEL": "INFO",
        "JOBQUEUE_SECURE_COOKIES": "0",
        **common.KEEP_EVERYTHING,
    }
    server = GunicornServer(url, log_dir, web_workers=1, embedded_workers=0, extra_env=env, name="gunicorn-enqueue")
    times: list[float] = []
    try:
        for i in range(-20, requests):  # 20 warm-ups, not counted
            body = json.dumps({"task": "noop", "task_key": f"h{i}", "payload": {"n": i}}).encode()
            req = urllib.request.Request(
                server.base + "/api/jobs",
                data=body,
                method="POST",
                headers={"Content-Type": "application/json", "Authorization": f"Bearer {TOKEN}"},
            )
            t0 = time.perf_counter()
            with urllib.request.urlopen(req, timeout=30) as r:
                r.read()
                assert r.status == 201, r.status
            if i >= 0:
                times.append((time.perf_counter() - t0) * 1000)
    finally:
        server.stop()
    return {
        "requests": requests,
        "p50_ms": percentile(times, 50),
        "p95_ms": percentile(times, 95),
        "p99_ms": percentile(times, 99),
        "max_ms": max(times),
    }


def run(rows: int, rounds: int, requests: int, with_pgqueuer: bool = True, with_http: bool = True) -> dict[str, Any]:
    samples: dict[str, list[float]] = {"ours": [], "raw": [], "cli": [], "cli_empty": [], "pgqueuer": []}
    pg_missing = pgqueuer_available() if with_pgqueuer else "skipped (--no-pgqueuer)"
    if pg_missing:
        log(f"pgqueuer: {pg_missing}")
    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        lines = tmp_path / "jobs.jsonl"
        lines.write_text("".join(json.dumps({"task": "noop", "task_key": f"c{i}"}) + "\n" for i in range(rows)))
        empty = tmp_path / "empty.jsonl"
        empty.write_text("")
        for r in range(rounds):
            # Alternate the order each round, so that neither side always runs on a warmer server.
            order = ["raw", "ours", "cli", "pgqueuer"] if r % 2 == 0 else ["pgqueuer", "cli", "ours", "raw"]
            for name in order:
                if name == "pgqueuer":
                    if not pg_missing:
                        samples["pgqueuer"].append(pgqueuer_run(rows))
                    continue
                with common.mysql_db(f"enq{name}") as url:
                    if name == "ours":
                        samples["ours"].append(ours(url, rows))
                    elif name == "raw":
                        samples["raw"].append(raw(url, rows))
                    else:
                        samples["cli_empty"].append(cli_run(url, empty))
                        samples["cli"].append(cli_run(url, lines))
            log(f"round {r + 1}/{rounds}: " + ", ".join(f"{k} {v[-1]:.2f}s" for k, v in samples.items() if v))
        latency = None
        if with_http:
            with common.mysql_db("enqhttp") as url:
                latency = http_latency(url, requests, tmp_path)
    rate = {name: rows / median(s) if s else None for name, s in samples.items() if name != "cli_empty"}
    cli_net = [c - e for c, e in zip(samples["cli"], samples["cli_empty"])]
    # Start-up varies by more than a small file's work: no rate when the difference is not positive.
    rate["cli_net"] = rows / median(cli_net) if median(cli_net) > 0 else None
    return {
        "rows": rows,
        "rounds": rounds,
        "batch": BATCH,
        "cpus": os.cpu_count(),
        "load_average": os.getloadavg(),
        "seconds": samples,
        "rows_per_s": rate,
        "cli_empty_run_s": median(samples["cli_empty"]),
        "ratios": {
            "enqueue_many / raw PyMySQL": ratio(rate["ours"], rate["raw"]),
            "enqueue-many process (empty run subtracted) / raw PyMySQL": ratio(rate["cli_net"], rate["raw"])
            if rate["cli_net"]
            else None,
            "enqueue-many whole process / raw PyMySQL": ratio(rate["cli"], rate["raw"]),
            "enqueue_many / pgqueuer": ratio(rate["ours"], rate["pgqueuer"]) if rate["pgqueuer"] else None,
        },
        "pgqueuer": pg_missing or "measured",
        "validation_us_per_job": validation_us(),
        "http_single_enqueue": latency,
    }


def scenario(ctx) -> dict[str, Any]:
    """As a scenario of bench.run (scripts/bench --only enqueue)."""
    if ctx.quick:
        return run(5_000, 1, 50, True, True)
    return run(100_000, 3, 500, True, True)


def markdown(res: dict[str, Any]) -> str:
    r, q = res["rows_per_s"], res["ratios"]
    out = [
        f"{res['rows']:,} rows in batches of {res['batch']:,}, median of {res['rounds']} rounds "
        f"(load average at the end: {', '.join(f'{x:.1f}' for x in res['load_average'])}).",
        "",
        "| what | rows/s | ratio |",
        "|---|---|---|",
        f"| hand-written PyMySQL multi-row INSERT | {r['raw']:,.0f} | 1.00 |",
        f"| `service.enqueue_many` | {r['ours']:,.0f} | {q['enqueue_many / raw PyMySQL']:.2f} |",
        f"| `jobqueue enqueue-many` process, empty run ({res['cli_empty_run_s']:.2f} s) subtracted | "
        + (
            f"{r['cli_net']:,.0f} | {q['enqueue-many process (empty run subtracted) / raw PyMySQL']:.2f} |"
            if r["cli_net"]
            else "not measurable (the empty run took longer) | |"
        ),
        f"| `jobqueue enqueue-many` whole process | {r['cli']:,.0f} | {q['enqueue-many whole process / raw PyMySQL']:.2f} |",
    ]
    if r["pgqueuer"]:
        out.append(
            f"| pgqueuer `Queries.enqueue` (PostgreSQL 15) | {r['pgqueuer']:,.0f} | "
            f"{ratio(r['pgqueuer'], r['raw']):.2f} (ours / pgqueuer: {q['enqueue_many / pgqueuer']:.2f}) |"
        )
    else:
        out.append(f"| pgqueuer | not measured: {res['pgqueuer']} | |")
    v = res["validation_us_per_job"]
    out += [
        "",
        "Validation (`validate_jobs`, best of 5 over 20,000 jobs): "
        + ", ".join(f"{name} {us:.2f} us/job" for name, us in v.items())
        + ".",
    ]
    h = res["http_single_enqueue"]
    if h:
        out += [
            "",
            f"Single enqueue, `POST /api/jobs` against gunicorn (1 process, no embedded workers), "
            f"{h['requests']} sequential requests after 20 warm-ups: p50 {h['p50_ms']:.1f} ms, "
            f"p95 {h['p95_ms']:.1f} ms, p99 {h['p99_ms']:.1f} ms, max {h['max_ms']:.1f} ms.",
        ]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=500, help="single POST /api/jobs requests")
    parser.add_argument("--no-pgqueuer", action="store_true")
    parser.add_argument("--no-http", action="store_true")
    parser.add_argument("--markdown", action="store_true", help="print the docs table after the JSON")
    args = parser.parse_args(argv)
    try:
        res = run(args.rows, args.rounds, args.requests, not args.no_pgqueuer, not args.no_http)
    finally:
        common.drop_leftovers()
    print(json.dumps(res, indent=2, default=str))
    if args.markdown:
        print(markdown(res))
    return res


if __name__ == "__main__":
    main()
