"""The soak's end-of-run checks (soak/checks.py) on small made-up runs: each invariant, when
broken, is caught and named, and a clean run with killed workers passes."""

from __future__ import annotations

import time
from datetime import UTC, datetime

import pytest

from soak.checks import Execution, Observed, Row, Spec, check
from soak.two_primaries import MAX_DETECTION_SECONDS, Spell, claims_stop_at


def utc(epoch: float) -> datetime:
    """A time.time() as the primary stamps it: naive UTC (the soak's servers run on its host)."""
    return datetime.fromtimestamp(epoch, UTC).replace(tzinfo=None)


def clean_run() -> Observed:
    """Three jobs: a noop done at once, a flaky one done on attempt 2 whose first successful run
    was by a worker that got SIGKILLed, and a doomed one failed after 2 attempts."""
    specs = {
        "k-noop": Spec("k-noop", "noop", "api", 4),
        "k-flaky": Spec("k-flaky", "flaky", "cli", 4),
        "k-doomed": Spec("k-doomed", "doomed", "api", 2),
    }
    rows = [
        Row(1, "k-noop", "done", 1, 4, None),
        Row(2, "k-flaky", "done", 3, 4, "SoakFailure: flaky"),
        Row(3, "k-doomed", "failed", 2, 2, "SoakFailure: doomed"),
    ]
    return Observed(
        specs=specs,
        acked={"k-noop": 1, "k-flaky": 2, "k-doomed": 3},
        rows=rows,
        results=[("k-noop", 1, 1), ("k-flaky", 2, 2)],
        attempt_rows=[
            (2, 1, "retry", "SoakFailure: flaky"),
            (2, 2, "lease_expired", "lease expired; held by w1"),
            (3, 1, "retry", "SoakFailure: doomed"),
            (3, 2, "fail", "SoakFailure: doomed"),
        ],
        executions=[
            Execution("k-noop", 1, "h:10:w1:1", 10),
            Execution("k-flaky", 2, "h:11:w2:1", 11),
            Execution("k-flaky", 3, "h:12:w3:2", 12),
        ],
        killed_pids={11},
    )


def test_a_clean_run_passes_and_explains_its_duplicate_execution():
    f = check(clean_run())
    assert f.violations() == {}
    assert f.get("duplicate_executions") == 1 and f.get("extra_executions") == 1
    assert dict(f.duplicate_causes) == {"process SIGKILLed": 1}
    assert f.get("failed_not_doomed") == 0
    assert dict(f.by_kind["doomed"]) == {"failed": 1}


def test_a_missing_or_unfinished_job_is_lost():
    obs = clean_run()
    obs.rows = [r for r in obs.rows if r.task_key != "k-noop"]
    obs.results = [r for r in obs.results if r[0] != "k-noop"]
    obs.executions = [e for e in obs.executions if e.task_key != "k-noop"]
    f = check(obs)
    assert f.violations() == {"lost": 1}
    assert "not in job_queue" in f.examples["lost"][0]

    obs = clean_run()
    obs.rows[0] = Row(1, "k-noop", "running", 1, 4, None)
    obs.results = [r for r in obs.results if r[0] != "k-noop"]
    f = check(obs)
    assert f.get("lost") == 1 and "still running" in f.examples["lost"][0]


def test_two_results_for_one_task_key_and_a_result_for_a_doomed_job():
    obs = clean_run()
    obs.results.append(("k-noop", 1, 1))
    obs.results.append(("k-doomed", 3, 2))
    f = check(obs)
    assert f.get("duplicate_results") == 1
    assert f.get("results_not_done") == 1 and f.get("doomed_not_failed") == 1


FIRST_ATTEMPT_ENDED = {
    "reaped": ("lease_expired", "lease expired; held by web:2"),
    "requeued": ("requeued", "requeued by soak while running"),
    "failed": ("retry", "Boom"),
}


