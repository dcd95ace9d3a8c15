"""Closed by default: login, roles, CSRF, headers, throttling; and the JSON API's contract."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import pytest
import sqlalchemy as sa

import jobqueue
from jobqueue import create_app
from jobqueue.core import repository, service
from jobqueue.core.db import create_engine
from jobqueue.core.models import Status
from jobqueue.core.schema import job_queue
from jobqueue.web.config import ConfigError
from testkit.web import ADMIN_PASSWORD, ADMIN_TOKEN, VIEWER_TOKEN, api, app_config, csrf_token, login

PAGES = ["/", "/overview/panels", "/jobs", "/jobs/1", "/jobs/1/row", "/jobs/1/summary", "/workers", "/audit"]


def count_jobs(engine) -> int:
    with engine.connect() as conn:
        return conn.execute(sa.select(sa.func.count()).select_from(job_queue)).scalar()


@pytest.mark.parametrize("path", PAGES)
def test_pages_refuse_anonymous_requests(app, path):
    c = app.test_client()
    response = c.get(path)
    assert response.status_code == 302 and response.headers["Location"].startswith("/login")
    polled = c.get(path, headers={"HX-Request": "true"})
    assert polled.status_code == 401 and polled.headers["HX-Redirect"].startswith("/login")


@pytest.mark.parametrize(
    "method, path",
    [
        ("POST", "/jobs/1/requeue"),
        ("POST", "/jobs/1/fail"),
        ("POST", "/jobs/bulk"),
        ("GET", "/api/jobs/1"),
        ("GET", "/api/stats"),
        ("POST", "/api/jobs"),
        ("POST", "/api/jobs/1/requeue"),
        ("POST", "/api/jobs/1/fail"),
    ],
)
def test_actions_and_api_refuse_anonymous_requests(app, method, path):
    c = app.test_client()
    token = csrf_token(c)
    response = c.open(path, method=method, headers={"X-CSRFToken": token})
    assert response.status_code in (302, 401)
    if path.startswith("/api/"):
        assert response.status_code == 401 and response.get_json()["error"]


def test_api_ignores_session_cookies(client):
    # A logged-in browser session is no credential for the API (that is what keeps it CSRF-safe).
    assert client.get("/api/stats").status_code == 401


def test_login_logout_and_safe_redirects(app):
    c = app.test_client()
    assert login(c, "alice", "wrong").status_code == 401
    assert login(c, "nobody", "wrong").status_code == 401
    token = csrf_token(c)
    ok = c.post(
        "/login?next=//evil.example/x", data={"username": "alice", "password": ADMIN_PASSWORD, "csrf_token": token}
    )
    assert ok.status_code == 302 and ok.headers["Location"] == "/"
    cookie = ok.headers["Set-Cookie"]
    assert "HttpOnly" in cookie and "SameSite=Lax" in cookie and "Secure" in cookie
    assert c.get("/").status_code == 200
    assert c.get("/logout").status_code == 405
    c.post("/logout", data={"csrf_token": csrf_token(c)})
    assert c.get("/").status_code == 302


def test_login_attempts_are_throttled(app):
    c = app.test_client()
    for _ in range(5):
        assert login(c, "alice", "nope").status_code == 401
    throttled = login(c, "alice", ADMIN_PASSWORD)
    assert throttled.status_code == 429 and int(throttled.headers["Retry-After"]) > 0


def test_posts_without_csrf_token_are_refused(client, engine):
    with engine.connect() as conn:
        job_id = service.enqueue(conn, "noop", "k").id
    refused = client.post(f"/jobs/{job_id}/fail", data={"confirm": "yes"}, headers={"HX-Request": "true"})
    assert refused.status_code == 400 and "security token" in refused.get_data(as_text=True)
    wrong = client.post(f"/jobs/{job_id}/fail", data={"confirm": "yes"}, headers={"X-CSRFToken": "forged"})
    assert wrong.status_code == 400
    anon = client.application.test_client()
    assert anon.post("/login", data={"username": "alice", "password": ADMIN_PASSWORD}).status_code == 400
    with engine.connect() as conn:
        assert repository.reads.get_job(conn, job_id).status is Status.READY


def test_security_headers(client):
    response = client.get("/")
    csp = response.headers["Content-Security-Policy"]
    assert "script-src 'self'" in csp and "unsafe-inline" not in csp and "frame-ancestors 'none'" in csp
    assert response.headers["X-Content-Type-Options"] == "nosniff"
    assert response.headers["X-Frame-Options"] == "DENY"
    html = response.get_data(as_text=True)
    assert "<script>" not in html and "onclick" not in html  # no inline script for the CSP to block
    assert "/static/htmx.min.js" in html
    with client.get("/static/htmx.min.js") as static:
        assert static.status_code == 200


def test_assets_are_cached_for_a_year_under_a_url_that_names_their_content(client):
    """Each page used to revalidate htmx.min.js, app.js and app.css (Cache-Control: no-cache, a
    304 round trip each): under load the deferred scripts came late enough that a select changed
    on the fresh jobs page had no listener yet (CI on MySQL). The page now links each asset with
    its content's hash, and that URL may be kept a year; a new release links new URLs."""
    html = client.get("/login").get_data(as_text=True)
    urls = re.findall(r'(?:src|href)="(/static/[^"]+)"', html)
    assert sorted(u.partition("?")[0] for u in urls) == ["/static/app.css", "/static/app.js", "/static/htmx.min.js"]
    static = Path(jobqueue.__file__).parent / "static"
    for url in urls:
        path, _, query = url.partition("?")
        content = (static / path.rsplit("/", 1)[1]).read_bytes()
        assert query == "v=" + hashlib.sha256(content).hexdigest()[:12]
        with client.get(url) as kept:
            assert kept.status_code == 200 and kept.data == content
            assert "max-age=31536000" in kept.headers["Cache-Control"], kept.headers["Cache-Control"]
        # Asked for without the current hash (an old page, a hand-typed URL): revalidated each time.
        for other in (path, path + "?v=0123456789ab"):
            with client.get(other) as asked:
                assert asked.status_code == 200 and asked.headers["Cache-Control"] == "no-cache"
    # A file that is not there, or a path out of the folder, with a `v`: 404, and nothing read.
    for missing in ("/static/nope.js?v=0123456789ab", "/static/sub/app.js?v=x", "/static/..%2Fweb%2F__init__.py?v=x"):
        with client.get(missing) as asked:
            assert asked.status_code == 404, (missing, asked.status_code)


