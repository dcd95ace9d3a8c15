"""Ringing other processes' idle workers after an enqueue (the mechanism and why it is safe:
jobqueue/core/repository/doorbell.py).

Per process and engine, the list of sleepers is read at most every REFRESH_SECONDS, and only when
a ready job was just enqueued; a sleeper rung is dropped from the list until the next read (it is
awake, claiming). So a process enqueueing all the time sends at most a couple of process-list
reads a second, and KILL QUERY only to workers that really sleep. Anything the server refuses
(no privilege to see or kill the sleepers, an old server) switches ringing off for
OFF_SECONDS in this process: the workers' own polling still finds the jobs.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections.abc import Iterable
from dataclasses import dataclass, field

from sqlalchemy.engine import Engine
from sqlalchemy.exc import SQLAlchemyError

from .logs import RateLimited, event
from .repository import doorbell as _doorbell

log = logging.getLogger("jobqueue.doorbell")
REFRESH_SECONDS = 0.5
OFF_SECONDS = 60.0


@dataclass
class _State:
    lock: threading.Lock = field(default_factory=threading.Lock)
    read_at: float = float("-inf")
    sleepers: list[_doorbell.Sleeper] = field(default_factory=list)
    off_until: float = float("-inf")


_states: weakref.WeakKeyDictionary[Engine, _State] = weakref.WeakKeyDictionary()
_states_lock = threading.Lock()
_refused_log = RateLimited(600.0)


def _state(engine: Engine) -> _State:
    with _states_lock:
        state = _states.get(engine)
        if state is None:
            state = _states[engine] = _State()
        return state


def ring_for(engine: Engine, queues: Iterable[str]) -> int:
    """Wake the sleeping workers (of any process) that serve one of `queues`. Returns how many
    were rung; never raises."""
    if engine.dialect.name not in ("mysql", "mariadb"):
        return 0
    state = _state(engine)
    wanted = set(queues)
    now = time.monotonic()
    with state.lock:
        if now < state.off_until:
            return 0
        try:
            # No connection at all while the list is fresh and nobody it names is due: the
            # common case of a process that enqueues all the time while the workers are busy.
            if now - state.read_at >= REFRESH_SECONDS:
                with engine.connect() as conn:
                    state.sleepers = _doorbell.sleepers(conn)
                state.read_at = now
            due = [s for s in state.sleepers if any(s.serves(q) for q in wanted)]
            if not due:
                return 0
            state.sleepers = [s for s in state.sleepers if s not in due]
            with engine.connect() as conn:
                return _doorbell.ring(conn, [s.connection_id for s in due])
        except SQLAlchemyError as exc:
            state.off_until = now + OFF_SECONDS
            if _refused_log.allow("refused") is not None:
                event(
                    log,
                    logging.WARNING,
                    "doorbell_off",
                    seconds=OFF_SECONDS,
                    reason=f"{type(exc).__name__}: {exc}"[:300],
                    detail="other processes' idle workers find new jobs on their next poll instead",
                )
            return 0


__all__ = ["REFRESH_SECONDS", "ring_for"]
