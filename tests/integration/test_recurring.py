"""Recurring jobs: stored schedules, one job per tick however many processes enqueue it (task_key
recurring:NAME:<YYYY-MM-DDTHH:MM>), at most one catch-up run after downtime, code-declared
schedules, and the CLI. Ticks are driven with an explicit clock (`now=`) except in the one
real-time test with worker processes."""

from __future__ import annotations

import json
import threading
from datetime import datetime, timedelta

import pytest
import sqlalchemy as sa
from click.testing import CliRunner

from jobqueue.core import repository, service
from jobqueue.core.builtin_tasks import noop
from jobqueue.core.cli import main
from jobqueue.core.errors import ScheduleNotFound, ValidationError
from jobqueue.core.recurring import REREAD_SECONDS, latest_tick, next_tick, parse_cron, run_key
from jobqueue.core.schema import job_queue, recurring_job
from jobqueue.core.tasks import Registry, TaskSpec
from testkit.procs import WorkerProcess, wait_until

jq = job_queue.c


def keys(conn, prefix="recurring:"):
    return sorted(conn.execute(sa.select(jq.task_key).where(jq.task_key.like(prefix + "%"))).scalars().all())


def at(text: str) -> datetime:
    return datetime.fromisoformat(text)


def test_cron_parsing_and_ticks():
    assert parse_cron("*/5  *  * * *") == "*/5 * * * *"
    assert parse_cron("@hourly") == "@hourly"
    for bad, words in [
        ("* * *", "5 fields"),
        ("* * * * * *", "5 fields"),
        ("61 * * * *", "not valid"),
        ("@sometimes", "unknown cron alias"),
        ("", "expression"),
        ("0 0 30 2 *", "not valid"),
    ]:
        with pytest.raises(ValidationError, match=words):
            parse_cron(bad)
    assert latest_tick("* * * * *", at("2026-12-02 10:05:00")) == at("2026-12-02 10:05:00")
    assert latest_tick("* * * * *", at("2026-12-02 10:05:59.9")) == at("2026-12-02 10:05:00")
    assert next_tick("* * * * *", at("2026-12-02 10:05:00")) == at("2026-12-02 10:06:00")
    assert next_tick("0 9 * * 0", at("2026-12-02 10:00:00")) == at("2026-12-06 09:00:00")  # Sunday is 0
    assert run_key("report", at("2026-12-02 10:05:00")) == "recurring:report:2026-12-02T10:05"


def test_each_tick_is_one_job_and_a_gap_gets_one_catch_up_run(engine):
    with engine.connect() as conn:
        row, created = service.upsert_recurring(conn, "tick", cron="* * * * *", task="noop", actor="tester")
        assert created and row["enabled"] and row["source"] == "operator"
        first = row["next_run_at"]
        assert first.second == 0 and first.microsecond == 0
        assert service.enqueue_due_recurring(conn, now=first - timedelta(seconds=1)).enqueued == 0
        due = service.enqueue_due_recurring(conn, now=first + timedelta(seconds=10))
        assert due.enqueued == 1 and due.next_due == first + timedelta(minutes=1)
        # Another process seeing the same tick due: the same job, nothing new.
        repository.recurring.get_recurring(conn, "tick")
        conn.execute(sa.update(recurring_job).values(next_run_at=first))
        conn.commit()
        again = service.enqueue_due_recurring(conn, now=first + timedelta(seconds=20))
        assert again.enqueued == 0 and again.runs[0].duplicate and again.runs[0].id == due.runs[0].id
        assert service.enqueue_due_recurring(conn, now=first + timedelta(seconds=59)).enqueued == 0
        assert service.enqueue_due_recurring(conn, now=first + timedelta(minutes=1)).enqueued == 1
        # Downtime: nothing ran for five ticks. One catch-up run, for the latest tick missed.
        gap = service.enqueue_due_recurring(conn, now=first + timedelta(minutes=6, seconds=30))
        assert gap.enqueued == 1
        assert keys(conn) == [run_key("tick", first + timedelta(minutes=m)) for m in (0, 1, 6)]
        state = repository.recurring.get_recurring(conn, "tick")
        assert state["last_run_at"] == first + timedelta(minutes=6)
        assert state["next_run_at"] == first + timedelta(minutes=7)
        assert state["last_job_id"] == gap.runs[0].id


def test_many_processes_at_once_enqueue_a_tick_once(mysql_engine):
    with mysql_engine.connect() as conn:
        row, _ = service.upsert_recurring(conn, "race", cron="* * * * *", task="noop", actor="tester")
    now = row["next_run_at"] + timedelta(seconds=1)
    results, errors = [], []
    barrier = threading.Barrier(6)

    def process():
        try:
            with mysql_engine.connect() as conn:
                barrier.wait()
                results.append(service.enqueue_due_recurring(conn, now=now))
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=process) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert errors == []
    assert sum(r.enqueued for r in results) == 1
    assert len({r.runs[0].id for r in results if r.runs}) == 1
    with mysql_engine.connect() as conn:
        assert keys(conn) == [run_key("race", row["next_run_at"])]


