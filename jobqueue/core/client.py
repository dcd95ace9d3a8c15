"""The Python API: a client object over the same repository verbs the CLI and the HTTP API use.

    from jobqueue import JobQueue, task

    jq = JobQueue("mysql+pymysql://app@db/shop")          # or JobQueue.from_env(), or an Engine
    jq.enqueue("send_invoice", "invoice-42", {"order": 42})

    with engine.begin() as conn:                          # the application's own transaction
        conn.execute(orders.insert().values(id=42))
        jq.enqueue("export_orders", "export-42", conn=conn)   # exists exactly when this commits

`conn=` takes the caller's SQLAlchemy Connection or ORM Session, already in a transaction: the
job is written in it, and idle workers in this process are woken after the COMMIT, not before.
A rollback leaves no job and no idempotency key behind.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from sqlalchemy.engine import Connection, Engine

from . import repository, service
from .models import Enqueued, Explanation, Job, Status
from .repository.operator import ActionResult, JobFilter
from .settings import Settings
from .tasks import TASKS, Registry

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

    from .tasks import TaskFunction
    from .validation import NewJob


class JobQueue:
    """A handle on one queue database: enqueue, look, act. Thread-safe; one per application."""

    def __init__(
        self,
        url_or_engine: str | Engine | None = None,
        *,
        settings: Settings | None = None,
        registry: Registry = TASKS,
        pool_size: int = 5,
    ) -> None:
        from .db import create_engine

        self.registry = registry
        if isinstance(url_or_engine, Engine):
            self.engine = url_or_engine
            self._owns_engine = False
        else:
            self.engine = create_engine(url_or_engine, pool_size=pool_size, settings=settings)
            self._owns_engine = True

    @classmethod
    def from_env(cls) -> JobQueue:
        """A client on JOBQUEUE_DATABASE_URL, as the `jobqueue` command would use."""
        return cls(None, settings=Settings.from_env())

    def close(self) -> None:
        if self._owns_engine:
            self.engine.dispose()

    def __enter__(self) -> JobQueue:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def _connection(self, conn: Connection | Session | None) -> Iterator[Connection]:
        if conn is None:
            with self.engine.connect() as own:
                yield own
            return
        if isinstance(conn, Connection):
            yield conn
            return
        yield conn.connection()  # an ORM Session: the Connection of its current transaction

    # --- enqueue -----------------------------------------------------------------------------

    def enqueue(
        self,
        task: str | TaskFunction,
        task_key: str,
        payload: Mapping[str, Any] | None = None,
        *,
        queue: str | None = None,
        priority: int = 0,
        delay: float = 0,
        max_attempts: int | None = None,
        conn: Connection | Session | None = None,
        allow_unregistered: bool = False,
        after: Iterable[str] | None = None,
        on_parent_failure: str = "cancel",
        batch: str | None = None,
    ) -> Enqueued:
        """Add one job (idempotent by task_key: a known key writes nothing, duplicate=True).
        With `conn`, in the caller's transaction.

        `after`: task_keys of jobs this one waits for: it is `blocked` until all are done, then
        ready (or scheduled, with a delay still to run). A parent that fails or is cancelled
        cancels it (`on_parent_failure="cancel"`) or counts as finished (`"run"`). An unknown
        parent key, or a cycle, raises ValidationError and writes nothing.

        `batch`: the key of an open batch (`batch()`) this job is a member of; a closed batch
        raises BatchClosed and writes nothing.

        `task` by name needs no import of its handler: a task of this process, a built-in one or
        one a worker registered (with that worker's queue and attempts). Any other name is
        refused as a likely typo, unless `allow_unregistered` (its worker has not started yet)."""
        name = task if isinstance(task, str) else task.task_name
        with self._connection(conn) as c:
            return service.enqueue(
                c,
                name,
                task_key,
                dict(payload) if payload is not None else None,
                queue=queue,
                priority=priority,
                delay=delay,
                max_attempts=max_attempts,
                registry=self.registry,
                allow_unregistered=allow_unregistered,
                after=after,
                on_parent_failure=on_parent_failure,
                batch=batch,
            )

    def enqueue_many(
        self,
        jobs: Iterable[NewJob | Mapping[str, Any]],
        *,
        conn: Connection | Session | None = None,
        allow_unregistered: bool = False,
    ) -> list[Enqueued]:
        """Add many jobs in one transaction (the caller's, with `conn`); all are validated first."""
        with self._connection(conn) as c:
            return service.enqueue_many(
                c, [self._spec(j) for j in jobs], registry=self.registry, allow_unregistered=allow_unregistered
            )

    @staticmethod
    def _spec(job: NewJob | Mapping[str, Any]) -> NewJob | Mapping[str, Any]:
        if isinstance(job, Mapping) and not isinstance(job.get("task", ""), str):
            return {**job, "task": job["task"].task_name}
        return job

    # --- look ----------------------------------------------------------------------------------

    def batch(
        self,
        key: str,
        *,
        on_success: str | TaskFunction | None = None,
        on_failure: str | TaskFunction | None = None,
        on_complete: str | TaskFunction | None = None,
        payload: Mapping[str, Any] | None = None,
    ) -> Batch:
        """Open the batch `key` (idempotent: an existing batch is found, as it was opened) and
        return it; as a context manager it is closed when the block ends (see Batch)."""
        names = {
            f"on_{kind}": task if task is None or isinstance(task, str) else task.task_name
            for kind, task in (("success", on_success), ("failure", on_failure), ("complete", on_complete))
        }
        with self._connection(None) as c:
            repository.batches.open_batch(c, key, payload=dict(payload) if payload is not None else None, **names)
        return Batch(self, key)

    def close_batch(self, key: str) -> dict[str, Any]:
        """Close the batch: no more members; its callbacks fire once its members have finished."""
        with self._connection(None) as c:
            return service.close_batch(c, key)

    def batch_status(self, key: str) -> dict[str, Any]:
        """{"key", "state", "total", "done", "failed", "cancelled", "pending", "callbacks", ...}"""
        with self._connection(None) as c:
            return repository.batches.show(c, key)

    def get(self, job_id: int) -> Job | None:
        with self.engine.connect() as c:
            return repository.reads.get_job(c, job_id)

    def list(
        self,
        *,
        status: Status | str | None = None,
        queue: str | None = None,
        task: str | None = None,
        key: str | None = None,
        before: int | None = None,
        limit: int = 50,
    ) -> list[Job]:
        """Jobs newest first, with the dashboard's filters; keyset pages (`before` an id)."""
        job_filter = JobFilter(status=Status(status) if status else None, queue=queue, task=task, key_prefix=key)
        with self.engine.connect() as c:
            return repository.reads.list_jobs(c, job_filter, before_id=before, limit=limit)

    def explain(self, job_id: int) -> Explanation:
        """Why a job is (not) running: its reasons, the main one first (JobNotFound when there is
        no such job). Reads only; waits at most about a second on a row another transaction holds."""
        with self.engine.connect() as c:
            return repository.explain.explain(c, job_id)

    def result(self, task_key: str, timeout: float | None = 30) -> Any:
        """What the job's handler returned or recorded (`ctx.record_result`; None if neither),
        waiting up to `timeout` seconds (None: no limit) for it to finish. Raises JobFailed with
        its last error for a failed job, JobCancelled (a JobFailed) for a cancelled one,
        TimeoutError when it is still pending at the deadline, JobNotFound for an unknown key.
        While it waits it reads the job's row once a second; a completion by a worker in this
        process wakes it at once."""
        from .errors import JobCancelled, JobFailed
        from .results import wait_for

        outcome = wait_for(self.engine, task_key=task_key, timeout=timeout)
        if outcome.status is Status.DONE:
            return outcome.result
        if outcome.status is Status.CANCELLED:
            raise JobCancelled(
                f"job {task_key!r} was cancelled: {outcome.error or 'no reason given'}",
                task_key=task_key,
                error=outcome.error,
            )
        if outcome.status is Status.FAILED:
            first = (outcome.error or "no error recorded").splitlines()[0]
            raise JobFailed(f"job {task_key!r} failed: {first}", task_key=task_key, error=outcome.error)
        raise TimeoutError(f"job {task_key!r} still {outcome.status.value} after {timeout} s")

    # --- act ---------------------------------------------------------------------------------

    def requeue(self, job_id: int, *, force: bool = False, again: bool = False, actor: str = "python") -> ActionResult:
        """Back to ready now. `force`: a running job whose lease is still valid (its attempt is
        fenced off); `again`: a done job, whose handler then runs again (as `jobqueue requeue
        --again`)."""
        with self.engine.connect() as c:
            return service.requeue_job(c, job_id, force=force, again=again, actor=actor)

    def fail(self, job_id: int, reason: str | None = None, *, actor: str = "python") -> ActionResult:
        with self.engine.connect() as c:
            return service.fail_job(c, job_id, reason, actor=actor)

    def cancel(self, job_id: int, reason: str | None = None, *, actor: str = "python") -> ActionResult:
        """Cancel a job now: a running job's lease is fenced (its handler's `ctx.transaction()`
        then commits nothing); a done job is refused (InvalidState)."""
        with self.engine.connect() as c:
            return service.cancel_job(c, job_id, reason, actor=actor)


_default: JobQueue | None = None
_default_lock = threading.Lock()


def set_default(client: JobQueue | None) -> None:
    """The client that tasks' `.enqueue()` use (None: JobQueue.from_env() on first use)."""
    global _default
    with _default_lock:
        _default = client


def default_client() -> JobQueue:
    global _default
    with _default_lock:
        if _default is None:
            _default = JobQueue.from_env()
        return _default


class Batch:
    """An open batch (JobQueue.batch). `with jq.batch(...) as b: b.enqueue(...)` closes it when
    the block ends normally. When the block raises, the batch stays open: its callbacks would
    otherwise report on half the work. Run the block again (the batch key and task_keys are
    idempotent: the members already written are answered duplicate) or close it by hand
    (`close()`, `jobqueue batch close KEY`)."""

    def __init__(self, jq: JobQueue, key: str) -> None:
        self.jq = jq
        self.key = key

    def enqueue(
        self, task: str | TaskFunction, task_key: str, payload: Mapping[str, Any] | None = None, **options: Any
    ) -> Enqueued:
        """JobQueue.enqueue, as a member of this batch."""
        return self.jq.enqueue(task, task_key, payload, batch=self.key, **options)

    def close(self) -> dict[str, Any]:
        return self.jq.close_batch(self.key)

    def status(self) -> dict[str, Any]:
        return self.jq.batch_status(self.key)

    def __enter__(self) -> Batch:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        if exc_type is None:
            self.close()
