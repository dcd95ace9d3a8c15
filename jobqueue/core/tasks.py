"""Task handlers: the registry, the `@task` decorator and what a handler is given.

    from jobqueue.core.tasks import task

    @task("send_invoice", max_attempts=10)
    def send_invoice(payload, ctx):
        ...                                   # runs after the claim committed, never inside it
        ctx.record_result({"invoice": n})     # at most one result per task_key

An `async def` handler takes the same arguments, `(payload, ctx)`, and runs on the worker's event
loop (`await ctx.arecord_result(...)`, `async with ctx.atransaction() as conn:`).

Options: `timeout_seconds=N` (an attempt still running after N s fails as `timeout` and is
retried by the usual backoff), `cron="0 * * * *"` (a recurring job named after the task, UTC),
`concurrency_key="customer_id", concurrency_limit=1` (at most that many jobs with the same
`payload["customer_id"]` run at once, across every process and host), `rate_limit="100/m"`
(at most 100 starts per fixed window of the database clock: `s`, `m` or `h`; with
`rate_key="customer_id"` one window per value of that payload field, a payload without the field
sharing one bucket with the others that lack it), across every process and host.

Point workers at the module with `--tasks myapp.tasks` or `JOBQUEUE_TASKS=myapp.tasks`
(`task_modules.load_task_modules` imports them, with the built-in tasks).
"""

from __future__ import annotations

import asyncio
import inspect
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, AbstractContextManager, asynccontextmanager
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any, Protocol, cast

from .errors import LeaseLostError

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection

    from .models import Enqueued

DEFAULT_QUEUE = "default"
DEFAULT_MAX_ATTEMPTS = 5

Handler = Callable[[dict[str, Any], "JobContext"], Any]


@dataclass(frozen=True)
class TaskSpec:
    name: str
    handler: Handler
    queue: str = DEFAULT_QUEUE
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    retry_base_seconds: float = 1.0
    retry_cap_seconds: float = 3600.0
    timeout_seconds: float | None = None  # an attempt running longer fails as `timeout`
    cron: str | None = None  # a recurring job named after the task (UTC)
    concurrency_key: str | None = None  # payload field whose value limits concurrency
    concurrency_limit: int | None = None  # jobs per value running at once (default 1)
    rate_limit: str | None = None  # "N/s", "N/m" or "N/h": starts per fixed window
    rate_key: str | None = None  # payload field whose value has its own window

    def __post_init__(self) -> None:
        if self.rate_limit is not None:
            parse_rate_limit(self.rate_limit, self.name)
        elif self.rate_key is not None:
            raise ValueError(f"task {self.name!r}: rate_key needs a rate_limit")
        if self.timeout_seconds is not None and not self.timeout_seconds > 0:
            raise ValueError(f"task {self.name!r}: timeout_seconds must be positive")
        if self.concurrency_limit is not None:
            if self.concurrency_key is None:
                raise ValueError(f"task {self.name!r}: concurrency_limit needs a concurrency_key")
            if (
                isinstance(self.concurrency_limit, bool)
                or not isinstance(self.concurrency_limit, int)
                or self.concurrency_limit < 1
            ):
                raise ValueError(f"task {self.name!r}: concurrency_limit must be a whole number >= 1")
        if self.concurrency_key is not None and self.concurrency_limit is None:
            object.__setattr__(self, "concurrency_limit", 1)
        if self.cron is not None:
            from .recurring import parse_cron

            parse_cron(self.cron)  # a bad expression fails at import, not at the first tick

    @cached_property
    def is_coroutine(self) -> bool:
        """An `async def` handler: it runs on the worker's event loop, not on a thread."""
        return inspect.iscoroutinefunction(self.handler)


RATE_PERIODS = {"s": 1, "m": 60, "h": 3600}


