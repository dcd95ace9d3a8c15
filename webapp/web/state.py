"""The web process's handle on the queue: its engine, settings and embedded runtime."""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field

from flask import current_app
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import SQLAlchemyError

from ..core import preflight
from ..core.errors import TransientDatabaseError, UnsupportedDatabase

from .auth import LoginThrottle
from .config import WebSettings
from .runtime import Runtime


@dataclass
class QueueExtension:
    engine: Engine
    settings: WebSettings
    runtime: Runtime
    login_throttle: LoginThrottle = field(default_factory=LoginThrottle)
    _refusal: tuple[float, str | None] = (0.0, None)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def write_refusal(self, max_age: float = 60.0) -> str | None:
        """Why this database must not take queue writes (a replica, statement binlogs, MyISAM,
        an old server), or None. Checked at most once a minute per web process."""
        checked_at, reason = self._refusal
        if time.monotonic() - checked_at < max_age:
            return reason
        with self._lock:
            try:
                preflight.require_supported(self.engine)
                reason = None
            except UnsupportedDatabase as exc:
                reason = str(exc)
            except (SQLAlchemyError, TransientDatabaseError):
                return None  # unreachable: the request itself will say so
            self._refusal = (time.monotonic(), reason)
        return reason


def extension() -> QueueExtension:
    return current_app.extensions["jobqueue"]


@contextmanager
def db() -> Connection:
    """A pooled connection for the length of a request's work; every statement on it goes
    through webapp.core.repository."""
    with extension().engine.connect() as conn:
        yield conn
