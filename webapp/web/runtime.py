"""Embedded workers and the reaper inside a web process, scheduled by APScheduler.

Nothing starts at import or in a gunicorn master: `start()` is called in each worker process
after the fork (see gunicorn_conf.py), and `stop()` on its way out, which releases unfinished
jobs just as a standalone worker does on SIGTERM. Several web processes with embedded workers
are safe: SKIP LOCKED arbitrates between them like between any workers.
"""

from __future__ import annotations

import logging
import threading
import time
from datetime import datetime, timedelta, timezone

from apscheduler.schedulers.background import BackgroundScheduler
from sqlalchemy.engine import Engine

from ..core import preflight, repository
from ..core.errors import UnsupportedDatabase
from ..core.logs import event
from ..core.reaper import Reaper
from ..core.worker import DB_ERRORS, Worker, WorkerConfig
from .config import WebSettings

log = logging.getLogger("jobqueue.web.runtime")

POLL_SECONDS = 1.0          # the poll job's slice; it waits on wake-ups inside it
STATS_RETENTION = timedelta(days=7)
PROCESS_RETENTION = timedelta(days=1)


class Runtime:
    def __init__(self, engine: Engine, settings: WebSettings):
        self.engine = engine
        self.settings = settings
        self.worker: Worker | None = None
        self.reaper = Reaper(engine, name="web-reaper")
        self.scheduler: BackgroundScheduler | None = None
        self._lock = threading.Lock()
        self._last_prune = 0.0
        self._next_poll_at = 0.0
        self._checked = False
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
                    reap_in_loop=False, kind="embedded", name="web", grace_seconds=self.settings.grace_seconds))
                self.worker.start_threads()
                scheduler.add_job(self._poll, "interval", seconds=POLL_SECONDS, id="jobqueue-poll",
                                  next_run_time=datetime.now(timezone.utc))
            reap_every = min(15.0, max(1.0, self.settings.lease_seconds / 4))
            scheduler.add_job(self._reap, "interval", seconds=reap_every, id="jobqueue-reaper",
                              next_run_time=datetime.now(timezone.utc))
            scheduler.start()
            self.scheduler = scheduler
        event(log, logging.INFO, "embedded_started", workers=n, reap_every=f"{reap_every:g}")

    def _verified(self) -> bool:
        """Claim and reap only on a server that passed preflight (as a standalone worker does
        before its first claim): never on a replica, with statement binlogs or on MyISAM."""
        if self._checked:
            return self.refused is None
        try:
            preflight.require_supported(self.engine)
        except UnsupportedDatabase as exc:
            self.refused = str(exc)
            event(log, logging.ERROR, "worker_refused", worker="embedded", reason=self.refused)
        except DB_ERRORS as exc:
            event(log, logging.ERROR, "sql_error", operation="preflight", error=f"{type(exc).__name__}: {exc}"[:300])
            return False  # try again next round
        self._checked = True
        return self.refused is None

    def _poll(self) -> None:
        """One slice of the worker loop: claim while there is work and free slots, and sleep on
        the wake-up event (enqueue in this process, a slot finishing) when there is not."""
        if not self._verified():
            return
        worker = self.worker
        deadline = time.monotonic() + POLL_SECONDS * 0.95
        while worker is not None and time.monotonic() < deadline:
            # The backoff outlives the slice: an idle worker does not claim at every slice start.
            wait = self._next_poll_at - time.monotonic()
            if wait > 0 and not worker.wait_for_wake(min(wait, max(0.0, deadline - time.monotonic()))):
                continue
            delay = worker.run_once()
            if delay is None:
                return
            self._next_poll_at = time.monotonic() + delay

    def _reap(self) -> None:
        if not self._verified():
            return
        try:
            self.reaper.run_once()
            if time.monotonic() - self._last_prune > 3600:
                self._last_prune = time.monotonic()
                now = datetime.now(timezone.utc).replace(tzinfo=None)
                with self.engine.connect() as conn:
                    repository.prune_history(conn, stats_older_than=now - STATS_RETENTION,
                                             processes_silent_since=now - PROCESS_RETENTION)
        except DB_ERRORS as exc:
            event(log, logging.ERROR, "sql_error", operation="reap", error=f"{type(exc).__name__}: {exc}"[:300])

    def stop(self) -> None:
        with self._lock:
            scheduler, self.scheduler = self.scheduler, None
        if scheduler is None:
            return
        if self.worker is not None:
            self.worker.stop("web process stopping")
        scheduler.shutdown(wait=True)
        if self.worker is not None:
            self.worker.shutdown()
        event(log, logging.INFO, "embedded_stopped")
