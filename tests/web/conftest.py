"""A Flask app per test against its own MariaDB database, with two users and two API tokens."""

from __future__ import annotations

import re

import pytest
from werkzeug.security import generate_password_hash

from webapp import create_app

ADMIN_PASSWORD = "admin-password-1"
VIEWER_PASSWORD = "viewer-password-1"
ADMIN_TOKEN = "admin-token-0123456789abcdef"
VIEWER_TOKEN = "viewer-token-0123456789abcdef"
_HASHES = {}


def users_setting() -> str:
    if not _HASHES:
        _HASHES["admin"] = generate_password_hash(ADMIN_PASSWORD)
        _HASHES["viewer"] = generate_password_hash(VIEWER_PASSWORD)
    return f"alice:admin:{_HASHES['admin']};victor:viewer:{_HASHES['viewer']}"


def app_config(url: str, **extra) -> dict:
    return {"DATABASE_URL": url, "SECRET_KEY": "test-secret", "USERS": users_setting(),
            "API_TOKENS": f"ops:admin:{ADMIN_TOKEN};grafana:viewer:{VIEWER_TOKEN}",
            "EMBEDDED_WORKERS": 0, "SECURE_COOKIES": "1", "TESTING": True, **extra}


@pytest.fixture
def app(mysql_url):
    application = create_app(app_config(mysql_url))
    yield application
    application.extensions["jobqueue"].engine.dispose()


@pytest.fixture
def engine(app):
    return app.extensions["jobqueue"].engine


def csrf_token(client) -> str:
    page = client.get("/login").get_data(as_text=True)
    return re.search(r'name="csrf_token" value="([^"]+)"', page).group(1)


def login(client, user: str = "alice", password: str = ADMIN_PASSWORD):
    return client.post("/login", data={"username": user, "password": password, "csrf_token": csrf_token(client)})


@pytest.fixture
def client(app):
    c = app.test_client()
    assert login(c).status_code == 302
    c.token = csrf_token(c)
    return c


@pytest.fixture
def viewer(app):
    c = app.test_client()
    assert login(c, "victor", VIEWER_PASSWORD).status_code == 302
    c.token = csrf_token(c)
    return c


def post(client, path: str, data: dict | None = None, htmx: bool = True, **kw):
    headers = {"X-CSRFToken": client.token}
    if htmx:
        headers["HX-Request"] = "true"
    return client.post(path, data=data or {}, headers=headers, **kw)


def api(client, method: str, path: str, token: str = ADMIN_TOKEN, **kw):
    return client.open(path, method=method, headers={"Authorization": f"Bearer {token}"}, **kw)