def test_no_users_configured_refuses_to_start(mysql_url):
    with pytest.raises(ConfigError, match="no users configured"):
        create_app({"DATABASE_URL": mysql_url, "SECRET_KEY": "x"})
    with pytest.raises(ConfigError, match="JOBQUEUE_SECRET_KEY"):
        create_app({"DATABASE_URL": mysql_url, "USERS": "a:admin:hash"})


def test_dev_mode_serves_localhost_only(mysql_url):
    app = create_app({"DATABASE_URL": mysql_url, "DEV": "1", "DEV_PASSWORD": "dev-pass-123", "EMBEDDED_WORKERS": 0})
    assert app.config["SESSION_COOKIE_SECURE"] is False
    remote = app.test_client()
    assert remote.get("/login", environ_base={"REMOTE_ADDR": "10.1.2.3"}).status_code == 403
    local = app.test_client()
    assert login(local, "admin", "dev-pass-123").status_code == 302
    app.extensions["jobqueue"].engine.dispose()


def test_database_down_gives_a_clear_page_and_health(mysql_url):
    app = create_app(app_config("mysql+pymysql://root@127.0.0.1:1/none"))
    c = app.test_client()
    # Sessions and the login throttle live in the database: signing in needs it.
    refused = login(c)
    assert refused.status_code == 503 and "database is unavailable" in refused.get_data(as_text=True)
    assert c.get("/").status_code == 302
    assert api(c, "GET", "/api/stats").get_json() == {
        "error": "The database is unavailable or busy right now; try again in a moment."
    }
    health = c.get("/healthz")
    assert health.status_code == 503 and health.get_json()["status"] == "error"


def test_database_gone_after_sign_in_gives_a_clear_page(mysql_url):
    app = create_app(app_config(mysql_url))
    c = app.test_client()
    assert login(c).status_code == 302
    ext = app.extensions["jobqueue"]
    ext.engine.dispose()
    ext.engine = create_engine("mysql+pymysql://root@127.0.0.1:1/none")
    for path in ("/", "/jobs"):
        response = c.get(path)
        text = response.get_data(as_text=True)
        assert response.status_code == 503 and "database is unavailable" in text and "Traceback" not in text
    ext.engine.dispose()


# --- the JSON API --------------------------------------------------------------------------------


