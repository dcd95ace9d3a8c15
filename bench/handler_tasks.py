"""`jobqueue worker --tasks bench.handler_tasks`: small handlers for bench/handler_cost.py, plus the
start gate and the COMMIT count of bench.gate_tasks.

- `append_line`: appends the job's id to the file $BENCH_APPEND_FILE (open, write, close: about
  3 us on its own), the "real (small) work" of issue 29; each execution is one line, so the file
  also counts executions.
- `spin3`: 3 us of pure Python, no I/O: the same time as append_line without releasing the GIL.
"""

import os
import time

from bench.gate import count_commits, wait
from jobqueue import task

APPEND_FILE = os.environ.get("BENCH_APPEND_FILE", os.devnull)


@task("append_line")
def append_line(payload, ctx) -> None:
    with open(APPEND_FILE, "a") as fh:
        fh.write(f"{ctx.job_id}\n")


@task("spin3")
def spin3(payload, ctx) -> None:
    until = time.perf_counter() + 3e-6
    while time.perf_counter() < until:
        pass


count_commits()
wait()
