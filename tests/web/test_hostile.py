"""Hostile and malformed input, generated as well as hand-written, and database faults as the web
app sees them: every answer is a clear 4xx/5xx, nothing is written, nothing leaks a traceback."""

from __future__ import annotations

import json
import threading

import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jobqueue import create_app
from jobqueue.core import repository, service
from jobqueue.core.db import create_engine
from jobqueue.core.migrate import init_db
from jobqueue.core.schema import audit_log, job_queue
from testkit.web import api, app_config, login, post

FUZZ = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

json_scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=100)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=12,
)
field_values = json_values | st.sampled_from(
    ["noop", "sleep", "fail", "export_orders", "", "a" * 81, "bad\x00key", "<script>", "' OR 1=1 --", "default", "mail"]
)
bodies = st.dictionaries(
    st.sampled_from(["task", "task_key", "payload", "queue", "priority", "delay", "max_attempts", "extra"]),
    field_values,
    max_size=8,
)


def rows(engine) -> int:
    with engine.connect() as conn:
        return conn.execute(sa.select(sa.func.count()).select_from(job_queue)).scalar()


@FUZZ
@given(body=bodies)
def test_api_enqueue_fuzz(client, engine, body):
    before = rows(engine)
    response = api(client, "POST", "/api/jobs", json=body)
    assert response.status_code in (200, 201, 400, 413, 422), response.get_data(as_text=True)
    data = response.get_json()
    if response.status_code == 201:
        assert rows(engine) == before + 1
        with engine.connect() as conn:
            job = repository.reads.get_job(conn, data["id"])
        assert job.task_key == body["task_key"] and job.task_name == body["task"]
        assert job.payload == (body.get("payload") or {})
    else:
        assert rows(engine) == before
        if response.status_code != 200:
            assert isinstance(data["error"], str) and data["error"]


@FUZZ
@given(raw=st.binary(max_size=300))
def test_api_enqueue_garbage_bytes(client, engine, raw):
    before = rows(engine)
    response = api(client, "POST", "/api/jobs", data=raw, content_type="application/json")
    assert response.status_code in (201, 200, 400, 422)
    if response.status_code >= 400:
        assert rows(engine) == before and response.get_json()["error"]


@FUZZ
@given(
    params=st.dictionaries(
        st.sampled_from(["status", "queue", "task", "key", "before", "junk"]), st.text(max_size=120), max_size=5
    )
)
def test_jobs_page_filters_fuzz(client, params):
    response = client.get("/jobs", query_string=params)
    assert response.status_code in (200, 400)
    assert "Traceback (most recent call last)" not in response.get_data(as_text=True)


@FUZZ
@given(
    path_id=st.text(max_size=30),
    form=st.dictionaries(
        st.sampled_from(["confirm", "force", "reason", "view", "ids", "action", "scope", "after", "status"]),
        st.text(max_size=50),
        max_size=6,
    ),
)
def test_action_posts_fuzz(client, engine, path_id, form):
    before = rows(engine)
    for path in (f"/jobs/{path_id}/requeue", f"/jobs/{path_id}/fail", "/jobs/bulk"):
        response = post(client, path, form)
        assert response.status_code in (200, 302, 400, 404, 405), (path, response.status_code)
        assert "Traceback (most recent call last)" not in response.get_data(as_text=True)
    assert rows(engine) == before


def test_huge_query_strings_and_bodies(client, engine):
    assert client.get("/jobs", query_string={"key": "k" * 20000}).status_code == 400
    assert client.get("/jobs?" + "&".join(f"x{i}=1" for i in range(2000))).status_code == 200
    huge = api(
        client, "POST", "/api/jobs", data=b"{" + b" " * (2 * 1024 * 1024) + b"}", content_type="application/json"
    )
    assert huge.status_code == 413 and rows(engine) == 0


def test_control_characters_in_task_key(client, engine):
    for key in ("a\nb", "a\tb", "\x1b[31m", "a\u202eb\x7f"):
        response = api(client, "POST", "/api/jobs", json={"task": "noop", "task_key": key})
        assert response.status_code == 422 and response.get_json()["field"] == "task_key"
    assert rows(engine) == 0


def test_lock_wait_timeout_is_a_clear_503_and_writes_nothing(mysql_url, monkeypatch):
    monkeypatch.setenv("JOBQUEUE_LOCK_WAIT_SECONDS", "1")
    app = create_app(app_config(mysql_url))
    client = app.test_client()
    engine = app.extensions["jobqueue"].engine
    # Another transaction inserted this task_key and has not committed: our INSERT waits on the
    # unique key, times out and gives up (a web request does not wait twice).
    holder = engine.connect()
    holder.begin()
    holder.execute(
        sa.insert(job_queue).values(
            task_key="contested",
            task_name="noop",
            queue="default",
            priority=0,
            payload={},
            status="ready",
            run_at=sa.func.utc_timestamp(),
            attempts=0,
            max_attempts=5,
            created_at=sa.func.utc_timestamp(),
            updated_at=sa.func.utc_timestamp(),
        )
    )
    try:
        response = api(client, "POST", "/api/jobs", json={"task": "noop", "task_key": "contested"})
        assert response.status_code == 503
        assert response.get_json() == {"error": "The database is unavailable or busy right now; try again in a moment."}
    finally:
        holder.rollback()
        holder.close()
    assert rows(engine) == 0
    assert api(client, "POST", "/api/jobs", json={"task": "noop", "task_key": "contested"}).status_code == 201
    engine.dispose()


