"""A worker frozen or cut off from the server in the middle of a claim cycle.

Its open transaction holds the rows it was claiming or completing (every other claim passes them
by with SKIP LOCKED, so ready jobs sit unclaimed) and a share lock on the queues' `queue_state`
rows (so a pause waits on it, then fails). Left to the server's defaults, such a transaction lives
until TCP keepalive or `wait_timeout` (8 hours) ends its connection. A worker's sessions bound it:
the server ends a transaction idle for JOBQUEUE_IDLE_TRANSACTION_SECONDS, and the worker, once it
runs again, goes on on a new connection with nothing lost or run twice.

The race is made on purpose: a real `jobqueue worker` is stopped (SIGSTOP) again and again until
the server shows it holding job rows in an open transaction.
"""

from __future__ import annotations

import random
import signal
import time
import uuid

import pytest
import sqlalchemy as sa

from jobqueue import JobQueue, create_app
from jobqueue.core import service
from jobqueue.core.db import CR_CONNECTION_ERRORS, ER_CLIENT_INTERACTION_TIMEOUT, create_engine, error_code
from jobqueue.core.models import Status
from jobqueue.core.repository import doorbell
from jobqueue.core.schema import job_queue
from testkit.procs import WorkerProcess, cli_env, wait_until
from testkit.web import app_config

BOUND_SECONDS = 3
JOBS = 20000


def _held(engine) -> int:
    """Job rows another transaction holds: the first ready and running rows a plain read sees and
    a SKIP LOCKED read passes by (what every claim does). Read this way rather than from
    information_schema.INNODB_TRX, whose picture is refreshed at most every 0.1 s and, on MariaDB,
    keeps showing a connection's last transaction."""
    live = (
        sa.select(job_queue.c.id)
        .where(job_queue.c.status.in_([Status.READY, Status.RUNNING]))
        .order_by(job_queue.c.id)
        .limit(300)
    )
    with engine.connect() as conn:
        seen = set(conn.execute(live).scalars())
        conn.rollback()
        free = set(conn.execute(live.with_for_update(skip_locked=True)).scalars())
        conn.rollback()
    return len(seen - free)


def _counts(engine) -> dict:
    with engine.connect() as conn:
        rows = conn.execute(sa.select(job_queue.c.status, sa.func.count()).group_by(job_queue.c.status))
        return dict(rows.all())


@pytest.mark.slow
def test_a_worker_stopped_mid_claim_frees_its_rows_and_a_pause_within_the_bound(mysql_url, mysql_engine, tmp_path):
    with mysql_engine.connect() as conn:
        service.enqueue_many(conn, [{"task": "noop", "task_key": f"s-{i}"} for i in range(JOBS)])
    env = cli_env(JOBQUEUE_IDLE_TRANSACTION_SECONDS=str(BOUND_SECONDS), JOBQUEUE_LOG_LEVEL="INFO")
    worker = WorkerProcess(mysql_url, tmp_path, "w", "--concurrency", "4", env=env)
    stopped = False
    try:
        wait_until(lambda: _counts(mysql_engine).get("done", 0) >= 200, timeout=30, message="the worker to run jobs")
        held = 0
        for _ in range(400):
            worker.signal(signal.SIGSTOP)
            stopped = True
            time.sleep(0.05)  # what it sent before it stopped reaches the server
            held = _held(mysql_engine)
            if held:
                break
            worker.signal(signal.SIGCONT)
            stopped = False
            time.sleep(random.uniform(0.002, 0.03))
        assert held, f"the worker was never caught holding job rows in an open transaction: {_counts(mysql_engine)}"

        caught = time.monotonic()
        wait_until(
            lambda: not _held(mysql_engine),
            timeout=BOUND_SECONDS + 10,
            interval=0.1,
            message=f"the server to end the stopped worker's transaction ({held} job rows held)",
        )
        freed = time.monotonic() - caught
        # The queue_state share lock went with it: a pause answers at once, the worker still stopped.
        with mysql_engine.connect() as conn:
            service.pause_queue(conn, "default", actor="tester")
            service.resume_queue(conn, "default", actor="tester")

        worker.signal(signal.SIGCONT)
        stopped = False
        wait_until(lambda: _counts(mysql_engine) == {"done": JOBS}, timeout=60, message="every job done once resumed")
    finally:
        if stopped:
            worker.signal(signal.SIGCONT)
        code = worker.stop()
    assert code == 0, worker.log()[-3000:]
    assert freed <= BOUND_SECONDS + 5, freed
    with mysql_engine.connect() as conn:
        twice = conn.execute(sa.select(sa.func.count()).where(job_queue.c.attempts > 1)).scalar()
        statuses = {s for (s,) in conn.execute(sa.select(job_queue.c.status).distinct())}
    assert twice == 0, f"{twice} jobs ran more than once"
    assert statuses == {Status.DONE}


