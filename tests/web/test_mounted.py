"""The dashboard mounted in a host application's own Flask app (init_dashboard, issue 16): the
host's login decides through authorize(), its user is the audit log's actor, CSRF and the CSP
hold under the prefix, the API takes its bearer tokens there, and the host's own pages, templates,
filters and blueprints (one even called "auth") are left as they were."""

from __future__ import annotations

import re

import pytest
from flask import Blueprint, Flask, abort, redirect, render_template, request, session, url_for
from flask_wtf.csrf import CSRFProtect

from jobqueue.core import repository, service
from jobqueue.core.models import Status
from jobqueue.web import init_dashboard
from jobqueue.web.config import ConfigError
from testkit.web import ADMIN_TOKEN, VIEWER_TOKEN, tokens_setting

ROLES = {"ada": "admin", "vic": "viewer", "bob": None}  # bob is a shop customer: no access


def host_app(url: str, tmp_path, *, host_csrf: bool = False) -> Flask:
    """A small host: its own login (a session key), its own base.html and an "auth" blueprint."""
    (tmp_path / "base.html").write_text("<title>HOST BASE</title>{{ items|count }} items")
    app = Flask("host", template_folder=str(tmp_path))
    app.config.update(
        SECRET_KEY="host-secret",
        TESTING=True,
        JOBQUEUE_DATABASE_URL=url,
        JOBQUEUE_API_TOKENS=tokens_setting(),
        JOBQUEUE_EMBEDDED_WORKERS=0,
    )
    if host_csrf:
        CSRFProtect(app)
    auth = Blueprint("auth", __name__)

    @auth.route("/login", methods=["GET", "POST"])
    def login():
        if request.method == "POST":
            session["who"] = request.form["name"]
            return redirect(request.args.get("next", "/"))
        return "host login page"

    @auth.post("/host-form")
    def host_form():
        return "host took a POST"

    app.register_blueprint(auth)

    @app.get("/")
    def home():
        return render_template("base.html", items=[1, 2, 3])

    def authorize(req):
        if "who" not in session:
            abort(redirect(url_for("auth.login", next=req.path)))
        return ROLES.get(session["who"])

    init_dashboard(app, "/jobs-admin", authorize=authorize, user_name=lambda req: session["who"])
    return app


@pytest.fixture
def host(mysql_url, tmp_path):
    app = host_app(mysql_url, tmp_path)
    yield app
    app.extensions["jobqueue"].engine.dispose()


def signed_in(app, name: str):
    client = app.test_client()
    with client.session_transaction() as s:
        s["who"] = name
    return client


def csrf_of(client) -> str:
    page = client.get("/jobs-admin/").get_data(as_text=True)
    return re.search(r'"X-CSRFToken": "([^"]+)"', page).group(1)


def new_job(app, key: str) -> int:
    with app.extensions["jobqueue"].engine.connect() as conn:
        return service.enqueue(conn, "noop", key).id


def job(app, job_id: int):
    with app.extensions["jobqueue"].engine.connect() as conn:
        return repository.reads.get_job(conn, job_id)


def test_a_request_authorize_denies_is_refused(host):
    signed_out = host.test_client().get("/jobs-admin/jobs")
    assert signed_out.status_code == 302  # authorize's own redirect to the host's login
    assert signed_out.headers["Location"] == "/login?next=/jobs-admin/jobs"
    customer = signed_in(host, "bob")
    for path in ("/jobs-admin/", "/jobs-admin/jobs", "/jobs-admin/audit", "/jobs-admin/health"):
        assert customer.get(path).status_code == 403, path
    assert customer.get("/jobs-admin/jobs", headers={"HX-Request": "true"}).status_code == 403
    job_id = new_job(host, "denied-1")
    assert customer.post(f"/jobs-admin/jobs/{job_id}/cancel", data={"confirm": "yes"}).status_code in (400, 403)
    assert job(host, job_id).status is Status.READY
    # The standalone app's own login and session pages are not mounted: signing in is the host's.
    assert customer.get("/jobs-admin/login").status_code == 404