def a_sleep_job_whose_attempts_all_died(first_attempt: str) -> Observed:
    """Seed 3 of the quick soak: attempt 1 slept, logged its execution and recorded its result
    under its lease, then its renewals failed and the reaper took the job back before the
    completion landed (or, in a CI run on MySQL, an operator's forced requeue took it back);
    attempts 2 to 4 were SIGKILLed or cut off, and the job failed."""
    obs = clean_run()
    obs.specs["k-sleep"] = Spec("k-sleep", "sleep", "api", 4)
    obs.acked["k-sleep"] = 4
    obs.rows.append(Row(4, "k-sleep", "failed", 4, 4, "lease expired after attempt 4 of 4; no attempts left"))
    obs.results.append(("k-sleep", 4, 1))
    obs.executions.append(Execution("k-sleep", 1, "h:13:web:2", 13))
    first = FIRST_ATTEMPT_ENDED[first_attempt]
    obs.attempt_rows += [
        (4, 1, *first),
        (4, 2, "lease_expired", "lease expired; held by w2"),
        (4, 3, "lease_expired", "lease expired; held by w3"),
        (4, 4, "lease_expired", "lease expired after attempt 4 of 4; no attempts left"),
    ]
    return obs


@pytest.mark.parametrize("first_attempt", ["reaped", "requeued"])
def test_a_result_recorded_by_an_attempt_that_was_then_taken_back_is_explained_not_failed(first_attempt):
    f = check(a_sleep_job_whose_attempts_all_died(first_attempt))
    assert f.violations() == {}
    assert f.get("results_of_reaped_attempts") == 1 and f.get("failed_not_doomed") == 1


def test_a_result_recorded_by_an_attempt_that_failed_is_not_explained():
    # The same result, but from an attempt that ended otherwise (a failure the worker recorded):
    # nothing explains it.
    f = check(a_sleep_job_whose_attempts_all_died("failed"))
    assert f.violations() == {"results_not_done": 1}


def test_the_same_attempt_executed_twice_is_a_double_claim():
    obs = clean_run()
    obs.executions.append(Execution("k-noop", 1, "h:13:w4:1", 13))
    f = check(obs)
    assert f.get("double_claims") == 1


def test_attempts_beyond_max_missing_history_and_failures_without_a_reason():
    obs = clean_run()
    obs.rows[2] = Row(3, "k-doomed", "failed", 3, 2, "")
    f = check(obs)
    assert f.get("attempts_over_max") == 1
    assert f.get("failed_without_error") == 1
    assert f.get("attempt_history_gaps") == 1  # attempt 3 has no job_attempt row


def test_rows_nobody_enqueued_and_the_monitors_findings():
    obs = clean_run()
    obs.rows.append(Row(4, "k-noop-replayed", "done", 1, 4, None))
    obs.attempts_backwards = [{"id": 2, "from": 2, "to": 1}]
    obs.terminal_regressions = [{"id": 1, "from": "done", "to": "ready"}]
    f = check(obs)
    assert f.get("extra_rows") == 1
    assert f.get("attempts_backwards") == 1 and f.get("terminal_regressions") == 1


def test_a_cancelled_job_counts_as_finished():
    obs = clean_run()
    obs.specs["k-cancel"] = Spec("k-cancel", "sleep", "api", 4)
    obs.acked["k-cancel"] = 4
    # Cancelled while it ran, after it had recorded its result: its attempt is in job_attempt.
    obs.rows.append(Row(4, "k-cancel", "cancelled", 1, 4, None))
    obs.results.append(("k-cancel", 4, 1))
    obs.attempt_rows.append((4, 1, "cancelled", "soak"))
    obs.executions.append(Execution("k-cancel", 1, "h:10:w1:2", 10))
    obs.cancelled = {"k-cancel"}
    f = check(obs)
    assert f.violations() == {} and f.get("cancelled") == 1


