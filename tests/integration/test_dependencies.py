"""Dependencies: a job enqueued with `after` is blocked until every parent is done, then ready
(or scheduled) in the transaction of its last parent's completion; a failed or cancelled parent
cancels it (or counts as finished, on_parent_failure="run"); unknown parents and cycles are
refused writing nothing; the last two parents finishing at once unblock the child exactly once."""

from __future__ import annotations

import threading
import time

import pytest
import sqlalchemy as sa
from click.testing import CliRunner

from jobqueue import JobQueue, create_app
from jobqueue.core import repository, service
from jobqueue.core.cli import main
from jobqueue.core.errors import InvalidState
from jobqueue.core.models import Outcome, Status
from jobqueue.core.repository.dependencies import DependencyCycle, UnknownParent
from jobqueue.core.schema import job_dependency, job_queue
from testkit.web import api, app_config, login

jq = job_queue.c


def status(engine, job_id: int) -> Status:
    with engine.connect() as c:
        return repository.reads.get_job(c, job_id).status


def count(engine, table) -> int:
    with engine.connect() as c:
        return c.execute(sa.select(sa.func.count()).select_from(table)).scalar()


def claim_one(conn, key: str, queue: str = "default"):
    """Claim until the job with `key` is in hand (others claimed on the way are released)."""
    for _ in range(20):
        got = service.claim(conn, "w", 1, [queue], lease_seconds=60)
        if not got:
            break
        if got[0].job.task_key == key:
            return got[0]
        service.release(conn, got[0].lease)
    raise AssertionError(f"{key} was not claimable")


def test_blocked_until_every_parent_is_done_then_ready(engine):
    q = JobQueue(engine)
    q.enqueue("noop", "a")
    q.enqueue("noop", "b")
    child = q.enqueue("noop", "child", after=["a", "b"])
    assert (child.duplicate, child.status) == (False, Status.BLOCKED)
    with engine.connect() as conn:
        ca = claim_one(conn, "a")
        cb = claim_one(conn, "b")
        assert service.claim(conn, "w", 5, ["default"], lease_seconds=60) == []  # the child is never claimed
        assert service.complete(conn, ca.lease) is Outcome.OK
        assert status(engine, child.id) is Status.BLOCKED
        assert [r.code for r in repository.explain.explain(conn, child.id).reasons] == ["blocked_by"]
        why = repository.explain.explain(conn, child.id).reasons[0].as_dict()
        assert [p["task_key"] for p in why["blocked_by"]] == ["b"]
        assert service.complete(conn, cb.lease) is Outcome.OK
    assert status(engine, child.id) is Status.READY


def test_the_claim_cycle_completion_unblocks_and_a_delay_makes_it_scheduled(engine):
    q = JobQueue(engine)
    q.enqueue("noop", "p")
    now = q.enqueue("noop", "now", after=["p"])
    later = q.enqueue("noop", "later", after=["p"], delay=3600)
    with engine.connect() as conn:
        cp = claim_one(conn, "p")
        cycle = service.claim_cycle(conn, [], ["default"], lease_seconds=60, completions=[cp.lease])
        assert cycle.completed[(cp.lease.job_id, cp.lease.attempt)] is Outcome.OK
    assert status(engine, now.id) is Status.READY
    assert status(engine, later.id) is Status.SCHEDULED


def test_a_parent_done_at_enqueue_does_not_block(engine):
    q = JobQueue(engine)
    q.enqueue("noop", "p")
    with engine.connect() as conn:
        assert service.complete(conn, claim_one(conn, "p").lease) is Outcome.OK
    assert q.enqueue("noop", "c", after=["p"]).status is Status.READY


@pytest.mark.parametrize("how", ["fail", "cancel", "reap"])
def test_a_failed_or_cancelled_parent_cancels_the_child_naming_it(engine, how):
    q = JobQueue(engine)
    parent = q.enqueue("noop", "p", max_attempts=1)
    child = q.enqueue("noop", "c", after=["p"])
    grandchild = q.enqueue("noop", "g", after=["c"])
    runner = q.enqueue("noop", "r", after=["p"], on_parent_failure="run")
    with engine.connect() as conn:
        if how == "fail":
            assert service.fail(conn, claim_one(conn, "p").lease, "broken") is Outcome.OK
        elif how == "cancel":
            q.cancel(parent.id)
        else:
            claim_one(conn, "p")
            conn.execute(
                sa.update(job_queue)
                .where(jq.id == parent.id)
                .values(lease_until=sa.func.coalesce(jq.started_at, jq.created_at))
            )
            conn.commit()
            assert service.reap(conn).failed == 1
        got = repository.reads.get_job(conn, child.id)
        assert got.status is Status.CANCELLED and "p" in got.last_error
        assert repository.reads.get_job(conn, grandchild.id).status is Status.CANCELLED  # down the line
        assert repository.reads.get_job(conn, runner.id).status is Status.READY
        assert repository.explain.explain(conn, child.id).reasons[0].code == "cancelled"


