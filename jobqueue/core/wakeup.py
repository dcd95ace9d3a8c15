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


_listeners: "weakref.WeakSet[Wake]" = weakref.WeakSet()
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
