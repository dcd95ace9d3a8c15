"""Errors that callers are expected to tell apart."""


class JobQueueError(Exception):
    """Base class for errors raised by the queue core."""


class ValidationError(JobQueueError, ValueError):
    """Bad input: nothing was written."""

    def __init__(self, message: str, field: str | None = None):
        super().__init__(message)
        self.field = field


class PayloadTooLarge(ValidationError):
    """The payload exceeds the configured size limit."""


class UnsupportedDatabase(JobQueueError):
    """The server cannot give the guarantees the queue depends on (version, engine, replica)."""


class JobNotFound(JobQueueError):
    pass


class InvalidState(JobQueueError):
    """The job is not in a state that allows the requested operator action."""

    def __init__(self, message: str, status: str | None = None):
        super().__init__(message)
        self.status = status


class LeaseStillValid(InvalidState):
    """Requeueing a running job whose lease is still valid needs explicit confirmation (force)."""


class JobBusy(JobQueueError):
    """Another transaction holds the job's row right now (NOWAIT refused); try again."""


class TransientDatabaseError(JobQueueError):
    """Deadlocks, lock-wait timeouts or lost connections that outlasted our retries."""


class PermanentError(Exception):
    """Raise from a handler to fail the job at once, without retries."""