def test_disable_enable_remove_and_what_is_refused(engine):
    with engine.connect() as conn:
        row, _ = service.upsert_recurring(
            conn, "r1", cron="*/5 * * * *", task="noop", payload={"a": 1}, queue="reports", actor="tester"
        )
        _, changed = service.set_recurring_enabled(conn, "r1", False, actor="tester")
        assert changed
        assert service.enqueue_due_recurring(conn, now=row["next_run_at"] + timedelta(hours=1)).enqueued == 0
        enabled, _ = service.set_recurring_enabled(conn, "r1", True, actor="tester")
        # Enabled again: from the next tick after now, the disabled time is not caught up.
        assert enabled["next_run_at"] > repository.reads.database_now(conn)
        (run,) = service.enqueue_due_recurring(conn, now=enabled["next_run_at"]).runs
        job = repository.reads.get_job(conn, run.id)
        assert (job.queue, job.payload, job.task_name) == ("reports", {"a": 1}, "noop")
        # Nothing written for a bad definition.
        for kwargs, field in [
            ({"cron": "nope"}, "cron"),
            ({"task": "missing"}, "task"),
            ({"payload": [1]}, "payload"),
            ({"queue": "a b"}, "queue"),
            ({"task": "keyed_sleep"}, "payload"),
        ]:
            args = {"cron": "* * * * *", "task": "noop", **kwargs}
            with pytest.raises(ValidationError) as err:
                service.upsert_recurring(conn, "bad", actor="tester", **args)
            assert err.value.field == field
        with pytest.raises(ValidationError, match="name"):
            service.upsert_recurring(conn, "x" * 51, cron="* * * * *", task="noop", actor="tester")
        service.remove_recurring(conn, "r1", actor="tester")
        with pytest.raises(ScheduleNotFound):
            service.remove_recurring(conn, "r1", actor="tester")
        rows, _ = repository.recurring.list_recurring(conn)
        assert rows == []


def test_a_task_can_declare_its_schedule_in_code(engine):
    reg = Registry()
    reg.register(TaskSpec("noop", noop))
    reg.register(TaskSpec("report", noop, cron="0 * * * *"))
    with engine.connect() as conn:
        assert service.sync_code_schedules(conn, registry=reg) == 1
        assert service.sync_code_schedules(conn, registry=reg) == 0
        row = repository.recurring.get_recurring(conn, "report")
        assert (row["cron"], row["task_name"], row["source"], row["enabled"]) == ("0 * * * *", "report", "code", True)
        # An operator's disable survives the next process start; a changed cron in code is followed.
        service.set_recurring_enabled(conn, "report", False, actor="tester")
        changed = Registry()
        changed.register(TaskSpec("report", noop, cron="30 * * * *"))
        assert service.sync_code_schedules(conn, registry=changed) == 1
        row = repository.recurring.get_recurring(conn, "report")
        assert (row["cron"], row["enabled"]) == ("30 * * * *", False)
        # The run of a code-declared schedule.
        service.set_recurring_enabled(conn, "report", True, actor="tester")
        row = repository.recurring.get_recurring(conn, "report")
        due = service.enqueue_due_recurring(conn, now=row["next_run_at"], registry=changed)
        assert due.enqueued == 1 and due.runs[0].task_key == run_key("report", row["next_run_at"])
    with pytest.raises(ValidationError):
        TaskSpec("bad", noop, cron="every hour")


def test_a_task_this_process_does_not_know_is_left_to_others(engine):
    with engine.connect() as conn:
        row, _ = service.upsert_recurring(conn, "elsewhere", cron="* * * * *", task="noop", actor="tester")
        bare = Registry()
        due = service.enqueue_due_recurring(conn, now=row["next_run_at"], registry=bare)
        assert due.enqueued == 0 and "unknown task" in due.skipped[0]
        assert repository.recurring.get_recurring(conn, "elsewhere")["next_run_at"] == row["next_run_at"]


