"""A handler gets the payload exactly as it was enqueued, on every server: key order, integers
beyond 64 bits, escapes, nesting (issue 24). MySQL's JSON column sorted keys and turned 2**70
into 1.1805916207174113e+21; since migration 0008 its payload and result columns keep the text,
as MariaDB's JSON (LONGTEXT with a JSON_VALID check) always did. Through a real worker process."""

from __future__ import annotations

import json

import pytest
import sqlalchemy as sa

from jobqueue.core import repository, service
from jobqueue.core.db import create_engine
from jobqueue.core.schema import job_queue
from testkit.procs import jobqueue

PAYLOAD = {
    "zeta": 1,
    "a": 2,
    "mm": 3,
    "b": {"y": 1, "x": [2**70, {"k2": -(2**63) - 1, "k1": 2**64}]},
    "big": 2**70,
    "small": -(2**63) - 1,
    "huge": 10**40,
    "edge": [2**64 - 1, -(2**63)],
    "float": 0.1,
    "exp": 1e300,
    "text": 'é ☃ 😀 \u0000 \u2028 "q" \\ </script>',
    "escaped\u00e9key": None,
    "empty": {},
    "list": [],
    "true": True,
    "deep": {"l1": {"l2": {"l3": {"z": 0, "a": [1.5, -0.0]}}}},
}


def test_a_handler_gets_the_payload_as_enqueued_and_its_result_is_kept_as_recorded(db_url, tmp_path):
    out = tmp_path / "received.json"
    payload = {**PAYLOAD, "out": str(out)}
    engine = create_engine(db_url, pool_size=1)
    try:
        with engine.connect() as conn:
            job = service.enqueue(conn, "echo_payload", "round-trip", payload)
            stored = conn.execute(
                sa.select(sa.cast(job_queue.c.payload, sa.Text)).where(job_queue.c.id == job.id)
            ).scalar()
        worker = jobqueue(db_url, "worker", "--burst", "--tasks", "testkit.tasks")
        assert worker.returncode == 0, worker.stderr
        with engine.connect() as conn:
            result = repository.reads.get_result(conn, "round-trip")
            status = repository.reads.get_job(conn, job.id).status
    finally:
        engine.dispose()
    assert status.value == "done"
    assert stored == json.dumps(payload)  # the server holds the text as written
    assert out.read_text() == json.dumps(payload)  # the handler got it: order, ints, floats
    assert json.dumps(result["result"]) == json.dumps(payload)  # and the recorded result


@pytest.mark.servers_only
def test_a_document_that_is_not_json_is_refused_by_the_column(db_url):
    """The LONGTEXT column keeps its JSON_VALID check (MySQL: migration 0008's constraint;
    MariaDB: its JSON type's own)."""
    engine = create_engine(db_url, pool_size=1)
    try:
        with engine.connect() as conn:
            job = service.enqueue(conn, "noop", "not-json", {"a": 1})
            with pytest.raises(sa.exc.DBAPIError) as refused:
                conn.exec_driver_sql(f"UPDATE job_queue SET payload = '{{\"a\": ' WHERE id = {job.id}")
            conn.rollback()
    finally:
        engine.dispose()
    assert refused.value.orig.args[0] in (3819, 4025)  # MySQL / MariaDB: check constraint violated
