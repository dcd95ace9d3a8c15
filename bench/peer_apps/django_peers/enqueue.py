"""Enqueue N append jobs for the peer in $BENCH_PEER, keys j0..j<N-1>, and print
[single_s, batch_s, how the batch part was enqueued] as JSON: the first SINGLE one call each
(each its own transaction, autocommit), the rest in chunks of BATCH with the peer's batch API,
or, where it has none, BATCH single calls inside one transaction.atomic().

    BENCH_PEER=dj_queue DJANGO_SETTINGS_MODULE=bench.peer_apps.django_peers.settings \\
        python -m bench.peer_apps.django_peers.enqueue 5000 1000 1000
"""

from __future__ import annotations

import json
import sys
import time

import django

django.setup()

from django.conf import settings  # noqa: E402
from django.db import transaction  # noqa: E402

APPEND = "bench.peer_apps.append_line.append_line"


def main(n: int, single: int, batch: int) -> None:
    peer = settings.PEER
    if peer == "django_q":
        from django_q.tasks import async_task

        def one(key: str) -> None:
            async_task(APPEND, key)

        many = None
    else:
        from bench.peer_apps.django_peers.tasks import append_task

        def one(key: str) -> None:
            append_task.enqueue(key)

        backend = append_task.get_backend()
        many = backend.enqueue_all if hasattr(backend, "enqueue_all") else None
    t0 = time.perf_counter()
    for i in range(single):
        one(f"j{i}")
    t1 = time.perf_counter()
    for lo in range(single, n, batch):
        keys = [f"j{i}" for i in range(lo, min(n, lo + batch))]
        if many is not None:
            many([(append_task, [k], {}) for k in keys])
        else:
            with transaction.atomic():
                for k in keys:
                    one(k)
    t2 = time.perf_counter()
    how = "batch API (enqueue_all)" if many is not None else f"{batch} calls in one transaction"
    print(json.dumps([t1 - t0, t2 - t1, how]))


if __name__ == "__main__":
    main(*(int(x) for x in sys.argv[1:4]))
