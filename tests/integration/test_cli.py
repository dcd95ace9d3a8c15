"""The `jobqueue` command's contract: output, exit codes, nothing written on bad input."""

from __future__ import annotations

import gc
import json

import click
import pytest
from click.testing import CliRunner

from jobqueue.cli import LAZY_COMMANDS, cli
from jobqueue.core import repository, service
from jobqueue.core.cli import main, pause_collector
from testkit.procs import jobqueue


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


@pytest.mark.parametrize(
    "args",
    [
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
    ],
)
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
        service.claim(conn, "w", 1, ["default"], lease_seconds=60)
    refused = run("requeue", str(job_id))
    assert refused.exit_code == 3 and "--force" in refused.output
    forced = run("requeue", str(job_id), "--force")
    assert forced.exit_code == 0 and json.loads(forced.stdout) == {
        "id": job_id,
        "before": "running",
        "after": "ready",
        "changed": True,
    }
    failed = run("fail", str(job_id), "--reason", "bad data")
    assert failed.exit_code == 0 and json.loads(failed.stdout)["after"] == "failed"
    assert run("fail", str(job_id)).exit_code == 3
    with engine.connect() as conn:
        assert repository.reads.get_job(conn, job_id).last_error == "bad data"


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


# --- enqueue-many ------------------------------------------------------------------------------


def _lines(result):
    return [json.loads(line) for line in result.stdout.splitlines()]


def _keys_in_table(engine):
    import sqlalchemy as sa

    from jobqueue.core.schema import job_queue

    with engine.connect() as conn:
        return set(conn.execute(sa.select(job_queue.c.task_key)).scalars())


def test_enqueue_many_prints_a_line_per_job_in_order_and_skips_blank_lines(run, tmp_path):
    path = tmp_path / "jobs.jsonl"
    path.write_text(
        '{"task": "noop", "task_key": "a"}\n\n   \n'
        '{"task": "noop", "task_key": "b", "payload": {"x": 1}, "queue": "mail", "priority": 2}\n'
        '{"task": "noop", "task_key": "a"}\n'
        '{"task": "noop", "task_key": "c", "delay": 30, "max_attempts": 3}'
    )  # no final newline
    result = run("enqueue-many", str(path))
    assert result.exit_code == 0, result.output
    lines = _lines(result)
    assert [(r["task_key"], r["duplicate"], r["status"]) for r in lines] == [
        ("a", False, "ready"),
        ("b", False, "ready"),
        ("a", True, "ready"),
        ("c", False, "scheduled"),
    ]
    assert all(set(r) == {"id", "task_key", "duplicate", "status"} for r in lines)
    assert lines[2]["id"] == lines[0]["id"]
    again = run("enqueue-many", str(path))
    assert again.exit_code == 0 and all(r["duplicate"] for r in _lines(again))
    assert [r["id"] for r in _lines(again)] == [r["id"] for r in lines]


def test_enqueue_many_reads_standard_input(db_url, engine):
    result = CliRunner().invoke(
        main,
        ["--database-url", db_url, "enqueue-many", "-"],
        obj={},
        input='{"task": "noop", "task_key": "in-1"}\n{"task": "noop", "task_key": "in-2"}\n',
    )
    assert result.exit_code == 0, result.output
    assert [r["task_key"] for r in _lines(result)] == ["in-1", "in-2"]
    assert _keys_in_table(engine) == {"in-1", "in-2"}


def test_a_bad_line_refuses_its_batch_and_the_other_batches_go_in(run, engine, tmp_path, monkeypatch):
    """2,500 lines are three batches (1,000, 1,000, 500). A bad line in the middle of the second
    batch (line 1,500): that batch prints the bad line's number and field and writes nothing;
    the first and third are written; exit 2."""
    lines = [json.dumps({"task": "noop", "task_key": f"j{i}"}) for i in range(1, 2501)]
    lines[1499] = json.dumps({"task": "noop", "task_key": "j1500", "priority": "high"})
    path = tmp_path / "jobs.jsonl"
    path.write_text("\n".join(lines) + "\n")
    result = run("enqueue-many", str(path))
    assert result.exit_code == 2
    out = _lines(result)
    assert len(out) == 2500
    assert out[1499] == {"line": 1500, "error": out[1499]["error"], "field": "priority"}
    assert all(
        r["error"] == "not written: line 1500 of the same batch was refused" and r["line"] == n + 1
        for n, r in enumerate(out)
        if 1000 <= n < 2000 and n != 1499
    )
    assert all("id" in r and not r["duplicate"] for n, r in enumerate(out) if n < 1000 or n >= 2000)
    assert "line 1500" in result.stderr
    assert _keys_in_table(engine) == {f"j{i}" for i in range(1, 2501) if not 1001 <= i <= 2000}


