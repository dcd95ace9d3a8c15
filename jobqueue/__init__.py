"""jobqueue: a job queue in a MySQL table with a Flask operations dashboard.

    from jobqueue import JobQueue, task

`jobqueue.core` is the queue (no Flask below this line); `jobqueue.web` is the dashboard and API.
Everything here is imported on first use, so that workers and the command line never pay for
what they do not use (Flask above all).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .core.client import JobQueue, set_default
    from .core.errors import JobCancelled, JobFailed, JobNotFound
    from .core.models import Enqueued, Explanation, Job, Reason, Status
    from .core.tasks import JobContext, task

__all__ = [
    "Enqueued",
    "Explanation",
    "Job",
    "JobCancelled",
    "JobContext",
    "JobFailed",
    "JobNotFound",
    "JobQueue",
    "Reason",
    "Status",
    "create_app",
    "set_default",
    "task",
]

_LAZY = {
    "JobQueue": "jobqueue.core.client",
    "set_default": "jobqueue.core.client",
    "task": "jobqueue.core.tasks",
    "JobContext": "jobqueue.core.tasks",
    "Enqueued": "jobqueue.core.models",
    "Job": "jobqueue.core.models",
    "Explanation": "jobqueue.core.models",
    "Reason": "jobqueue.core.models",
    "Status": "jobqueue.core.models",
    "JobFailed": "jobqueue.core.errors",
    "JobCancelled": "jobqueue.core.errors",
    "JobNotFound": "jobqueue.core.errors",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'jobqueue' has no attribute {name!r}")


def create_app(test_config: dict[str, Any] | None = None) -> Any:
    """Flask application factory (see jobqueue.web). Imported lazily so that workers and the CLI
    never import Flask."""
    from .web import create_app as _create_app

    return _create_app(test_config)
