"""The worker, by role:

loop.py         the loop and its lifecycle: start, each turn, stop with its grace period, heartbeat
claimer.py      the claim cycle: complete what finished and claim what fits in one transaction,
                hand each job to a thread; back off on empty claims; which queues
finisher.py     how an attempt ends: complete, retry, fail, release, record_result, the
                handler's transaction; frees the lease slots
maintenance.py  what maintenance runs and when (reap, promote, recurring, prune), for the loop
                and for the web process's scheduler
slots.py        the handler threads: run an attempt after its claim committed
renewer.py      renews leases until their final write, gives up on overdue ones, heartbeats
leases.py       the lease keeper: each lease by (job id, attempt), its stage and local deadline
state.py        the worker's state and its database errors, counted and rate-limited
probe.py        the idle worker's one-statement read
doorbell.py     woken by other processes' enqueues
config.py       WorkerConfig
"""

from .config import WorkerConfig
from .leases import Held, LeaseKeeper, LeaseState
from .loop import DB_ERRORS, Worker, process_id

__all__ = ["DB_ERRORS", "Held", "LeaseKeeper", "LeaseState", "Worker", "WorkerConfig", "process_id"]
