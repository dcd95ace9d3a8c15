"""The doorbell (jobqueue/core/repository/doorbell.py): another process's enqueue wakes an idle
standalone worker at once, through the server (a marked SLEEP ended by KILL QUERY), and an
enqueue that cannot ring (no privilege) still enqueues."""

from __future__ import annotations

import uuid

import pytest
import sqlalchemy as sa

from jobqueue.core import doorbell, repository, service
from jobqueue.core.db import create_engine
from jobqueue.core.migrate import init_db
from jobqueue.core.repository import doorbell as bell
from jobqueue.core.tasks import TASKS
from testkit.procs import WorkerProcess, wait_until


@pytest.fixture
def queue_engine(mysql_url):
    engine = create_engine(mysql_url)
    init_db(engine)
    yield engine
    engine.dispose()


def _sleeper_for(engine, queue: str):
    with engine.connect() as conn:
        return [s for s in bell.sleepers(conn) if queue in s.queues]  # not other tests' "*" sleepers


def test_an_enqueue_in_another_process_rings_the_idle_worker(queue_engine, mysql_url, tmp_path):
    queue = f"bell{uuid.uuid4().hex[:8]}"  # the shared server may have other tests' sleepers
    # An idle cap of 5 minutes: the worker's own polling would not find the job for minutes.
    worker = WorkerProcess(
        mysql_url, tmp_path, "w1", "--concurrency", "1", "--queues", queue, "--idle-cap-seconds", "300"
    )
    try:
        mine = wait_until(lambda: _sleeper_for(queue_engine, queue), timeout=30, message="the worker's doorbell")
        assert mine[0].queues == (queue,)
        with queue_engine.connect() as conn:
            job = service.enqueue(conn, "noop", "rung-1", queue=queue)
        worker.wait_for_log(r"event=doorbell_rung", timeout=10)
        wait_until(
            lambda: repository.reads.get_job(queue_engine.connect(), job.id).status.value == "done",
            timeout=10,
            message="the job done",
        )
        # Back to sleep on the same doorbell once the queue is empty again.
        wait_until(lambda: _sleeper_for(queue_engine, queue), timeout=30, message="the doorbell again")
    finally:
        assert worker.stop() == 0


def test_a_rolled_back_enqueue_rings_nobody_and_a_gone_sleeper_is_not_an_error(queue_engine):
    with queue_engine.connect() as conn:
        assert bell.ring(conn, [2**40]) == 0  # no such connection: nothing to do
    rung = []
    original = doorbell.ring_for
    doorbell.ring_for = lambda engine, queues: rung.append(set(queues)) or 0
    try:
        with queue_engine.connect() as conn:
            with conn.begin() as tx:
                service.enqueue(conn, "noop", "rolled-back")
                tx.rollback()
            assert rung == []
            service.enqueue(conn, "noop", "committed", queue="mail")
            service.enqueue(conn, "noop", "later", delay=60)  # scheduled: nobody to wake
        assert rung == [{"mail"}]
    finally:
        doorbell.ring_for = original


def test_an_account_that_cannot_ring_still_enqueues(queue_engine, mysql_url, tmp_path):
    """A sleeper of another account is invisible without PROCESS; a KILL of it is refused
    without CONNECTION ADMIN / SUPER. Either way the enqueue succeeds and ringing goes quiet."""
    queue = f"bell{uuid.uuid4().hex[:8]}"
    database = sa.engine.make_url(mysql_url).database
    user = f"jq_bell_{uuid.uuid4().hex[:8]}"
    with queue_engine.connect() as conn:
        conn.exec_driver_sql(f"CREATE USER '{user}'@'%%' IDENTIFIED BY 'pw'")
        conn.exec_driver_sql(f"GRANT SELECT, INSERT, UPDATE, DELETE ON `{database}`.* TO '{user}'@'%%'")
    worker = WorkerProcess(
        mysql_url, tmp_path, "w2", "--concurrency", "1", "--queues", queue, "--idle-cap-seconds", "1"
    )
    limited = create_engine(
        sa.engine.make_url(mysql_url).set(username=user, password="pw").render_as_string(hide_password=False)
    )
    try:
        wait_until(lambda: _sleeper_for(queue_engine, queue), timeout=30, message="the worker's doorbell")
        with limited.connect() as conn:
            assert bell.sleepers(conn) == []  # root's threads are not this account's to see
            job = service.enqueue(conn, "noop", "unrung", queue=queue)
        assert not job.duplicate
        # Found by the worker's own polling instead (its idle cap is 1 s here).
        wait_until(
            lambda: repository.reads.get_job(queue_engine.connect(), job.id).status.value == "done",
            timeout=20,
            message="the job done by polling",
        )
    finally:
        limited.dispose()
        worker.stop()
        with queue_engine.connect() as conn:
            conn.exec_driver_sql(f"DROP USER '{user}'@'%%'")


def test_burst_workers_and_sqlite_have_no_doorbell(tmp_path):
    from jobqueue.core.worker import Worker, WorkerConfig

    engine = create_engine(f"sqlite:///{tmp_path / 'q.db'}")
    try:
        init_db(engine)
        assert Worker(engine, WorkerConfig())._doorbell is None
        assert doorbell.ring_for(engine, {"default"}) == 0
    finally:
        engine.dispose()
    assert "noop" in TASKS.names()


def test_a_sleeper_of_another_database_on_the_same_server_is_not_rung(queue_engine, mysql_url):
    """Two installs on one server (their own databases): an enqueue in one must not end the
    idle SLEEPs of the other's workers (it would wake them for nothing, every time)."""
    import threading

    other_name = f"jqt_{uuid.uuid4().hex[:16]}"
    server = mysql_url.rsplit("/", 1)[0]
    admin = sa.create_engine(server + "/")
    with admin.connect() as conn:
        conn.exec_driver_sql(f"CREATE DATABASE `{other_name}`")
    other = create_engine(f"{server}/{other_name}")
    queue = f"bell{uuid.uuid4().hex[:8]}"
    woken: list[bool] = []
    try:

        def sleep_there() -> None:
            with other.connect() as conn:
                conn = conn.execution_options(isolation_level="AUTOCOMMIT")
                woken.append(bell.wait_for_ring(conn, 5, [queue]))

        sleeper = threading.Thread(target=sleep_there)
        sleeper.start()
        with other.connect() as conn:
            wait_until(
                lambda: [s for s in bell.sleepers(conn) if queue in s.queues],
                timeout=10,
                message="the other database's sleeper",
            )
        # From this database: not a sleeper of ours.
        assert _sleeper_for(queue_engine, queue) == []
        sleeper.join(10)
        assert woken == [False]
    finally:
        other.dispose()
        with admin.connect() as conn:
            conn.exec_driver_sql(f"DROP DATABASE IF EXISTS `{other_name}`")
        admin.dispose()
