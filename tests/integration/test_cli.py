"""The `jobqueue` command's contract: output, exit codes, nothing written on bad input."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from testkit.procs import jobqueue
from webapp.core import repository
from webapp.core.cli import main


@pytest.fixture
def run(db_url):
    runner = CliRunner()

    def invoke(*args):
        return runner.invoke(main, ["--database-url", db_url, *args], obj={})

    return invoke


def test_enqueue_prints_json_and_reports_duplicates(run):
    first = run("enqueue", "noop", "--key", "k1", "--payload", '{"a": 1}', "--queue", "mail", "--priority", "3")
    assert first.exit_code == 0, first.output
    data = json.loads(first.stdout)
    assert data == {"id": data["id"], "task_key": "k1", "duplicate": False, "status": "ready"}
    again = run("enqueue", "noop", "--key", "k1")
    assert again.exit_code == 0 and json.loads(again.stdout)["duplicate"] is True
    delayed = run("enqueue", "noop", "--key", "k2", "--delay", "30")
    assert json.loads(delayed.stdout)["status"] == "scheduled"


@pytest.mark.parametrize("args", [
    ["enqueue", "nope", "--key", "k"],
    ["enqueue", "noop", "--key", ""],
    ["enqueue", "noop", "--key", "x" * 81],
    ["enqueue", "noop", "--key", "k", "--payload", "[1]"],
    ["enqueue", "noop", "--key", "k", "--payload", "{oops"],
    ["enqueue", "noop", "--key", "k", "--priority", "lots"],
    ["enqueue", "noop", "--key", "k", "--delay", "-5"],
    ["enqueue", "noop", "--key", "k", "--max-attempts", "0"],
    ["enqueue", "noop", "--key", "k", "--queue", "a b"],
    ["enqueue", "noop"],
])
def test_bad_enqueue_exits_2_and_writes_nothing(run, args):
    result = run(*args)
    assert result.exit_code == 2, result.output
    stats = json.loads(run("stats", "--json").stdout)
    assert sum(stats["totals"].values()) == 0


def test_operator_commands_exit_codes(run, engine):
    job_id = json.loads(run("enqueue", "noop", "--key", "k1").stdout)["id"]
    assert run("requeue", "999999").exit_code == 4
    assert run("fail", "999999").exit_code == 4
    with engine.connect() as conn:
        repository.claim(conn, "w", 1, ["default"], lease_seconds=60)
    refused = run("requeue", str(job_id))
    assert refused.exit_code == 3 and "--force" in refused.output
    forced = run("requeue", str(job_id), "--force")
    assert forced.exit_code == 0 and json.loads(forced.stdout) == {"id": job_id, "before": "running", "after": "ready",
                                                                   "changed": True}
    failed = run("fail", str(job_id), "--reason", "bad data")
    assert failed.exit_code == 0 and json.loads(failed.stdout)["after"] == "failed"
    assert run("fail", str(job_id)).exit_code == 3
    with engine.connect() as conn:
        assert repository.get_job(conn, job_id).last_error == "bad data"


def test_stats_and_reap(run):
    run("enqueue", "noop", "--key", "a")
    run("enqueue", "noop", "--key", "b", "--queue", "mail")
    stats = json.loads(run("stats", "--json").stdout)
    assert stats["queues"]["default"]["ready"] == 1 and stats["queues"]["mail"]["ready"] == 1
    assert stats["totals"]["ready"] == 2
    table = run("stats").stdout
    assert "mail" in table and "(all)" in table
    assert json.loads(run("reap").stdout) == {"reclaimed": 0, "failed": 0, "promoted": 0}


def test_worker_burst_and_init_db_twice(run):
    assert run("init-db").exit_code == 0
    assert "schema at revision" in run("init-db").stdout
    for i in range(5):
        run("enqueue", "noop", "--key", f"k{i}")
    result = run("worker", "--burst", "--concurrency", "2")
    assert result.exit_code == 0
    assert json.loads(run("stats", "--json").stdout)["totals"]["done"] == 5


def test_unreachable_database_is_one_line_exit_1():
    result = jobqueue("mysql+pymysql://root@127.0.0.1:1/nothing", "stats")
    assert result.returncode == 1
    assert result.stderr.startswith("error: database:") and "Traceback" not in result.stderr
