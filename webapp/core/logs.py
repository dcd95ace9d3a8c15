"""One log line per queue event, as `event=... key=value` pairs an operator can grep.

`grep 'task_key=export-42 '` over the logs of every process tells that job's whole story.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any


def _format_value(value: Any) -> str:
    text = str(value)
    if text == "" or any(ch in text for ch in ' "=\n\r\t'):
        return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\r", "\\r") + '"'
    return text


def event(logger: logging.Logger, level: int, name: str, **fields: Any) -> None:
    if not logger.isEnabledFor(level):
        return
    parts = [f"event={name}"]
    parts.extend(f"{key}={_format_value(value)}" for key, value in fields.items() if value is not None)
    logger.log(level, " ".join(parts))


class RateLimited:
    """Lets an event through at most once per `interval` seconds per key, and says how many were
    held back in between, so a quiet queue logs a heartbeat rather than a flood."""

    def __init__(self, interval: float):
        self.interval = interval
        self._last: dict[Any, float] = {}
        self._suppressed: dict[Any, int] = {}
        self._lock = threading.Lock()

    def allow(self, key: Any = None) -> int | None:
        """None when suppressed; otherwise the number suppressed since the last one let through."""
        now = time.monotonic()
        with self._lock:
            last = self._last.get(key)
            if last is not None and now - last < self.interval:
                self._suppressed[key] = self._suppressed.get(key, 0) + 1
                return None
            self._last[key] = now
            return self._suppressed.pop(key, 0)

    def reset(self) -> None:
        """Forget the past: the next event of every key is let through."""
        with self._lock:
            self._last.clear()
            self._suppressed.clear()
