"""11. Against the Python queues on MySQL (issue 29): dj-queue, django-tasks-db, firm-queue and
django-q2 beside our worker, on the same server, in the same run, systems alternating.

    python -m bench.mysql_peers --server mariadb --jobs 5000 --rounds 3
    python -m bench.mysql_peers --server mysql,mariadb11 --only "ours p1 t4,dj-queue t4"
    python -m bench.run --only mysql_peers        # every server, into docs/benchmarks.md

Every system runs the same handler (bench/peer_apps/append_line.py): append "<key> <time>" to a
file. Each run: a fresh database on the chosen server, N jobs enqueued (timed: the first
min(1,000, N/5) one call each, the rest with the system's batch API, or where it has none in
chunks of 1,000 calls inside one transaction), then the workers start together behind the start
gate (bench/gate.py) and run until every job is done. Executions are counted from the file:
lost = N - distinct keys, duplicates = lines - distinct keys. jobs/s = jobs the system recorded as
done / (first start .. last finish), from the system's own timestamps where it records them:

    ours              job_queue.started_at .. finished_at
    django-tasks-db   started_at .. finished_at of its result rows
    dj-queue          jobs.finished_at; no start is kept (the claimed row is deleted on finish),
    firm-queue        so first start = the first line its handler wrote
    django-q2         django_q_task.stopped (save_limit 0 keeps every success); its `started` is
                      stamped by async_task() at enqueue, so first start = the first line too

The peers run in a Python 3.12 venv of their own (bench/peers_venv.py builds it) from the small
Django project in bench/peer_apps/django_peers/ (firm-queue is not a Django app:
bench/peer_apps/firm_worker.py). Configurations, and the documentation each follows: the
docstrings of those two files and `configs()` below. Everything at each system's default log level.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import math
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.pool import NullPool

import bench.append_tasks  # noqa: F401  (registers `append`, which the harness enqueues)
from bench import common
from bench.common import log

SERVERS = {
    "mariadb": os.environ.get(
        "BENCH_SERVER_MARIADB", os.environ.get("BENCH_MYSQL", "mysql+pymysql://root@127.0.0.1:3306")
    ),
    "mysql": os.environ.get("BENCH_SERVER_MYSQL", "mysql+pymysql://root@127.0.0.1:3307"),
    "mariadb11": os.environ.get("BENCH_SERVER_MARIADB11", "mysql+pymysql://root@127.0.0.1:3308"),
}
BATCH = 1000
DJANGO_SETTINGS = "bench.peer_apps.django_peers.settings"


def single_count(jobs: int) -> int:
    return min(1000, jobs // 5)


@dataclass
class Config:
    key: str  # "dj-queue t16": the name in results and tables
    system: str  # ours, dj-queue, django-tasks-db, firm-queue, django-q2
    four_way: bool  # the 4-way configuration compared with ours at 1 process x 4 threads
    why: str  # where the configuration comes from
    start: Callable[[Run], common.ProcRun]  # starts the workers (behind the gate)
    exits: bool  # the workers exit by themselves once the queue is empty


# --- one run --------------------------------------------------------------------------------------


@dataclass
class Run:
    """One system on one server: its database, its append file, its workers' environment."""

    server: str
    url: str  # mysql+pymysql://root@host:port/db
    append_file: Path
    log_dir: Path
    peers_python: str | None

    @property
    def db_name(self) -> str:
        return sa.engine.make_url(self.url).database

    def peer_env(self, **extra: str) -> dict[str, str]:
        u = sa.engine.make_url(self.url)
        return {
            "BENCH_APPEND_FILE": str(self.append_file),
            "DJANGO_SETTINGS_MODULE": DJANGO_SETTINGS,
            "BENCH_DB_NAME": u.database,
            "BENCH_DB_HOST": u.host or "127.0.0.1",
            "BENCH_DB_PORT": str(u.port or 3306),
            "BENCH_DB_USER": u.username or "root",
            "BENCH_DB_PASSWORD": u.password or "",
            "BENCH_FIRM_URL": self.url,
            **extra,
        }

    def peer(self, args: list[str], **env: str) -> str:
        """Run the peers' interpreter to the end; its stdout."""
        assert self.peers_python, "the peers' venv (bench/peers_venv.py)"
        out = subprocess.run(
            [self.peers_python, *args],
            capture_output=True,
            text=True,
            env=common.child_env(**self.peer_env(**env)),
            cwd=common.REPO,
            timeout=900,
        )
        if out.returncode != 0:
            raise RuntimeError(f"{' '.join(args)} failed:\n{out.stdout[-2000:]}\n{out.stderr[-4000:]}")
        return out.stdout


