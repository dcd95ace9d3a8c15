"""The Flask application: dashboard, JSON API, login, and the embedded runtime (workers and the
reaper, started after fork by gunicorn_conf.py, never at import)."""

from __future__ import annotations

import ipaddress
import logging
import os
import sys
from datetime import datetime, timedelta
from pathlib import Path

from flask import Flask, jsonify, render_template, request
from flask_wtf.csrf import CSRFError, CSRFProtect
from sqlalchemy.exc import SQLAlchemyError
from werkzeug.exceptions import HTTPException

from ..core import repository
from ..core.db import create_engine
from ..core.errors import TransientDatabaseError
from ..core.tasks import load_task_modules
from ..core.validation import max_payload_bytes
from . import api, auth, dashboard, health
from .config import SETTING_KEYS, ConfigError, load_settings
from .runtime import Runtime
from .state import QueueExtension, extension

log = logging.getLogger("jobqueue.web")

CSP = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
       "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'; object-src 'none'")


def _asset_folder(name: str) -> str:
    """templates/ and static/ sit at the top of a source checkout and inside the package once
    installed from a wheel."""
    package = Path(__file__).resolve().parents[1]
    for candidate in (package / name, package.parent / name):
        if candidate.is_dir():
            return str(candidate)
    raise RuntimeError(f"cannot find the {name} folder next to {package}")


def create_app(test_config: dict | None = None) -> Flask:
    """Build the app. `test_config` overrides settings by their JOBQUEUE_* names without the
    prefix (DATABASE_URL, USERS, DEV, ...) and Flask config keys."""
    test_config = dict(test_config or {})
    if not logging.getLogger().handlers:
        logging.basicConfig(level=os.environ.get("JOBQUEUE_LOG_LEVEL", "INFO").upper(), stream=sys.stderr,
                            format="%(asctime)s %(levelname)s %(name)s %(message)s")
    settings = load_settings(test_config)
    load_task_modules(test_config.pop("TASKS", None))

    app = Flask(__name__, template_folder=_asset_folder("templates"), static_folder=_asset_folder("static"))
    app.config.update(
        SECRET_KEY=settings.secret_key,
        SESSION_COOKIE_NAME="jobqueue_session",
        SESSION_COOKIE_HTTPONLY=True,
        SESSION_COOKIE_SAMESITE="Lax",
        SESSION_COOKIE_SECURE=settings.secure_cookies,
        PERMANENT_SESSION_LIFETIME=timedelta(hours=12),
        # The whole request body: the payload limit plus room for the other fields.
        MAX_CONTENT_LENGTH=max_payload_bytes() + 16 * 1024,
        MAX_FORM_MEMORY_SIZE=max_payload_bytes() + 16 * 1024,
        WTF_CSRF_TIME_LIMIT=None,   # valid for the session's life: a dashboard stays open all night
    )
    app.config.update({k: v for k, v in test_config.items() if k not in SETTING_KEYS})
    engine = create_engine(settings.database_url, pool_size=max(4, settings.embedded_workers + 4))
    app.extensions["jobqueue"] = QueueExtension(engine, settings, Runtime(engine, settings))

    csrf = CSRFProtect(app)
    csrf.exempt(api.bp)
    app.register_blueprint(auth.bp)
    app.register_blueprint(health.bp)
    app.register_blueprint(dashboard.bp)
    app.register_blueprint(api.bp)

    if settings.dev:
        log.warning("event=dev_mode detail=\"development mode: localhost only%s\"",
                    "; login admin / " + settings.dev_password if settings.dev_password else "")

        @app.before_request
        def _localhost_only():
            try:
                loopback = ipaddress.ip_address(request.remote_addr or "").is_loopback
            except ValueError:
                loopback = False
            if not loopback:
                return render_template("error.html", code=403,
                                       message="Development mode serves localhost only."), 403

    @app.before_request
    def _refuse_writes_on_an_unsafe_server():
        if request.method == "POST" and request.endpoint not in ("auth.login", "auth.logout"):
            reason = extension().write_refusal()
            if reason:
                log.error("event=write_refused path=%s reason=%r", request.path, reason)
                message = f"This database does not take queue writes: {reason}"
                if _wants_json():
                    return jsonify({"error": message}), 503
                return render_template("error.html", code=503, message=message), 503

    _register_headers(app)
    _register_errors(app)
    _register_filters(app)

    @app.get("/healthz")
    def healthz():
        """For load balancers: no login, no details beyond ok / database unavailable."""
        try:
            with engine.connect() as conn:
                repository.database_now(conn)
        except (SQLAlchemyError, TransientDatabaseError):
            return jsonify({"status": "error", "error": "database unavailable"}), 503
        return jsonify({"status": "ok", "embedded_workers": extension().runtime.started})

    return app


