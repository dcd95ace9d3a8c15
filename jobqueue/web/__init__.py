"""The Flask application: dashboard, JSON API, login, and the embedded runtime (workers and the
reaper, started after fork by gunicorn_conf.py, never at import).

Two ways in, one wiring (`_install`): `create_app()` builds the standalone app with its own login;
`init_dashboard(app, ...)` mounts the same blueprints in an application's own Flask app under a
prefix, where the host's login decides who may look and act (see HostAccess).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from functools import cached_property
from pathlib import Path
from typing import Any

from flask import Blueprint, Flask, Request, request
from jinja2 import BaseLoader, FileSystemLoader, PrefixLoader
from werkzeug.routing import IntegerConverter, Map

from . import api, auth, dashboard, errors, filters, health, security, state
from .auth import HostAccess
from .config import SETTING_KEYS, WebSettings, load_settings

__all__ = ["create_app", "init_dashboard"]


class BigIntConverter(IntegerConverter):
    def __init__(
        self,
        url_map: Map,
        fixed_digits: int = 0,
        min: int | None = None,
        max: int | None = 2**63 - 1,
        signed: bool = False,
    ):
        super().__init__(url_map, fixed_digits=fixed_digits, min=min, max=max, signed=signed)


def _asset_folder(name: str) -> str:
    """templates/ and static/ ship inside the package."""
    return str(Path(__file__).resolve().parents[1] / name)


class _QueueBlueprint(Blueprint):
    """Its templates are found as "jobqueue/<name>", so a host app's own base.html, error.html or
    auth/login.html never stands in for ours (Flask searches the app's folder first)."""

    @cached_property
    def jinja_loader(self) -> BaseLoader:
        return PrefixLoader({"jobqueue": FileSystemLoader(_asset_folder("templates"))})

    def get_send_file_max_age(self, filename: str | None) -> int | None:
        """A year for a static file asked for by the URL filters.asset_url gives (its content's
        hash in `v`); asked for any other way, revalidated each time (Flask's default)."""
        version = filters.asset_version(filename) if filename else None
        if version is not None and request.args.get("v") == version:
            return filters.ASSET_MAX_AGE
        return super().get_send_file_max_age(filename)


def _blueprint(own_login: bool) -> Blueprint:
    """Everything the queue serves, under one name ("jobqueue": endpoints are
    jobqueue.dashboard.jobs, jobqueue.static, ...), so it can sit beside a host app's own
    blueprints called auth, api or dashboard. Built per app: its hooks belong to that app."""
    bp = _QueueBlueprint("jobqueue", __name__, static_folder=_asset_folder("static"), static_url_path="/static")
    for child in ([auth.bp] if own_login else []) + [health.bp, dashboard.bp, api.bp]:
        bp.register_blueprint(child)
    return bp


def _install(app: Flask, settings: WebSettings, url_prefix: str, access: HostAccess | None) -> None:
    """The one place the queue's web side is wired into an app, standalone or hosted."""
    # Ids in URLs fit a BIGINT: a longer number is no such page (404), never a database error.
    app.url_map.converters["bigint"] = BigIntConverter
    state.init_app(app, settings, url_prefix=url_prefix, access=access)
    bp = _blueprint(own_login=access is None)
    # Standalone, the whole app is the queue's: its 404 pages and headers too. Hosted, only the
    # queue's own requests get its error pages, headers, CSRF check and template context.
    scope: Flask | Blueprint = app if access is None else bp
    security.init_app(app, scope)
    errors.init_app(scope)
    filters.init_app(app, scope)
    app.register_blueprint(bp, url_prefix=url_prefix or None)


def create_app(test_config: dict[str, Any] | None = None) -> Flask:
    """Build the app. `test_config` overrides settings by their JOBQUEUE_* names without the
    prefix (DATABASE_URL, USERS, DEV, ...) and Flask config keys."""
    test_config = dict(test_config or {})
    settings = load_settings(test_config)

    app = Flask(__name__, template_folder=None, static_folder=None)
    body_limit = settings.core.max_payload_bytes + 16 * 1024  # the payload plus room for the other fields
    app.config.from_mapping(
        SECRET_KEY=settings.secret_key,
        SESSION_COOKIE_NAME="jobqueue_session",
        SESSION_COOKIE_HTTPONLY=True,
        SESSION_COOKIE_SAMESITE="Lax",
        SESSION_COOKIE_SECURE=settings.secure_cookies,
        PERMANENT_SESSION_LIFETIME=timedelta(seconds=settings.session_max_seconds),
        MAX_CONTENT_LENGTH=body_limit,
        MAX_FORM_MEMORY_SIZE=body_limit,
        WTF_CSRF_TIME_LIMIT=None,  # valid for the session's life: a dashboard stays open all night
    )
    app.config.update({k: v for k, v in test_config.items() if k not in SETTING_KEYS})
    _install(app, settings, "", None)
    return app


def _remote_user(request: Request) -> str:
    return request.remote_user or "host-user"


def init_dashboard(
    app: Flask,
    url_prefix: str = "/jobs-admin",
    *,
    authorize: Callable[[Request], str | None],
    user_name: Callable[[Request], str] | None = None,
) -> None:
    """Mount the dashboard, its health page and the JSON API in an application's own Flask app
    under `url_prefix`, behind the application's own login.

    `authorize(request)` answers None (no access: 403), "viewer" (looks) or "admin" (acts); it may
    also raise, e.g. `abort(redirect(url_for("login", next=request.path)))` to send a signed-out
    user to the host's login page. `user_name(request)` names the user for the audit log
    ("web:<name>"); it is asked only when authorize gave a role. Both run once per request.
    Without `user_name` the name is the request's REMOTE_USER (set by a server or proxy that
    authenticated it), else "host-user": pass `user_name` for an audit log that names people.

    Settings come from the app's config as JOBQUEUE_* keys (JOBQUEUE_DATABASE_URL,
    JOBQUEUE_API_TOKENS, ...), else from the environment, as for `jobqueue serve`. The session,
    its cookie and SECRET_KEY are the host's; the API still takes bearer tokens only. Call it
    after `CSRFProtect(app)` if the app uses one, so that the API's POSTs are exempted from it.
    """
    if not url_prefix.startswith("/") or url_prefix.endswith("/"):
        raise ValueError("url_prefix starts with '/' and does not end with one, e.g. '/jobs-admin'")
    overrides: dict[str, Any] = {
        k[len("JOBQUEUE_") :]: v
        for k, v in app.config.items()
        if k.startswith("JOBQUEUE_") and k[len("JOBQUEUE_") :] in SETTING_KEYS
    }
    settings = load_settings(overrides, hosted=True)
    _install(app, settings, url_prefix, HostAccess(authorize, user_name or _remote_user))