def _query(url: str, sql: str) -> tuple:
    engine = sa.create_engine(url, poolclass=NullPool)
    try:
        with engine.connect() as conn:
            return tuple(conn.exec_driver_sql(sql).one())
    finally:
        engine.dispose()


# Per system: (done, first start or None, last finish) from its own tables.
DONE_SQL = {
    "ours": "SELECT COUNT(*), MIN(started_at), MAX(finished_at) FROM job_queue WHERE status = 'done'",
    "dj-queue": "SELECT COUNT(*), NULL, MAX(finished_at) FROM dj_queue_jobs WHERE finished_at IS NOT NULL",
    "django-tasks-db": (
        "SELECT COUNT(*), MIN(started_at), MAX(finished_at) FROM django_tasks_database_dbtaskresult "
        "WHERE status = 'SUCCESSFUL'"
    ),
    "firm-queue": "SELECT COUNT(*), NULL, MAX(finished_at) FROM firm_queue_jobs WHERE finished_at IS NOT NULL",
    # `started` is the enqueue time (django_q/tasks.py async_task), not the start of the run.
    "django-q2": "SELECT COUNT(*), NULL, MAX(stopped) FROM django_q_task WHERE success = 1",
}
DJANGO_PEER = {"dj-queue": "dj_queue", "django-tasks-db": "django_tasks_db", "django-q2": "django_q"}


def read_lines(path: Path) -> tuple[int, int, float | None, float | None]:
    """(lines, distinct keys, first time, last time) of an append file."""
    if not path.exists():
        return 0, 0, None, None
    keys: set[str] = set()
    lines = 0
    first = last = None
    for line in path.read_text().splitlines():
        key, _, at = line.partition(" ")
        lines += 1
        keys.add(key)
        t = float(at)
        first = t if first is None or t < first else first
        last = t if last is None or t > last else last
    return lines, len(keys), first, last


def _epoch(d: datetime | None) -> float | None:
    """A server's naive UTC DATETIME as a Unix time (every system here stores UTC)."""
    return d.replace(tzinfo=UTC).timestamp() if d else None


def _line_count(path: Path) -> int:
    try:
        with open(path, "rb") as fh:
            return fh.read().count(b"\n")
    except FileNotFoundError:
        return 0


