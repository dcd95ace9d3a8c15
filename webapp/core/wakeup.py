"""In-process wake-ups: an enqueue (or a reaped or promoted job) wakes this process's idle workers
at once instead of letting them sleep out their backoff. Other processes find new work on their
next poll."""

from __future__ import annotations

import threading
import weakref

_listeners: "weakref.WeakSet[threading.Event]" = weakref.WeakSet()
_lock = threading.Lock()


def subscribe() -> threading.Event:
    """An Event that is set on every notify(); keep a reference for as long as you listen."""
    ev = threading.Event()
    with _lock:
        _listeners.add(ev)
    return ev


def notify() -> None:
    with _lock:
        listeners = list(_listeners)
    for ev in listeners:
        ev.set()