def test_a_parent_failed_at_enqueue_cancels_or_runs(engine):
    q = JobQueue(engine)
    parent = q.enqueue("noop", "p")
    q.cancel(parent.id)
    assert q.enqueue("noop", "c", after=["p"]).status is Status.CANCELLED
    assert q.enqueue("noop", "r", after=["p"], on_parent_failure="run").status is Status.READY


def test_operator_actions_on_a_blocked_job(engine):
    q = JobQueue(engine)
    q.enqueue("noop", "p")
    child = q.enqueue("noop", "c", after=["p"])
    with pytest.raises(InvalidState, match="blocked"):
        q.requeue(child.id)
    assert q.cancel(child.id).after is Status.CANCELLED


def test_unknown_parent_and_cycles_are_refused_writing_nothing(engine, db_url):
    q = JobQueue(engine)
    q.enqueue("noop", "a")
    before = count(engine, job_queue)
    with pytest.raises(UnknownParent):
        q.enqueue("noop", "c", after=["a", "nope"])
    with pytest.raises(DependencyCycle):
        q.enqueue("noop", "self", after=["self"])
    # The only way to a cycle: re-enqueue an existing key after a job that waits for it.
    q.enqueue("noop", "b", after=["a"])
    q.enqueue("noop", "c2", after=["b"])
    with pytest.raises(DependencyCycle):
        q.enqueue("noop", "a", after=["c2"])
    assert q.enqueue("noop", "a").duplicate is True  # without `after`: idempotent as ever
    assert count(engine, job_queue) == before + 2 and count(engine, job_dependency) == 2
    result = CliRunner().invoke(
        main, ["--database-url", db_url, "enqueue", "noop", "--key", "x", "--after", "a", "--after", "missing"], obj={}
    )
    assert result.exit_code == 2, result.output
    ok = CliRunner().invoke(
        main,
        ["--database-url", db_url, "enqueue", "noop", "--key", "x", "--after", "a", "--on-parent-failure", "run"],
        obj={},
    )
    assert ok.exit_code == 0 and '"blocked"' in ok.output
    assert count(engine, job_queue) == before + 3


def test_the_api_takes_after_and_refuses_unknown_parents(mysql_url):
    app = create_app(app_config(mysql_url))
    try:
        client = app.test_client()
        assert api(client, "POST", "/api/jobs", json={"task": "noop", "task_key": "p"}).status_code == 201
        created = api(
            client,
            "POST",
            "/api/jobs",
            json={"task": "noop", "task_key": "c", "after": ["p"], "on_parent_failure": "run"},
        )
        assert created.status_code == 201 and created.get_json()["status"] == "blocked"
        refused = api(client, "POST", "/api/jobs", json={"task": "noop", "task_key": "d", "after": ["nope"]})
        assert refused.status_code == 422 and refused.get_json()["field"] == "after"
        in_array = api(client, "POST", "/api/jobs", json=[{"task": "noop", "task_key": "e", "after": ["p"]}])
        assert in_array.status_code == 422
        # Found by the OpenAPI negative tests: a list (or object) inside `after` was a 500.
        for bad in ([[]], [{"k": 1}], ["p", ["p"]]):
            refused = api(client, "POST", "/api/jobs", json={"task": "noop", "task_key": "f", "after": bad})
            assert refused.status_code == 422 and refused.get_json()["field"] == "after", bad
        with app.extensions["jobqueue"].engine.connect() as c:
            assert c.execute(sa.select(jq.task_key).order_by(jq.id)).scalars().all() == ["p", "c"]
    finally:
        app.extensions["jobqueue"].engine.dispose()