def measure(cfg: Config, server: str, jobs: int, log_dir: Path, peers_python: str | None) -> dict[str, Any]:
    common.MYSQL_SERVER = SERVERS[server]
    common._mariadbd_pid = None  # the server's CPU, as ProcRun counts it, is this server's
    label = cfg.system.replace("-", "")[:8]
    url = common.create_mysql_db(f"mp_{label}", schema=cfg.system == "ours")
    run = Run(server, url, log_dir / f"append-{uuid.uuid4().hex[:8]}.txt", log_dir, peers_python)
    try:
        single = single_count(jobs)
        if cfg.system == "ours":
            single_s = common.enqueue_one_by_one(url, single, prefix="j", task="append")
            batch_s = common.enqueue_noops(url, jobs - single, batch=BATCH, prefix="j", start=single, task="append")
            how = "batch API (enqueue_many)"
        elif cfg.system == "firm-queue":
            run.peer(["-m", "bench.peer_apps.firm_worker", "schema"])
            single_s, batch_s, how = json.loads(
                run.peer(["-m", "bench.peer_apps.firm_worker", "enqueue", str(jobs), str(single)]).splitlines()[-1]
            )
        else:
            peer = DJANGO_PEER[cfg.system]
            run.peer(["-m", "django", "migrate", "-v0"], BENCH_PEER=peer)
            single_s, batch_s, how = json.loads(
                run.peer(
                    ["-m", "bench.peer_apps.django_peers.enqueue", str(jobs), str(single), str(BATCH)], BENCH_PEER=peer
                ).splitlines()[-1]
            )
        procs = cfg.start(run)
        deadline = max(180.0, jobs / 20)
        if cfg.exits:
            procs.wait(deadline)
            procs.check()
        else:
            _wait_done(cfg, run, procs, jobs, deadline)
            procs.stop(signal.SIGTERM, timeout=30)
        done, first, last = _query(url, DONE_SQL[cfg.system])
        lines, distinct, first_line, last_line = read_lines(run.append_file)
    finally:
        common.drop_mysql_db(url)
        with contextlib.suppress(FileNotFoundError):
            run.append_file.unlink()
    first_start = _epoch(first) if first else first_line
    last_finish = _epoch(last)
    window = (last_finish - first_start) if first_start and last_finish else float("nan")
    handler_window = (last_line - first_line) if first_line and last_line else float("nan")
    return {
        "system": cfg.system,
        "config": cfg.key,
        "server": server,
        "jobs": jobs,
        "done": done,
        "lines": lines,
        "distinct": distinct,
        "lost": jobs - distinct,
        "duplicates": lines - distinct,
        "start_from": "system" if first else "first handler line",
        "window_s": window,
        "jobs_per_s": done / window if window > 0 else float("nan"),
        "handler_jobs_per_s": distinct / handler_window if handler_window > 0 else float("nan"),
        "enqueue_single_jobs_per_s": single / single_s if single_s else float("nan"),
        "enqueue_batch_jobs_per_s": (jobs - single) / batch_s if batch_s else float("nan"),
        "enqueue_batch_how": how,
        "cpu_ms_per_job": procs.cpu / jobs * 1000,
        "wall_s": procs.t_end - procs.t_gate,
        "exit_codes": procs.returncodes,
    }