def parse_rate_limit(text: str, task_name: str = "?") -> tuple[int, int]:
    """ "100/m" -> (100, 60): starts allowed per window, and the window's length in seconds."""
    count, _, unit = text.partition("/") if isinstance(text, str) else ("", "", "")
    if not count.isdigit() or int(count) < 1 or unit not in RATE_PERIODS:
        raise ValueError(
            f"task {task_name!r}: rate_limit must be a positive whole number, '/' and s, m or h "
            f"(such as '100/m'), got {text!r}"
        )
    return int(count), RATE_PERIODS[unit]


def handled_elsewhere(payload: dict[str, Any], ctx: JobContext) -> Any:
    """The handler of a task this process knows only by name (registered by a worker, or
    enqueued with allow_unregistered): it runs in the workers that import it."""
    raise RuntimeError("this task's handler lives in the worker processes that import it")


class Registry:
    """Task names to their specs. `builtins`: a module of tasks this registry always has,
    imported on first look, so that every process knows them without importing anything."""

    def __init__(self, builtins: str | None = None) -> None:
        self._tasks: dict[str, TaskSpec] = {}
        self._lock = threading.Lock()
        self._builtins = builtins
        self._finders: list[Callable[[str], TaskSpec | None]] = []

    def add_finder(self, finder: Callable[[str], TaskSpec | None]) -> None:
        """`finder(name)` makes the spec of a task known by a name this process has not imported
        (jobqueue.django: a Django task by its module path), or answers None; asked on a miss."""
        with self._lock:
            if finder not in self._finders:
                self._finders.append(finder)

    def register(self, spec: TaskSpec) -> None:
        with self._lock:
            existing = self._tasks.get(spec.name)
            if existing is not None and existing.handler is not spec.handler:
                raise ValueError(f"task {spec.name!r} is already registered to {existing.handler!r}")
            self._tasks[spec.name] = spec

    def _load_builtins(self) -> None:
        if self._builtins is not None:
            import importlib

            module, self._builtins = self._builtins, None
            importlib.import_module(module)

    def get(self, name: str) -> TaskSpec | None:
        spec = self._tasks.get(name)
        if spec is None and self._builtins is not None:
            self._load_builtins()
            spec = self._tasks.get(name)
        if spec is None:
            for find in list(self._finders):
                spec = find(name)
                if spec is not None:
                    self.register(spec)
                    return self._tasks[name]
        return spec

    def names(self) -> list[str]:
        self._load_builtins()
        return sorted(self._tasks)

    def specs(self) -> list[TaskSpec]:
        self._load_builtins()
        return [self._tasks[name] for name in sorted(self._tasks)]

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self.get(name) is not None


TASKS = Registry(builtins="jobqueue.core.builtin_tasks")


class TaskFunction(Protocol):
    """A function made a task by @task: still callable as itself (in tests, say), and able to
    enqueue itself through the default client (`jobqueue.set_default`, else JobQueue.from_env())."""

    task_name: str

    def __call__(self, payload: dict[str, Any], ctx: JobContext) -> Any: ...

    def enqueue(self, task_key: str, payload: dict[str, Any] | None = None, **options: Any) -> Enqueued: ...


def task(
    name: str | None = None,
    *,
    queue: str = DEFAULT_QUEUE,
    max_attempts: int = DEFAULT_MAX_ATTEMPTS,
    retry_base_seconds: float = 1.0,
    retry_cap_seconds: float = 3600.0,
    timeout_seconds: float | None = None,
    cron: str | None = None,
    concurrency_key: str | None = None,
    concurrency_limit: int | None = None,
    rate_limit: str | None = None,
    rate_key: str | None = None,
    registry: Registry = TASKS,
) -> Callable[[Handler], TaskFunction]:
    """Register `fn(payload, ctx)` as the handler of task `name` (default: the function's name)."""

    def decorate(fn: Handler) -> TaskFunction:
        task_name = name or fn.__name__
        registry.register(
            TaskSpec(
                task_name,
                fn,
                queue,
                max_attempts,
                retry_base_seconds,
                retry_cap_seconds,
                timeout_seconds=timeout_seconds,
                cron=cron,
                concurrency_key=concurrency_key,
                concurrency_limit=concurrency_limit,
                rate_limit=rate_limit,
                rate_key=rate_key,
            )
        )

        def enqueue(task_key: str, payload: dict[str, Any] | None = None, **options: Any) -> Enqueued:
            from .client import default_client

            return default_client().enqueue(task_name, task_key, payload, **options)

        made = cast(TaskFunction, fn)
        made.task_name = task_name
        made.enqueue = enqueue  # type: ignore[method-assign]
        return made

    return decorate


