"""Errors that callers are expected to tell apart, and the one answer each gets everywhere.

Every error the queue raises on purpose says how the command line exits (`exit_code`) and how the
HTTP API answers (`http_status`), so the CLI, the JSON API and the dashboard map it the same way
(`answer_for`). Exit codes: 0 ok; 1 database unreachable or unexpected; 2 bad input (nothing
written); 3 the job's state does not allow it, or the server cannot run the queue safely; 4 no
such job; 75 busy right now, try again.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

EXIT_OK, EXIT_ERROR, EXIT_BAD_INPUT, EXIT_STATE, EXIT_NOT_FOUND, EXIT_BUSY = 0, 1, 2, 3, 4, 75


class JobQueueError(Exception):
    """Base class for errors raised by the queue core."""

    exit_code = EXIT_ERROR
    http_status = 500


class ValidationError(JobQueueError, ValueError):
    """Bad input: nothing was written."""

    exit_code = EXIT_BAD_INPUT
    http_status = 422

    def __init__(self, message: str, field: str | None = None):
        super().__init__(message)
        self.field = field


class PayloadTooLarge(ValidationError):
    """The payload exceeds the configured size limit."""

    http_status = 413


class UnsupportedDatabase(JobQueueError):
    """The server cannot give the guarantees the queue depends on (version, engine, replica)."""

    exit_code = EXIT_STATE
    http_status = 503


class NotPrimary(UnsupportedDatabase):
    """The server is read-only or a replica right now (demoted, failing over, misrouted). Nothing
    was claimed or written; a process keeps trying and resumes when a writable primary answers."""

    exit_code = EXIT_BUSY
    http_status = 503


class NotFound(JobQueueError):
    exit_code = EXIT_NOT_FOUND
    http_status = 404


class JobNotFound(NotFound):
    pass


class BatchNotFound(NotFound):
    """No batch has that key."""


class ScheduleNotFound(NotFound):
    """No recurring job of that name."""


class InvalidState(JobQueueError):
    """The job is not in a state that allows the requested operator action."""

    exit_code = EXIT_STATE
    http_status = 409

    def __init__(self, message: str, status: str | None = None):
        super().__init__(message)
        self.status = status


class BatchClosed(InvalidState):
    """The batch is closed: it takes no more members (its callbacks may have fired)."""


class LeaseStillValid(InvalidState):
    """Requeueing a running job whose lease is still valid needs explicit confirmation (force)."""


class RunAgainNeeded(InvalidState):
    """Requeueing a done job runs its handler again: it needs explicit confirmation (again)."""


class JobFailed(JobQueueError):
    """The job awaited (JobQueue.result) failed for good; `error` is its last error."""

    exit_code = EXIT_ERROR
    http_status = 409

    def __init__(self, message: str, *, task_key: str, error: str | None):
        super().__init__(message)
        self.task_key = task_key
        self.error = error


class JobCancelled(JobFailed):
    """The job awaited was cancelled (by an operator): it will not run."""


class JobBusy(JobQueueError):
    """Another transaction holds the job's row right now (NOWAIT refused); try again."""

    exit_code = EXIT_BUSY
    http_status = 423


class TransientDatabaseError(JobQueueError):
    """Deadlocks, lock-wait timeouts or lost connections that outlasted our retries."""

    exit_code = EXIT_ERROR
    http_status = 503


class TransactionConflict(TransientDatabaseError):
    """The server rolled back the caller's own transaction (the one passed as `conn=`): a deadlock
    (1213), or on MariaDB 11.6.2+ at REPEATABLE READ a row another transaction changed after this
    one's snapshot (1020, innodb_snapshot_isolation). Nothing of that transaction was kept, the
    caller's own writes included: run the whole transaction again."""

    exit_code = EXIT_BUSY


class PermanentError(Exception):
    """Raise from a handler to fail the job at once, without retries."""


class LeaseLostError(Exception):
    """This attempt's lease is gone (expired and reaped, or taken by an operator): its writes are
    refused and its handler should stop."""


@dataclass(frozen=True)
class Answer:
    exit_code: int
    http_status: int
    message: str
    extra: dict[str, Any]


def answer_for(exc: JobQueueError) -> Answer:
    """How the CLI, the API and the dashboard report `exc`: the same code and words everywhere."""
    extra: dict[str, Any] = {}
    message = str(exc)
    if isinstance(exc, ValidationError) and exc.field:
        extra["field"] = exc.field
    if isinstance(exc, InvalidState):
        extra["status"] = exc.status
    if isinstance(exc, LeaseStillValid):
        extra["needs"] = "force"
    if isinstance(exc, RunAgainNeeded):
        extra["needs"] = "again"
    return Answer(exc.exit_code, exc.http_status, message, extra)
