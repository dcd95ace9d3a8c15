"""pgqueuer: one no-op entrypoint, run the way `pgq run` runs a factory (pgqueuer.run), in drain
mode (exit when the queue is empty):

    BENCH_PG_DSN=postgresql://... python -m bench.peer_apps.pgqueuer_app --batch-size 10

(`pgq run ... --log-level X` fails in pgqueuer 1.6 with "'str' object has no attribute 'name'",
so the harness calls pgqueuer.run itself; that is what the CLI calls.) The factory waits at the
start gate (bench/gate.py) before it connects.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
from collections.abc import AsyncIterator

import asyncpg
import pgqueuer
from pgqueuer import AsyncpgDriver, PgQueuer
from pgqueuer.models import Job
from pgqueuer.types import QueueExecutionMode

from bench.gate import wait


@contextlib.asynccontextmanager
async def main() -> AsyncIterator[PgQueuer]:
    wait()
    conn = await asyncpg.connect(os.environ["BENCH_PG_DSN"])
    pgq = PgQueuer(AsyncpgDriver(conn))

    @pgq.entrypoint("noop")
    async def noop(job: Job) -> None:
        pass

    try:
        yield pgq
    finally:
        await conn.close()


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--batch-size", type=int, default=10)
    a = p.parse_args()
    logging.basicConfig(level=logging.WARNING)
    asyncio.run(pgqueuer.run(main, batch_size=a.batch_size, mode=QueueExecutionMode.drain))
