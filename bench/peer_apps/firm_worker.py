"""firm-queue for bench/mysql_peers.py, in the peers' venv ($BENCH_FIRM_URL names the database):

    python -m bench.peer_apps.firm_worker schema
    python -m bench.peer_apps.firm_worker enqueue N SINGLE     # prints [single_s, batch_s, how]
    python -m bench.peer_apps.firm_worker work --processes 2 --threads 16 --poll 0

`work` is what `firm-queue start` runs (a ForkSupervisor: one forked child per worker, and one
dispatcher), with the worker count, threads and poll interval the CLI does not take: its docs'
WorkerConfig(queues, threads, poll_interval) and "CPU-bound jobs scale by running more worker
processes". It waits at the start gate before forking, and runs until SIGTERM (a graceful drain).
firm has no batch enqueue: every job is one `enqueue()` (one transaction) and the "batch" part
is more of the same.
"""

from __future__ import annotations

import argparse
import json
import time

from bench.peer_apps import firm_jobs


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("command", choices=["schema", "enqueue", "work"])
    p.add_argument("n", nargs="?", type=int, default=0)
    p.add_argument("single", nargs="?", type=int, default=0)
    p.add_argument("--processes", type=int, default=1)
    p.add_argument("--threads", type=int, default=3)
    p.add_argument("--poll", type=float, default=0.1)
    a = p.parse_args()
    from firm.queue import current_runtime, schema

    runtime = current_runtime()
    if a.command == "schema":
        schema.create_all(runtime.engine)
    elif a.command == "enqueue":
        t0 = time.perf_counter()
        for i in range(a.single):
            firm_jobs.append.enqueue(f"j{i}")
        t1 = time.perf_counter()
        for i in range(a.single, a.n):
            firm_jobs.append.enqueue(f"j{i}")
        t2 = time.perf_counter()
        print(json.dumps([t1 - t0, t2 - t1, "one call each (no batch API)"]))
    else:
        from firm.queue.supervisor import DispatcherConfig, ForkSupervisor, SupervisorConfig, WorkerConfig

        from bench.gate import wait

        config = SupervisorConfig(
            workers=[WorkerConfig(queues=("*",), threads=a.threads, poll_interval=a.poll) for _ in range(a.processes)],
            dispatchers=[DispatcherConfig()],
        )
        wait()
        ForkSupervisor(runtime, config).start()


if __name__ == "__main__":
    main()