def test_a_viewer_looks_but_cannot_act(host):
    job_id = new_job(host, "look-1")
    viewer = signed_in(host, "vic")
    page = viewer.get("/jobs-admin/jobs")
    assert page.status_code == 200 and "look-1" in page.get_data(as_text=True)
    assert "vic (viewer)" in page.get_data(as_text=True)
    assert viewer.get(f"/jobs-admin/jobs/{job_id}").status_code == 200
    token = csrf_of(viewer)
    for action in ("requeue", "fail", "cancel"):
        answer = viewer.post(
            f"/jobs-admin/jobs/{job_id}/{action}",
            data={"confirm": "yes"},
            headers={"X-CSRFToken": token, "HX-Request": "true"},
        )
        assert answer.status_code == 403, action
    assert (
        viewer.post(
            "/jobs-admin/queues/default/pause", data={"confirm": "yes"}, headers={"X-CSRFToken": token}
        ).status_code
        == 403
    )
    assert job(host, job_id).status is Status.READY


def test_an_admin_acts_and_the_audit_log_names_the_host_user(host):
    job_id = new_job(host, "act-1")
    admin = signed_in(host, "ada")
    answer = admin.post(
        f"/jobs-admin/jobs/{job_id}/cancel",
        data={"confirm": "yes", "reason": "duplicate order"},
        headers={"X-CSRFToken": csrf_of(admin), "HX-Request": "true"},
    )
    assert answer.status_code == 200 and "cancelled" in answer.get_data(as_text=True)
    assert job(host, job_id).status is Status.CANCELLED
    with host.extensions["jobqueue"].engine.connect() as conn:
        entries = repository.operator.list_audit(conn, job_id=job_id, limit=5)
    assert [e["actor"] for e in entries] == ["web:ada"]
    assert "web:ada" in admin.get("/jobs-admin/audit").get_data(as_text=True)


def test_csrf_is_enforced_on_the_mounted_forms(host):
    job_id = new_job(host, "csrf-1")
    admin = signed_in(host, "ada")
    missing = admin.post(f"/jobs-admin/jobs/{job_id}/cancel", data={"confirm": "yes"})
    forged = admin.post(f"/jobs-admin/jobs/{job_id}/cancel", data={"confirm": "yes", "csrf_token": "forged"})
    assert (missing.status_code, forged.status_code) == (400, 400)
    assert "security token" in missing.get_data(as_text=True)
    assert job(host, job_id).status is Status.READY
    # The host's own forms are not the dashboard's business: no CSRF check imposed on them.
    assert admin.post("/host-form").get_data(as_text=True) == "host took a POST"


def test_the_api_under_the_prefix_takes_bearer_tokens(host):
    client = host.test_client()
    assert client.get("/jobs-admin/api/stats").status_code == 401
    stats = client.get("/jobs-admin/api/stats", headers={"Authorization": f"Bearer {VIEWER_TOKEN}"})
    assert stats.status_code == 200 and stats.is_json
    made = client.post(
        "/jobs-admin/api/jobs",
        json={"task": "noop", "task_key": "api-1"},
        headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
    )
    assert made.status_code == 201
    assert (
        client.post(
            "/jobs-admin/api/jobs",
            json={"task": "noop", "task_key": "api-2"},
            headers={"Authorization": f"Bearer {VIEWER_TOKEN}"},
        ).status_code
        == 403
    )
    # A session is no key to the API, not even an admin's.
    assert signed_in(host, "ada").get("/jobs-admin/api/stats").status_code == 401
    missing = client.get("/jobs-admin/api/jobs/999999999", headers={"Authorization": f"Bearer {VIEWER_TOKEN}"})
    assert missing.status_code == 404 and missing.is_json
    contract = client.get("/jobs-admin/api/openapi.json").json
    assert contract["servers"] == [{"url": "/jobs-admin"}] and "/api/jobs" in contract["paths"]


