"""Batches: members counted on the batch's row; on_success / on_failure / on_complete enqueued
exactly once (task_key batch:<KEY>:<kind>) in the transaction that decided it, never before the
batch is closed; the last two members finishing at once, or the close racing the last
completion, still make one callback."""

from __future__ import annotations

import datetime
import threading

import pytest
import sqlalchemy as sa

from jobqueue import JobQueue
from jobqueue.core import repository, service
from jobqueue.core.errors import BatchClosed, BatchNotFound
from jobqueue.core.models import Outcome
from jobqueue.core.schema import job_queue

jq = job_queue.c


def claim_one(conn, key: str, queue: str = "default"):
    for _ in range(20):
        got = service.claim(conn, "w", 1, [queue], lease_seconds=60)
        if not got:
            break
        if got[0].job.task_key == key:
            return got[0]
        service.release(conn, got[0].lease)
    raise AssertionError(f"{key} was not claimable")


def callbacks(engine, key: str) -> dict[str, dict]:
    """The callback jobs of batch `key`, by kind, with their payloads."""
    with engine.connect() as c:
        rows = c.execute(sa.select(jq.task_key, jq.task_name, jq.payload).where(jq.task_key.like(f"batch:{key}:%")))
        return {r.task_key.rsplit(":", 1)[1]: {"task": r.task_name, "payload": r.payload} for r in rows}


def finish(engine, key: str, how: str, queue: str = "default") -> None:
    with engine.connect() as conn:
        lease = claim_one(conn, key, queue).lease
        outcome = service.complete(conn, lease) if how == "done" else service.fail(conn, lease, "boom")
        assert outcome is Outcome.OK


def open_batch(q: JobQueue, key: str, **kw):
    return q.batch(key, on_success="notify", on_failure="page_oncall", on_complete="cleanup", **kw)


def test_all_done_fires_success_and_complete_with_counts(engine):
    q = JobQueue(engine)
    with open_batch(q, "nightly", payload={"day": "2026-12-03"}) as b:
        b.enqueue("noop", "m1")
        b.enqueue("noop", "m2")
    assert callbacks(engine, "nightly") == {}
    finish(engine, "m1", "done")
    assert callbacks(engine, "nightly") == {}
    finish(engine, "m2", "done")
    fired = callbacks(engine, "nightly")
    assert set(fired) == {"success", "complete"}
    assert fired["success"]["task"] == "notify" and fired["complete"]["task"] == "cleanup"
    assert fired["success"]["payload"] == {
        "batch": "nightly",
        "kind": "success",
        "total": 2,
        "done": 2,
        "failed": 0,
        "cancelled": 0,
        "payload": {"day": "2026-12-03"},
    }
    shown = q.batch_status("nightly")
    assert {k: shown[k] for k in ("key", "state", "total", "done", "failed", "cancelled", "pending")} == {
        "key": "nightly",
        "state": "finished",
        "total": 2,
        "done": 2,
        "failed": 0,
        "cancelled": 0,
        "pending": 0,
    }
    assert shown["callbacks"]["on_success"]["status"] == "ready"
    assert shown["callbacks"]["on_failure"]["job_id"] is None


def test_a_failure_fires_on_failure_at_once_when_closed_and_complete_at_the_end(engine):
    q = JobQueue(engine)
    with open_batch(q, "b") as b:
        for k in ("m1", "m2", "m3"):
            b.enqueue("noop", k)
    finish(engine, "m1", "failed")
    assert set(callbacks(engine, "b")) == {"failure"}
    assert callbacks(engine, "b")["failure"]["payload"]["failed"] == 1
    finish(engine, "m2", "failed")  # the second failure fires nothing more
    finish(engine, "m3", "done")
    fired = callbacks(engine, "b")
    assert set(fired) == {"failure", "complete"}
    assert fired["complete"]["payload"] | {"payload": None} == {
        "batch": "b",
        "kind": "complete",
        "total": 3,
        "done": 1,
        "failed": 2,
        "cancelled": 0,
        "payload": None,
    }


def test_nothing_fires_before_close_and_the_close_fires_what_is_due(engine):
    q = JobQueue(engine)
    b = open_batch(q, "late")
    b.enqueue("noop", "m1")
    b.enqueue("noop", "m2")
    finish(engine, "m1", "failed")
    finish(engine, "m2", "done")
    assert callbacks(engine, "late") == {}
    assert b.status()["state"] == "open"
    shown = b.close()
    assert shown["state"] == "finished"
    assert set(callbacks(engine, "late")) == {"failure", "complete"}
    b.close()  # closing again changes nothing
    assert set(callbacks(engine, "late")) == {"failure", "complete"}


def test_an_empty_batch_succeeds_at_its_close(engine):
    q = JobQueue(engine)
    with open_batch(q, "empty"):
        pass
    assert set(callbacks(engine, "empty")) == {"success", "complete"}


