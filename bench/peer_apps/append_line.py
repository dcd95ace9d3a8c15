"""The handler every system runs in bench/mysql_peers.py: append one line, "<key> <time.time()>",
to $BENCH_APPEND_FILE (real, small work: an open, one write, a close). Each line is one execution,
so the harness counts lost jobs (keys never written) and duplicates (keys written twice) from the
file, whatever the system says. One write of a short line to a file opened with O_APPEND lands
whole, so threads and processes may append at once. Standard library only: our worker and every
peer's interpreter import it."""

from __future__ import annotations

import os
import time


def append_line(key: str) -> None:
    with open(os.environ["BENCH_APPEND_FILE"], "a") as fh:
        fh.write(f"{key} {time.time():.6f}\n")
