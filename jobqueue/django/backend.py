"""`jobqueue.django.JobQueueBackend`: Django's tasks framework on the queue.

    TASKS = {"default": {"BACKEND": "jobqueue.django.JobQueueBackend",
                         "QUEUES": ["default", "emails"],
                         "OPTIONS": {"DATABASE": "default", "MAX_ATTEMPTS": 5, "RETRY_BASE_SECONDS": 1}}}

A task becomes one job: its task name is the task's module path, its task_key the result id,
its payload the arguments as Django serialises them (`{"args": [...], "kwargs": {...}}`, plus
`run_after` when given). The job is written on Django's own connection for DATABASES[DATABASE]
(connection.py), so a task enqueued in `transaction.atomic()` exists exactly when the block
commits. Our workers run it (`manage.py jobqueue_worker`): leases, retries with backoff up to
MAX_ATTEMPTS (1: Django's run-once), fencing, the dashboard.

How a job reads as a TaskResult (get_result):

    status      scheduled, ready -> READY; running -> RUNNING; done -> SUCCESSFUL;
                failed, cancelled -> FAILED (a job waiting out a retry's backoff is READY again)
    enqueued_at created_at; started_at the first attempt's start; last_attempted_at the latest's;
                finished_at when SUCCESSFUL or FAILED (all UTC, aware when USE_TZ)
    errors      one TaskError per attempt that raised (class path, traceback), timed out
                (TimeoutError) or lost its lease (jobqueue.core.errors.LeaseLostError)
    worker_ids  the lease owner of each attempt, so `attempts` is the job's attempts
    return_value  what the task returned (normalised to JSON), stored with record_result
    priority    Django's -100..100, larger first, is stored negated (the queue claims lower first)
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings
from django.utils import timezone
from django.utils.crypto import get_random_string
from django.utils.module_loading import import_string

from ..core import repository, service
from ..core.models import Job, Status
from ..core.tasks import DEFAULT_MAX_ATTEMPTS, TASKS, TaskSpec
from ..core.validation import MAX_TASK_NAME_CHARS
from .connection import lent_engine
from .framework import (
    BaseTaskBackend,
    InvalidTask,
    Task,
    TaskError,
    TaskResult,
    TaskResultDoesNotExist,
    TaskResultStatus,
    task_enqueued,
)

QUEUE_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")
MAX_DELAY = timedelta(days=366)

STATUSES = {
    Status.SCHEDULED: TaskResultStatus.READY,
    Status.READY: TaskResultStatus.READY,
    Status.RUNNING: TaskResultStatus.RUNNING,
    Status.DONE: TaskResultStatus.SUCCESSFUL,
    Status.FAILED: TaskResultStatus.FAILED,
    Status.CANCELLED: TaskResultStatus.FAILED,
    Status.BLOCKED: TaskResultStatus.READY,
}

# Attempts that ended without the task raising, as the exception a TaskError names.
ATTEMPT_ERRORS = {"timeout": "builtins.TimeoutError", "lease_expired": "jobqueue.core.errors.LeaseLostError"}
_CLASS_PATH = re.compile(r"[A-Za-z_][\w.]*")
_TRACEBACK = "Traceback (most recent call last):"


class JobQueueBackend(BaseTaskBackend):
    supports_defer = True
    supports_async_task = True  # run on the worker's thread through async_to_sync
    supports_get_result = True
    supports_priority = True

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        self.database = self.options.get("DATABASE", "default")
        self.max_attempts = int(self.options.get("MAX_ATTEMPTS", DEFAULT_MAX_ATTEMPTS))
        self.retry_base_seconds = float(self.options.get("RETRY_BASE_SECONDS", 1.0))
        from .worker import find_task

        TASKS.add_finder(find_task)  # a worker finds each task by the module path its jobs name

    def validate_task(self, task: Task) -> None:
        super().validate_task(task)
        if not QUEUE_NAME.fullmatch(task.queue_name):
            raise InvalidTask(f"queue_name {task.queue_name!r}: 1-64 of A-Z a-z 0-9 _ . -")
        if len(task.module_path) > MAX_TASK_NAME_CHARS:
            raise InvalidTask(f"the task's module path is longer than {MAX_TASK_NAME_CHARS} characters")

    def spec(self, task: Task) -> TaskSpec:
        from .worker import run_task

        return TaskSpec(
            task.module_path, run_task, task.queue_name, self.max_attempts, retry_base_seconds=self.retry_base_seconds
        )

    # --- enqueue -------------------------------------------------------------------------------

    def enqueue(self, task: Task, args: Any, kwargs: Any) -> TaskResult:
        self.validate_task(task)
        result = TaskResult(
            task=task,
            id=get_random_string(32),
            status=TaskResultStatus.READY,
            enqueued_at=None,
            started_at=None,
            last_attempted_at=None,
            finished_at=None,
            args=args,
            kwargs=kwargs,
            backend=self.alias,
            errors=[],
            worker_ids=[],
        )
        payload: dict[str, Any] = {"args": result.args, "kwargs": result.kwargs}
        delay = 0.0
        if task.run_after is not None:
            run_after = task.run_after if timezone.is_aware(task.run_after) else timezone.make_aware(task.run_after)
            if run_after - timezone.now() > MAX_DELAY:
                raise InvalidTask("run_after is more than 366 days away")
            payload["run_after"] = run_after.isoformat()
            # This process's clock against the database's: a skew between them moves the start.
            delay = max(0.0, (run_after - timezone.now()).total_seconds())
        if task.module_path not in TASKS:
            TASKS.register(self.spec(task))
        with repository_connection(self.database) as conn:
            made = service.enqueue(
                conn,
                task.module_path,
                result.id,
                payload,
                queue=task.queue_name,
                priority=-task.priority,
                delay=delay,
                max_attempts=self.max_attempts,
            )
            job = repository.reads.get_job(conn, made.id)
        assert job is not None
        stored = self.result_of(job, [], None)
        task_enqueued.send(type(self), task_result=stored)
        return stored

    # --- results -------------------------------------------------------------------------------

    def get_result(self, result_id: str) -> TaskResult:
        with repository_connection(self.database) as conn:
            job = repository.reads.get_job_by_key(conn, result_id)
            if job is None:
                raise TaskResultDoesNotExist(result_id)
            attempts = repository.reads.list_attempts(conn, job.id) if job.attempts else []
            stored = repository.reads.get_result(conn, job.task_key) if job.status is Status.DONE else None
        return self.result_of(job, attempts, stored)

    def result_of(self, job: Job, attempts: list[dict[str, Any]], stored: dict[str, Any] | None) -> TaskResult:
        """A job, its attempt history and its recorded result, as Django's TaskResult."""
        run_after = job.payload.get("run_after")
        task = task_named(job.task_name).using(
            priority=-job.priority,
            queue_name=job.queue,
            backend=self.alias,
            run_after=datetime.fromisoformat(run_after) if run_after else None,
        )
        status = STATUSES[job.status]
        starts = [a["started_at"] for a in attempts if a["started_at"]] + ([job.started_at] if job.started_at else [])
        first_start = min(starts, default=None)
        result = TaskResult(
            task=task,
            id=job.task_key,
            status=status,
            enqueued_at=aware(job.created_at),
            started_at=aware(first_start),
            last_attempted_at=aware(job.started_at),
            finished_at=aware(job.finished_at)
            if status in (TaskResultStatus.SUCCESSFUL, TaskResultStatus.FAILED)
            else None,
            args=job.payload.get("args", []),
            kwargs=job.payload.get("kwargs", {}),
            backend=self.alias,
            errors=[error for error in map(task_error, attempts) if error is not None],
            worker_ids=worker_ids(job, attempts),
        )
        if status == TaskResultStatus.SUCCESSFUL and stored is not None:
            object.__setattr__(result, "_return_value", stored["result"].get("return_value"))
        return result