def test_open_is_idempotent_and_a_closed_batch_refuses_members(engine):
    q = JobQueue(engine)
    open_batch(q, "k").enqueue("noop", "m1")
    again = q.batch("k", on_success="other")  # the existing batch, as it was opened
    assert again.status()["callbacks"]["on_success"]["task"] == "notify"
    assert again.status()["total"] == 1
    again.enqueue("noop", "m1")  # a known task_key: duplicate, counted once
    assert again.status()["total"] == 1
    again.close()
    with pytest.raises(BatchClosed, match="closed"):
        again.enqueue("noop", "m2")
    with engine.connect() as c:
        assert c.execute(sa.select(sa.func.count()).where(jq.task_key == "m2")).scalar() == 0
    with pytest.raises(BatchNotFound):
        q.enqueue("noop", "m3", batch="nope")


def test_an_exception_in_the_block_leaves_the_batch_open(engine):
    q = JobQueue(engine)
    with pytest.raises(RuntimeError), open_batch(q, "half") as b:
        b.enqueue("noop", "m1")
        raise RuntimeError("stopped half way")
    assert q.batch_status("half")["state"] == "open"
    with open_batch(q, "half") as b:  # run again: the members written are duplicates
        b.enqueue("noop", "m1")
        b.enqueue("noop", "m2")
    assert q.batch_status("half") | {"callbacks": None} == q.batch_status("half") | {
        "state": "closed",
        "total": 2,
        "pending": 2,
        "callbacks": None,
    }


def test_operator_cancel_and_requeue_move_the_counts(engine):
    q = JobQueue(engine)
    with open_batch(q, "ops") as b:
        m1 = b.enqueue("noop", "m1")
        m2 = b.enqueue("noop", "m2")
    q.cancel(m1.id)
    assert (q.batch_status("ops")["cancelled"], q.batch_status("ops")["pending"]) == (1, 1)
    q.requeue(m1.id)
    assert (q.batch_status("ops")["cancelled"], q.batch_status("ops")["pending"]) == (0, 2)
    q.fail(m2.id, "by hand")
    q.cancel(m2.id)  # failed -> cancelled: counted once, as cancelled
    shown = q.batch_status("ops")
    assert (shown["failed"], shown["cancelled"], shown["pending"]) == (0, 1, 1)
    assert set(callbacks(engine, "ops")) == {"failure"}  # fired when it failed, never taken back


def test_a_dependency_cancelling_a_member_counts_it(engine):
    q = JobQueue(engine)
    q.enqueue("noop", "parent")
    with open_batch(q, "dep") as b:
        b.enqueue("noop", "child", after=["parent"])
    finish(engine, "parent", "failed")
    shown = q.batch_status("dep")
    assert (shown["state"], shown["cancelled"]) == ("finished", 1)
    assert set(callbacks(engine, "dep")) == {"complete"}


def test_pruning_finished_members_keeps_the_counts(engine):
    q = JobQueue(engine)
    with open_batch(q, "pruned") as b:
        b.enqueue("noop", "m1")
        b.enqueue("noop", "m2")
    finish(engine, "m1", "done")
    with engine.connect() as c:
        m1 = c.execute(sa.select(jq.id).where(jq.task_key == "m1")).scalar()
        pruned, _, _ = repository.retention.prune_batch(c, [m1], ["done"], datetime.datetime(2100, 1, 1))
    assert pruned == {"done": 1}
    finish(engine, "m2", "done")
    shown = q.batch_status("pruned")
    assert (shown["done"], shown["state"]) == (2, "finished")
    assert set(callbacks(engine, "pruned")) == {"success", "complete"}