_LAZY = threading.Lock()


class LeaseLost:
    """`ctx.lease_lost`: set when the attempt's lease is gone (reaped, taken by an operator, timed
    out), so that a long handler may stop early. threading.Event's is_set, set and wait, with the
    Event itself made only when a handler waits: most never look, and an Event per job was a
    twentieth of a busy worker's CPU."""

    __slots__ = ("_set", "_event")

    def __init__(self) -> None:
        self._set = False
        self._event: threading.Event | None = None

    def is_set(self) -> bool:
        return self._set

    def set(self) -> None:
        with _LAZY:
            self._set = True
            event = self._event
        if event is not None:
            event.set()

    def wait(self, timeout: float | None = None) -> bool:
        with _LAZY:
            if self._set:
                return True
            if self._event is None:
                self._event = threading.Event()
            event = self._event
        return event.wait(timeout)


@dataclass
class JobContext:
    """What a handler knows about the attempt it is running."""

    job_id: int
    task_key: str
    task_name: str
    queue: str
    attempt: int
    max_attempts: int
    worker_id: str
    _record_result: Callable[[Any], bool] = field(repr=False)
    lease_lost: LeaseLost | threading.Event = field(default_factory=LeaseLost, repr=False)
    _transaction: Callable[[], AbstractContextManager[Connection]] | None = field(default=None, repr=False)

    def transaction(self) -> AbstractContextManager[Connection]:
        """`with ctx.transaction() as conn:` a transaction on the queue's database in which this
        attempt's completion is written too. Leaving the block commits the handler's writes and
        marks the job done, together: if this attempt's lease is gone by then (reaped, requeued,
        failed, cancelled), nothing of it commits and LeaseLostError is raised. If the block
        raises, its writes roll back and the attempt is retried as usual.

        Use it for effects in this database; for effects elsewhere, `record_result` (keyed by
        task_key) is the way to stay idempotent."""
        if self._transaction is None:
            raise RuntimeError("ctx.transaction() needs a worker: this context was made by hand")
        return self._transaction()

    def record_result(self, result: Any) -> bool:
        """Store this task_key's downstream result, at most once.

        Returns True when the row was written, False when a result for this task_key already
        exists (a replay: logged as a duplicate result, nothing written). Refused with
        LeaseLostError when this attempt no longer holds the job's lease.
        """
        return self._record_result(result)

    async def arecord_result(self, result: Any) -> bool:
        """record_result for an `async def` handler: the write runs in a thread, so the worker's
        event loop goes on running the other coroutines meanwhile."""
        return await asyncio.to_thread(self._record_result, result)

    def atransaction(self) -> AbstractAsyncContextManager[Connection]:
        """`async with ctx.atransaction() as conn:` ctx.transaction() for an `async def` handler:
        it begins and commits in a thread. The connection is a plain (blocking) one: run its
        statements with `await asyncio.to_thread(conn.execute, ...)` so the loop is not held."""
        return self._atransaction()

    @asynccontextmanager
    async def _atransaction(self) -> AsyncIterator[Connection]:
        block = self.transaction()
        conn = await asyncio.to_thread(block.__enter__)
        try:
            yield conn
        except BaseException as exc:
            if not await asyncio.to_thread(block.__exit__, type(exc), exc, exc.__traceback__):
                raise
        else:
            await asyncio.to_thread(block.__exit__, None, None, None)


__all__ = [
    "DEFAULT_MAX_ATTEMPTS",
    "DEFAULT_QUEUE",
    "Handler",
    "JobContext",
    "LeaseLost",
    "LeaseLostError",
    "Registry",
    "TASKS",
    "TaskFunction",
    "TaskSpec",
    "task",
]
