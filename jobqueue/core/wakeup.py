"""In-process wake-ups: an enqueue (or a reaped or promoted job) wakes this process's idle workers
at once instead of letting them sleep out their backoff. Other processes find new work on their
next poll."""

from __future__ import annotations

import threading
import weakref


class Wake(threading.Event):
    """An Event that also remembers whether new work was announced (as opposed to the worker's
    own reasons to wake up, such as a slot coming free)."""

    def __init__(self) -> None:
        super().__init__()
        self.new_work = False


_listeners: weakref.WeakSet[Wake] = weakref.WeakSet()
_lock = threading.Lock()


def subscribe() -> Wake:
    """A Wake that is set on every notify(); keep a reference for as long as you listen."""
    ev = Wake()
    with _lock:
        _listeners.add(ev)
    return ev


def notify() -> None:
    with _lock:
        listeners = list(_listeners)
    for ev in listeners:
        ev.new_work = True
        ev.set()


# --- results awaited in this process (JobQueue.result, the API's long poll) ----------------------
# A waiter polls the database about once a second; a completion this process makes itself wakes it
# at once. A process where nobody waits pays one dict check per completion batch.

_awaited: dict[str, set[threading.Event]] = {}


class awaiting:
    """`with awaiting(task_key) as done:` an Event set when this process finishes that job."""

    def __init__(self, task_key: str) -> None:
        self.task_key = task_key
        self.event = threading.Event()

    def __enter__(self) -> threading.Event:
        with _lock:
            _awaited.setdefault(self.task_key, set()).add(self.event)
        return self.event

    def __exit__(self, *exc: object) -> None:
        with _lock:
            events = _awaited.get(self.task_key)
            if events is not None:
                events.discard(self.event)
                if not events:
                    del _awaited[self.task_key]


def results_awaited() -> bool:
    return bool(_awaited)


def finished(task_keys: list[str]) -> None:
    """These jobs ended (done or failed for good): wake whoever awaits them here."""
    with _lock:
        events = [ev for key in task_keys for ev in _awaited.get(key, ())]
    for ev in events:
        ev.set()
