"""`jobqueue worker --tasks bench.append_tasks,bench.gate_tasks`: the `append` task of
bench/mysql_peers.py, whose handler appends "<task_key> <time.time()>" to $BENCH_APPEND_FILE
(bench/peer_apps/append_line.py, the same handler every peer runs)."""

from bench.peer_apps.append_line import append_line
from jobqueue.core.tasks import task


@task("append")
def append(payload, ctx) -> None:
    append_line(ctx.task_key)