def test_a_cancel_that_did_not_stick_or_was_never_asked_for_is_caught():
    obs = clean_run()
    obs.rows[0] = Row(1, "k-noop", "cancelled", 0, 4, None)
    obs.results = [r for r in obs.results if r[0] != "k-noop"]
    obs.executions = [e for e in obs.executions if e.task_key != "k-noop"]
    assert check(obs).violations() == {"cancelled_unasked": 1}
    obs = clean_run()
    obs.cancelled = {"k-noop"}  # answered changed, but the job ended done
    assert check(obs).violations() == {"cancel_undone": 1}


def test_a_cancel_whose_answer_was_lost_is_not_taken_for_one_never_asked_for():
    """A cancel that committed and whose answer never came (the COMMIT's OK lost as the server
    restarted: 503 after the server's own retries, or a reset connection), tried again and
    answered 200 `changed: false` (already cancelled), was counted as cancelled_unasked in a
    MySQL soak. Such a key was asked for; whether the cancel took effect is not known, so the
    job may end either way, and cancel_undone holds only for cancels answered `changed: true`."""
    obs = clean_run()
    obs.rows[0] = Row(1, "k-noop", "cancelled", 0, 4, None)
    obs.results = [r for r in obs.results if r[0] != "k-noop"]
    obs.executions = [e for e in obs.executions if e.task_key != "k-noop"]
    obs.cancel_unknown = {"k-noop"}
    f = check(obs)
    assert f.violations() == {} and f.get("cancelled_answer_lost") == 1
    obs = clean_run()
    obs.cancel_unknown = {"k-noop"}  # the cancel did not take: the job ran and ended done
    assert check(obs).violations() == {}


def test_claims_while_paused_fail_the_run():
    obs = clean_run()
    obs.paused_claims = [{"id": 1, "attempt": 1}]
    assert check(obs).violations() == {"claims_while_paused": 1}


def test_a_resume_that_waits_for_the_database_holds_up_no_other_fault(tmp_path, monkeypatch):
    """The soak's fault loop ran a pause's resume in line, retrying `jobqueue resume` for up to
    60 s; when the resume came due while the primary was read-only, the end of the read-only
    flip (due in the same loop) waited behind it, so the resume could never succeed: 60 s of
    nothing, then "resume FAILED" and a cancel that gave up (seed 1 of the quick soak). The
    resume now runs on its own thread, like replays and cancels."""
    import subprocess

    from soak import run as soak_run

    plan = soak_run.Plan.quick()
    plan.pause_seconds, plan.read_only_seconds = 0.2, 1.0
    soak = soak_run.Soak(plan, 1, tmp_path)
    soak.say = lambda *a, **k: None
    read_only = {"on": False}
    monkeypatch.setattr(soak.server, "execute", lambda sql, **kw: read_only.update(on=sql.endswith("ON")))
    monkeypatch.setattr(soak, "_http", lambda method, path, body, **kw: (200, {"paused": True}))
    monkeypatch.setattr(
        soak, "_cli", lambda *args, **kw: subprocess.CompletedProcess(args, 75 if read_only["on"] else 0)
    )
    monkeypatch.setattr(soak, "check_unexpected_exits", lambda: None)
    started = time.monotonic()
    soak.run_faults([(0.0, "read_only_flip"), (0.05, "pause_queue")])
    for t in soak.action_threads:
        t.join(90)
    assert soak.actions_gave_up == []
    assert not read_only["on"]
    assert time.monotonic() - started < 30, "the resume went through once the flip had ended"


class _FakeCursor:
    def __init__(self, rows):
        self.rows = rows

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def execute(self, sql):
        pass

    def fetchall(self):
        return self.rows


class _FakeConnection:
    def __init__(self, rows, alive=True):
        self.rows, self.alive = rows, alive

    def cursor(self):
        return _FakeCursor(self.rows)

    def ping(self, reconnect=False):
        import pymysql

        if not self.alive:
            raise pymysql.err.OperationalError(2013, "Lost connection to server during query")

    def rollback(self):
        pass

    def close(self):
        pass


