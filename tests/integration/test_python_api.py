"""The Python API: the client object, enqueue in the caller's transaction, and completion in the
handler's (issue 16). On the real MariaDB, and SQLite where it applies."""

from __future__ import annotations

import threading
import time

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

import jobqueue
from jobqueue import JobQueue, task
from jobqueue.core import repository, service
from jobqueue.core.builtin_tasks import noop
from jobqueue.core.errors import InvalidState, LeaseLostError
from jobqueue.core.models import Status
from jobqueue.core.schema import job_queue
from jobqueue.core.tasks import Registry, TaskSpec
from jobqueue.core.worker import LeaseState, Worker, WorkerConfig
from testkit.procs import wait_until

orders = sa.Table(
    "shop_orders", sa.MetaData(), sa.Column("id", sa.Integer, primary_key=True), sa.Column("note", sa.String(50))
)


@pytest.fixture
def shop(engine):
    orders.create(engine)
    yield engine
    orders.drop(engine)


def count(engine, table) -> int:
    with engine.connect() as conn:
        return conn.execute(sa.select(sa.func.count()).select_from(table)).scalar()


def start(worker: Worker) -> threading.Thread:
    t = threading.Thread(target=worker.run, daemon=True)
    t.start()
    return t


# --- the client ------------------------------------------------------------------------------


def test_the_client_enqueues_looks_and_acts(engine):
    jq = JobQueue(engine)
    first = jq.enqueue("noop", "c-1", {"a": 1}, queue="mail")
    assert (first.duplicate, first.status) == (False, Status.READY)
    assert jq.enqueue("noop", "c-1").duplicate is True
    many = jq.enqueue_many([{"task": "noop", "task_key": f"m-{i}"} for i in range(3)])
    assert [m.duplicate for m in many] == [False] * 3
    assert jq.get(first.id).queue == "mail"
    assert [j.task_key for j in jq.list(queue="mail")] == ["c-1"]
    assert len(jq.list(key="m-")) == 3
    assert jq.fail(first.id, "no").after is Status.FAILED
    assert jq.requeue(first.id).after is Status.READY
    done = jq.enqueue("noop", "c-done")
    with engine.connect() as conn:
        conn.execute(sa.update(job_queue).where(job_queue.c.id == done.id).values(status="done"))
        conn.commit()
    with pytest.raises(InvalidState):
        jq.requeue(done.id)  # a done job runs again only when asked
    assert jq.requeue(done.id, again=True).after is Status.READY


def test_the_client_cancels_with_its_actor_in_the_audit_log(engine):
    jq = JobQueue(engine)
    job = jq.enqueue("noop", "c-cancel")
    result = jq.cancel(job.id, "order withdrawn", actor="app:shop")
    assert (result.before, result.after, result.changed) == (Status.READY, Status.CANCELLED, True)
    assert jq.cancel(job.id).changed is False  # already cancelled: nothing to do
    with engine.connect() as conn:
        entries = repository.operator.list_audit(conn, job_id=job.id, limit=5)
    assert [e["actor"] for e in entries] == ["app:shop"] and "order withdrawn" in entries[0]["detail"]
    done = jq.enqueue("noop", "c-done")
    with engine.begin() as conn:
        conn.execute(job_queue.update().where(job_queue.c.id == done.id).values(status="done"))
    with pytest.raises(InvalidState):
        jq.cancel(done.id)


def test_a_task_enqueues_itself_and_is_still_a_function(engine, monkeypatch):
    registry = Registry()
    calls = []

    @task("greet", registry=registry)
    def greet(payload, ctx):
        calls.append(payload["name"])

    jobqueue.set_default(JobQueue(engine, registry=registry))
    try:
        res = greet.enqueue("hello-1", {"name": "Ada"})
        assert res.duplicate is False and greet.task_name == "greet"
    finally:
        jobqueue.set_default(None)
    greet({"name": "direct"}, None)
    assert calls == ["direct"]
    with engine.connect() as conn:
        assert repository.reads.get_job(conn, res.id).task_name == "greet"


# --- transactional enqueue --------------------------------------------------------------------


def test_an_enqueue_in_a_rolled_back_transaction_leaves_nothing_and_frees_its_key(shop):
    jq = JobQueue(shop)
    with shop.connect() as conn:
        with conn.begin() as tx:
            conn.execute(orders.insert().values(id=1, note="cart"))
            jq.enqueue("noop", "order-1", conn=conn)
            tx.rollback()
    assert count(shop, orders) == 0 and count(shop, job_queue) == 0
    again = jq.enqueue("noop", "order-1")
    assert again.duplicate is False


