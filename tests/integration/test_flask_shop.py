"""examples/flask_shop, run (issue 16): an order POST commits the order and its export_orders job
together and a failing order write leaves neither; the dashboard sits behind the shop's login; the
shop under the queue's gunicorn settings runs the job in its embedded workers."""

from __future__ import annotations

import importlib.util
import re
import sys
import urllib.request
from pathlib import Path

import pytest
import sqlalchemy as sa
from werkzeug.security import generate_password_hash

from jobqueue.core import repository
from jobqueue.core.models import Status
from jobqueue.core.schema import job_queue
from jobqueue.core.worker import Worker, WorkerConfig
from testkit.procs import GunicornServer, wait_until
from testkit.web import ADMIN_TOKEN, tokens_setting

SHOP_DIR = Path(__file__).resolve().parents[2] / "examples" / "flask_shop"
PASSWORD = "shop-password-1"


def load_shop():
    if "shop" not in sys.modules:
        spec = importlib.util.spec_from_file_location("shop", SHOP_DIR / "shop.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules["shop"] = module
        spec.loader.exec_module(module)
    return sys.modules["shop"]


shop = load_shop()


def staff_setting() -> str:
    digest = generate_password_hash(PASSWORD)
    return f"ada:admin:{digest};vic:viewer:{digest};carl:none:{digest}"


@pytest.fixture
def app(mysql_url, tmp_path):
    application = shop.create_app(
        {
            "SECRET_KEY": "shop-secret",
            "TESTING": True,
            "SQLALCHEMY_DATABASE_URI": mysql_url,
            "SHOP_STAFF": shop.parse_staff(staff_setting()),
            "JOBQUEUE_EMBEDDED_WORKERS": 0,
            "JOBQUEUE_API_TOKENS": tokens_setting(),
            "JOBQUEUE_EXPORT_DIR": str(tmp_path / "exports"),
        }
    )
    with application.app_context():
        shop.db.create_all()
        shop.db.session.add(shop.Product(id=1, name="teapot", price_cents=2500, stock=3))
        shop.db.session.commit()
    yield application
    with application.app_context():
        shop.db.engine.dispose()
    application.extensions["jobqueue"].engine.dispose()


def csrf(client, path: str = "/") -> str:
    return re.search(r'name="csrf_token" value="([^"]+)"', client.get(path).get_data(as_text=True)).group(1)


def rows(app):
    """(orders, stock, jobs) as the database has them."""
    with app.extensions["jobqueue"].engine.connect() as conn:
        orders = conn.execute(sa.text("SELECT id, quantity FROM shop_order ORDER BY id")).all()
        stock = conn.execute(sa.text("SELECT stock FROM shop_product WHERE id = 1")).scalar()
        jobs = conn.execute(sa.select(job_queue.c.task_key, job_queue.c.task_name)).all()
    return [tuple(o) for o in orders], stock, [tuple(j) for j in jobs]


def order(client, quantity: int):
    return client.post(
        "/orders", data={"customer": "Grace", "product": "1", "quantity": str(quantity), "csrf_token": csrf(client)}
    )


def test_an_order_commits_with_its_export_job_and_the_worker_runs_it(app, tmp_path):
    client = app.test_client()
    assert order(client, 2).status_code == 303
    orders, stock, jobs = rows(app)
    assert (len(orders), stock) == (1, 1)
    assert jobs == [(f"order-{orders[0][0]}", "export_orders")]
    worker = Worker(app.extensions["jobqueue"].runtime.engine, WorkerConfig(concurrency=1, burst=True))
    assert worker.run() == 0
    with app.extensions["jobqueue"].engine.connect() as conn:
        job = repository.reads.get_job(
            conn, repository.reads.list_jobs(conn, repository.operator.JobFilter(), limit=1)[0].id
        )
    assert job.status is Status.DONE
    export = (tmp_path / "exports" / f"order-{orders[0][0]}.csv").read_text()
    assert export.splitlines() == ["order_id,amount", f"{orders[0][0]},50.00"]


def test_a_failing_order_write_leaves_no_job(app):
    client = app.test_client()
    refused = order(client, 5)  # 3 teapots left: taking the stock fails after the enqueue
    assert refused.status_code == 303
    assert "not enough teapot" in client.get("/").get_data(as_text=True)
    assert rows(app) == ([], 3, [])  # no order, the stock untouched, and no job
    assert order(client, 3).status_code == 303
    orders, stock, jobs = rows(app)
    assert (len(orders), stock, [j[0] for j in jobs]) == (1, 0, [f"order-{orders[0][0]}"])


def test_the_dashboard_is_behind_the_shops_own_login(app):
    client = app.test_client()
    first = client.get("/jobs-admin/jobs")
    assert first.status_code == 302 and first.headers["Location"] == "/login?next=/jobs-admin/jobs"
    signed_in = client.post(
        "/login?next=/jobs-admin/jobs", data={"name": "ada", "password": PASSWORD, "csrf_token": csrf(client, "/login")}
    )
    assert signed_in.headers["Location"] == "/jobs-admin/jobs"
    assert order(client, 1).status_code == 303
    with app.extensions["jobqueue"].engine.connect() as conn:
        job_id = conn.execute(sa.select(job_queue.c.id)).scalar_one()
    page = client.get("/jobs-admin/jobs").get_data(as_text=True)
    assert "ada (admin)" in page and "order-" in page
    token = re.search(r'"X-CSRFToken": "([^"]+)"', page).group(1)
    cancelled = client.post(
        f"/jobs-admin/jobs/{job_id}/cancel",
        data={"confirm": "yes"},
        headers={"X-CSRFToken": token, "HX-Request": "true"},
    )
    assert cancelled.status_code == 200
    with app.extensions["jobqueue"].engine.connect() as conn:
        assert [e["actor"] for e in repository.operator.list_audit(conn, job_id=job_id, limit=5)] == ["web:ada"]
    # A clerk who may sign in to the shop but has no dashboard role: refused.
    clerk = app.test_client()
    clerk.post("/login", data={"name": "carl", "password": PASSWORD, "csrf_token": csrf(clerk, "/login")})
    assert clerk.get("/jobs-admin/").status_code == 403
    # The API under the prefix, with a bearer token, past the shop's own CSRFProtect.
    made = app.test_client().post(
        "/jobs-admin/api/jobs",
        json={"task": "noop", "task_key": "shop-api-1"},
        headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
    )
    assert made.status_code == 201


@pytest.mark.slow
def test_the_shop_under_the_queues_gunicorn_settings_runs_jobs_in_its_embedded_workers(app, mysql_url, tmp_path):
    env = {"SHOP_SECRET_KEY": "s3cret", "SHOP_STAFF": staff_setting(), "JOBQUEUE_EXPORT_DIR": str(tmp_path / "gx")}
    server = GunicornServer(
        mysql_url,
        tmp_path,
        web_workers=1,
        embedded_workers=1,
        extra_env=env,
        app_uri="shop:create_app()",
        chdir=SHOP_DIR,
        ready_path="/jobs-admin/healthz",
    )
    try:
        with urllib.request.urlopen(server.base + "/jobs-admin/healthz", timeout=5) as r:
            assert b'"embedded_workers":true' in r.read().replace(b" ", b"")
        with app.app_context():
            jq = app.extensions["shop_queue"]
            job = jq.enqueue("export_orders", "gunicorn-1", {"orders": [{"id": 7, "amount": "1.00"}]})
        assert wait_until(lambda: jq.get(job.id).status is Status.DONE, timeout=30), server.log()[-3000:]
        assert (tmp_path / "gx" / "gunicorn-1.csv").exists()
    finally:
        assert server.stop() == 0, server.log()[-3000:]
