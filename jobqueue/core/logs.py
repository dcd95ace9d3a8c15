"""One log line per queue event, as `event=... key=value` pairs an operator can grep.

`grep 'task_key=export-42 '` over the logs of every process tells that job's whole story.

A line costs the thread that logs it almost nothing: `event()` hands the logging module the
fields, and the text is made and written by a listener thread (`setup`'s QueueHandler and
QueueListener), off the worker's hot path. Two INFO lines per job used to cost a third of a
worker's throughput.
"""

from __future__ import annotations

import atexit
import functools
import logging
import os
import re
import sys
import threading
import time
from typing import Any

FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"
# Libraries whose INFO lines are about themselves, not the queue (APScheduler logs every run of
# every job: 87% of a quiet server's lines).
QUIET_LOGGERS = ("apscheduler", "alembic")


_NEEDS_QUOTES = re.compile(r'[ "=\n\r\t]')


def _format_value(value: Any) -> str:
    text = str(value)
    if text == "" or _NEEDS_QUOTES.search(text):
        return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\r", "\\r") + '"'
    return text


class EventMessage:
    """A log record's message that becomes `event=name k=v ...` only when a handler formats it."""

    __slots__ = ("name", "fields")

    def __init__(self, name: str, fields: dict[str, Any]):
        self.name = name
        self.fields = fields

    def __str__(self) -> str:
        return " ".join(
            [f"event={self.name}"]
            + [f"{key}={_format_value(value)}" for key, value in self.fields.items() if value is not None]
        )


class EventBatch:
    """Events of one name logged as one record: each becomes a line of its own, prefixed like any
    other line by `setup`'s formatter (EventFormatter), so the output is what one record per event
    would give, at a fraction of the cost (a worker finishing 32 jobs makes one record, not 32)."""

    __slots__ = ("name", "each")

    def __init__(self, name: str, each: list[dict[str, Any]]):
        self.name = name
        self.each = each

    def lines(self) -> list[str]:
        return [str(EventMessage(self.name, fields)) for fields in self.each]

    def __str__(self) -> str:
        return "\n".join(self.lines())


class EventFormatter(logging.Formatter):
    """FORMAT, with an EventBatch written as one prefixed line per event."""

    def format(self, record: logging.LogRecord) -> str:
        if not isinstance(record.msg, EventBatch):
            return super().format(record)
        record.asctime = self.formatTime(record, self.datefmt)
        # The prefix (and whatever follows the message) made once for all the batch's lines.
        record.message = "\0"
        before, _, after = self.formatMessage(record).partition("\0")
        lines = record.msg.lines()
        record.message = "\n".join(lines)
        return "\n".join([before + line + after for line in lines])


def event(logger: logging.Logger, level: int, name: str, **fields: Any) -> None:
    if logger.isEnabledFor(level):
        logger.log(level, EventMessage(name, fields))


def events(logger: logging.Logger, level: int, name: str, each: list[dict[str, Any]]) -> None:
    """One `name` event per item of `each` (a line each), logged as one record."""
    if each and logger.isEnabledFor(level):
        logger.log(level, EventBatch(name, each) if len(each) > 1 else EventMessage(name, each[0]))


_listener = None
_direct: logging.Handler | None = None
_setup_lock = threading.Lock()


def setup(level: str | int = "INFO", stream=None, *, threaded: bool = True) -> None:
    """Log to standard error (or `stream`) at `level`, through a listener thread (`threaded`, for
    long-running processes) or directly (a one-shot command, which logs a line or two). Idempotent:
    a second call only changes the level, or moves a direct setup to a threaded one."""
    global _listener, _direct
    root = logging.getLogger()
    root.setLevel(level.upper() if isinstance(level, str) else level)
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)
    with _setup_lock:
        if _listener is not None or (_direct is not None and not threaded):
            return
        out = logging.StreamHandler(stream or sys.stderr)
        out.setFormatter(EventFormatter(FORMAT))
        if not threaded:
            _direct = out
            root.addHandler(out)
            return
        if _direct is not None:
            root.removeHandler(_direct)
            _direct = None
        import queue
        from logging import handlers

        class InProcessQueueHandler(handlers.QueueHandler):
            # QueueHandler formats each record in the caller's thread (to make it picklable for
            # other processes); ours stays in this process, so the listener thread formats.
            def prepare(self, record: logging.LogRecord) -> logging.LogRecord:
                return record

        records: queue.SimpleQueue = queue.SimpleQueue()
        _listener = _Listener(records, out)
        _listener.start()
        _listener.queue_handler = InProcessQueueHandler(records)
        root.addHandler(_listener.queue_handler)
        atexit.register(flush)
        # Threads do not survive fork(): a child (a gunicorn worker of a preloaded app) gets a
        # listener of its own for the same queue.
        os.register_at_fork(after_in_child=_listen_again)


@functools.lru_cache(maxsize=1)
def _listener_class():
    from logging import handlers

    class Listener(handlers.QueueListener):
        """Writes what was logged meanwhile in one go, then pauses a moment before looking again:
        a worker logging a line per job wakes this thread (and pays a thread switch) at most
        1/PAUSE times a second instead of once per record. A line waits at most PAUSE seconds."""

        PAUSE = 0.02

        def __init__(self, records, out: logging.StreamHandler):
            super().__init__(records, out, respect_handler_level=False)
            self.out = out

        def _monitor(self) -> None:
            import queue

            while True:
                batch = [self.queue.get()]
                try:
                    while True:
                        batch.append(self.queue.get_nowait())
                except queue.Empty:
                    pass
                records = [r for r in batch if r is not self._sentinel]
                if records:
                    self._write(records)
                if len(records) < len(batch):
                    return
                time.sleep(self.PAUSE)

        def _write(self, records: list[logging.LogRecord]) -> None:
            out = self.out
            try:
                text = "".join(out.format(r) + out.terminator for r in records)
                with out.lock:
                    out.stream.write(text)
                    out.flush()
            except Exception:  # what logging does: report on stderr, never raise into the app
                out.handleError(records[0])

    return Listener


def _Listener(records, out: logging.StreamHandler):
    return _listener_class()(records, out)


def _listen_again() -> None:
    global _listener
    if _listener is not None:
        old = _listener
        _listener = _Listener(old.queue, old.out)
        _listener.queue_handler = old.queue_handler
        _listener.start()


def flush() -> None:
    """Write out every line logged so far (at exit, and before a process replaces itself)."""
    global _listener
    with _setup_lock:
        listener, _listener = _listener, None
    if listener is not None:
        listener.stop()
        logging.getLogger().removeHandler(listener.queue_handler)


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
