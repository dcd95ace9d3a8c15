"""How a worker runs: its slots, queues, lease, and how it stops."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..settings import DEFAULTS
from .maintenance import reap_interval

# Automatic prefetch holds at most this many leases in all (one per thread, the rest claimed
# ahead), or two per thread where that is more: a claim cycle's round trips are paid once for
# every job it takes, and a worker of 4 threads running jobs of microseconds spent half its CPU
# a job on them with 4 taken ahead (docs/benchmarks.md, "Automatic prefetch, deeper"). 64: with
# 32, 2 x 4 threads of no-op jobs ran 0.6-0.7x the jobs a second of 2 x 64 on an Intel Xeon of
# this machine kind; with 128, a handler that appends a line to a file left the lane (slots.py)
# for other threads more often and cost more CPU a job than with 32 ("Automatic prefetch to 64
# leases"). It binds only while jobs take under 5 ms / 64 (HAND_WAIT_SECONDS in claimer.py).
AUTO_LEASES = 64


@dataclass
class WorkerConfig:
    concurrency: int = 4  # handlers running at once, threads and coroutines
    queues: Sequence[str] | None = None  # None: every queue
    name: str | None = None
    lease_seconds: float = DEFAULTS.lease_seconds
    burst: bool = False  # exit when nothing is ready and nothing is held
    grace_seconds: float = DEFAULTS.grace_seconds  # on stop: how long running jobs may finish
    idle_cap_seconds: float = 2.0  # longest sleep between claims when idle
    doorbell: bool = True  # MySQL: other processes' enqueues wake it (worker/doorbell.py)
    prefetch: int | None = None  # jobs claimed ahead of a free thread (leased, renewed);
    # None: automatic, while handlers are short (claimer.auto_prefetch)
    reap_interval: float | None = None  # default: a quarter of the lease, 1..15 s
    queue_refresh_seconds: float = 1.0
    finish_retry_seconds: float | None = None  # how long to keep retrying a job's last write
    reap_in_loop: bool = True  # off when a scheduler runs maintenance (embedded mode):
    # reaping, recurring runs and retention
    prune_every_seconds: float = 3600.0  # retention passes (any process) at most this often
    heartbeat_seconds: float = 15.0
    kind: str = "worker"  # how the dashboard lists this process: worker | embedded
    refuse_read_only_at_start: bool = True  # a standalone worker on a replica exits 3 at once

    def __post_init__(self) -> None:
        if self.concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        if self.prefetch is not None and self.prefetch < 0:
            raise ValueError("prefetch must be 0 or more (or None: automatic)")
        if self.lease_seconds < 1:
            raise ValueError("lease must be at least 1 second")
        if self.reap_interval is None:
            self.reap_interval = reap_interval(self.lease_seconds)
        if self.finish_retry_seconds is None:
            self.finish_retry_seconds = max(5.0, self.lease_seconds)

    @property
    def max_prefetch(self) -> int:
        if self.prefetch is not None:
            return self.prefetch
        return max(self.concurrency, AUTO_LEASES - self.concurrency)

    @property
    def capacity(self) -> int:
        """Leases held at most: one per thread, plus the prefetched ones."""
        return self.concurrency + self.max_prefetch

    @property
    def renew_seconds(self) -> float:
        return self.lease_seconds / 3