def test_the_last_two_members_finishing_at_once_fire_once(mysql_engine):
    for round_ in range(10):
        q = JobQueue(mysql_engine)
        key, queue = f"race{round_}", f"q{round_}"
        with open_batch(q, key) as b:
            for k in ("a", "b"):
                b.enqueue("noop", f"{key}-{k}", queue=queue)
        with mysql_engine.connect() as conn:
            leases = [claim_one(conn, f"{key}-{k}", queue).lease for k in ("a", "b")]
        start = threading.Barrier(2)
        outcomes = []

        def complete(lease, via_cycle):
            with mysql_engine.connect() as conn:
                start.wait()
                if via_cycle:
                    cycle = service.claim_cycle(conn, [], [queue], lease_seconds=60, completions=[lease])
                    outcomes.append(cycle.completed[(lease.job_id, lease.attempt)])
                else:
                    outcomes.append(service.complete(conn, lease))

        threads = [
            threading.Thread(target=complete, args=(lease, i % 2 == round_ % 2)) for i, lease in enumerate(leases)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert outcomes == [Outcome.OK, Outcome.OK]
        assert set(callbacks(mysql_engine, key)) == {"success", "complete"}, round_
        assert q.batch_status(key)["done"] == 2


def test_a_close_racing_the_last_completion_fires_once(mysql_engine):
    for round_ in range(10):
        q = JobQueue(mysql_engine)
        key, queue = f"close{round_}", f"q{round_}"
        b = open_batch(q, key)
        b.enqueue("noop", f"{key}-a", queue=queue)
        with mysql_engine.connect() as conn:
            lease = claim_one(conn, f"{key}-a", queue).lease
        start = threading.Barrier(2)

        def complete():
            with mysql_engine.connect() as conn:
                start.wait()
                assert service.complete(conn, lease) is Outcome.OK

        def close():
            start.wait()
            b.close()

        threads = [threading.Thread(target=complete), threading.Thread(target=close)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert set(callbacks(mysql_engine, key)) == {"success", "complete"}, round_
        assert q.batch_status(key)["state"] == "finished"


def test_the_batch_state_machine(engine):
    """Hypothesis stateful: members enqueued, finished done / failed / cancelled in any order,
    the close anywhere among them. Invariant after every step: each callback job exists at most
    once, and exists exactly when its condition holds."""
    from hypothesis import HealthCheck, settings
    from hypothesis import strategies as st
    from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

    q = JobQueue(engine)
    counter = iter(range(10**6))

    class BatchMachine(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.key = f"sm{next(counter)}"
            self.batch = open_batch(q, self.key)
            self.closed = False
            self.pending: list[tuple[str, int]] = []
            self.outcomes: list[str] = []

        @precondition(lambda self: not self.closed)
        @rule()
        def enqueue(self) -> None:
            task_key = f"{self.key}-{len(self.pending) + len(self.outcomes)}"
            self.pending.append((task_key, self.batch.enqueue("noop", task_key, queue=task_key).id))

        @precondition(lambda self: self.pending)
        @rule(how=st.sampled_from(["done", "failed", "cancelled"]), which=st.integers(0, 100))
        def finish(self, how: str, which: int) -> None:
            task_key, job_id = self.pending.pop(which % len(self.pending))
            if how == "cancelled":
                q.cancel(job_id)
            else:
                finish(engine, task_key, how, task_key)
            self.outcomes.append(how)

        @rule()
        def close(self) -> None:
            self.batch.close()
            self.closed = True

        @invariant()
        def callbacks_exactly_when_due(self) -> None:
            with engine.connect() as c:
                counts = dict(
                    c.execute(
                        sa.select(jq.task_key, sa.func.count())
                        .where(jq.task_key.like(f"batch:{self.key}:%"))
                        .group_by(jq.task_key)
                    ).all()
                )
            assert all(n == 1 for n in counts.values())
            fired = {k.rsplit(":", 1)[1] for k in counts}
            finished = self.closed and not self.pending
            due = {
                "failure": self.closed and "failed" in self.outcomes,
                "success": finished and all(o == "done" for o in self.outcomes),
                "complete": finished,
            }
            assert fired == {kind for kind, yes in due.items() if yes}
            shown = self.batch.status()
            assert shown["pending"] == len(self.pending)
            assert (shown["done"], shown["failed"], shown["cancelled"]) == tuple(
                self.outcomes.count(o) for o in ("done", "failed", "cancelled")
            )

    case = BatchMachine.TestCase
    case.settings = settings(
        max_examples=15, stateful_step_count=12, deadline=None, suppress_health_check=list(HealthCheck)
    )
    case().runTest()


def test_the_cli(engine, db_url):
    import json

    from click.testing import CliRunner

    from jobqueue.core.cli import main

    def run(*args: str):
        return CliRunner().invoke(main, ["--database-url", db_url, *args], obj={})

    opened = run("batch", "open", "cli", "--on-success", "notify", "--on-complete", "cleanup", "--payload", '{"a": 1}')
    assert opened.exit_code == 0, opened.output
    assert json.loads(opened.output)["created"] is True
    assert json.loads(run("batch", "open", "cli").output)["created"] is False
    assert run("enqueue", "noop", "--key", "m1", "--batch", "cli").exit_code == 0
    assert run("enqueue", "noop", "--key", "m2", "--batch", "nope").exit_code == 4
    closed = run("batch", "close", "cli")
    assert closed.exit_code == 0 and json.loads(closed.output)["state"] == "closed"
    refused = run("enqueue", "noop", "--key", "m3", "--batch", "cli")
    assert refused.exit_code == 3 and "closed" in refused.output
    finish(engine, "m1", "done")
    shown = json.loads(run("batch", "show", "cli", "--json").output)
    assert {k: shown[k] for k in ("key", "state", "total", "done", "failed", "cancelled", "pending")} == {
        "key": "cli",
        "state": "finished",
        "total": 1,
        "done": 1,
        "failed": 0,
        "cancelled": 0,
        "pending": 0,
    }
    assert set(shown["callbacks"]) == {"on_success", "on_complete"}
    assert shown["callbacks"]["on_success"]["task_key"] == "batch:cli:success"
    assert shown["callbacks"]["on_success"]["job_id"] is not None
    assert "on_success: notify  job" in run("batch", "show", "cli").output
    assert run("batch", "show", "nope").exit_code == 4
    assert run("batch", "open", "x" * 65).exit_code == 2


def test_the_api(mysql_url):
    from jobqueue import create_app
    from testkit.web import api, app_config

    app = create_app(app_config(mysql_url))
    try:
        client = app.test_client()
        body = {"key": "web", "on_success": "notify", "on_failure": "page_oncall", "payload": {"a": 1}}
        opened = api(client, "POST", "/api/batches", json=body)
        assert opened.status_code == 201 and opened.get_json()["state"] == "open"
        assert api(client, "POST", "/api/batches", json={"key": "web"}).status_code == 200
        member = api(client, "POST", "/api/jobs", json={"task": "noop", "task_key": "w1", "batch": "web"})
        assert member.status_code == 201
        unknown = api(client, "POST", "/api/jobs", json={"task": "noop", "task_key": "w2", "batch": "nope"})
        assert unknown.status_code == 404
        closed = api(client, "POST", "/api/batches/web/close")
        assert closed.status_code == 200 and closed.get_json()["total"] == 1
        refused = api(client, "POST", "/api/jobs", json={"task": "noop", "task_key": "w3", "batch": "web"})
        assert refused.status_code == 409
        shown = api(client, "GET", "/api/batches/web").get_json()
        assert {k: shown[k] for k in ("key", "state", "total", "pending")} == {
            "key": "web",
            "state": "closed",
            "total": 1,
            "pending": 1,
        }
        assert set(shown["callbacks"]) == {"on_success", "on_failure"}
        assert api(client, "GET", "/api/batches/nope").status_code == 404
        # A callback name its enqueue at the close would refuse is refused at the open: such a
        # batch could never close (schemathesis found one).
        odd = api(client, "POST", "/api/batches", json={"key": "odd", "on_complete": " notify"})
        assert odd.status_code == 422 and odd.get_json()["field"] == "on_complete"
        assert api(client, "GET", "/api/batches/odd").status_code == 404
        # null for a job's optional workflow fields: refused, as its contract says (an array / a string).
        for name in ("after", "on_parent_failure", "batch"):
            answer = api(client, "POST", "/api/jobs", json={"task": "noop", "task_key": f"null-{name}", name: None})
            assert answer.status_code == 422 and answer.get_json()["field"] == name, name
    finally:
        app.extensions["jobqueue"].engine.dispose()


def test_a_worker_sigkilled_right_after_the_last_completion_loses_no_callback(mysql_url, mysql_engine, tmp_path):
    """A real `jobqueue worker` runs the members and is SIGKILLed the moment it logs the last
    completion: the callbacks committed with that completion, so each is there, once."""
    import signal

    from testkit.procs import WorkerProcess

    q = JobQueue(mysql_engine)
    with q.batch("killed", on_success="noop", on_complete="noop") as b:
        last = [b.enqueue("noop", f"killed-{i}", queue="kq").id for i in range(5)][-1]
    worker = WorkerProcess(mysql_url, tmp_path, "k", "--concurrency", "2", "--queues", "kq")
    try:
        worker.wait_for_log(rf"event=complete job_id={last}\b", timeout=30)
        worker.signal(signal.SIGKILL)
        worker.proc.wait(5)
    finally:
        worker.kill()
    with mysql_engine.connect() as c:
        keys = c.execute(sa.select(jq.task_key).where(jq.task_key.like("batch:killed:%"))).scalars().all()
    assert sorted(keys) == ["batch:killed:complete", "batch:killed:success"]
    assert q.batch_status("killed")["state"] == "finished"


def test_a_callback_is_reported_like_any_enqueue_once_its_transaction_commits(engine, monkeypatch):
    """Reported (counted, idle workers woken) after the COMMIT of the completion that enqueued
    it, never for a transaction rolled back."""
    reported = []
    monkeypatch.setattr(service, "_report_enqueued", lambda results, engine=None: reported.extend(results))
    q = JobQueue(engine)
    with q.batch("woken", on_complete="noop") as b:
        b.enqueue("noop", "woken-1")
    reported.clear()  # the member's own enqueue
    with engine.connect() as conn:
        lease = claim_one(conn, "woken-1").lease
        with conn.begin() as tx:
            repository.leases.complete_with(conn, lease)
            tx.rollback()
        assert reported == []
        assert service.complete(conn, lease) is Outcome.OK
    assert [r.task_key for r in reported] == ["batch:woken:complete"]