def test_api_enqueue_contract(client, engine):
    created = api(
        client,
        "POST",
        "/api/jobs",
        json={
            "task": "noop",
            "task_key": "api-1",
            "payload": {"a": 1},
            "queue": "mail",
            "priority": 2,
            "max_attempts": 3,
        },
    )
    assert created.status_code == 201
    body = created.get_json()
    assert body == {"id": body["id"], "task_key": "api-1", "duplicate": False, "status": "ready"}
    again = api(client, "POST", "/api/jobs", json={"task": "noop", "task_key": "api-1"})
    assert again.status_code == 200 and again.get_json() == {**body, "duplicate": True}
    delayed = api(client, "POST", "/api/jobs", json={"task": "noop", "task_key": "api-2", "delay": 60})
    assert delayed.status_code == 201 and delayed.get_json()["status"] == "scheduled"
    job = api(client, "GET", f"/api/jobs/{body['id']}").get_json()
    assert job["queue"] == "mail" and job["priority"] == 2 and job["max_attempts"] == 3 and job["payload"] == {"a": 1}
    assert job["created_at"].endswith("Z") and job["result"] is None and job["attempt_history"] == []


@pytest.mark.parametrize(
    "body, content_type, status",
    [
        ("{not json", "application/json", 400),
        ("[1, 2]", "application/json", 400),
        ('"text"', "application/json", 400),
        ("task=noop", "application/x-www-form-urlencoded", 400),
        (json.dumps({"task": "noop"}), "application/json", 422),
        (json.dumps({"task": "nope", "task_key": "k"}), "application/json", 422),
        (json.dumps({"task": "noop", "task_key": ""}), "application/json", 422),
        (json.dumps({"task": "noop", "task_key": "k" * 81}), "application/json", 422),
        (json.dumps({"task": "noop", "task_key": "a\u0007b"}), "application/json", 422),
        (json.dumps({"task": "noop", "task_key": "k", "payload": [1]}), "application/json", 422),
        (json.dumps({"task": "noop", "task_key": "k", "priority": "high"}), "application/json", 422),
        (json.dumps({"task": "noop", "task_key": "k", "delay": "soon"}), "application/json", 422),
        (json.dumps({"task": "noop", "task_key": "k", "max_attempts": 1.5}), "application/json", 422),
        (json.dumps({"task": "noop", "task_key": "k", "surprise": 1}), "application/json", 422),
        (json.dumps({"task": "noop", "task_key": "k", "payload": {"x": "y" * 70000}}), "application/json", 413),
        (json.dumps({"task": "noop", "task_key": "k", "payload": {"x": "y" * 200000}}), "application/json", 413),
    ],
)
def test_api_rejects_bad_input_and_writes_nothing(client, engine, body, content_type, status):
    response = api(client, "POST", "/api/jobs", data=body, content_type=content_type)
    assert response.status_code == status, response.get_data(as_text=True)
    assert response.get_json()["error"]
    assert count_jobs(engine) == 0


def test_api_operator_actions(client, engine):
    with engine.connect() as conn:
        job_id = service.enqueue(conn, "noop", "k").id
        (c,) = service.claim(conn, "h:1:1", 1, ["default"], lease_seconds=300)
    held = api(client, "POST", f"/api/jobs/{job_id}/requeue")
    assert held.status_code == 409 and held.get_json()["needs"] == "force"
    forced = api(client, "POST", f"/api/jobs/{job_id}/requeue", json={"force": True})
    assert forced.get_json() == {"id": job_id, "before": "running", "after": "ready", "changed": True}
    failed = api(client, "POST", f"/api/jobs/{job_id}/fail", json={"reason": "nope"})
    assert failed.status_code == 200 and failed.get_json()["after"] == "failed"
    assert api(client, "POST", f"/api/jobs/{job_id}/fail").status_code == 409
    assert api(client, "POST", "/api/jobs/999999/requeue").status_code == 404
    assert api(client, "GET", "/api/jobs/999999").status_code == 404
    assert api(client, "POST", f"/api/jobs/{job_id}/fail", json={"reason": 5}).status_code == 422
    assert api(client, "POST", f"/api/jobs/{job_id}/requeue", token=VIEWER_TOKEN).status_code == 403
    assert api(client, "POST", f"/api/jobs/{job_id}/requeue", token="x" * 30).status_code == 401
    holder = engine.connect()
    holder.begin()
    holder.execute(sa.text("SELECT id FROM job_queue WHERE id = :id FOR UPDATE"), {"id": job_id})
    try:
        busy = api(client, "POST", f"/api/jobs/{job_id}/requeue")
        assert busy.status_code == 423 and busy.headers["Retry-After"] == "1"
    finally:
        holder.rollback()
        holder.close()