def _wait_done(cfg: Config, run: Run, procs: common.ProcRun, jobs: int, timeout: float) -> None:
    """Until the handler wrote N lines and the system recorded N done (or the time is up, or a
    worker died): for the peers whose workers never exit by themselves."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and procs.poll():
        if _line_count(run.append_file) >= jobs and _query(run.url, DONE_SQL[cfg.system])[0] >= jobs:
            return
        time.sleep(0.2)
    if not procs.poll():
        raise RuntimeError(f"{cfg.key}: workers exited before the jobs were done:\n{procs.log_tail()}")
    log(f"{cfg.key}: not done after {timeout:.0f}s; counting what was done")


# --- the configurations ---------------------------------------------------------------------------


def _ours(procs: int, threads: int, driver: str = "pymysql") -> Callable[[Run], common.ProcRun]:
    """`procs` x `jobqueue worker --concurrency threads`, through `driver` (the URL's: pymysql,
    the default, or mysqldb, the jobqueue[mysqlclient] extra's, the C driver the Django peers use)."""

    def start(run: Run) -> common.ProcRun:
        url = run.url.replace("+pymysql://", f"+{driver}://", 1)
        cmd = common.worker_cmd(url, threads, tasks="bench.append_tasks,bench.gate_tasks")
        p = common.ProcRun([cmd] * procs, env={"BENCH_APPEND_FILE": str(run.append_file)})
        p.start(run.log_dir)
        return p

    return start


def _peer_procs(cmds: list[list[str]], **env: str) -> Callable[[Run], common.ProcRun]:
    def start(run: Run) -> common.ProcRun:
        p = common.ProcRun([[run.peers_python, *c] for c in cmds], env=run.peer_env(**env), new_session=True)
        p.start(run.log_dir)
        return p

    return start


def _dj_queue(threads: int) -> Callable[[Run], common.ProcRun]:
    return _peer_procs(
        [["-m", "django", "dj_queue", "--mode", "async", "--skip-recurring"]],
        BENCH_PEER="dj_queue",
        BENCH_THREADS=str(threads),
    )


def _django_tasks_db(procs: int) -> Callable[[Run], common.ProcRun]:
    return _peer_procs(
        [["-m", "django", "db_worker", "--batch", "--no-startup-delay", "--no-reload"]] * procs,
        BENCH_PEER="django_tasks_db",
    )


def _firm(procs: int, threads: int, poll: float) -> Callable[[Run], common.ProcRun]:
    return _peer_procs(
        [
            [
                "-m",
                "bench.peer_apps.firm_worker",
                "work",
                "--processes",
                str(procs),
                "--threads",
                str(threads),
                "--poll",
                str(poll),
            ]
        ]
    )


def _django_q(workers: int) -> Callable[[Run], common.ProcRun]:
    return _peer_procs([["-m", "django", "qcluster"]], BENCH_PEER="django_q", BENCH_WORKERS=str(workers))


DJQ_WHY = (
    "standalone async mode (README: async 'runs supervised actors in threads inside one process'), one worker, "
    "polling_interval 0.1 and prefetch_multiplier 2 (its defaults), CONN_MAX_AGE 600 (README: 'can materially "
    "improve worker throughput')"
)
TASKS_DB_WHY = (
    "`manage.py db_worker --batch --no-startup-delay` per process (one task at a time per process, so concurrency "
    "is processes; --batch: 'Process all outstanding tasks, then exit'), CONN_MAX_AGE 600"
)
FIRM_WHY = (
    "a ForkSupervisor as `firm-queue start` runs it (docs: 'the production default'), one forked worker per process "
    "('CPU-bound jobs scale by running more worker processes'), poll_interval 0 (busy workers claim again at once; "
    "idle ones still back off 1 s), PyMySQL (its docs' MySQL driver)"
)
DJQ2_WHY = (
    "`manage.py qcluster`, ORM broker as its docs' example (timeout 90, retry 120, queue_limit 50, bulk 10: 'can "
    "improve performance'), save_limit 0 (keeps every success, whose `stopped` is measured), scheduler off"
)


def _with_mysqlclient(*fields: Any) -> list[Config]:
    """The configuration where mysqlclient is installed (scripts/ensure-services installs it),
    else none: a machine without a compiler still runs every other one."""
    return [Config(*fields)] if importlib.util.find_spec("MySQLdb") is not None else []


def configs() -> list[Config]:
    """Ours at 1 x 4 threads, 2 x 4 and 2 x 64 (on no-op jobs which is faster has depended on the
    machine; on this section's handler 2 x 4 was, on both kinds of CPU measured), each of the two
    also on mysqlclient, the C driver of the jobqueue[mysqlclient] extra and of every Django peer
    here; each peer at 4-way concurrency and at its best configuration found in issue 29's
    measurement."""
    return [
        Config("ours p1 t4", "ours", True, "`jobqueue worker --concurrency 4 --burst`", _ours(1, 4), True),
        Config("ours p2 t4", "ours", False, "2 x `jobqueue worker --concurrency 4 --burst`", _ours(2, 4), True),
        Config("ours p2 t64", "ours", False, "2 x `jobqueue worker --concurrency 64 --burst`", _ours(2, 64), True),
        *_with_mysqlclient(
            "ours p2 t4 mysqlclient",
            "ours",
            False,
            "2 x `jobqueue worker --concurrency 4 --burst`, URL `mysql+mysqldb://` (the `jobqueue[mysqlclient]` extra: "
            "mysqlclient, the C driver the Django peers run on)",
            _ours(2, 4, "mysqldb"),
            True,
        ),
        *_with_mysqlclient(
            "ours p2 t64 mysqlclient",
            "ours",
            False,
            "2 x `jobqueue worker --concurrency 64 --burst`, URL `mysql+mysqldb://`",
            _ours(2, 64, "mysqldb"),
            True,
        ),
        Config("dj-queue t4", "dj-queue", True, DJQ_WHY + ", 4 threads", _dj_queue(4), False),
        Config("dj-queue t16", "dj-queue", False, DJQ_WHY + ", 16 threads", _dj_queue(16), False),
        Config(
            "django-tasks-db p4", "django-tasks-db", True, TASKS_DB_WHY + ", 4 processes", _django_tasks_db(4), True
        ),
        Config(
            "django-tasks-db p8", "django-tasks-db", False, TASKS_DB_WHY + ", 8 processes", _django_tasks_db(8), True
        ),
        Config(
            "django-tasks-db p12", "django-tasks-db", False, TASKS_DB_WHY + ", 12 processes", _django_tasks_db(12), True
        ),
        Config("firm-queue p1 t4", "firm-queue", True, FIRM_WHY + ", 1 worker x 4 threads", _firm(1, 4, 0.0), False),
        Config(
            "firm-queue p2 t16", "firm-queue", False, FIRM_WHY + ", 2 workers x 16 threads", _firm(2, 16, 0.0), False
        ),
        Config("django-q2 w4", "django-q2", True, DJQ2_WHY + ", 4 workers", _django_q(4), False),
        Config("django-q2 w16", "django-q2", False, DJQ2_WHY + ", 16 workers", _django_q(16), False),
    ]


# --- the scenario ---------------------------------------------------------------------------------


def measure_all(
    servers: list[str], jobs: int, rounds: int, log_dir: Path, only: list[str] | None = None
) -> dict[str, Any]:
    table = [c for c in configs() if not only or c.key in only]
    unknown = set(only or ()) - {c.key for c in configs()}
    if unknown:
        raise ValueError(f"unknown configurations {sorted(unknown)}; known: {', '.join(c.key for c in configs())}")
    peers_python = None
    versions: dict[str, str] = {}
    if any(c.system != "ours" for c in table):
        from bench import peers_venv

        peers_python = peers_venv.python()
        versions = peers_venv.versions(peers_python)
    samples: dict[str, dict[str, list[dict]]] = {s: {c.key: [] for c in table} for s in servers}
    problems: dict[str, str] = {}
    for r in range(rounds):
        for server in servers:
            order = table if r % 2 == 0 else list(reversed(table))
            for cfg in order:
                name = f"{server}: {cfg.key}"
                if name in problems:
                    continue
                try:
                    res = measure(cfg, server, jobs, log_dir, peers_python)
                except Exception as exc:  # a peer that cannot run is reported, not faked
                    problems[name] = f"{type(exc).__name__}: {str(exc)[:800]}"
                    log(f"mysql_peers: {name} failed: {problems[name]}")
                    continue
                res["round"] = r
                samples[server][cfg.key].append(res)
                log(
                    f"mysql_peers round {r + 1}/{rounds} {name}: {res['jobs_per_s']:.0f} jobs/s "
                    f"(handler {res['handler_jobs_per_s']:.0f}), lost {res['lost']}, duplicates {res['duplicates']}, "
                    f"enqueue {res['enqueue_single_jobs_per_s']:.0f}/s single, {res['enqueue_batch_jobs_per_s']:.0f}/s batch"
                )
    summary: dict[str, dict[str, dict]] = {}
    for server, by_cfg in samples.items():
        summary[server] = {}
        for key, ss in by_cfg.items():
            if not ss:
                continue
            summary[server][key] = {
                k: common.median([s[k] for s in ss])
                for k in (
                    "jobs_per_s",
                    "handler_jobs_per_s",
                    "enqueue_single_jobs_per_s",
                    "enqueue_batch_jobs_per_s",
                    "cpu_ms_per_job",
                )
            }
            summary[server][key] |= {
                "runs": [round(s["jobs_per_s"]) for s in ss],
                "lost": sum(s["lost"] for s in ss),
                "duplicates": sum(s["duplicates"] for s in ss),
                "start_from": ss[0]["start_from"],
                "enqueue_batch_how": ss[0]["enqueue_batch_how"],
            }
    return {
        "jobs": jobs,
        "rounds": rounds,
        "servers": servers,
        "configs": {c.key: {"system": c.system, "four_way": c.four_way, "why": c.why} for c in table},
        "versions": versions,
        "summary": summary,
        "ratios": ratios(summary, {c.key: c for c in table}),
        "problems": problems,
        "samples": samples,
        "single_enqueue_jobs": single_count(jobs),
        "batch_size": BATCH,
    }


def ratios(summary: dict[str, dict[str, dict]], table: dict[str, Config]) -> dict[str, dict[str, dict]]:
    """Per server and peer: ours best / peer best, and ours 1 x 4 / the peer's 4-way configuration."""
    out: dict[str, dict[str, dict]] = {}
    for server, s in summary.items():
        ours = {k: v for k, v in s.items() if table[k].system == "ours"}
        best_ours = max(ours, key=lambda k: ours[k]["jobs_per_s"], default=None)
        four = s.get("ours p1 t4")
        out[server] = {}
        for system in dict.fromkeys(table[k].system for k in s if table[k].system != "ours"):
            mine = {k: v for k, v in s.items() if table[k].system == system}
            best = max(mine, key=lambda k: mine[k]["jobs_per_s"])
            four_way = next((k for k in mine if table[k].four_way), None)
            out[server][system] = {
                "peer_best": best,
                "peer_best_jobs_per_s": mine[best]["jobs_per_s"],
                "ours_best": best_ours,
                "best_vs_best": common.ratio(ours[best_ours]["jobs_per_s"], mine[best]["jobs_per_s"])
                if best_ours
                else float("nan"),
                "peer_four_way": four_way,
                "four_way": common.ratio(four["jobs_per_s"], mine[four_way]["jobs_per_s"])
                if four and four_way
                else float("nan"),
            }
    return out


def _times(x: float) -> str:
    return "n/a" if math.isnan(x) else f"**{x:.2f}x**"


def targets(res: dict[str, Any]) -> list[tuple[str, str, bool | None]]:
    """Issue 29's targets, per server and peer: ours best ahead of the peer's best, and ours at
    1 process x 4 threads >= 5x the peer at 4-way concurrency."""
    out = []
    for server, by_peer in res.get("ratios", {}).items():
        for system, r in by_peer.items():
            if not math.isnan(r["best_vs_best"]):
                out.append(
                    (
                        f"11. {server}: ours best ahead of {system}'s best ({r['ours_best']} vs {r['peer_best']})",
                        f"{r['best_vs_best']:.2f}x",
                        r["best_vs_best"] > 1,
                    )
                )
            if not math.isnan(r["four_way"]):
                out.append(
                    (
                        f"11. {server}: ours 1 process x 4 threads >= 5x {r['peer_four_way']}",
                        f"{r['four_way']:.2f}x",
                        r["four_way"] >= 5,
                    )
                )
    return out


def markdown(res: dict[str, Any]) -> str:
    from bench.report_format import n0, n2, table

    out = [
        f"{n0(res['jobs'])} jobs per system and round, rounds: {res['rounds']}, systems alternating (order reversed "
        f"every other round). Handler: append one line to a file. Enqueue: the first "
        f"{n0(res['single_enqueue_jobs'])} one call each, the rest in chunks of {n0(res['batch_size'])}. jobs/s: from "
        "each system's own timestamps, first start to last finish (median over rounds); 'handler': first to last "
        "line the handler wrote. Lost and duplicates: summed over rounds, counted from the file."
    ]
    if res.get("versions"):
        out.append("Peers: " + ", ".join(f"{k} {v}" for k, v in res["versions"].items()) + ".")
    for server in res["servers"]:
        s = res["summary"].get(server, {})
        rows = [
            [
                k,
                f"**{n0(v['jobs_per_s'])}**",
                ", ".join(n0(x) for x in v["runs"]),
                n0(v["handler_jobs_per_s"]),
                v["lost"],
                v["duplicates"],
                n0(v["enqueue_single_jobs_per_s"]),
                n0(v["enqueue_batch_jobs_per_s"]),
                n2(v["cpu_ms_per_job"]),
            ]
            for k, v in s.items()
        ]
        out.append(f"**{server}** ({SERVERS[server].rsplit('@', 1)[-1]})")
        out.append(
            table(
                [
                    "system (configuration)",
                    "jobs/s",
                    "runs",
                    "handler jobs/s",
                    "lost",
                    "duplicates",
                    "enqueue one at a time, jobs/s",
                    "enqueue batches, jobs/s",
                    "worker CPU ms/job",
                ],
                rows,
            )
        )
        cmp_rows = [
            [
                system,
                f"{r['peer_best']} ({n0(r['peer_best_jobs_per_s'])})",
                _times(r["best_vs_best"]),
                r["peer_four_way"] or "n/a",
                _times(r["four_way"]),
                "n/a" if math.isnan(r["four_way"]) else ("yes" if r["four_way"] >= 5 else "no"),
            ]
            for system, r in res["ratios"].get(server, {}).items()
        ]
        if cmp_rows:
            out.append(
                table(
                    [
                        "peer",
                        "peer's best (jobs/s)",
                        "ours best / peer best",
                        "peer at 4-way",
                        "ours 1 x 4 threads / peer 4-way",
                        ">= 5x?",
                    ],
                    cmp_rows,
                )
            )
    cfg_rows = [[k, c["why"]] for k, c in res["configs"].items()]
    out.append("Configurations:\n\n" + table(["configuration", "how, and why"], cfg_rows))
    if res.get("problems"):
        out.append("Could not run: " + "; ".join(f"{k}: {v}" for k, v in res["problems"].items()))
    return "\n\n".join(out)


def run(ctx) -> dict[str, Any]:
    """The bench.run scenario: every server."""
    return measure_all(list(SERVERS), ctx.jobs, ctx.rounds, ctx.log_dir)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--server", default="mariadb", help=f"comma-separated, of {', '.join(SERVERS)}")
    p.add_argument("--jobs", type=int, default=5000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--only", default="", help="comma-separated configurations (default: all)")
    p.add_argument("--out", default=None, help="results JSON (default build/bench-mysql-peers/results.json)")
    a = p.parse_args(argv)
    servers = [s.strip() for s in a.server.split(",") if s.strip()]
    if set(servers) - set(SERVERS):
        p.error(f"--server: of {', '.join(SERVERS)}")
    only = [s.strip() for s in a.only.split(",") if s.strip()] or None
    log_dir = Path(os.environ.get("BENCH_LOG_DIR", "/tmp")) / f"{common.RUN_TAG}-logs"
    log_dir.mkdir(parents=True, exist_ok=True)

    def _interrupt(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, _interrupt)
    t0, load = time.time(), os.getloadavg()
    try:
        res = measure_all(servers, a.jobs, a.rounds, log_dir, only)
    finally:
        common.drop_leftovers()
    res["_meta"] = {  # as bench.run writes it (bench/report_format.py meta_line)
        "command": "python -m bench.mysql_peers " + " ".join(argv if argv is not None else sys.argv[1:]),
        "date": time.strftime("%Y-%m-%d", time.gmtime(t0)),
        "started": time.strftime("%H:%M:%S", time.gmtime(t0)),
        "finished": time.strftime("%H:%M:%S", time.gmtime()),
        "seconds": time.time() - t0,
        "loadavg_start": load,
        "loadavg_end": os.getloadavg(),
    }
    out = Path(a.out) if a.out else common.REPO / "build" / "bench-mysql-peers" / "results.json"
    common.dump_json(out, res)
    print(markdown(res))
    log(f"results: {out}")
    return 1 if res["problems"] else 0


if __name__ == "__main__":
    sys.exit(main())
