"""`jobqueue worker --tasks bench.gate_tasks`: registers no task, only waits at the start gate
(see bench/gate.py) when $BENCH_GATE_DIR is set."""

from bench.gate import wait

wait()