def test_the_api_works_beside_the_hosts_own_csrf_protection(mysql_url, tmp_path):
    app = host_app(mysql_url, tmp_path, host_csrf=True)
    try:
        client = app.test_client()
        made = client.post(
            "/jobs-admin/api/jobs",
            json={"task": "noop", "task_key": "api-csrf"},
            headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
        )
        assert made.status_code == 201
        admin = signed_in(app, "ada")
        assert admin.post(f"/jobs-admin/jobs/{made.json['id']}/cancel", data={"confirm": "yes"}).status_code == 400
        assert (
            admin.post(
                f"/jobs-admin/jobs/{made.json['id']}/cancel",
                data={"confirm": "yes"},
                headers={"X-CSRFToken": csrf_of(admin)},
            ).status_code
            == 302
        )
        assert job(app, made.json["id"]).status is Status.CANCELLED
    finally:
        app.extensions["jobqueue"].engine.dispose()


def test_static_files_links_and_headers_live_under_the_prefix_and_the_host_keeps_its_own(host):
    admin = signed_in(host, "ada")
    page = admin.get("/jobs-admin/")
    html = page.get_data(as_text=True)
    assert 'src="/jobs-admin/static/htmx.min.js?v=' in html and 'href="/jobs-admin/jobs"' in html
    assert "HOST BASE" not in html  # our base.html, not the host's
    assert "Content-Security-Policy" in page.headers and page.headers["X-Frame-Options"] == "DENY"
    with admin.get("/jobs-admin/static/app.css") as css:
        assert css.status_code == 200 and "Content-Security-Policy" in css.headers
    home = admin.get("/")
    assert home.get_data(as_text=True) == "<title>HOST BASE</title>3 items"  # Jinja's own |count
    assert "Content-Security-Policy" not in home.headers
    assert "Strict-Transport-Security" not in page.headers  # the host's site, the host's call
    # A 404 outside the prefix is the host's; one inside a dashboard view is the dashboard's page.
    assert "Back to the overview" not in admin.get("/nowhere").get_data(as_text=True)
    assert "Back to the overview" in admin.get("/jobs-admin/jobs/999999999").get_data(as_text=True)


def test_authorize_answering_something_else_is_a_clear_error(mysql_url, tmp_path):
    app = Flask("odd")
    app.config.update(SECRET_KEY="x", JOBQUEUE_DATABASE_URL=mysql_url, JOBQUEUE_EMBEDDED_WORKERS=0)
    init_dashboard(app, authorize=lambda req: "superuser", user_name=lambda req: "x")
    try:
        answer = app.test_client().get("/jobs-admin/")
        assert answer.status_code == 500 and "&#39;superuser&#39;" in answer.get_data(as_text=True)
    finally:
        app.extensions["jobqueue"].engine.dispose()
    # The call, without user_name: the request's REMOTE_USER names the actor.
    plain = Flask("plain")
    plain.config.update(SECRET_KEY="x", JOBQUEUE_DATABASE_URL=mysql_url, JOBQUEUE_EMBEDDED_WORKERS=0)
    init_dashboard(plain, url_prefix="/jobs-admin", authorize=lambda req: "viewer")
    try:
        assert plain.test_client().get("/jobs-admin/", environ_base={"REMOTE_USER": "ada"}).status_code == 200
    finally:
        plain.extensions["jobqueue"].engine.dispose()
    with pytest.raises(ValueError):
        init_dashboard(Flask("bad"), "jobs/", authorize=lambda req: None, user_name=lambda req: "")
    clash = Flask("clash")
    clash.config.update(JOBQUEUE_DATABASE_URL=mysql_url)
    clash.add_template_filter(lambda v: v, "ago")
    with pytest.raises(ConfigError, match="'ago'"):
        init_dashboard(clash, authorize=lambda req: None, user_name=lambda req: "")
    clash.extensions["jobqueue"].engine.dispose()
