"""RQ: the no-op job function, and its pooled, non-forking worker:

    python -m bench.peer_apps.rq_app --url redis://127.0.0.1:6379/0 --queue Q --workers 4

runs rq.worker_pool.WorkerPool (what `rq worker-pool` runs) with worker_class=SimpleWorker (jobs
run in the worker process; no fork per job), in burst mode, after the start gate.
"""

from __future__ import annotations

import argparse
import logging


def noop() -> None:
    pass


if __name__ == "__main__":
    from redis import Redis
    from rq.worker import SimpleWorker
    from rq.worker_pool import WorkerPool

    from bench.gate import wait

    p = argparse.ArgumentParser()
    p.add_argument("--url", required=True)
    p.add_argument("--queue", required=True)
    p.add_argument("--workers", type=int, default=4)
    a = p.parse_args()
    logging.basicConfig(level=logging.WARNING)
    wait()
    pool = WorkerPool([a.queue], connection=Redis.from_url(a.url), num_workers=a.workers, worker_class=SimpleWorker)
    pool.start(burst=True, logging_level="WARNING")
