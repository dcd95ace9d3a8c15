"""What a worker says about itself: its state (claiming, not_primary, ...) for the dashboard and
/api/health, and its database errors, every one counted, logged at most once per operation every
few seconds; and which database errors are worth waiting out."""

from __future__ import annotations

import logging
from collections.abc import Callable

from sqlalchemy.exc import DBAPIError, SQLAlchemyError

from .. import metrics
from ..db import is_not_primary, pool_gave_up, transient_kind
from ..db.drivers import installed
from ..errors import NotPrimary, TransientDatabaseError
from ..logs import RateLimited, event

log = logging.getLogger("jobqueue.worker")

# The drivers' own errors: the idle probe reads on a DB-API connection, unwrapped by SQLAlchemy.
_DRIVER_ERRORS = tuple(module.Error for module in installed())
_DRIVER_OPERATIONAL_ERRORS = tuple(module.OperationalError for module in installed())
DB_ERRORS = (DBAPIError, SQLAlchemyError, TransientDatabaseError, NotPrimary, *_DRIVER_ERRORS)
NOT_CLAIMING = ("not_primary", "split_brain", "database_unreachable")  # states in which a worker claims nothing


def reachability(exc: BaseException) -> str | None:
    """A lost connection, a deadlock, a lock-wait timeout, a server that is not (or no longer) the
    primary: worth waiting out. Anything else (a result the database refuses) is not."""
    if isinstance(exc, TransientDatabaseError):
        return "transient"
    if is_not_primary(exc) or pool_gave_up(exc):
        return "not_primary"
    if isinstance(exc, DBAPIError):
        return transient_kind(exc)
    if isinstance(exc, _DRIVER_OPERATIONAL_ERRORS):
        return "disconnect"
    return None


class WorkerState:
    """`on_change()` is called when the worker starts or stops claiming, so that its heartbeat
    tells at once rather than at the next beat."""

    def __init__(self, worker_id: str, on_change: Callable[[], None]):
        self.worker_id = worker_id
        self.name = "starting"  # claiming | not_primary | split_brain | database_unreachable | stopping | stopped
        self.detail: str | None = None
        self._on_change = on_change
        self._error_log = RateLimited(5.0)

    def set(self, state: str, detail: str | None) -> None:
        if state == self.name and detail == self.detail:
            return
        before, self.name, self.detail = self.name, state, detail
        if state == "claiming" and before in NOT_CLAIMING:
            event(log, logging.WARNING, "claiming_resumed", worker=self.worker_id, after=before)
        if state != before and (state in NOT_CLAIMING or before in NOT_CLAIMING):
            self._on_change()

    def split_brain(self, detail: str) -> None:
        first = self.name != "split_brain"
        self.set("split_brain", detail)
        allowed = self._error_log.allow(("split_brain", "claim")) is not None
        if first or allowed:
            event(log, logging.ERROR, "split_brain", worker=self.worker_id, detail=detail)

    def not_primary(self, operation: str, exc: BaseException) -> None:
        metrics.NOT_PRIMARY.labels(operation=operation).inc()
        first = self.name != "not_primary"
        self.set("not_primary", str(exc)[:300])
        if first or self._error_log.allow(("not_primary", operation)) is not None:
            event(
                log,
                logging.ERROR,
                "not_primary",
                worker=self.worker_id,
                operation=operation,
                detail="claiming paused: the server is not a writable primary; resuming when one answers",
                error=str(getattr(exc, "orig", None) or exc)[:300],
            )

    def sql_error(self, operation: str, exc: BaseException) -> None:
        metrics.SQL_ERRORS.labels(operation=operation).inc()
        # Every error is counted; during an outage the log gets one line per operation every
        # few seconds, with how many were held back.
        suppressed = self._error_log.allow(operation)
        if suppressed is not None:
            event(
                log,
                logging.ERROR,
                "sql_error",
                worker=self.worker_id,
                operation=operation,
                error=f"{type(exc).__name__}: {str(getattr(exc, 'orig', None) or exc)[:300]}",
                repeats=suppressed or None,
            )