def repository_connection(alias: str):
    """A SQLAlchemy Connection on Django's connection for `alias`, in Django's transaction: the
    caller's atomic block if there is one (a savepoint inside it), else one of its own."""
    from contextlib import contextmanager

    from django.db import transaction

    @contextmanager
    def lent():
        with transaction.atomic(using=alias), lent_engine(alias).connect() as conn:
            # The repository sees a transaction that is not its own (it writes in savepoints);
            # closing `conn` ends nothing: Django's atomic commits or rolls back.
            conn.begin()
            yield conn

    return lent()


def task_named(module_path: str) -> Task:
    task = import_string(module_path)
    if not isinstance(task, Task):
        raise ValueError(f"{module_path!r} is not a Django task")
    return task


def aware(value: datetime | None) -> datetime | None:
    """A database time (naive UTC) as Django wants it: aware UTC with USE_TZ, else naive local."""
    if value is None:
        return None
    value = value.replace(tzinfo=UTC)
    return value if settings.USE_TZ else timezone.make_naive(value)


def task_error(attempt: dict[str, Any]) -> TaskError | None:
    error = attempt["error"] or ""
    if attempt["outcome"] in ATTEMPT_ERRORS:
        return TaskError(exception_class_path=ATTEMPT_ERRORS[attempt["outcome"]], traceback=error)
    if attempt["outcome"] not in ("retry", "fail"):
        return None  # released at a worker's stop, or ended by an operator: the task raised nothing
    head = error.split(": ", 1)[0]
    path = head if _CLASS_PATH.fullmatch(head) else "Exception"
    if "." not in path:
        path = f"builtins.{path}"
    start = error.find(_TRACEBACK)
    return TaskError(exception_class_path=path, traceback=error[start:] if start >= 0 else error)


def worker_ids(job: Job, attempts: list[dict[str, Any]]) -> list[str]:
    """The lease owner of each attempt, first to last: the attempt history has those that did
    not succeed, the job row the latest one's."""
    owners: dict[int, str] = {}
    for attempt in attempts:
        owners.setdefault(attempt["attempt"], attempt["worker"] or "")
    if job.attempts and job.attempts not in owners:
        owners[job.attempts] = job.lease_owner or ""
    return [owners.get(n, "") for n in range(1, job.attempts + 1)]