def test_a_failed_write_ends_the_command_and_its_reader_thread(run, tmp_path, monkeypatch):
    """A thread reads the next batch while one is written. When a write fails the command exits 1
    with what the server said, after printing the batches that went in, and the thread stops
    instead of reading the rest of the file (in-process callers would keep it running)."""
    import threading

    from sqlalchemy.exc import OperationalError

    real, calls = service.enqueue_many, []

    def failing_second_batch(conn, jobs, **kwargs):
        calls.append(len(jobs))
        if len(calls) == 2:
            raise OperationalError("INSERT", {}, Exception("server gone"))
        return real(conn, jobs, **kwargs)

    monkeypatch.setattr(service, "enqueue_many", failing_second_batch)
    path = tmp_path / "jobs.jsonl"
    path.write_text("".join(json.dumps({"task": "noop", "task_key": f"k{i}"}) + "\n" for i in range(6000)))
    result = run("enqueue-many", str(path))
    assert result.exit_code == 1 and "server gone" in result.stderr
    assert len(_lines(result)) == 1000 and calls == [1000, 1000]
    readers = [t for t in threading.enumerate() if t.name == "enqueue-many-reader"]
    for reader in readers:
        reader.join(timeout=5)
    assert not any(reader.is_alive() for reader in readers)


@pytest.mark.parametrize(
    "line, field",
    [
        ('{"task": "noop"', None),  # not JSON
        ('[{"task": "noop", "task_key": "x"}]', None),  # not an object
        ('{"task": "noop", "task_key": "x", "colour": "red"}', "colour"),
        ('{"task": "nope", "task_key": "x"}', "task"),
        ('{"task": "noop", "task_key": ""}', "task_key"),
        ('{"task": "noop", "task_key": "x", "payload": [1]}', "payload"),
        ('{"task": "noop", "task_key": "x", "delay": NaN}', "delay"),
    ],
)
def test_each_kind_of_bad_line_is_refused_with_its_field(run, engine, tmp_path, line, field):
    path = tmp_path / "jobs.jsonl"
    path.write_text('{"task": "noop", "task_key": "ok"}\n' + line + "\n")
    result = run("enqueue-many", str(path))
    assert result.exit_code == 2
    out = _lines(result)
    assert out[0]["line"] == 1 and "not written" in out[0]["error"]
    assert out[1]["line"] == 2 and out[1]["field"] == field
    assert _keys_in_table(engine) == set()


def test_a_line_that_is_not_utf8_is_refused(run, engine, tmp_path):
    path = tmp_path / "jobs.jsonl"
    path.write_bytes(b'{"task": "noop", "task_key": "caf\xe9"}\n')
    result = run("enqueue-many", str(path))
    assert result.exit_code == 2 and _lines(result)[0]["line"] == 1
    assert _keys_in_table(engine) == set()


# --- the console entry point's garbage collector ----------------------------------------------------

SEEN_COLLECTING: list[bool] = []
collecting_probe = click.Command("probe", callback=lambda: SEEN_COLLECTING.append(gc.isenabled()))


@pytest.fixture
def paused_collector():
    """What jobqueue.cli.run does before a command; the test's process gets its collector back."""
    pause_collector()
    try:
        yield
    finally:
        gc.enable()
        gc.unfreeze()


def test_a_command_collects_again_once_it_has_its_engine(paused_collector, sqlite_url):
    assert not gc.isenabled()
    result = CliRunner().invoke(main, ["--database-url", sqlite_url, "stats", "--json"], obj={})
    assert result.exit_code == 0, result.output
    assert gc.isenabled()


def test_a_command_from_above_the_core_collects_from_its_start(paused_collector, monkeypatch):
    # `jobqueue serve` runs gunicorn for days without building an engine in jobqueue.core.cli.
    monkeypatch.setitem(LAZY_COMMANDS, "probe", (f"{__name__}:collecting_probe", "probe"))
    SEEN_COLLECTING.clear()
    result = CliRunner().invoke(cli, ["probe"], obj={})
    assert result.exit_code == 0, result.output
    assert SEEN_COLLECTING == [True]


@pytest.mark.parametrize(
    "args",
    [
        ["prune", "--done-older-than", "nan"],
        ["prune", "--failed-older-than", "inf"],
        ["worker", "--burst", "--lease-seconds", "nan"],
        ["worker", "--burst", "--grace-seconds", "inf"],
        ["worker", "--burst", "--idle-cap-seconds", "nan"],
        ["enqueue", "noop", "--key", "k", "--delay", "nan"],
    ],
)
def test_numeric_options_refuse_nan_and_infinities(sqlite_url, args):
    """`prune --done-older-than nan` passed click's range check (NaN compares false with both ends)
    and failed with a traceback, exit 1 (issue 25, defect 7)."""
    result = jobqueue(sqlite_url, *args)
    assert result.returncode == 2, (result.returncode, result.stderr[-2000:])
    assert "Traceback" not in result.stderr
