"""Retention: how an install that runs for months keeps its tables small.

Finished jobs are deleted once they are old enough: `done` after JOBQUEUE_KEEP_DONE_DAYS (7),
`failed` and `cancelled` after JOBQUEUE_KEEP_FAILED_DAYS (30); 0 keeps them forever. Their
attempts and results go with them. Their task_keys do not: each is kept in `pruned_key` for
JOBQUEUE_KEEP_KEYS_DAYS (365) after the prune, so a replay of a pruned job's key still answers
`duplicate: true` and never runs again (see docs/operations.md, Retention, for what that costs).
Finished batches follow once their members are gone and their callbacks have finished, by the
same keep times; what each was stays in `pruned_batch` as long, so opening its key again finds
the finished batch and fires nothing (repository/retention.py).

Every worker process takes part, standalone or embedded: its maintenance starts a pass in a
thread of its own when no process has started one for `every_seconds` (the prune_run table says,
by the database clock), so one process usually does the work and the others skip. A pass deletes
in batches of at most 1,000 rows, each one short transaction locking its rows by primary key with
SKIP LOCKED, and pauses between batches as long as the batch took, so claims going on meanwhile
keep most of their throughput and replicas see no burst. `jobqueue prune` runs the same pass by
hand. The pass also drops old per-minute activity and dead process rows (repository.maintenance.prune_history).
"""

from __future__ import annotations

import logging
import threading
import time
from datetime import timedelta

from sqlalchemy.engine import Engine

from . import repository, service
from .logs import event
from .settings import Settings, current

log = logging.getLogger("jobqueue.retention")

PRUNE_EVERY_SECONDS = 3600.0
CHECK_SECONDS = 60.0  # the longest a process waits before asking again after an error
PRUNE_LOG_RETENTION = timedelta(days=30)


class Pruner:
    """One process's share of retention: `maybe_start()` from a maintenance step (cheap: it
    looks at the database when a pass may be due, and at most every CHECK_SECONDS), the pass
    itself in a daemon thread."""

    def __init__(
        self,
        engine: Engine,
        *,
        name: str = "pruner",
        every_seconds: float = PRUNE_EVERY_SECONDS,
        settings: Settings | None = None,
        clock=time.monotonic,
    ):
        self.engine = engine
        self.name = name
        self.every_seconds = every_seconds
        self.settings = settings
        self.clock = clock
        self._next_check = float("-inf")
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self.last: repository.retention.PruneCounts | None = None

    def maybe_start(self) -> bool:
        """Start a pass in the background if one is due and none runs here. True when started.

        Whether one is due is asked here, in the caller's thread (one short read on the
        connection the caller's own work uses in turn), not in a thread of its own: a thread
        asking while an idle worker's loop swept took a second pooled connection (and its set-up
        statements) for a question nearly always answered no. The answer says when the next pass
        falls due (`every_seconds` after the last one any process started), and nobody asks again
        before then: an idle worker asks once an hour, not once a minute."""
        if self._stop.is_set() or (self._thread is not None and self._thread.is_alive()):
            return False
        now = self.clock()
        if now < self._next_check:
            return False
        self._next_check = now + min(self.every_seconds, CHECK_SECONDS)  # after an error, or when due
        try:
            with self.engine.connect() as conn:
                wait = repository.retention.prune_due_in(conn, self.every_seconds)
        except Exception as exc:  # a database error: counted and logged, asked again later
            self._failed(exc)
            return False
        if wait > 0:
            self._next_check = now + max(wait, min(self.every_seconds, CHECK_SECONDS))
            return False
        self._next_check = now + self.every_seconds  # the next pass is due that long after this one
        self._thread = threading.Thread(target=self._run, name="jobqueue-pruner", daemon=True)
        self._thread.start()
        return True

    def _run(self) -> None:
        try:
            self.run_once()
        except Exception as exc:  # a database error: counted and logged, tried again later
            self._failed(exc)

    def _failed(self, exc: Exception) -> None:
        from . import metrics

        self._next_check = min(self._next_check, self.clock() + min(self.every_seconds, CHECK_SECONDS))

        metrics.SQL_ERRORS.labels(operation="prune").inc()
        event(
            log,
            logging.ERROR,
            "sql_error",
            operation="prune",
            by=self.name,
            error=f"{type(exc).__name__}: {str(getattr(exc, 'orig', None) or exc)[:300]}",
        )

    def run_if_due(self) -> repository.retention.PruneCounts | None:
        """One pass now if no process started one within `every_seconds`."""
        with self.engine.connect() as conn:
            if not repository.retention.prune_due(conn, self.every_seconds):
                return None
        return self.run_once()

    def run_once(self) -> repository.retention.PruneCounts:
        settings = self.settings or current()
        with self.engine.connect() as conn:
            counts = service.prune(
                conn,
                done_days=settings.keep_done_days,
                failed_days=settings.keep_failed_days,
                keys_days=settings.keep_keys_days,
                by=self.name,
                stop=self._stop.is_set,
                sleep=self._stop.wait,
            )
            repository.maintenance.prune_history(conn)
            repository.retention.forget_prune_runs(conn, PRUNE_LOG_RETENTION)
        self.last = counts
        return counts

    def stop(self, timeout: float = 10.0) -> None:
        """Stop a pass between two batches (a shutdown) and wait for it."""
        self._stop.set()
        thread = self._thread
        if thread is not None and thread.is_alive() and thread is not threading.current_thread():
            thread.join(timeout)