def test_connections_idle_past_the_bound_are_replaced_not_handed_out_closed(mysql_url, db_server):
    """MySQL's bound is its sessions' wait_timeout, which closes idle pool connections too: one
    idle for half of it is replaced at checkout. MariaDB's ends only idle transactions, so its
    connections stay. Either way, a transaction left idle past the bound is ended by the server."""
    engine = create_engine(mysql_url, pool_size=1, idle_transaction_seconds=2)
    try:
        with engine.connect() as conn:
            first = conn.exec_driver_sql("SELECT CONNECTION_ID()").scalar()
        time.sleep(3)  # past the bound: MySQL has closed that session
        with engine.connect() as conn:
            second = conn.exec_driver_sql("SELECT CONNECTION_ID()").scalar()
        assert (second == first) == (db_server != "mysql"), (first, second)

        with engine.connect() as conn:
            conn.execute(sa.select(job_queue.c.id).limit(1).with_for_update())
            time.sleep(3)
            with pytest.raises(sa.exc.OperationalError) as ended:
                conn.exec_driver_sql("SELECT 1").scalar()
        assert error_code(ended.value) in (*CR_CONNECTION_ERRORS, ER_CLIENT_INTERACTION_TIMEOUT), ended.value
    finally:
        engine.dispose()


@pytest.mark.slow
def test_a_worker_busy_past_the_bound_keeps_its_doorbell_and_idle_probe(mysql_url, mysql_engine, tmp_path):
    """The doorbell's connection and the idle probe's stay open through a worker's busy spells;
    under a 2 s bound, a 4 s job would have had the server close them (MySQL) and the next idle
    spell begin with a doorbell error and 5 s deaf. Here the worker's own polling is 5 minutes
    apart: only the doorbell finds the second job."""
    queue = f"busy{uuid.uuid4().hex[:8]}"
    env = cli_env(JOBQUEUE_IDLE_TRANSACTION_SECONDS="2", JOBQUEUE_LOG_LEVEL="INFO")
    worker = WorkerProcess(
        mysql_url, tmp_path, "w", "--concurrency", "1", "--queues", queue, "--idle-cap-seconds", "300", env=env
    )
    try:
        wait_until(lambda: _sleeping(mysql_engine, queue), timeout=30, message="the worker's doorbell")
        with mysql_engine.connect() as conn:
            service.enqueue(conn, "slow_noop", "long", queue=queue, payload={"seconds": 4})
        wait_until(lambda: _counts(mysql_engine) == {"done": 1}, timeout=20, message="the long job done")
        wait_until(lambda: _sleeping(mysql_engine, queue), timeout=10, message="the doorbell again")
        with mysql_engine.connect() as conn:
            service.enqueue(conn, "noop", "short", queue=queue)
        wait_until(lambda: _counts(mysql_engine) == {"done": 2}, timeout=10, message="the second job, rung")
    finally:
        code = worker.stop()
    assert code == 0
    assert not [line for line in worker.log().splitlines() if " WARNING " in line or " ERROR " in line]


def _sleeping(engine, queue: str) -> bool:
    with engine.connect() as conn:
        return any(queue in s.queues for s in doorbell.sleepers(conn))


def test_only_the_engines_that_run_workers_bound_idle_transactions(mysql_url, db_server):
    """The web app's embedded workers and the reaper (its runtime engine) are bounded; its request
    engine and a client's, whose transactions may be the application's, keep the server's."""

    def bound(engine) -> int:
        variable = "wait_timeout" if db_server == "mysql" else "idle_transaction_timeout"
        with engine.connect() as conn:
            return int(conn.exec_driver_sql(f"SELECT @@session.{variable}").scalar())

    app = create_app(app_config(mysql_url))
    client = JobQueue(mysql_url)
    try:
        queue = app.extensions["jobqueue"]
        assert bound(queue.runtime.engine) == 30
        assert bound(queue.engine) != 30
        assert bound(client.engine) != 30
    finally:
        client.close()
        queue.runtime.engine.dispose()
        queue.engine.dispose()