def test_the_last_two_parents_finishing_at_once_unblock_the_child_once(mysql_engine):
    """Two transactions complete the child's last two parents at the same instant: the child is
    ready afterwards every time (never left blocked), and was made ready once."""
    for round_ in range(15):
        q = JobQueue(mysql_engine)
        keys, queue = [f"r{round_}-a", f"r{round_}-b"], f"q{round_}"
        for k in keys:
            q.enqueue("noop", k, queue=queue)
        child = q.enqueue("noop", f"r{round_}-child", after=keys)
        with mysql_engine.connect() as conn:
            leases = [claim_one(conn, k, queue).lease for k in keys]
        start = threading.Barrier(2)
        outcomes = []

        def finish(lease, via_cycle):
            with mysql_engine.connect() as conn:
                start.wait()
                if via_cycle:
                    cycle = service.claim_cycle(conn, [], [queue], lease_seconds=60, completions=[lease])
                    outcomes.append(cycle.completed[(lease.job_id, lease.attempt)])
                else:
                    outcomes.append(service.complete(conn, lease))

        threads = [threading.Thread(target=finish, args=(lease, i % 2 == round_ % 2)) for i, lease in enumerate(leases)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert outcomes == [Outcome.OK, Outcome.OK]
        assert status(mysql_engine, child.id) is Status.READY, round_


def test_a_parent_finishing_during_the_childs_enqueue_never_leaves_it_blocked(mysql_engine):
    for round_ in range(15):
        q = JobQueue(mysql_engine)
        key = f"p{round_}"
        q.enqueue("noop", key, queue=key)
        with mysql_engine.connect() as conn:
            lease = claim_one(conn, key, key).lease
        start = threading.Barrier(2)
        found = {}

        def complete():
            with mysql_engine.connect() as conn:
                start.wait()
                # BUSY while the enqueue holds the parent's row: the worker tries again, as here.
                while (outcome := service.complete(conn, lease)) is Outcome.BUSY:
                    time.sleep(0.005)
                found["outcome"] = outcome

        def enqueue():
            start.wait()
            found["child"] = q.enqueue("noop", f"c{round_}", after=[key])

        threads = [threading.Thread(target=complete), threading.Thread(target=enqueue)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert found["outcome"] is Outcome.OK
        assert status(mysql_engine, found["child"].id) is Status.READY, round_


def test_the_dashboard_shows_blocked_jobs_and_their_parents(mysql_url):
    app = create_app(app_config(mysql_url))
    try:
        q = JobQueue(app.extensions["jobqueue"].engine)
        parent = q.enqueue("noop", "dash-parent")
        child = q.enqueue("noop", "dash-child", after=["dash-parent"])
        client = app.test_client()
        assert login(client).status_code == 302
        page = client.get(f"/jobs/{child.id}").get_data(as_text=True)
        assert "Runs after" in page and "dash-parent" in page and "blocked_by" in page
        assert "Waited for by" in client.get(f"/jobs/{parent.id}").get_data(as_text=True)
        listed = client.get("/jobs?status=blocked").get_data(as_text=True)
        assert "dash-child" in listed and "dash-parent" not in listed
        assert ">blocked<" in client.get("/").get_data(as_text=True)  # a column of the overview
    finally:
        app.extensions["jobqueue"].engine.dispose()


def test_a_burst_worker_runs_a_graph_in_order(engine):
    """Parents first, then the job after all of them, then the one after it: the worker's own
    completions (the claim cycle) unblock each in turn, and a burst worker does not stop early."""
    from jobqueue.core.tasks import Registry, TaskSpec
    from jobqueue.core.worker import Worker, WorkerConfig

    order: list[str] = []
    lock = threading.Lock()

    def record(payload, ctx):
        with lock:
            order.append(payload["name"])

    registry = Registry()
    registry.register(TaskSpec("record", record))
    q = JobQueue(engine, registry=registry)
    parents = [f"part-{i}" for i in range(12)]
    for key in parents:
        q.enqueue("record", key, {"name": key})
    q.enqueue("record", "merge", {"name": "merge"}, after=parents)
    q.enqueue("record", "publish", {"name": "publish"}, after=["merge"])
    assert Worker(engine, WorkerConfig(concurrency=4, burst=True), registry=registry).run() == 0
    assert sorted(order[:12]) == sorted(parents) and order[12:] == ["merge", "publish"]