def _register_headers(app: Flask) -> None:
    @app.after_request
    def _headers(response):
        response.headers.setdefault("Content-Security-Policy", CSP)
        response.headers.setdefault("X-Content-Type-Options", "nosniff")
        response.headers.setdefault("X-Frame-Options", "DENY")
        response.headers.setdefault("Referrer-Policy", "same-origin")
        if response.mimetype == "text/html":
            response.headers.setdefault("Cache-Control", "no-store")
        return response


def _wants_json() -> bool:
    return request.path.startswith("/api/") or request.accept_mimetypes.best == "application/json"


def _register_errors(app: Flask) -> None:
    def page(code: int, message: str):
        if _wants_json():
            return jsonify({"error": message}), code
        return render_template("error.html", code=code, message=message), code

    @app.errorhandler(CSRFError)
    def _csrf(exc):
        log.warning("event=csrf_refused path=%s reason=%r", request.path, exc.description)
        return page(400, f"The form's security token is missing or stale ({exc.description}). Reload the page.")

    @app.errorhandler(HTTPException)
    def _http(exc: HTTPException):
        if exc.code and exc.code >= 500:
            log.error("event=http_error code=%s path=%s", exc.code, request.path)
        elif exc.code not in (401, 404):
            log.info("event=http_refused code=%s path=%s reason=%r", exc.code, request.path, exc.description)
        return page(exc.code or 500, exc.description or exc.name)

    @app.errorhandler(SQLAlchemyError)
    @app.errorhandler(TransientDatabaseError)
    def _database(exc):
        log.error("event=sql_error path=%s error=%r", request.path, f"{type(exc).__name__}: {exc}"[:300])
        return page(503, "The database is unavailable or busy right now; try again in a moment.")

    @app.errorhandler(ConfigError)
    def _config(exc):
        return page(500, str(exc))


def _register_filters(app: Flask) -> None:
    @app.template_filter("ts")
    def ts(value: datetime | None) -> str:
        return value.strftime("%Y-%m-%d %H:%M:%S") if value else "—"

    @app.template_filter("ago")
    def ago(value: datetime | None, now: datetime) -> str:
        if value is None:
            return "—"
        return human_seconds((now - value).total_seconds())

    @app.template_filter("until")
    def until(value: datetime | None, now: datetime) -> str:
        if value is None:
            return "—"
        left = (value - now).total_seconds()
        return ("in " + human_seconds(left)) if left >= 0 else (human_seconds(-left) + " ago (expired)")

    @app.template_filter("shorten")
    def shorten(value: str | None, limit: int = 80) -> str:
        if not value:
            return ""
        first = value.splitlines()[0]
        return first if len(first) <= limit else first[: limit - 1] + "…"

    @app.context_processor
    def _user():
        from flask import session
        return {"current_user": extension().settings.users.get(session.get("user", "")),
                "dev_mode": extension().settings.dev}


def human_seconds(seconds: float) -> str:
    seconds = abs(seconds)
    if seconds < 60:
        return f"{seconds:.0f} s" if seconds >= 10 else f"{seconds:.1f} s"
    if seconds < 3600:
        return f"{seconds / 60:.0f} min"
    if seconds < 86400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} d"