def test_rows_taken_after_a_restart_ended_the_hold_are_not_touched_while_held(tmp_path, monkeypatch):
    """Seed 9 of the quick soak: the database restarted while the soak held 5 ready rows in a
    paused transaction; the restart ended that transaction and its locks, workers then took the
    rows, and the check at the release called them touched while held. A hold whose session is
    gone is not checked; one whose session lived still is."""
    from soak import run as soak_run

    def hold_then_release(holder_alive: bool) -> list[str]:
        soak = soak_run.Soak(soak_run.Plan.quick(), 9, tmp_path)
        soak.say = lambda *a, **k: None
        holder = _FakeConnection([(87, 1), (392, 1)])
        checker = _FakeConnection([(87, 2, "running"), (392, 1, "ready")])
        connections = iter([holder, checker])
        monkeypatch.setattr(soak, "_connect", lambda own=True: next(connections))
        ends = []
        soak.fault_hold_rows(lambda seconds, fn: ends.append(fn))
        holder.alive = holder_alive
        ends[0]()
        return soak.held_touched

    assert hold_then_release(holder_alive=False) == []
    assert hold_then_release(holder_alive=True) == ["job 87: held as ready/attempts 1, now (2, 'running')"]


def workflow_run() -> Observed:
    """A chain (b after a), a fan-in (j after p1 and p2, p2 doomed, on_parent_failure run), a
    dependent job cancelled by its doomed parent (c after p2), and a batch of two members, one
    doomed: its on_failure and on_complete fired, each once."""
    from datetime import datetime, timedelta

    t0 = datetime(2026, 12, 4, 12, 0, 0)

    def at(seconds: float) -> datetime:
        return t0 + timedelta(seconds=seconds)

    specs = {
        "a": Spec("a", "noop", "api", 4),
        "b": Spec("b", "noop", "api", 4, after=("a",)),
        "p1": Spec("p1", "noop", "api", 4),
        "p2": Spec("p2", "doomed", "api", 1),
        "j": Spec("j", "noop", "api", 4, after=("p1", "p2"), on_parent_failure="run"),
        "c": Spec("c", "noop", "api", 4, after=("p2",)),
        "m1": Spec("m1", "noop", "api", 4, batch="B"),
        "m2": Spec("m2", "doomed", "api", 1, batch="B"),
    }
    rows = [
        Row(1, "a", "done", 1, 4, None),
        Row(2, "b", "done", 1, 4, None),
        Row(3, "p1", "done", 1, 4, None),
        Row(4, "p2", "failed", 1, 1, "SoakFailure: doomed"),
        Row(5, "j", "done", 1, 4, None),
        Row(6, "c", "cancelled", 0, 4, "parent p2 failed"),
        Row(7, "m1", "done", 1, 4, None),
        Row(8, "m2", "failed", 1, 1, "SoakFailure: doomed"),
        Row(9, "batch:B:failure", "done", 1, 4, None),
        Row(10, "batch:B:complete", "done", 1, 4, None),
    ]
    done = ["a", "b", "p1", "j", "m1", "batch:B:failure", "batch:B:complete"]
    ids = {r.task_key: r.id for r in rows}
    return Observed(
        specs=specs,
        acked={k: ids[k] for k in specs},
        rows=rows,
        results=[(k, ids[k], 1) for k in done],
        attempt_rows=[(4, 1, "fail", "SoakFailure: doomed"), (8, 1, "fail", "SoakFailure: doomed")],
        executions=[Execution(k, 1, "h:1:w1:1", 1) for k in done],
        times={
            "a": (at(0), at(1)),
            "b": (at(1.5), at(2)),
            "p1": (at(0), at(1)),
            "p2": (at(0), at(3)),
            "j": (at(3.1), at(4)),
            "c": (None, at(3)),
            "m1": (at(0), at(1)),
            "m2": (at(0), at(2)),
            "batch:B:failure": (at(2.1), at(2.5)),
            "batch:B:complete": (at(2.1), at(2.5)),
        },
        batches={
            "B": {
                "state": "finished",
                "total": 2,
                "done": 1,
                "failed": 1,
                "cancelled": 0,
                "success_job_id": None,
                "failure_job_id": 9,
                "complete_job_id": 10,
            }
        },
        batches_opened={"B"},
        batches_closed={"B"},
    )


