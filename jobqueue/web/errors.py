"""How the web answers errors: JSON under /api/ (or when JSON is asked for), a page otherwise;
the queue's own errors with the same code everywhere (jobqueue.core.errors.answer_for)."""

from __future__ import annotations

import logging

from flask import Blueprint, Flask, jsonify, render_template, request
from flask_wtf.csrf import CSRFError
from sqlalchemy.exc import SQLAlchemyError
from werkzeug.exceptions import HTTPException

from ..core.errors import JobQueueError, NotPrimary, TransientDatabaseError, answer_for
from ..core.logs import event
from .config import ConfigError
from .security import wants_json

log = logging.getLogger("jobqueue.web")

BUSY_MESSAGE = "The database is unavailable or busy right now; try again in a moment."


def page(code: int, message: str, headers: dict | None = None, **extra):
    if wants_json():
        response = jsonify({"error": message, **extra})
    else:
        response = render_template("jobqueue/error.html", code=code, message=message)
    return response, code, headers or {}


def init_app(app: Flask | Blueprint) -> None:
    """Error pages for the app (standalone) or, mounted, for the queue's blueprint only."""

    @app.errorhandler(CSRFError)
    def _csrf(exc):
        event(log, logging.WARNING, "csrf_refused", path=request.path, reason=exc.description)
        return page(400, f"The form's security token is missing or stale ({exc.description}). Reload the page.")

    @app.errorhandler(HTTPException)
    def _http(exc: HTTPException):
        if exc.code and exc.code >= 500:
            event(log, logging.ERROR, "http_error", code=exc.code, path=request.path)
        elif exc.code not in (401, 404):
            event(log, logging.INFO, "http_refused", code=exc.code, path=request.path, reason=exc.description)
        return page(exc.code or 500, exc.description or exc.name)

    @app.errorhandler(NotPrimary)
    def _not_primary(exc):
        event(log, logging.ERROR, "write_refused", path=request.path, reason=str(exc)[:300])
        return page(503, f"This database does not take queue writes right now: {exc}", {"Retry-After": "5"})

    @app.errorhandler(SQLAlchemyError)
    @app.errorhandler(TransientDatabaseError)
    def _database(exc):
        event(log, logging.ERROR, "sql_error", path=request.path, error=f"{type(exc).__name__}: {exc}"[:300])
        return page(503, BUSY_MESSAGE, {"Retry-After": "2"})

    @app.errorhandler(JobQueueError)
    def _queue_error(exc):
        answer = answer_for(exc)
        return page(answer.http_status, answer.message, **answer.extra)

    @app.errorhandler(ConfigError)
    def _config(exc):
        return page(500, str(exc))
