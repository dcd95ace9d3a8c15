"""Results you can wait for (issue 27, item 3): JobQueue.result, `jobqueue result`, what a
handler returns, and what a waiter costs the database. A real worker (a thread of this process)
runs the handlers."""

from __future__ import annotations

import json
import threading
import time
from contextlib import contextmanager

import pytest
import sqlalchemy as sa
from click.testing import CliRunner

from jobqueue import JobCancelled, JobFailed, JobNotFound, JobQueue
from jobqueue.core.cli import main
from jobqueue.core.errors import PermanentError
from jobqueue.core.schema import job_result
from jobqueue.core.tasks import Registry, TaskSpec
from jobqueue.core.worker import Worker, WorkerConfig


def returns(payload, ctx):
    if "value" in payload:
        return payload["value"]
    return {"echo": payload.get("n")} if "n" in payload else None


def records_then_returns(payload, ctx):
    assert ctx.record_result({"recorded": True}) is True
    return {"returned": True}


def returns_no_json(payload, ctx):
    return object()


def raises(payload, ctx):
    raise PermanentError("the order is gone")


def sleeps(payload, ctx):
    time.sleep(payload["seconds"])
    payload_end[ctx.task_key] = time.monotonic()
    return {"slept": payload["seconds"]}


payload_end: dict[str, float] = {}


@contextmanager
def worker(engine):
    registry = Registry()
    for name, fn in [
        ("returns", returns),
        ("records", records_then_returns),
        ("no_json", returns_no_json),
        ("raises", raises),
        ("sleeps", sleeps),
    ]:
        registry.register(TaskSpec(name, fn, max_attempts=1))
    w = Worker(engine, WorkerConfig(concurrency=2, idle_cap_seconds=0.2), registry=registry)
    t = threading.Thread(target=w.run, daemon=True)
    t.start()
    try:
        yield
    finally:
        w.stop()
        t.join(10)


def result_rows(engine) -> int:
    with engine.connect() as conn:
        return conn.execute(sa.select(sa.func.count()).select_from(job_result)).scalar()


def test_result_is_what_the_handler_returned_or_recorded(engine):
    jq = JobQueue(engine)
    jq.enqueue("returns", "r-value", {"n": 42}, allow_unregistered=True)
    jq.enqueue("returns", "r-none", {}, allow_unregistered=True)
    jq.enqueue("records", "r-recorded", allow_unregistered=True)
    with worker(engine):
        assert jq.result("r-value", timeout=10) == {"echo": 42}
        assert jq.result("r-recorded", timeout=10) == {"recorded": True}  # the record wins, no duplicate
        assert jq.result("r-none", timeout=10) is None
    assert result_rows(engine) == 2  # returning None writes nothing
    with pytest.raises(JobNotFound):
        jq.result("no-such-key", timeout=0)


@pytest.mark.parametrize("value", ["ok", "", 7, 2**70, [1, "two"], True])
def test_any_json_value_comes_back_as_returned(engine, value):
    """Not only objects: a bare string (which SQLite's JSON type had already decoded, and was
    decoded a second time) or a number."""
    jq = JobQueue(engine)
    jq.enqueue("returns", "r-bare", {"value": value}, allow_unregistered=True)
    with worker(engine):
        assert jq.result("r-bare", timeout=10) == value


def test_failed_cancelled_and_unserialisable_results_raise_job_failed(engine):
    jq = JobQueue(engine)
    jq.enqueue("raises", "f-raise", allow_unregistered=True)
    jq.enqueue("no_json", "f-json", allow_unregistered=True, max_attempts=1)
    cancelled = jq.enqueue("returns", "f-cancel", {"n": 1}, allow_unregistered=True, delay=60)
    jq.cancel(cancelled.id, "order withdrawn")
    with worker(engine):
        with pytest.raises(JobFailed) as failed:
            jq.result("f-raise", timeout=10)
        assert "the order is gone" in failed.value.error and not isinstance(failed.value, JobCancelled)
        with pytest.raises(JobFailed) as no_json:
            jq.result("f-json", timeout=10)
        assert "not JSON-serialisable" in no_json.value.error
    with pytest.raises(JobCancelled) as gone:
        jq.result("f-cancel", timeout=0)
    assert "cancelled" in str(gone.value)
    assert result_rows(engine) == 0


def test_timeout_raises_after_about_the_timeout(engine):
    jq = JobQueue(engine)
    jq.enqueue("returns", "t-pending", allow_unregistered=True)  # no worker runs it
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        jq.result("t-pending", timeout=1.5)
    assert 1.4 <= time.monotonic() - started < 2.5


def test_a_waiter_sends_at_most_one_statement_a_second(mysql_engine):
    engine = mysql_engine
    jq = JobQueue(engine)
    jq.enqueue("returns", "s-pending", allow_unregistered=True)
    statements: list[str] = []

    def count(conn, cursor, statement, parameters, context, executemany):
        statements.append(statement)

    sa.event.listen(engine, "before_cursor_execute", count)
    try:
        started = time.monotonic()
        with pytest.raises(TimeoutError):
            jq.result("s-pending", timeout=3)
        waited = time.monotonic() - started
    finally:
        sa.event.remove(engine, "before_cursor_execute", count)
    assert waited >= 2.9
    assert len(statements) <= 1 + 3, statements  # the first read, then one a second


def test_a_completion_in_this_process_wakes_the_waiter_at_once(engine):
    jq = JobQueue(engine)
    jq.enqueue("sleeps", "w-sleep", {"seconds": 1.4}, allow_unregistered=True)
    with worker(engine):
        assert jq.result("w-sleep", timeout=10) == {"slept": 1.4}
        woken = time.monotonic()
    # A poll alone would notice anywhere within a second of the completion.
    assert woken - payload_end["w-sleep"] < 0.5


# --- jobqueue result ---------------------------------------------------------------------------


def test_the_result_command_exits_0_1_3_and_4(engine, db_url):
    runner = CliRunner()

    def run(*args):
        return runner.invoke(main, ["--database-url", db_url, "result", *args], obj={})

    jq = JobQueue(engine)
    jq.enqueue("returns", "c-done", {"n": 7}, allow_unregistered=True)
    jq.enqueue("raises", "c-failed", allow_unregistered=True)
    with worker(engine):
        jq.result("c-done", timeout=10)
        with pytest.raises(JobFailed):
            jq.result("c-failed", timeout=10)
    pending = jq.enqueue("returns", "c-pending", allow_unregistered=True, delay=60)

    done = run("c-done")
    assert (done.exit_code, done.output.strip()) == (0, '{"echo": 7}')
    as_json = run("c-done", "--json")
    data = json.loads(as_json.output)
    assert as_json.exit_code == 0 and data["status"] == "done" and data["result"] == {"echo": 7}
    assert set(data) == {"id", "task_key", "status", "result", "error", "finished_at"} and data["finished_at"]
    failed = run("c-failed")
    assert failed.exit_code == 1 and "the order is gone" in failed.output
    started = time.monotonic()
    assert run("c-pending").exit_code == 3 and time.monotonic() - started < 1
    waited = run("c-pending", "--wait", "1.2", "--json")
    assert waited.exit_code == 3 and json.loads(waited.output)["status"] == "scheduled"
    assert time.monotonic() - started >= 1.2
    jq.cancel(pending.id, "not needed")
    cancelled = run("c-pending")
    assert cancelled.exit_code == 1 and "cancelled" in cancelled.output
    assert run("no-such-key").exit_code == 4
