"""procrastinate: one no-op task (async, its cheapest form).

Its worker is bench/peer_apps/procrastinate_worker.py.
"""

from __future__ import annotations

import os

from procrastinate import App, PsycopgConnector

app = App(connector=PsycopgConnector(conninfo=os.environ.get("BENCH_PG_DSN", "")))


@app.task(name="noop")
async def noop() -> None:
    pass
