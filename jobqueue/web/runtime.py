"""Embedded workers and the reaper inside a web process, scheduled by APScheduler.

What the scheduler runs is the worker's own loop (one long job, `Worker.run`, the same loop a
standalone `jobqueue worker` runs) and the maintenance steps on the intervals
jobqueue/core/worker/maintenance.py sets for them (reap, recurring, prune), each after checking
that the server may run them. Nothing starts at import
or in a gunicorn master: `start()` is called in each worker process after the fork (see
gunicorn_conf.py), and `stop()` on its way out, which releases unfinished jobs just as a
standalone worker does on SIGTERM. Several web processes with embedded workers are safe: SKIP
LOCKED arbitrates between them like between any workers.
"""

from __future__ import annotations

import logging
import threading
import time
from datetime import UTC, datetime

from apscheduler.schedulers.background import BackgroundScheduler
from sqlalchemy.engine import Engine

from ..core import preflight
from ..core.errors import UnsupportedDatabase
from ..core.logs import event
from ..core.worker import DB_ERRORS, Worker, WorkerConfig
from ..core.worker.maintenance import Maintenance, Timed, reap_interval
from .config import WebSettings

log = logging.getLogger("jobqueue.web.runtime")


class Runtime:
    def __init__(self, engine: Engine, settings: WebSettings):
        self.engine = engine
        self.settings = settings
        self.worker: Worker | None = None
        self.maintenance = Maintenance(
            engine,
            name="web",
            on_error=_sql_error,
            settings=settings.core,
            reap_every=reap_interval(settings.lease_seconds),
        )
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
            scheduler = BackgroundScheduler(
                timezone=UTC, job_defaults={"coalesce": True, "max_instances": 1, "misfire_grace_time": 30}
            )
            n = self.settings.embedded_workers
            if n > 0:
                self.worker = Worker(
                    self.engine,
                    WorkerConfig(
                        concurrency=n,
                        queues=self.settings.embedded_queues,
                        lease_seconds=self.settings.lease_seconds,
                        reap_in_loop=False,
                        kind="embedded",
                        name="web",
                        grace_seconds=self.settings.grace_seconds,
                        # A web process outlives a failover: wait for a writable primary.
                        refuse_read_only_at_start=False,
                    ),
                )
                scheduler.add_job(self._run_worker, id="jobqueue-worker", next_run_time=datetime.now(UTC))
            for step in self.maintenance.timed():
                scheduler.add_job(
                    self._run_step,
                    "interval",
                    args=(step,),
                    seconds=step.every,
                    id=f"jobqueue-{step.name}",
                    next_run_time=datetime.now(UTC) if step.at_start else None,
                )
            scheduler.start()
            self.scheduler = scheduler
        event(log, logging.INFO, "embedded_started", workers=n, reap_every=f"{self.maintenance.reap_every:g}")

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

    def _run_step(self, step: Timed) -> None:
        if (step.preflight or self.refused is not None) and not self._verified():
            return
        step.run()

    def stop(self) -> None:
        with self._lock:
            scheduler, self.scheduler = self.scheduler, None
        if scheduler is None:
            return
        if self.worker is not None:
            self.worker.stop("web process stopping")
        self.maintenance.stop(timeout=0)  # a retention pass in progress stops after its current batch
        # Waits for the worker's loop to return: its shutdown releases what is still running.
        scheduler.shutdown(wait=True)
        event(log, logging.INFO, "embedded_stopped")


def _sql_error(operation: str, exc: BaseException) -> None:
    event(log, logging.ERROR, "sql_error", operation=operation, error=f"{type(exc).__name__}: {exc}"[:300])
