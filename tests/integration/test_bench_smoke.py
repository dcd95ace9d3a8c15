"""The benchmark harness's ceiling (bench/raw_loop.py) does the queue's work correctly: every job
claimed once and completed under the fence. Correctness only; nothing here is timed."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import sqlalchemy as sa

from bench.raw_loop import RawLoop, connect_args
from jobqueue.core import service
from jobqueue.core.schema import job_queue
from tests.conftest import SERVERS

jq = job_queue.c


def _enqueue(engine, n):
    with engine.connect() as conn:
        service.enqueue_many(conn, [{"task": "noop", "task_key": f"k{i}"} for i in range(n)])


def _rows(engine):
    with engine.connect() as conn:
        return conn.execute(sa.select(jq.status, jq.attempts, jq.lease_owner, jq.started_at, jq.finished_at)).all()


def test_raw_loop_processes_every_job_once(mysql_engine, mysql_url):
    _enqueue(mysql_engine, 50)
    out = RawLoop(mysql_url, threads=3, batch=4).run()
    assert out["errors"] == [] and out["lost"] == 0 and out["mismatch"] == 0
    assert out["processed"] == 50
    rows = _rows(mysql_engine)
    assert len(rows) == 50
    assert {(r.status, r.attempts) for r in rows} == {("done", 1)}
    assert all(r.lease_owner and r.started_at and r.finished_at and r.finished_at >= r.started_at for r in rows)
    assert len({r.lease_owner for r in rows}) <= 3


def test_raw_loop_plain_for_update_also_completes(mysql_engine, mysql_url):
    _enqueue(mysql_engine, 20)
    out = RawLoop(mysql_url, threads=2, batch=1, skip_locked=False).run()
    assert out["errors"] == [] and out["processed"] == 20
    assert {(r.status, r.attempts) for r in _rows(mysql_engine)} == {("done", 1)}


def test_connect_args_parse_app_urls():
    args = connect_args("mysql+pymysql://u%40x:p%3Aw@db.example:3307/jq")
    assert (args["host"], args["port"], args["user"], args["password"], args["database"]) == (
        "db.example",
        3307,
        "u@x",
        "p:w",
        "jq",
    )
    assert args["autocommit"] is False


def test_the_enqueue_bench_runs_every_part_small(mysql_url):
    """bench/enqueue.py end to end at a small size (pgqueuer left out): every rate and ratio is
    measured, and the markdown table renders. Nothing is asserted about speed."""
    from bench import enqueue as enqueue_bench

    res = enqueue_bench.run(rows=1500, rounds=1, requests=5, with_pgqueuer=False)
    assert all(res["rows_per_s"][k] > 0 for k in ("ours", "raw", "cli"))
    assert res["cli_empty_run_s"] > 0  # at this size the empty run's time may exceed the difference
    assert res["ratios"]["enqueue_many / raw PyMySQL"] > 0 and res["ratios"]["enqueue_many / pgqueuer"] is None
    assert res["http_single_enqueue"]["requests"] == 5 and res["http_single_enqueue"]["p95_ms"] > 0
    assert set(res["validation_us_per_job"]) == {"no payload", "small payload"}
    assert "| `service.enqueue_many` |" in enqueue_bench.markdown(res)
    # The report's section and targets render from it (what scripts/bench --only enqueue writes).
    from bench.report import _enqueue

    targets: list = []
    assert "hand-written PyMySQL" in _enqueue(res, targets)
    assert any(name.startswith("9. validation") for name, _, _ in targets)


def test_the_enqueue_client_bench_runs_small(mysql_url):
    """bench/enqueue_client.py as documented, at a small size: it makes and drops its database."""
    import subprocess
    import sys

    server = mysql_url.rsplit("/", 1)[0]
    out = subprocess.run(
        [sys.executable, "-m", "bench.enqueue_client", "--server", server, "--rows", "2000"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
    )
    assert out.returncode == 0, out.stderr
    assert " rows/s, client CPU " in out.stdout


def test_the_dashboard_bench_loads_its_shape_on_every_server(mysql_url):
    """bench/dashboard.py fills the table from a table of numbers of its own (MariaDB's seq_1_to_N
    tables do not exist on MySQL): the history, then the live jobs above it, ids in time order."""
    from bench import dashboard

    dashboard.load(mysql_url, 12_000, live=1_000)
    engine = sa.create_engine(mysql_url)
    with engine.connect() as conn:
        counts = dict(conn.exec_driver_sql("SELECT status, COUNT(*) FROM job_queue GROUP BY status").all())
        assert counts == {
            "done": 11_000 - 11_000 // 19,
            "failed": 11_000 // 19,
            "ready": 800,
            "scheduled": 180,
            "running": 20,
        }
        # AUTO_INCREMENT ids follow the numbers: the keyset pages are in time order.
        assert (
            conn.exec_driver_sql(
                "SELECT COUNT(*) FROM (SELECT created_at, LAG(created_at) OVER (ORDER BY id) AS before_it FROM job_queue) t "
                "WHERE created_at < before_it"
            ).scalar()
            == 0
        )
        assert (
            conn.exec_driver_sql("SELECT MAX(id) FROM job_queue WHERE status IN ('done', 'failed')").scalar()
            < conn.exec_driver_sql("SELECT MIN(id) FROM job_queue WHERE status = 'ready'").scalar()
        )
        assert conn.exec_driver_sql("SELECT COUNT(*) FROM job_queue WHERE payload LIKE '%%needle-77%%'").scalar() == 1
        assert conn.exec_driver_sql("SELECT COUNT(*) FROM audit_log").scalar() == 5000
        assert conn.exec_driver_sql("SELECT COUNT(*) FROM worker_stats").scalar() == 60
        assert not conn.exec_driver_sql("SHOW TABLES LIKE 'bench_seq'").all()
    engine.dispose()


@pytest.mark.slow
@pytest.mark.only_servers("mariadb", "mariadb11")
def test_the_mysql_peers_bench_counts_every_execution(db_server, tmp_path, monkeypatch):
    """bench/mysql_peers.py end to end at 200 jobs on each server (MySQL 9.7 by hand, to keep the
    CI's longest share short: `PYTHONPATH=. .venv/bin/python -m bench.mysql_peers --server mysql
    --jobs 200 --rounds 1`, measured 2026-12-04 at 2,000 jobs: docs/benchmarks.md section 11): our worker (1 process x 4
    threads) and one peer (django-tasks-db, 4 db_worker processes, from the peers' Python 3.12
    venv: built on first use into ~/.cache/jobqueue/, about 30-45 s, then reused). Every job ran
    exactly once, counted from the file the handler appends to, each system's own timestamps give
    a rate, and the section and its targets render. Nothing is asserted about speed."""
    from bench import common, mysql_peers, peers_venv

    monkeypatch.setitem(mysql_peers.SERVERS, db_server, SERVERS[db_server])
    monkeypatch.setattr(common, "MYSQL_SERVER", common.MYSQL_SERVER)  # measure() points it at the server
    monkeypatch.setattr(common, "_mariadbd_pid", None)
    cache = Path.home() / ".cache" / "jobqueue" / "venv-bench-peers-py312"
    monkeypatch.setattr(peers_venv, "VENV", Path(os.environ.get("BENCH_PEERS_VENV", cache)))

    res = mysql_peers.measure_all([db_server], 200, 1, tmp_path, only=["ours p1 t4", "django-tasks-db p4"])

    assert res["problems"] == {}
    for key in ("ours p1 t4", "django-tasks-db p4"):
        (sample,) = res["samples"][db_server][key]
        assert (sample["done"], sample["lines"], sample["distinct"]) == (200, 200, 200), sample
        assert sample["lost"] == 0 and sample["duplicates"] == 0
        assert sample["jobs_per_s"] > 0 and sample["handler_jobs_per_s"] > 0
        assert sample["start_from"] == "system"
    assert res["versions"]["Django"].startswith("6.")
    ratio = res["ratios"][db_server]["django-tasks-db"]
    assert ratio["peer_four_way"] == "django-tasks-db p4" and ratio["four_way"] > 0 and ratio["best_vs_best"] > 0
    text = mysql_peers.markdown(res)
    assert "| django-tasks-db p4 |" in text and "ours 1 x 4 threads / peer 4-way" in text
    assert len(mysql_peers.targets(res)) == 2
    assert not list(tmp_path.glob("append-*")), "each run's append file is removed"


def test_ab_splits_worker_cpu_into_a_further_job_and_once_a_process():
    """bench.ab --steady: rounds of two processes that spend F ms each once and then c us a job
    give back c and F, medians over the rounds (100 us and 30 ms here)."""
    from bench.ab import split_cpu

    rounds = [(30, 100), (40, 90), (20, 110)]  # (F ms a process, c us a job)

    def per_job(jobs: int) -> list[tuple[float, float]]:
        return [(1.0, (2 * f * 1000 + jobs * c) / jobs) for f, c in rounds]

    assert split_cpu(per_job(5_000), per_job(20_000), 5_000, 20_000, 2) == pytest.approx((100, 30))


@pytest.mark.only_servers("mariadb")
def test_the_binlog_cost_bench_runs_each_server_as_it_says(db_server):
    """bench/binlog_cost.py end to end at a small size, once (its servers are its own throwaway
    ones, whatever the share): each server runs with the binlog it is named for, every rate is
    measured and the table renders. Nothing is asserted about speed."""
    from bench import binlog_cost

    res = binlog_cost.run(rows=2000, rounds=1)

    log_bin = {name: settings["log_bin"] for name, settings in res["settings"].items()}
    assert log_bin == {
        "MySQL 9.7, binlog": "ON",
        "MySQL 9.7, binlog, 4 MB binlog cache": "ON",
        "MySQL 9.7, no binlog": "OFF",
        "MariaDB 10.11": "OFF",
        "MariaDB 10.11, binlog": "ON",
    }
    for name in ("MySQL 9.7, binlog", "MariaDB 10.11, binlog"):  # alike
        assert (res["settings"][name]["binlog_format"], res["settings"][name]["sync_binlog"]) == ("ROW", "1")
    assert res["settings"]["MySQL 9.7, binlog, 4 MB binlog cache"]["binlog_cache_size"] == str(4 << 20)
    assert res["settings"]["MySQL 9.7, binlog"]["binlog_cache_size"] == "32768"
    # 1,000 rows of row events outgrow the default cache, not a 4 MB one; no binlog, no cache.
    spills = res["binlog_cache_spills_a_batch"]
    assert (spills["MySQL 9.7, binlog"], spills["MySQL 9.7, binlog, 4 MB binlog cache"]) == (1.0, 0.0)
    assert spills["MySQL 9.7, no binlog"] == spills["MariaDB 10.11"] == 0.0
    assert all(rate["ours"] > 0 and rate["raw"] > 0 for rate in res["rows_per_s"].values())
    # CPU read off each server's own process and this one: 2,000 rows cost any server some.
    for by in (res["server_cpu_us_a_row"], res["client_cpu_us_a_row"]):
        assert all(cpu["ours"] > 0 and cpu["raw"] > 0 for cpu in by.values()), by
    assert res["against_mariadb"]["MariaDB 10.11"] == {"ours": 1.0, "raw": 1.0}
    assert "| MySQL 9.7, no binlog |" in binlog_cost.markdown(res)