def test_read_only_replica_refuses_writes_and_reports_it(throwaway_server):
    server = throwaway_server()
    url = server.create_database("jq")
    engine = create_engine(url)
    init_db(engine)
    with engine.connect() as conn:
        service.enqueue(conn, "noop", "before-failover")
    engine.dispose()
    server.restart("--read-only")

    app = create_app(app_config(url))
    client = app.test_client()
    assert login(client).status_code == 302
    assert client.get("/jobs").status_code == 200  # reading a replica is fine
    refused = api(client, "POST", "/api/jobs", json={"task": "noop", "task_key": "after"})
    assert refused.status_code == 503 and "read-only" in refused.get_json()["error"]
    health = api(client, "GET", "/api/health")
    assert health.status_code == 503 and health.get_json()["status"] == "problem"
    assert any(c["name"] == "primary" and c["verdict"] == "problem" for c in health.get_json()["checks"])
    page = client.get("/health").get_data(as_text=True)
    assert "read-only" in page and "problem" in page
    runtime = app.extensions["jobqueue"].runtime
    assert runtime._verified() is False and "read-only" in runtime.refused
    with app.extensions["jobqueue"].engine.connect() as conn:
        assert [j.task_key for j in repository.reads.list_jobs(conn)] == ["before-failover"]
    app.extensions["jobqueue"].engine.dispose()