def test_a_committed_one_exists_once_and_runs_only_after_the_commit(shop):
    registry = Registry()
    started = []

    def mark(payload, ctx):
        started.append(time.monotonic())

    registry.register(TaskSpec("mark", mark))
    jq = JobQueue(shop, registry=registry)
    worker = Worker(shop, WorkerConfig(concurrency=1, idle_cap_seconds=0.2), registry=registry)
    t = start(worker)
    try:
        with shop.connect() as conn:
            with conn.begin():
                conn.execute(orders.insert().values(id=2, note="paid"))
                jq.enqueue("mark", "order-2", conn=conn)
                time.sleep(1.0)  # an idle worker polls every 0.2 s meanwhile
                assert started == [], "the worker ran a job whose transaction had not committed"
            committed = time.monotonic()
        wait_until(lambda: started, timeout=5, message="the job to run after the commit")
    finally:
        worker.stop()
        t.join(10)
    assert started[0] >= committed and count(shop, job_queue) == 1


def test_an_orm_session_works_the_same(shop):
    jq = JobQueue(shop)
    with Session(shop) as session:
        session.execute(orders.insert().values(id=3, note="session"))
        jq.enqueue("noop", "order-3", conn=session)
        session.rollback()
    assert count(shop, job_queue) == 0
    with Session(shop) as session:
        session.execute(orders.insert().values(id=3, note="session"))
        jq.enqueue("noop", "order-3", conn=session)
        session.commit()
    assert count(shop, job_queue) == 1 and count(shop, orders) == 1


# --- transactional completion -------------------------------------------------------------


def run_one(engine, registry, key, **config) -> Worker:
    worker = Worker(engine, WorkerConfig(concurrency=1, **config), registry=registry)
    return worker


def test_writes_in_ctx_transaction_commit_with_the_completion_and_roll_back_with_an_error(shop):
    registry = Registry()
    attempts = []

    def export(payload, ctx):
        attempts.append(ctx.attempt)
        with ctx.transaction() as conn:
            conn.execute(orders.insert().values(id=10, note=f"attempt {ctx.attempt}"))
            if ctx.attempt == 1:
                raise RuntimeError("the first attempt fails after its insert")

    registry.register(TaskSpec("export", export, retry_base_seconds=0.05))
    with shop.connect() as conn:
        res = service.enqueue(conn, "export", "t-1", registry=registry)
    worker = Worker(shop, WorkerConfig(concurrency=1, idle_cap_seconds=0.2), registry=registry)
    t = start(worker)
    try:
        wait_until(lambda: JobQueue(shop).get(res.id).status is Status.DONE, timeout=10, message="done")
    finally:
        worker.stop()
        t.join(10)
    assert attempts == [1, 2]
    with shop.connect() as conn:
        assert conn.execute(sa.select(orders.c.note)).scalars().all() == ["attempt 2"]
        assert repository.reads.get_job(conn, res.id).attempts == 2


@pytest.mark.servers_only
def test_an_attempt_that_lost_its_lease_commits_nothing_and_the_next_one_does(shop):
    registry = Registry()
    go = threading.Event()
    results = {}

    def export(payload, ctx):
        if ctx.attempt == 1:
            go.wait(20)  # an operator force-requeues the job meanwhile
        try:
            with ctx.transaction() as conn:
                conn.execute(orders.insert().values(id=20 + ctx.attempt, note=f"attempt {ctx.attempt}"))
        except LeaseLostError:
            results[ctx.attempt] = "lease lost"
            raise
        results[ctx.attempt] = "committed"

    registry.register(TaskSpec("export", export))
    registry.register(TaskSpec("noop", noop))
    with shop.connect() as conn:
        res = service.enqueue(conn, "export", "t-2", registry=registry)
    worker = Worker(shop, WorkerConfig(concurrency=2, lease_seconds=30, idle_cap_seconds=0.2), registry=registry)
    t = start(worker)
    try:
        wait_until(lambda: worker.keeper.held(LeaseState.RUNNING), message="attempt 1 running")
        JobQueue(shop).requeue(res.id, force=True)
        wait_until(lambda: results.get(2) == "committed", timeout=10, message="attempt 2 committed")
        go.set()
        wait_until(lambda: 1 in results, timeout=10, message="attempt 1 to finish")
    finally:
        go.set()
        worker.stop()
        t.join(10)
    assert results == {1: "lease lost", 2: "committed"}
    with shop.connect() as conn:
        assert conn.execute(sa.select(orders.c.note)).scalars().all() == ["attempt 2"]
        job = repository.reads.get_job(conn, res.id)
    assert (job.status, job.attempts) == (Status.DONE, 2)
