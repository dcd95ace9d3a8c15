"""procrastinate's worker in one process with concurrency N, until the queue is empty
(wait=False: what `procrastinate worker --one-shot` does), after the start gate:

    BENCH_PG_DSN=postgresql://... python -m bench.peer_apps.procrastinate_worker --concurrency 4
"""

from __future__ import annotations

import argparse
import logging

from bench.gate import wait
from bench.peer_apps.procrastinate_app import app

if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--concurrency", type=int, default=4)
    a = p.parse_args()
    logging.basicConfig(level=logging.WARNING)
    wait()
    with app.open():
        app.run_worker(concurrency=a.concurrency, wait=False)
