"""The web process's handle on the queue: its engine, settings and embedded runtime."""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field

from flask import current_app
from sqlalchemy.engine import Connection, Engine

from .auth import LoginThrottle
from .config import WebSettings
from .runtime import Runtime


@dataclass
class QueueExtension:
    engine: Engine
    settings: WebSettings
    runtime: Runtime
    login_throttle: LoginThrottle = field(default_factory=LoginThrottle)


def extension() -> QueueExtension:
    return current_app.extensions["jobqueue"]


@contextmanager
def db() -> Connection:
    """A pooled connection for the length of a request's work; every statement on it goes
    through webapp.core.repository."""
    with extension().engine.connect() as conn:
        yield conn
