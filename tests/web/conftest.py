"""A Flask app per test against its own MariaDB database, with two users and two API tokens
(testkit.web), and signed-in clients."""

from __future__ import annotations

import pytest

from jobqueue import create_app
from testkit.web import AuthActions, app_config, csrf_token, login


@pytest.fixture
def app(mysql_url):
    application = create_app(app_config(mysql_url))
    yield application
    application.extensions["jobqueue"].engine.dispose()


@pytest.fixture
def engine(app):
    return app.extensions["jobqueue"].engine


@pytest.fixture
def auth(app):
    """flaskr's AuthActions: `auth.login("victor")`, `auth.post(...)`, `auth.logout()`."""
    return AuthActions(app.test_client())


@pytest.fixture
def client(app):
    c = app.test_client()
    assert login(c).status_code == 302
    c.token = csrf_token(c)
    return c


@pytest.fixture
def viewer(app):
    c = app.test_client()
    assert login(c, "victor", "viewer-password-1").status_code == 302
    c.token = csrf_token(c)
    return c
