"""The published API contract (issue 12, item 9): /api/openapi.json lists exactly the app's /api/
routes, and schemathesis finds every answer as documented (and no 500) with generated requests."""

from __future__ import annotations

import re

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import positive_data_acceptance
from schemathesis.config import SchemathesisConfig

from jobqueue import create_app
from jobqueue.core import service
from jobqueue.web import api, openapi
from testkit.web import ADMIN_TOKEN, app_config

ADD_IT = (
    "add it to jobqueue/web/openapi.py (PATHS: the path with {parameters}, the method, its request body and "
    "every status it can answer, with the schemas of those answers)"
)


def _app_routes(app) -> set[tuple[str, str]]:
    routes = set()
    for rule in app.url_map.iter_rules():
        if rule.rule.startswith("/api/"):
            path = re.sub(r"<(?:[^:>]+:)?([^>]+)>", r"{\1}", rule.rule)
            routes.update((path, method.lower()) for method in rule.methods - {"HEAD", "OPTIONS"})
    return routes


def test_the_document_lists_exactly_the_api_routes(app):
    served = app.test_client().get("/api/openapi.json")
    assert served.status_code == 200 and served.get_json()["openapi"].startswith("3.1")
    documented = {(path, method) for path, item in served.get_json()["paths"].items() for method in item}
    missing = sorted(_app_routes(app) - documented)
    assert not missing, f"API routes missing from the OpenAPI document: {missing}; {ADD_IT}"
    stale = sorted(documented - _app_routes(app))
    assert not stale, f"the OpenAPI document lists routes the app does not have: {stale}; remove them from PATHS"
    for path, method in documented:
        operation = served.get_json()["paths"][path][method]
        for status in operation["responses"]:
            assert re.fullmatch(r"[1-5]\d\d", status), (path, method, status)


AUTH = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
# An array of more than 1,000 jobs is refused with 413 (issue 17 spells it): a rejection too, which
# schemathesis' negative mode does not count among its default ones.
# The rest is schemathesis' default list.
CONFIG = SchemathesisConfig.from_dict(
    {
        "checks": {
            "negative_data_rejection": {
                "expected-statuses": [
                    "400",
                    "401",
                    "403",
                    "404",
                    "405",
                    "406",
                    "409",
                    "413",
                    "415",
                    "422",
                    "428",
                    "429",
                    "5xx",
                ]
            }
        }
    }
)
EXAMPLES = 100  # per operation and generation mode: about 15 s for the whole API


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
def test_every_endpoint_answers_as_documented(mysql_url, mode, monkeypatch):
    """Generated requests (valid ones, then invalid ones) to every operation, each answer checked
    against the document: status code, content type, headers, body schema, never a 500."""
    app = create_app(app_config(mysql_url))
    try:
        with app.extensions["jobqueue"].engine.connect() as conn:
            ids = [
                r.id for r in service.enqueue_many(conn, [{"task": "noop", "task_key": f"seed-{i}"} for i in range(3)])
            ]
            service.fail_job(conn, ids[1], "seeded", actor="test")
        # A long poll of up to 30 s per generated request would take minutes: the route is
        # called with its wait capped (tests/web/test_security_and_api.py waits for real).
        real_wait = api.wait_for
        monkeypatch.setattr(
            api, "wait_for", lambda engine, **kw: real_wait(engine, **{**kw, "timeout": min(kw["timeout"], 0.01)})
        )
        schema = schemathesis.openapi.from_wsgi("/api/openapi.json", app, config=CONFIG)
        operations = [result.ok() for result in schema.get_all_operations()]
        # Every operation but the document itself, which schemathesis leaves out.
        assert len(operations) == sum(len(item) for item in openapi.PATHS.values()) - 1
        for operation in operations:
            # A cron expression's grammar is not a JSON schema: a schema-valid string may not parse
            # (422, documented); nor is whether the task_keys of a job's `after` exist (422,
            # documented). Every other operation takes every schema-valid request.
            refusing = {"add_recurring", "enqueue"}
            excluded = [positive_data_acceptance] if operation.definition.raw.get("operationId") in refusing else []

            # The token as a fixed header of the generated cases, not added after: a negative case
            # whose mutation is "no Authorization" would otherwise get it back and be accepted.
            @given(case=operation.as_strategy(generation_mode=mode, headers=AUTH))
            @settings(max_examples=EXAMPLES, deadline=None, database=None, suppress_health_check=list(HealthCheck))
            def check(case):
                case.call_and_validate(excluded_checks=excluded)

            try:
                check()
            except Unsatisfiable:
                # Negative mode, an operation whose only input is the token (GET /api/stats): with
                # the token fixed there is nothing left to make invalid. Positive mode always has a case.
                if mode is not GenerationMode.NEGATIVE:
                    raise
    finally:
        app.extensions["jobqueue"].engine.dispose()
