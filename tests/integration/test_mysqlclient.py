"""mysqlclient (`mysql+mysqldb://`, the optional extra `jobqueue[mysqlclient]`) on every server:
what differs from PyMySQL is handled (its %s parameter style, literals as bytes, the warning count
on the connection, its own errors). The suite's other tests run with it too under
`--driver mysqldb` (tests/conftest.py); this one runs in every run where mysqlclient is installed."""

from __future__ import annotations

import json

import pytest
import sqlalchemy as sa

from jobqueue.core import repository, service
from jobqueue.core.db import create_engine
from jobqueue.core.schema import job_queue
from testkit.procs import jobqueue
from tests.conftest import database_on, driver_url

pytest.importorskip("MySQLdb", reason="mysqlclient (the optional extra jobqueue[mysqlclient]) is not installed")


@pytest.fixture
def mysqldb_url(db_server):
    with database_on(db_server) as url:
        yield driver_url(url, "mysqldb")


def test_enqueue_and_work_through_mysqlclient(mysqldb_url, tmp_path):
    out = tmp_path / "received.json"
    # Literals the multi-row INSERT escapes itself (quotes, backslashes, % and non-ASCII).
    odd = 'it\'s 100% \\ "quoted" é ☃ 😀'
    payload = {"text": odd, "big": 2**70, "out": str(out)}
    engine = create_engine(mysqldb_url, pool_size=2)
    try:
        assert engine.dialect.driver == "mysqldb"
        with engine.connect() as conn:
            first = service.enqueue_many(conn, [{"task": "noop", "task_key": f"{odd}-{i}"} for i in range(3)])
            again = service.enqueue_many(conn, [{"task": "noop", "task_key": f"{odd}-{i}"} for i in range(4)])
            job = service.enqueue(conn, "echo_payload", "round-trip", payload)
            stored = conn.execute(
                sa.select(sa.cast(job_queue.c.payload, sa.Text)).where(job_queue.c.id == job.id)
            ).scalar()
        # INSERT IGNORE's duplicates are counted through the warning count (the connection's, here).
        assert [e.duplicate for e in first] == [False] * 3
        assert [e.duplicate for e in again] == [True, True, True, False]
        assert [e.id for e in again[:3]] == [e.id for e in first]
        worker = jobqueue(mysqldb_url, "worker", "--burst", "--concurrency", "2", "--tasks", "testkit.tasks")
        assert worker.returncode == 0, worker.stderr
        with engine.connect() as conn:
            statuses = conn.execute(sa.select(job_queue.c.status, sa.func.count()).group_by(job_queue.c.status)).all()
            result = repository.reads.get_result(conn, "round-trip")
    finally:
        engine.dispose()
    assert dict(statuses) == {"done": 5}
    assert stored == json.dumps(payload)
    assert out.read_text() == json.dumps(payload)
    assert json.dumps(result["result"]) == json.dumps(payload)
