"""The worker's side of the doorbell (jobqueue/core/repository/doorbell.py): while the worker is
idle, a thread of its own sleeps on the server in a marked SLEEP that another process's enqueue
can end; when it does, the worker is woken as if the job had been enqueued in this process.

The worker says when it is idle (`idle()`, before a backoff sleep) and busy (`busy()`, after a
claim that took jobs). A SLEEP still running when the worker got busy is harmless: a ring then
only wakes a worker that is awake. Errors (a lost connection, a server restarting) make the thread
wait ERROR_PAUSE_SECONDS and try again on a new connection; the worker's own polling goes on
regardless, so the doorbell only ever makes pick-up faster, never slower.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence

from sqlalchemy.engine import Engine

from ..db import keep_when_idle, on_chosen_primary
from ..logs import RateLimited, event
from ..repository import doorbell as _doorbell
from ..wakeup import Wake

log = logging.getLogger("jobqueue.worker")
SLEEP_SECONDS = 30.0  # one statement per 30 s while idle; a ring ends it at once
ERROR_PAUSE_SECONDS = 5.0


class Doorbell(threading.Thread):
    def __init__(self, engine: Engine, queues: Sequence[str] | None, wake: Wake, stop: threading.Event, *, name: str):
        super().__init__(name=f"doorbell-{name}", daemon=True)
        self.engine = engine
        self.queues = list(queues) if queues else None
        self.wake = wake
        self.stop_event = stop
        self._idle = threading.Event()
        self._error_log = RateLimited(60.0)
        self.connection_id: int | None = None
        self._conn = None
        self.rings = 0

    def idle(self) -> None:
        self._idle.set()

    def busy(self) -> None:
        self._idle.clear()

    def run(self) -> None:
        while not self.stop_event.is_set():
            if not self._idle.wait(0.5):
                continue
            try:
                # Kept checked out while the worker lives, in autocommit (no ROLLBACK after each
                # SLEEP); taken from the pool once, not at every idle spell.
                if self._conn is None:
                    self._conn = self.engine.connect().execution_options(isolation_level="AUTOCOMMIT")
                    keep_when_idle(self.engine, self._conn.connection.dbapi_connection)
                    self.connection_id = int(self._conn.exec_driver_sql("SELECT CONNECTION_ID()").scalar())
                while not self.stop_event.is_set() and self._idle.is_set():
                    if not on_chosen_primary(self.engine, self._conn.connection.info):
                        self._drop()  # the engine moved to another candidate: listen there
                        break
                    if _doorbell.wait_for_ring(self._conn, SLEEP_SECONDS, self.queues):
                        self.rings += 1
                        event(log, logging.DEBUG, "doorbell_rung", worker=self.name)
                        self._idle.clear()
                        self.wake.new_work = True
                        self.wake.set()
            except Exception as exc:  # never let the thread die: the worker polls meanwhile
                if self.stop_event.is_set():
                    return
                if self._error_log.allow("error") is not None:
                    event(
                        log,
                        logging.WARNING,
                        "doorbell_error",
                        error=f"{type(exc).__name__}: {exc}"[:300],
                        detail=f"polling only; trying again in {ERROR_PAUSE_SECONDS:g} s",
                    )
                self._drop()
                self.stop_event.wait(ERROR_PAUSE_SECONDS)
        self._drop()

    def _drop(self) -> None:
        conn, self._conn, self.connection_id = self._conn, None, None
        if conn is not None:
            try:
                conn.invalidate()
                conn.close()
            except Exception:
                pass

    def hang_up(self) -> None:
        """End a SLEEP in progress (at shutdown), so the thread's connection goes back at once."""
        connection_id = self.connection_id
        if connection_id is None:
            return
        try:
            with self.engine.connect() as conn:
                _doorbell.ring(conn, [connection_id])
        except Exception:
            pass  # the process is exiting; its connections close with it