def test_cli_recurring_commands(db_url):
    runner = CliRunner()

    def run(*args):
        return runner.invoke(main, ["--database-url", db_url, *args], obj={})

    out = run(
        "recurring",
        "add",
        "nightly",
        "--cron",
        "0 3 * * *",
        "--task",
        "noop",
        "--payload",
        '{"n": 1}',
        "--queue",
        "night",
    )
    assert out.exit_code == 0, out.output
    added = json.loads(out.stdout)
    assert (added["name"], added["cron"], added["task"], added["queue"], added["enabled"], added["created"]) == (
        "nightly",
        "0 3 * * *",
        "noop",
        "night",
        True,
        True,
    )
    assert run("recurring", "add", "bad", "--cron", "0 3 * *", "--task", "noop").exit_code == 2
    assert run("recurring", "add", "bad", "--cron", "* * * * *", "--task", "nope").exit_code == 2
    assert run("recurring", "add", "bad", "--cron", "* * * * *", "--task", "noop", "--payload", "{x").exit_code == 2
    listed = json.loads(run("recurring", "list", "--json").stdout)["recurring"]
    assert [r["name"] for r in listed] == ["nightly"]
    assert "nightly" in run("recurring", "list").stdout
    assert json.loads(run("recurring", "disable", "nightly").stdout)["enabled"] is False
    assert json.loads(run("recurring", "enable", "nightly").stdout)["enabled"] is True
    assert run("recurring", "disable", "missing").exit_code == 4
    assert json.loads(run("recurring", "remove", "nightly").stdout) == {"name": "nightly", "removed": True}
    assert run("recurring", "remove", "nightly").exit_code == 4


@pytest.mark.slow
def test_three_worker_processes_enqueue_exactly_one_job_per_minute(mysql_url, mysql_engine, tmp_path):
    """Real time: three `jobqueue worker` processes and a `* * * * *` schedule for two ticks (three
    made each of CI's three shares wait a minute longer for nothing the second does not show):
    one job per minute (distinct keys, none twice), each run by one of them."""
    workers = [WorkerProcess(mysql_url, tmp_path, f"w{n}", "--concurrency", "2") for n in range(3)]
    try:
        for w in workers:
            w.wait_for_log("event=worker_started ")
        with mysql_engine.connect() as conn:
            row, _ = service.upsert_recurring(conn, "every-minute", cron="* * * * *", task="noop", actor="tester")
            added = repository.reads.database_now(conn)
        # Other processes learn of a new schedule within REREAD_SECONDS: a tick that comes sooner
        # than that after the upsert runs once but may run late. The timed ticks come after it.
        first = row["next_run_at"]
        early = [first] if first < added + timedelta(seconds=REREAD_SECONDS) else []
        if early:
            first += timedelta(minutes=1)
        ticks = [first + timedelta(minutes=m) for m in range(2)]
        wait_until(
            lambda: _now(mysql_engine) >= ticks[-1] + timedelta(seconds=20),
            timeout=330,
            interval=1,
            message="two ticks",
        )
        with mysql_engine.connect() as conn:
            rows = conn.execute(
                sa.select(jq.task_key, jq.status, jq.created_at).where(jq.task_key.like("recurring:%")).order_by(jq.id)
            ).all()
    finally:
        codes = [w.stop() for w in workers]
    assert codes == [0, 0, 0]
    assert [r.task_key for r in rows] == [run_key("every-minute", t) for t in early + ticks]
    assert {r.status for r in rows} == {"done"}
    # Each enqueued after its tick and well before the next (the database clock): within a second
    # or two on a quiet machine, 15 s late once in CI while a soak shared its two cores; the keys
    # above already say one run per tick.
    timed = rows[len(early) :]
    assert all(timedelta(0) <= r.created_at - t < timedelta(seconds=30) for r, t in zip(timed, ticks)), rows
    if early:
        assert timedelta(0) <= rows[0].created_at - early[0] < timedelta(seconds=REREAD_SECONDS + 5), rows
    logs = "".join(w.log() for w in workers)
    assert logs.count("event=recurring_enqueued ") == len(early) + 2


def _now(engine):
    with engine.connect() as conn:
        return repository.reads.database_now(conn)


def test_the_runner_reads_rarely_and_enqueues_when_due(engine):
    from jobqueue.core.recurring import RecurringRunner

    clock = [1000.0]
    runner = RecurringRunner(engine, clock=lambda: clock[0])
    with engine.connect() as conn:
        service.upsert_recurring(conn, "late", cron="* * * * *", task="noop", actor="tester")
        now = repository.reads.database_now(conn)
        conn.execute(sa.update(recurring_job).values(next_run_at=now - timedelta(minutes=3)))
        conn.commit()
    assert runner.tick() == 1  # three ticks missed: one catch-up run, for the latest
    with engine.connect() as conn:
        assert keys(conn) == [run_key("late", latest_tick("* * * * *", now))]
    calls = []
    real = service.enqueue_due_recurring
    try:
        service.enqueue_due_recurring = lambda *a, **k: calls.append(1) or real(*a, **k)
        clock[0] += 5  # the next tick is still ahead: no read at all
        assert runner.tick() == 0 and calls == []
        clock[0] += 61  # past the next tick: a read
        runner.tick()
        assert calls == [1]
    finally:
        service.enqueue_due_recurring = real
