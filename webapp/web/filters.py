"""Template filters and globals: times, durations, the signed-in user."""

from __future__ import annotations

from datetime import datetime

from flask import Flask
from sqlalchemy.exc import SQLAlchemyError

from ..core.errors import TransientDatabaseError
from .auth import current_user
from .state import extension


def human_seconds(seconds: float) -> str:
    seconds = abs(seconds)
    if seconds < 60:
        return f"{seconds:.0f} s" if seconds >= 10 else f"{seconds:.1f} s"
    if seconds < 3600:
        return f"{seconds / 60:.0f} min"
    if seconds < 86400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} d"


def init_app(app: Flask) -> None:
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

    @app.template_filter("seconds")
    def seconds(value: float | None) -> str:
        return "—" if value is None else human_seconds(value)

    @app.context_processor
    def _user():
        try:
            user = current_user()
        except (SQLAlchemyError, TransientDatabaseError):
            user = None      # the error page of a database that is down: shown as signed out
        return {"current_user": user, "dev_mode": extension().settings.dev}
