"""Payloads the database's JSON check would refuse (32+ levels deep, a lone surrogate) are refused
before anything is written, with an answer that says what is wrong: never a 503 "try again" or
an exit 1 that invites a retry which can never succeed."""

from __future__ import annotations

import json

import pytest
import sqlalchemy as sa

from jobqueue import create_app
from jobqueue.core import repository, service
from jobqueue.core.errors import ValidationError
from jobqueue.core.schema import job_queue
from jobqueue.core.validation import MAX_PAYLOAD_DEPTH
from testkit.procs import jobqueue
from testkit.web import api, app_config, login


def nested(depth: int) -> dict:
    value: dict = {}
    for _ in range(depth - 1):
        value = {"a": value}
    return value


def circular() -> dict:
    value: dict = {"leaf": 1}
    value["self"] = value
    return value


def rows(engine) -> int:
    with engine.connect() as conn:
        return conn.execute(sa.select(sa.func.count()).select_from(job_queue)).scalar()


@pytest.mark.parametrize(
    "payload, words",
    [
        (nested(MAX_PAYLOAD_DEPTH + 1), "levels deep"),
        (nested(40), "levels deep"),
        ({"a": [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]}, "levels deep"),
        ({"text": "\ud800"}, "lone surrogate"),
        ({"\udfff": 1}, "lone surrogate"),
        (circular(), "levels deep"),  # json's circular check is off: it recurses, then is measured
        ({"x": float("nan")}, "not valid JSON"),
        ({"x": {1, 2}}, "not valid JSON"),
    ],
)
def test_the_repository_refuses_them_and_writes_nothing(engine, payload, words):
    with engine.connect() as conn:
        with pytest.raises(ValidationError) as refused:
            service.enqueue(conn, "noop", "bad", payload)
    assert refused.value.field == "payload" and words in str(refused.value)
    assert rows(engine) == 0


def test_the_deepest_allowed_payload_is_stored_and_read_back(mysql_engine):
    deep = nested(MAX_PAYLOAD_DEPTH)
    with mysql_engine.connect() as conn:
        res = service.enqueue(conn, "noop", "deep-ok", deep)
        assert repository.reads.get_job(conn, res.id).payload == deep


def test_the_api_answers_422_naming_payload(mysql_url):
    app = create_app(app_config(mysql_url))
    client = app.test_client()
    assert login(client).status_code == 302
    engine = app.extensions["jobqueue"].engine
    try:
        for body in (
            {"task": "noop", "task_key": "deep", "payload": nested(32)},
            {"task": "noop", "task_key": "surrogate", "payload": {"s": "\ud800"}},
        ):
            raw = json.dumps(body)  # \ud800 travels as the escape a client would send
            response = api(client, "POST", "/api/jobs", data=raw, content_type="application/json")
            assert response.status_code == 422, response.get_data(as_text=True)
            assert response.get_json()["field"] == "payload"
        assert rows(engine) == 0
    finally:
        engine.dispose()


def test_the_cli_exits_2(mysql_url, mysql_engine):
    for payload in (json.dumps(nested(33)), '{"s": "\\ud800"}'):
        result = jobqueue(mysql_url, "enqueue", "noop", "--key", "bad", "--payload", payload)
        assert result.returncode == 2, result.stderr
        assert "payload" in result.stderr
    assert rows(mysql_engine) == 0
