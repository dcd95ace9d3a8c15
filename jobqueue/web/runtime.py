"""Embedded workers and the reaper inside a web process, scheduled by APScheduler.

What the scheduler runs is the worker's own loop (one long job, `Worker.run`, the same loop a
standalone `jobqueue worker` runs), the reaper's pass on an interval, the recurring jobs' check
every second (it reads the database only when a tick is due, or every 30 s) and, when due, a
retention pass (see jobqueue/core/retention.py). Nothing starts at import
or in a gunicorn master: `start()` is called in each worker process after the fork (see
gunicorn_conf.py), and `stop()` on its way out, which releases unfinished jobs just as a
standalone worker does on SIGTERM. Several web processes with embedded workers are safe: SKIP
LOCKED arbitrates between them like between any workers.
"""

from __future__ import annotations

import logging
import threading
import time
from datetime import datetime, timezone

from apscheduler.schedulers.background import BackgroundScheduler
from sqlalchemy.engine import Engine

from ..core import preflight
from ..core.errors import UnsupportedDatabase
from ..core.logs import event
from ..core.reaper import Reaper
from ..core.recurring import RecurringRunner
from ..core.retention import Pruner
from ..core.worker import DB_ERRORS, Worker, WorkerConfig
from .config import WebSettings

log = logging.getLogger("jobqueue.web.runtime")

PRUNE_CHECK_SECONDS = 60


class Runtime:
    def __init__(self, engine: Engine, settings: WebSettings):
        self.engine = engine
        self.settings = settings
        self.worker: Worker | None = None
        self.reaper = Reaper(engine, name="web-reaper")
        self.recurring = RecurringRunner(engine, name="web")
        self.pruner = Pruner(engine, name="web", settings=settings.core)
        self.scheduler: BackgroundScheduler | None = None
        self._lock = threading.Lock()
        self.refused: str | None = None

    @property
    def started(self) -> bool:
        return self.scheduler is not None

    def after_fork(self) -> None:
        # Connections inherited from a parent process belong to it: drop them without closing.
        self.engine.dispose(close=False)

    def start(self) -> None:
        with self._lock:
            if self.scheduler is not None:
                return
            scheduler = BackgroundScheduler(timezone=timezone.utc, job_defaults={
                "coalesce": True, "max_instances": 1, "misfire_grace_time": 30})
            n = self.settings.embedded_workers
            if n > 0:
                self.worker = Worker(self.engine, WorkerConfig(
                    concurrency=n, queues=self.settings.embedded_queues, lease_seconds=self.settings.lease_seconds,
                    reap_in_loop=False, kind="embedded", name="web", grace_seconds=self.settings.grace_seconds,
                    # A web process outlives a failover: wait for a writable primary.
                    refuse_read_only_at_start=False))
                scheduler.add_job(self._run_worker, id="jobqueue-worker", next_run_time=datetime.now(timezone.utc))
            reap_every = min(15.0, max(1.0, self.settings.lease_seconds / 4))
            scheduler.add_job(self._reap, "interval", seconds=reap_every, id="jobqueue-reaper",
                              next_run_time=datetime.now(timezone.utc))
            scheduler.add_job(self._recurring, "interval", seconds=1, id="jobqueue-recurring",
                              next_run_time=datetime.now(timezone.utc))
            scheduler.add_job(self._prune, "interval", seconds=PRUNE_CHECK_SECONDS, id="jobqueue-prune")
            scheduler.start()
            self.scheduler = scheduler
        event(log, logging.INFO, "embedded_started", workers=n, reap_every=f"{reap_every:g}")

    def wait_running(self, timeout: float = 10.0) -> bool:
        """Until the embedded worker has finished its first turn (and logged what it found), so
        that whoever waits (gunicorn_conf's banner) comes after its start-up lines."""
        deadline = time.monotonic() + timeout
        while self.worker is not None and self.worker.state == "starting":
            if time.monotonic() > deadline:
                return False
            time.sleep(0.02)
        return True

    def _run_worker(self) -> None:
        code = self.worker.run()
        if code:
            self.refused = self.worker.state_detail

    def _verified(self) -> bool:
        """Reap only on a server that passes preflight (as a worker does before its first claim):
        never on a replica, with statement binlogs or on MyISAM."""
        try:
            preflight.require_supported(self.engine)
        except UnsupportedDatabase as exc:
            if self.refused != str(exc):
                event(log, logging.ERROR, "reaper_refused", reason=str(exc))
            self.refused = str(exc)
            return False
        except DB_ERRORS as exc:
            event(log, logging.ERROR, "sql_error", operation="preflight", error=f"{type(exc).__name__}: {exc}"[:300])
            return False
        self.refused = None
        return True

    def _reap(self) -> None:
        if not self._verified():
            return
        try:
            self.reaper.run_once()
        except DB_ERRORS as exc:
            event(log, logging.ERROR, "sql_error", operation="reap", error=f"{type(exc).__name__}: {exc}"[:300])

    def _recurring(self) -> None:
        if self.refused is not None and not self._verified():
            return
        try:
            self.recurring.tick()
        except DB_ERRORS as exc:
            event(log, logging.ERROR, "sql_error", operation="recurring", error=f"{type(exc).__name__}: {exc}"[:300])

    def _prune(self) -> None:
        """A retention pass in the scheduler's thread when no process started one lately."""
        if not self._verified():
            return
        try:
            self.pruner.run_if_due()
        except DB_ERRORS as exc:
            event(log, logging.ERROR, "sql_error", operation="prune", error=f"{type(exc).__name__}: {exc}"[:300])

    def stop(self) -> None:
        with self._lock:
            scheduler, self.scheduler = self.scheduler, None
        if scheduler is None:
            return
        if self.worker is not None:
            self.worker.stop("web process stopping")
        self.pruner.stop(timeout=0)   # a pass in progress stops after its current batch
        # Waits for the worker's loop to return: its shutdown releases what is still running.
        scheduler.shutdown(wait=True)
        event(log, logging.INFO, "embedded_stopped")
