"""`jobqueue worker --tasks bench.handler_tasks`: small handlers for bench/handler_cost.py, plus the
start gate and the COMMIT count of bench.gate_tasks.

- `append_line`: appends "<task_key> <time>" to the file $BENCH_APPEND_FILE (open, write, close:
  about 3 us on its own; bench/peer_apps/append_line.py, the handler every peer runs in
  bench/mysql_peers.py), the "real (small) work" of issue 29; each execution is one line.
- `spin3`: 3 us of pure Python, no I/O: the same time as append_line without releasing the GIL.
"""

import time

from bench.gate import count_commits, wait
from bench.peer_apps.append_line import append_line as append
from jobqueue import task


@task("append_line")
def append_line(payload, ctx) -> None:
    append(ctx.task_key)


@task("spin3")
def spin3(payload, ctx) -> None:
    until = time.perf_counter() + 3e-6
    while time.perf_counter() < until:
        pass


count_commits()
wait()
