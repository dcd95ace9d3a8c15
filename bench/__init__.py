"""The benchmark harness: `python -m bench.run [--quick] [--only throughput,peers,...]`.

Not part of the installed package and not part of the test suite: it measures, it does not
assert. Results go to docs/benchmarks.md and docs/bench/ (see bench/run.py).
"""