def test_concurrent_duplicate_enqueues_write_one_row(client, engine):
    codes = []

    def send():
        codes.append(
            api(
                client.application.test_client(), "POST", "/api/jobs", json={"task": "noop", "task_key": "race"}
            ).status_code
        )

    threads = [threading.Thread(target=send) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(codes) == [200] * 7 + [201]
    assert rows(engine) == 1


def test_json_error_bodies_everywhere_under_api(client):
    for method, path in (
        ("GET", "/api/jobs/abc"),
        ("GET", "/api/nope"),
        ("PUT", "/api/jobs"),
        ("DELETE", "/api/jobs/1"),
    ):
        response = api(client, method, path)
        assert response.status_code in (404, 405)
        assert json.loads(response.get_data(as_text=True))["error"]


# --- issue 12: every input validated before anything is done -----------------------------------

ODD_DIGITS = ["²", "١٢", "𝟗", "①", "1²", "٣"]  # str.isdigit() says yes to all of these, int() not


def audit_rows(engine) -> int:
    with engine.connect() as conn:
        return conn.execute(sa.select(sa.func.count()).select_from(audit_log)).scalar()


def statuses(engine) -> list[tuple[int, str]]:
    with engine.connect() as conn:
        return [tuple(r) for r in conn.execute(sa.select(job_queue.c.id, job_queue.c.status).order_by(job_queue.c.id))]


def test_odd_digits_in_keyset_and_id_arguments_are_400(client):
    for digits in ODD_DIGITS:
        for path in ("/jobs", "/audit"):
            response = client.get(path, query_string={"before": digits})
            assert response.status_code == 400, (path, digits, response.status_code)
            assert "whole number" in response.get_data(as_text=True)


def test_bulk_with_odd_digits_or_bad_totals_is_400_and_writes_nothing(client, engine):
    with engine.connect() as conn:
        ids = [r.id for r in service.enqueue_many(conn, [{"task": "noop", "task_key": f"k{i}"} for i in range(3)])]
    before, audits = statuses(engine), audit_rows(engine)
    base = {"confirm": "yes", "action": "fail"}
    cases = [{**base, "scope": "selected", "ids": [str(ids[0]), digits]} for digits in ODD_DIGITS]
    cases += [{**base, "scope": "filter", "after": digits} for digits in ODD_DIGITS]
    cases += [
        {**base, "scope": "selected", "ids": [str(i) for i in ids], "total_changed": "abc"},
        {**base, "scope": "filter", "total_busy": "²"},
        {**base, "scope": "filter", "total_skipped": "-5"},
        {**base, "scope": "filter", "total_changed": "9" * 40},
        {**base, "scope": "selected", "ids": [str(i) for i in ids], "force": "maybe"},
        {**base, "scope": "everything"},
    ]
    for form in cases:
        response = post(client, "/jobs/bulk", form)
        assert response.status_code == 400, (form, response.status_code)
        assert "Traceback (most recent call last)" not in response.get_data(as_text=True)
    assert statuses(engine) == before and audit_rows(engine) == audits


def test_deep_json_bodies_are_400_and_write_nothing(client, engine):
    with engine.connect() as conn:
        job_id = service.enqueue(conn, "fail", "deep-target").id
    audits = audit_rows(engine)
    deep_array = "[" * 5000 + "]" * 5000
    deep_payload = '{"task": "noop", "task_key": "deep", "payload": ' + '{"a": ' * 5000 + "1" + "}" * 5000 + "}"
    for path in ("/api/jobs", f"/api/jobs/{job_id}/requeue", f"/api/jobs/{job_id}/fail"):
        for body in (deep_array, deep_payload):
            response = api(client, "POST", path, data=body, content_type="application/json")
            assert response.status_code == 400, (path, response.status_code)
            assert "nested" in response.get_json()["error"]
    assert rows(engine) == 1 and statuses(engine) == [(job_id, "ready")] and audit_rows(engine) == audits


def test_operator_api_bodies_are_validated_before_acting(client, engine):
    with engine.connect() as conn:
        job_id = service.enqueue(conn, "noop", "validated").id
    audits = audit_rows(engine)
    for path, body, status in [
        (f"/api/jobs/{job_id}/requeue", "[1]", 400),
        (f"/api/jobs/{job_id}/requeue", "{not json", 400),
        (f"/api/jobs/{job_id}/requeue", '{"force": "yes"}', 422),
        (f"/api/jobs/{job_id}/requeue", '{"force": true, "extra": 1}', 422),
        (f"/api/jobs/{job_id}/fail", '{"reason": "\\ud800"}', 422),
        (f"/api/jobs/{job_id}/fail", '{"reason": 5}', 422),
        (f"/api/jobs/{job_id}/fail", '"just a string"', 400),
    ]:
        response = api(client, "POST", path, data=body, content_type="application/json")
        assert response.status_code == status, (path, body, response.status_code, response.get_data(as_text=True))
        assert response.get_json()["error"]
    assert statuses(engine) == [(job_id, "ready")] and audit_rows(engine) == audits


def test_task_key_line_separators_are_refused(client, engine):
    for key in ("a\u2028b", "a\u2029b", "a\x85b", "\u2028"):
        response = api(client, "POST", "/api/jobs", json={"task": "noop", "task_key": key})
        assert response.status_code == 422 and response.get_json()["field"] == "task_key", key
    assert rows(engine) == 0


def test_payloads_too_deep_or_with_lone_surrogates_are_refused(client, engine):
    nested: dict = {"leaf": 1}
    for _ in range(25):
        nested = {"a": nested}
    for payload in (nested, {"s": "\ud800"}):
        response = api(
            client,
            "POST",
            "/api/jobs",
            data=json.dumps({"task": "noop", "task_key": "p", "payload": payload}),
            content_type="application/json",
        )
        assert response.status_code == 422 and response.get_json()["field"] == "payload"
    assert rows(engine) == 0


def test_a_held_table_lock_gives_a_quick_503_while_login_static_and_healthz_answer(client, mysql_url):
    import time

    import pymysql
    from sqlalchemy.engine import make_url

    from jobqueue.web.state import REQUEST_LOCK_WAIT_SECONDS

    u = make_url(mysql_url)
    holder = pymysql.connect(host=u.host, port=u.port or 3306, user=u.username, database=u.database)
    try:
        holder.cursor().execute("LOCK TABLES job_queue WRITE")
        answers = {}
        for path in ("/jobs", "/", "/api/stats", "/api/jobs", "/login", "/static/app.css", "/healthz"):
            started = time.monotonic()
            if path.startswith("/api/"):
                method = "POST" if path == "/api/jobs" else "GET"
                response = api(
                    client, method, path, json={"task": "noop", "task_key": "locked"} if method == "POST" else None
                )
            else:
                response = client.get(path)
            answers[path] = (response.status_code, response.headers.get("Retry-After"), time.monotonic() - started)
            response.close()
        print({p: f"{code} in {s:.2f} s" for p, (code, _, s) in answers.items()})
        for path in ("/jobs", "/", "/api/stats", "/api/jobs"):
            code, retry_after, seconds = answers[path]
            assert code == 503 and retry_after == "2", (path, answers[path])
            # One bounded lock wait, not two and not the server's default of a year.
            assert seconds < 2 * REQUEST_LOCK_WAIT_SECONDS + 1, (path, seconds)
        assert all(answers[p][0] == 200 for p in ("/login", "/static/app.css", "/healthz")), answers
    finally:
        holder.close()
    assert rows(client.application.extensions["jobqueue"].engine) == 0


def test_a_queue_name_with_a_final_newline_is_refused(client, engine):
    response = api(client, "POST", "/api/jobs", json={"task": "noop", "task_key": "q", "queue": "default\n"})
    assert response.status_code == 422 and response.get_json()["field"] == "queue"
    assert rows(engine) == 0


def test_ids_too_long_for_a_bigint_are_404(client):
    for path in ("/jobs/99999999999999999999999", "/jobs/9223372036854775808/row"):
        assert client.get(path).status_code == 404
    assert api(client, "GET", "/api/jobs/99999999999999999999999").status_code == 404
    assert api(client, "POST", "/api/jobs/99999999999999999999999/fail").status_code == 404
    assert client.get("/jobs/9223372036854775807").status_code == 404  # the largest id: looked up, not there