def test_api_stats_for_a_viewer_token(client, engine):
    with engine.connect() as conn:
        service.enqueue_many(conn, [{"task": "noop", "task_key": f"k{i}"} for i in range(3)])
    stats = api(client, "GET", "/api/stats", token=VIEWER_TOKEN).get_json()
    assert stats["totals"]["ready"] == 3 and stats["queues"]["default"]["ready"] == 3
    assert stats["queues"]["default"]["oldest_ready_age_seconds"] >= 0
    assert (
        api(client, "POST", "/api/jobs", token=VIEWER_TOKEN, json={"task": "noop", "task_key": "v"}).status_code == 403
    )


def test_api_uses_same_admin_token_for_writes(client):
    assert (
        api(client, "POST", "/api/jobs", token=ADMIN_TOKEN, json={"task": "noop", "task_key": "w"}).status_code == 201
    )


# --- issue 12: next= stays on the site -------------------------------------------------------------

HOSTILE_NEXT = [
    "/%09/evil.example",
    "/%5Cevil.example",
    "//evil.example",
    "https:evil.example",
    "https://evil.example/",
    "/%0d/evil.example",
    "/%0a/evil.example",
    "%20//evil.example",
    "/\\evil.example",
    "\\\\evil.example",
    "%09//evil.example",
    "/%0d%0aSet-Cookie:x=1",
    "javascript:alert(1)",
    "/%00/evil.example",
    "%E2%80%A8//evil.example",
    "//%09evil.example",
    "http:/evil.example",
    "/%C2%A0/evil.example",
    "%2F%2Fevil.example",
]


@pytest.mark.parametrize("target", HOSTILE_NEXT)
def test_login_next_never_leaves_the_site(app, target):
    from urllib.parse import urljoin, urlsplit

    c = app.test_client()
    token = csrf_token(c)
    response = c.post(
        "/login?next=" + target, data={"username": "alice", "password": ADMIN_PASSWORD, "csrf_token": token}
    )
    assert response.status_code == 302, response.status_code
    location = response.headers["Location"]
    # Judged the way a browser reads it: relative to the page, after its own clean-up.
    landed = urlsplit(urljoin("https://dash.example/login", location.strip().replace("\\", "/")))
    assert (landed.scheme, landed.netloc) == ("https", "dash.example"), location
    assert not any(ch in location for ch in "\t\r\n\\ ") and location.isascii()


@pytest.mark.parametrize(
    "target, expected",
    [
        ("/jobs?status=failed", "/jobs?status=failed"),
        ("/jobs/12", "/jobs/12"),
        ("/audit?before=40", "/audit?before=40"),
        ("/jobs?key=caf%C3%A9", "/jobs?key=caf%C3%A9"),
    ],
)
def test_login_next_keeps_paths_on_the_site(app, target, expected):
    c = app.test_client()
    response = c.post(
        "/login?next=" + target.replace("?", "%3F").replace("&", "%26").replace("=", "%3D"),
        data={"username": "alice", "password": ADMIN_PASSWORD, "csrf_token": csrf_token(c)},
    )
    assert response.status_code == 302 and response.headers["Location"] == expected


def test_hsts_when_secure_cookies_are_on(client, mysql_url):
    assert client.get("/login").headers["Strict-Transport-Security"] == "max-age=31536000"
    plain = create_app(app_config(mysql_url, SECURE_COOKIES="0"))
    assert "Strict-Transport-Security" not in plain.test_client().get("/login").headers
    plain.extensions["jobqueue"].engine.dispose()


# --- POST /api/jobs with an array ----------------------------------------------------------------


