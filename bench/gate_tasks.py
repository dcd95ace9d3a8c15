"""`jobqueue worker --tasks bench.gate_tasks`: registers no task, only waits at the start gate
(see bench/gate.py) when $BENCH_GATE_DIR is set, and counts the process's COMMITs (every
SQLAlchemy engine's commit event) into $BENCH_COUNT_DIR/commits-<pid> at exit when that is set."""

from bench.gate import count_commits, wait

count_commits()
wait()
