"""OpenTelemetry (issue 28, item 3, `jobqueue[otel]`), across two processes: an enqueuing process
(`python -m testkit.otel`) opens a span per action and enqueues inside it; a real `jobqueue
worker` process runs the jobs. Each process has the SDK set up by testkit/otel.py, writing every
span it ends to its own JSON-lines file; the test reads both. This process sets no provider, so
the other tests' in-process workers are not traced."""

from __future__ import annotations

import json
import subprocess
import sys
from contextlib import contextmanager

import pytest
import sqlalchemy as sa

from testkit.otel import read_spans
from testkit.procs import REPO, WorkerProcess, cli_env, wait_until

pytestmark = pytest.mark.slow


def enqueue_in_spans(url: str, path, actions: list[dict]) -> list[dict]:
    """Run `actions` in the enqueuing process; its spans (one `test <do>` per action), in order."""
    done = subprocess.run(
        [sys.executable, "-m", "testkit.otel", url, json.dumps(actions)],
        env=cli_env(JQ_OTEL_SPANS=str(path)),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return [s for s in read_spans(path) if s["name"].startswith("test ")]


@contextmanager
def traced_worker(url: str, tmp_path, spans, *args: str, env: dict | None = None):
    w = WorkerProcess(
        url,
        tmp_path,
        "otel",
        "--tasks",
        "testkit.otel",
        "--concurrency",
        "2",
        "--idle-cap-seconds",
        "0.2",
        *args,
        env=env or cli_env(JQ_OTEL_SPANS=str(spans)),
    )
    try:
        yield w
    finally:
        w.stop()


def runs(path, count: int, **attributes) -> list[dict]:
    """Wait for `count` ended `jobqueue.run` spans with these attributes; they are returned by attempt."""

    def found():
        return [
            s
            for s in read_spans(path)
            if s["name"].startswith("jobqueue.run ")
            and all(s["attributes"].get(f"jobqueue.{k}") == v for k, v in attributes.items())
        ]

    wait_until(lambda: len(found()) >= count, timeout=30, message=f"{count} run spans with {attributes}")
    return sorted(found(), key=lambda s: s["attributes"]["jobqueue.attempt"])


def column(url: str, name: str, key: str):
    eng = sa.create_engine(url)
    try:
        with eng.connect() as conn:
            return conn.exec_driver_sql(f"SELECT {name} FROM job_queue WHERE task_key = %s", (key,)).scalar()
    finally:
        eng.dispose()


def stored(url: str, key: str) -> str | None:
    return column(url, "trace_context", key)


def test_the_run_span_is_a_child_of_the_enqueuers_span_with_the_jobs_attributes(mysql_url, tmp_path):
    (enqueue,) = enqueue_in_spans(
        mysql_url, tmp_path / "enqueuer.jsonl", [{"do": "enqueue", "task": "otel_ok", "key": "o1"}]
    )
    assert stored(mysql_url, "o1").startswith(f"00-{enqueue['trace_id']}-{enqueue['span_id']}-")
    spans = tmp_path / "worker.jsonl"
    with traced_worker(mysql_url, tmp_path, spans):
        (run,) = runs(spans, 1, task_key="o1")
    assert run["name"] == "jobqueue.run otel_ok"
    assert run["kind"] == "CONSUMER"
    assert (run["trace_id"], run["parent_id"]) == (enqueue["trace_id"], enqueue["span_id"])
    attrs = run["attributes"]
    assert attrs["jobqueue.queue"] == "default"
    assert attrs["jobqueue.task"] == "otel_ok"
    assert attrs["jobqueue.attempt"] == 1
    assert attrs["jobqueue.lease_owner"] == column(mysql_url, "lease_owner", "o1")
    assert attrs["jobqueue.job_id"] == column(mysql_url, "id", "o1")
    assert attrs["jobqueue.outcome"] == "done"
    assert run["status"] == "UNSET"
    # The handler's own span is the attempt's child.
    (inside,) = [s for s in read_spans(spans) if s["name"] == "inside"]
    assert (inside["trace_id"], inside["parent_id"]) == (run["trace_id"], run["span_id"])


def test_an_async_handlers_span_is_a_child_too(mysql_url, tmp_path):
    (enqueue,) = enqueue_in_spans(
        mysql_url, tmp_path / "enqueuer.jsonl", [{"do": "enqueue", "task": "otel_async", "key": "a1"}]
    )
    spans = tmp_path / "worker.jsonl"
    with traced_worker(mysql_url, tmp_path, spans):
        (run,) = runs(spans, 1, task_key="a1")
    assert (run["trace_id"], run["parent_id"]) == (enqueue["trace_id"], enqueue["span_id"])
    (inside,) = [s for s in read_spans(spans) if s["name"] == "inside"]
    assert inside["parent_id"] == run["span_id"]


def test_a_retried_job_is_one_trace_of_two_attempt_spans(mysql_url, tmp_path):
    (enqueue,) = enqueue_in_spans(
        mysql_url, tmp_path / "enqueuer.jsonl", [{"do": "enqueue", "task": "otel_flaky", "key": "f1"}]
    )
    spans = tmp_path / "worker.jsonl"
    with traced_worker(mysql_url, tmp_path, spans):
        first, second = runs(spans, 2, task_key="f1")
    assert [s["attributes"]["jobqueue.attempt"] for s in (first, second)] == [1, 2]
    assert [s["attributes"]["jobqueue.outcome"] for s in (first, second)] == ["retry", "done"]
    for s in (first, second):
        assert (s["trace_id"], s["parent_id"]) == (enqueue["trace_id"], enqueue["span_id"])
    assert first["span_id"] != second["span_id"]
    assert first["status"] == "ERROR" and first["events"] == ["exception"]
    assert second["status"] == "UNSET"


def test_a_timed_out_attempts_span_ends_when_the_timeout_is_written(mysql_url, tmp_path):
    (enqueue,) = enqueue_in_spans(
        mysql_url, tmp_path / "enqueuer.jsonl", [{"do": "enqueue", "task": "otel_slow", "key": "t1"}]
    )
    spans = tmp_path / "worker.jsonl"
    with traced_worker(mysql_url, tmp_path, spans):
        (run,) = runs(spans, 1, task_key="t1")
    assert run["parent_id"] == enqueue["span_id"]
    assert (run["attributes"]["jobqueue.outcome"], run["status"]) == ("timeout", "ERROR")


def test_batch_callbacks_and_recurring_runs_start_traces_linked_to_their_spans(mysql_url, tmp_path):
    opened, member, closed, recurring = enqueue_in_spans(
        mysql_url,
        tmp_path / "enqueuer.jsonl",
        [
            {"do": "batch", "key": "b1", "on_complete": "otel_ok"},
            {"do": "member", "task": "otel_ok", "key": "m1", "batch": "b1"},
            {"do": "close", "batch": "b1"},
            {"do": "recurring", "name": "every_minute", "task": "otel_ok"},
        ],
    )
    spans = tmp_path / "worker.jsonl"
    with traced_worker(mysql_url, tmp_path, spans):
        (member_run,) = runs(spans, 1, task_key="m1")
        (callback,) = runs(spans, 1, task_key="batch:b1:complete")
        (recurring_run,) = runs(spans, 1, task_key=_recurring_key(mysql_url))
    # A member is its enqueuer's child; the callback a new trace linked to the span that opened the batch.
    assert (member_run["trace_id"], member_run["parent_id"]) == (member["trace_id"], member["span_id"])
    assert callback["parent_id"] is None and callback["trace_id"] != opened["trace_id"]
    assert callback["links"] == [{"trace_id": opened["trace_id"], "span_id": opened["span_id"]}]
    # A recurring run: a new trace linked to the span its tick was enqueued in.
    assert recurring_run["parent_id"] is None and recurring_run["trace_id"] != recurring["trace_id"]
    assert recurring_run["links"] == [{"trace_id": recurring["trace_id"], "span_id": recurring["span_id"]}]
    assert closed["trace_id"] != callback["trace_id"]


def _recurring_key(url: str) -> str:
    eng = sa.create_engine(url)
    try:
        with eng.connect() as conn:
            return conn.exec_driver_sql(
                "SELECT task_key FROM job_queue WHERE id = (SELECT last_job_id FROM recurring_job WHERE name = 'every_minute')"
            ).scalar()
    finally:
        eng.dispose()


def test_claim_and_completion_histograms(mysql_url, tmp_path):
    out = tmp_path / "metrics.json"
    enqueue_in_spans(
        mysql_url,
        tmp_path / "enqueuer.jsonl",
        [{"do": "enqueue", "task": "otel_ok", "key": "h1"}, {"do": "enqueue", "task": "otel_ok", "key": "h2"}],
    )
    spans = tmp_path / "worker.jsonl"
    with traced_worker(mysql_url, tmp_path, spans):
        runs(spans, 1, task_key="h1")
        runs(spans, 1, task_key="h2")
        enqueue_in_spans(
            mysql_url,
            tmp_path / "enqueuer.jsonl",
            [{"do": "enqueue", "task": "otel_metrics", "key": "dump", "payload": {"path": str(out)}}],
        )
        wait_until(out.exists, timeout=30, message="the metrics written")
    counts = json.loads(out.read_text())
    assert counts["jobqueue.claim.duration"] >= 2
    assert counts["jobqueue.completion.duration"] >= 2


def test_jobqueue_otel_0_writes_and_reads_no_context(mysql_url, tmp_path):
    spans = tmp_path / "worker.jsonl"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "testkit.otel",
            mysql_url,
            json.dumps([{"do": "enqueue", "task": "otel_ok", "key": "n1"}]),
        ],
        env=cli_env(JQ_OTEL_SPANS=str(tmp_path / "enqueuer.jsonl"), JOBQUEUE_OTEL="0"),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert stored(mysql_url, "n1") is None
    with traced_worker(mysql_url, tmp_path, spans, env=cli_env(JQ_OTEL_SPANS=str(spans), JOBQUEUE_OTEL="0")) as w:
        w.wait_for_log(r"event=complete job_id=\d+ task_key=n1 ")
    assert [s for s in read_spans(spans) if s["name"].startswith("jobqueue.")] == []
