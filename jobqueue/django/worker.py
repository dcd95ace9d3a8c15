"""Django tasks in our workers: found by the module path their jobs name, run on a slot thread.

`manage.py jobqueue_worker` (or `jobqueue worker --tasks jobqueue.django.worker` with
DJANGO_SETTINGS_MODULE set) runs the queue's worker in a process where Django is set up; a job
whose task name is the module path of a Django task using a JobQueueBackend is run as that task:
its arguments from the payload, a TaskContext when it takes one, its return value recorded for
get_result, Django's task_started / task_finished signals sent. An exception is the attempt's
error, retried with backoff until MAX_ATTEMPTS as any job is.
"""

from __future__ import annotations

import functools
import re
from typing import Any

from django.db import close_old_connections
from django.utils.module_loading import import_string

from ..core.errors import PermanentError
from ..core.tasks import JobContext, TaskSpec
from .framework import Task, TaskContext, TaskResultStatus, normalize_json, task_finished, task_started

_MODULE_PATH = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)+")


@functools.lru_cache(maxsize=1024)
def find_task(name: str) -> TaskSpec | None:
    """The spec of a Django task of ours named by its module path, or None (anything else: a
    name that is not a module path, not importable, not a Django task, or not on our backend)."""
    if not _MODULE_PATH.fullmatch(name):
        return None
    try:
        task = import_string(name)
    except ImportError:
        return None
    if not isinstance(task, Task):
        return None
    from .backend import JobQueueBackend

    backend = task.get_backend()
    return backend.spec(task) if isinstance(backend, JobQueueBackend) else None


def run_task(payload: dict[str, Any], ctx: JobContext) -> None:
    """The handler of every Django task: one attempt."""
    task = import_string(ctx.task_name)
    backend = task.get_backend()
    close_old_connections()
    try:
        result = backend.get_result(ctx.task_key)  # RUNNING, this attempt counted
        task_started.send(type(backend), task_result=result)
        args, kwargs = payload.get("args", []), payload.get("kwargs", {})
        try:
            if task.takes_context:
                value = task.call(TaskContext(task_result=result), *args, **kwargs)
            else:
                value = task.call(*args, **kwargs)
            value = normalize_json(value)
        except Exception as exc:
            if ctx.attempt >= ctx.max_attempts or isinstance(exc, PermanentError):
                object.__setattr__(result, "status", TaskResultStatus.FAILED)
                task_finished.send(type(backend), task_result=result)  # in the handler: exc_info is there
            raise
        ctx.record_result({"return_value": value})
        object.__setattr__(result, "status", TaskResultStatus.SUCCESSFUL)
        object.__setattr__(result, "_return_value", value)
        task_finished.send(type(backend), task_result=result)
    finally:
        close_old_connections()


def setup() -> None:
    """Django set up (DJANGO_SETTINGS_MODULE), and each configured backend made, so that the
    registry can find Django tasks by their module paths."""
    import django

    django.setup()
    from .framework import task_backends

    task_backends.all()
