"""task_definition: what the workers registered, so that any process can enqueue by name.

A worker writes its tasks when it registers (`register_tasks`, in register_process's transaction).
A producer that does not import a task's handler finds the task here (`KnownTasks`): its queue,
attempts and concurrency key come from the worker's code, and a name no worker registered is
still refused, unless the caller says it is expected (validation.new_job's `allow_unregistered`)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from ..db import db_now
from ..schema import task_definition
from ..tasks import TASKS, Registry, TaskSpec, handled_elsewhere
from .common import upsert

td = task_definition.c


def register_tasks(c: Connection, process_id: str, specs: Iterable[TaskSpec]) -> None:
    """Upsert the tasks this process can run (in the caller's transaction)."""
    for spec in specs:
        values = dict(
            name=spec.name,
            queue=spec.queue,
            max_attempts=spec.max_attempts,
            concurrency_key=spec.concurrency_key,
            concurrency_limit=spec.concurrency_limit,
            rate_limit=spec.rate_limit,
            rate_key=spec.rate_key,
            registered_by=process_id[:64],
            registered_at=db_now(),
        )
        upsert(
            c, task_definition, ["name"], values, {k: (lambda new, k=k: getattr(new, k)) for k in values if k != "name"}
        )


class KnownTasks(Registry):
    """The tasks this process registered, then those the workers registered (read on a miss,
    kept `ttl` seconds).

    `source` is a Connection (the read joins its transaction, or ends the one it began) or an
    Engine (each read on a connection of its own)."""

    def __init__(self, source: Connection | Engine, *, base: Registry = TASKS, ttl: float = 60.0) -> None:
        super().__init__()
        self.source = source
        self.base = base
        self.ttl = ttl
        self._found: dict[str, tuple[float, TaskSpec]] = {}
        self._cache_lock = threading.Lock()

    def get(self, name: str) -> TaskSpec | None:
        spec = self.base.get(name)
        if spec is not None:
            return spec
        with self._cache_lock:
            cached = self._found.get(name)
        if cached is not None and time.monotonic() - cached[0] < self.ttl:
            return cached[1]
        rows = self._read(sa.select(task_definition).where(td.name == name))
        if rows:
            row = rows[0]
            spec = TaskSpec(
                name,
                handled_elsewhere,
                row.queue,
                row.max_attempts,
                concurrency_key=row.concurrency_key,
                concurrency_limit=row.concurrency_limit,
                rate_limit=row.rate_limit,
                rate_key=row.rate_key,
            )
            with self._cache_lock:
                self._found[name] = (time.monotonic(), spec)
            return spec
        return None

    def names(self) -> list[str]:
        return sorted(set(self.base.names()) | {row.name for row in self._read(sa.select(td.name))})

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self.get(name) is not None

    def _read(self, statement) -> list:
        if isinstance(self.source, Engine):
            with self.source.connect() as c:
                return c.execute(statement).all()
        c = self.source
        began = not c.in_transaction()
        try:
            return c.execute(statement).all()
        finally:
            if began:  # leave the connection as it was: the enqueue's own transaction is next
                c.rollback()