def test_a_clean_workflow_run_passes():
    f = check(workflow_run())
    assert f.violations() == {}
    assert (f.get("dependent_jobs"), f.get("cancelled_by_parent"), f.get("batches"), f.get("callbacks")) == (3, 1, 1, 2)
    assert f.get("callback_executions") == 2


def test_a_dependent_job_claimed_before_its_parent_finished_is_caught():
    obs = workflow_run()
    obs.times["j"] = (obs.times["p2"][1].replace(second=2), obs.times["j"][1])  # before p2 finished at 3 s
    assert check(obs).violations() == {"started_before_parents": 1}


def test_a_child_not_cancelled_by_its_failed_parent_is_caught():
    obs = workflow_run()
    obs.rows = [Row(6, "c", "done", 1, 4, None) if r.task_key == "c" else r for r in obs.rows]
    obs.results.append(("c", 6, 1))
    obs.executions.append(Execution("c", 1, "h:1:w1:1", 1))
    obs.times["c"] = (obs.times["p2"][1], obs.times["p2"][1])
    assert check(obs).violations() == {"ran_despite_failed_parent": 1}


def test_batch_callbacks_missing_unexpected_or_enqueued_twice_are_caught():
    obs = workflow_run()
    obs.rows = [r for r in obs.rows if r.task_key != "batch:B:complete"]
    obs.results = [r for r in obs.results if r[0] != "batch:B:complete"]
    obs.executions = [e for e in obs.executions if e.task_key != "batch:B:complete"]
    obs.batches["B"]["complete_job_id"] = None
    assert check(obs).violations() == {"callbacks_missing": 1}

    obs = workflow_run()
    obs.rows.append(Row(11, "batch:B:success", "done", 1, 4, None))
    obs.results.append(("batch:B:success", 11, 1))
    obs.executions.append(Execution("batch:B:success", 1, "h:1:w1:1", 1))
    obs.batches["B"]["success_job_id"] = 11
    assert check(obs).violations() == {"callbacks_unexpected": 1}

    obs = workflow_run()
    obs.batches["B"]["failure_job_id"] = 12  # the batch names another job: a second enqueue
    assert check(obs).violations() == {"duplicate_callbacks": 1}

    obs = workflow_run()
    obs.batches["B"]["failed"] = 0
    assert check(obs).violations() == {"batch_counts_wrong": 1}


def test_a_claim_before_the_split_brain_line_is_not_taken_for_one_after_it():
    """The two_primaries check (soak/two_primaries.py) counts the twin worker's claims from its
    split_brain line on. CI failed on 2 such claims with the fault's clock read taking a while on a
    loaded machine: the primary's clock was read (writable_at) half a second before the wall
    clock (writable_wall), and the line's time was moved onto the primary's clock by that pair, so
    the window began half a second before the line, where the worker still claimed, rightly."""
    wall = time.time()
    spell = Spell(utc(wall - 0.5), wall)  # SELECT UTC_TIMESTAMP(6), then its connection's close: 0.5 s
    line_at = wall + 1.0
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(line_at)) + f",{int(line_at * 1000) % 1000:03d}"
    log = f"{stamp} ERROR jobqueue.worker event=split_brain worker=h:1:twin detail=two writable\n"

    since, delay = claims_stop_at(spell, log)

    assert delay == pytest.approx(1.0, abs=0.002)
    assert since > utc(line_at - 0.001)  # a claim that started before the line is not counted
    assert since <= utc(line_at + 0.002)  # one a moment after it is

    late, delay = claims_stop_at(spell, "")  # never said: from MAX_DETECTION_SECONDS on
    assert delay is None and since < late <= utc(wall + MAX_DETECTION_SECONDS)
