"""The worker's event loop for `async def` handlers: one thread running one asyncio loop, every
coroutine handler of the process on it. Started by the first coroutine job, so that a worker
with only plain handlers starts nothing."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Coroutine
from typing import Any


class EventLoop:
    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def submit(self, coro: Coroutine[Any, Any, None]) -> concurrent.futures.Future[None]:
        with self._lock:
            if self._loop is None:
                self._loop = asyncio.new_event_loop()
                self._thread = threading.Thread(target=self._loop.run_forever, name="jobqueue-event-loop", daemon=True)
                self._thread.start()
            return asyncio.run_coroutine_threadsafe(coro, self._loop)

    def stop(self, wait: float) -> None:
        """Let the coroutines still on the loop end (those of released jobs were cancelled and
        only forget their lease) for up to `wait` seconds, cancel the rest, stop the thread."""
        with self._lock:
            loop, thread, self._loop = self._loop, self._thread, None
        if loop is None or thread is None:
            return

        async def wind_down() -> None:
            tasks = asyncio.all_tasks() - {asyncio.current_task()}
            if tasks:
                _, pending = await asyncio.wait(tasks, timeout=wait)
                for t in pending:
                    t.cancel()
            await loop.shutdown_default_executor()

        try:
            asyncio.run_coroutine_threadsafe(wind_down(), loop).result(wait + 5)
        except (concurrent.futures.TimeoutError, concurrent.futures.CancelledError):
            pass
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
        if not thread.is_alive():
            loop.close()
