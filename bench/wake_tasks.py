"""The `wake` task for the wake-up latency measurement: records when its handler started.

In the harness's own process the times land in STARTED (in-process worker); in a worker
subprocess (`--tasks bench.wake_tasks`) each start is appended to $BENCH_WAKE_FILE as
"<task_key> <time.time()>".
"""

from __future__ import annotations

import os
import threading
import time

from jobqueue.core.tasks import task

STARTED: dict[str, float] = {}
CHANGED = threading.Condition()


@task("wake")
def wake(payload, ctx) -> None:
    now = time.time()
    path = os.environ.get("BENCH_WAKE_FILE")
    if path:
        with open(path, "a") as fh:
            fh.write(f"{ctx.task_key} {now:.6f}\n")
    with CHANGED:
        STARTED[ctx.task_key] = now
        CHANGED.notify_all()