def test_api_enqueues_an_array_in_one_transaction(client, engine):
    repository_job = api(client, "POST", "/api/jobs", json={"task": "noop", "task_key": "known"}).get_json()
    created = api(
        client,
        "POST",
        "/api/jobs",
        json=[
            {"task": "noop", "task_key": "b1", "payload": {"a": 1}},
            {"task": "noop", "task_key": "known"},
            {"task": "noop", "task_key": "b2", "delay": 60},
            {"task": "noop", "task_key": "b1"},
        ],
    )
    assert created.status_code == 201
    body = created.get_json()
    assert [(r["task_key"], r["duplicate"], r["status"]) for r in body] == [
        ("b1", False, "ready"),
        ("known", True, "ready"),
        ("b2", False, "scheduled"),
        ("b1", True, "ready"),
    ]
    assert body[1]["id"] == repository_job["id"] and body[3]["id"] == body[0]["id"]
    assert all(set(r) == {"id", "task_key", "duplicate", "status"} for r in body)
    again = api(
        client, "POST", "/api/jobs", json=[{"task": "noop", "task_key": "b1"}, {"task": "noop", "task_key": "b2"}]
    )
    assert again.status_code == 200 and all(r["duplicate"] for r in again.get_json())
    empty = api(client, "POST", "/api/jobs", json=[])
    assert empty.status_code == 200 and empty.get_json() == []
    assert count_jobs(engine) == 3


def test_an_array_of_a_thousand_jobs_is_taken_and_one_more_is_413(client, engine):
    jobs = [{"task": "noop", "task_key": f"t{i}", "payload": {"order": i, "note": "x" * 40}} for i in range(1000)]
    taken = api(client, "POST", "/api/jobs", json=jobs)  # about 80 kB: more than one job's body limit
    assert taken.status_code == 201 and len(taken.get_json()) == 1000
    refused = api(client, "POST", "/api/jobs", json=jobs + [{"task": "noop", "task_key": "t1000"}])
    assert refused.status_code == 413 and "1000" in refused.get_json()["error"]
    assert count_jobs(engine) == 1000


@pytest.mark.parametrize(
    "bad, status, field",
    [
        ({"task": "noop", "task_key": "x", "priority": "high"}, 422, "priority"),
        ({"task": "noop", "task_key": "x", "colour": "red"}, 422, "colour"),
        ({"task": "nope", "task_key": "x"}, 422, "task"),
        ({"task": "noop", "task_key": "x", "payload": {"x": "y" * 70000}}, 413, "payload"),
        ("not a job", 400, None),
    ],
)
def test_one_invalid_job_in_an_array_names_its_index_and_writes_nothing(client, engine, bad, status, field):
    jobs = [{"task": "noop", "task_key": f"ok-{i}"} for i in range(5)]
    jobs.insert(3, bad)
    response = api(client, "POST", "/api/jobs", json=jobs)
    assert response.status_code == status, response.get_data(as_text=True)
    answer = response.get_json()
    assert answer["index"] == 3 and answer["error"].startswith("job 3: ") and answer.get("field") == field
    assert count_jobs(engine) == 0


def test_api_job_result_answers_200_when_finished_and_202_while_pending(client, engine):
    import time

    with engine.connect() as conn:
        ids = [r.id for r in service.enqueue_many(conn, [{"task": "noop", "task_key": f"res-{i}"} for i in range(3)])]
        (c,) = service.claim(conn, "h:1:1", 1, ["default"], lease_seconds=300)
        assert service.record_result(conn, c.lease, c.job.task_key, {"rows": 3})
        assert service.complete(conn, c.lease).value == "ok"
        service.fail_job(conn, ids[1], "bad data", actor="test")
    done = api(client, "GET", f"/api/jobs/{c.job.id}/result", token=VIEWER_TOKEN)
    assert done.status_code == 200
    assert {k: v for k, v in done.get_json().items() if k != "finished_at"} == {
        "id": c.job.id,
        "task_key": c.job.task_key,
        "status": "done",
        "result": {"rows": 3},
        "error": None,
    }
    failed = api(client, "GET", f"/api/jobs/{ids[1]}/result").get_json()
    assert (failed["status"], failed["result"], failed["error"]) == ("failed", None, "bad data")
    started = time.monotonic()
    pending = api(client, "GET", f"/api/jobs/{ids[2]}/result?wait=1.2")
    assert pending.status_code == 202 and pending.get_json()["status"] == "ready"
    assert time.monotonic() - started >= 1.2
    assert api(client, "GET", f"/api/jobs/{ids[2]}/result?wait=31").status_code == 400
    assert api(client, "GET", f"/api/jobs/{ids[2]}/result?wait=x").status_code == 400
    assert api(client, "GET", "/api/jobs/999999/result").status_code == 404
    assert api(client, "GET", f"/api/jobs/{ids[2]}/result", token="x" * 30).status_code == 401
