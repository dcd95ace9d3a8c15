"""The Flask application: dashboard, JSON API, login, and the embedded runtime (workers and the
reaper, started after fork by gunicorn_conf.py, never at import)."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from flask import Flask
from werkzeug.routing import IntegerConverter

from . import api, auth, dashboard, errors, filters, health, security, state
from .config import SETTING_KEYS, load_settings


class BigIntConverter(IntegerConverter):
    def __init__(self, url_map, fixed_digits: int = 0, min: int | None = None, max: int | None = 2 ** 63 - 1,
                 signed: bool = False):
        super().__init__(url_map, fixed_digits=fixed_digits, min=min, max=max, signed=signed)


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
    settings = load_settings(test_config)

    app = Flask(__name__, template_folder=_asset_folder("templates"), static_folder=_asset_folder("static"))
    body_limit = settings.core.max_payload_bytes + 16 * 1024   # the payload plus room for the other fields
    app.config.from_mapping(
        SECRET_KEY=settings.secret_key,
        SESSION_COOKIE_NAME="jobqueue_session",
        SESSION_COOKIE_HTTPONLY=True,
        SESSION_COOKIE_SAMESITE="Lax",
        SESSION_COOKIE_SECURE=settings.secure_cookies,
        PERMANENT_SESSION_LIFETIME=timedelta(seconds=settings.session_max_seconds),
        MAX_CONTENT_LENGTH=body_limit,
        MAX_FORM_MEMORY_SIZE=body_limit,
        WTF_CSRF_TIME_LIMIT=None,   # valid for the session's life: a dashboard stays open all night
    )
    app.config.update({k: v for k, v in test_config.items() if k not in SETTING_KEYS})

    # Ids in URLs fit a BIGINT: a longer number is no such page (404), never a database error.
    app.url_map.converters["int"] = BigIntConverter
    state.init_app(app, settings)
    security.init_app(app)
    errors.init_app(app)
    filters.init_app(app)
    for blueprint in (auth.bp, health.bp, dashboard.bp, api.bp):
        app.register_blueprint(blueprint)
    return app
