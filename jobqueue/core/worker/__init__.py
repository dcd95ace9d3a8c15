"""The worker, in the threads it runs:

    loop.py      the claim loop: one cycle completes what finished and claims what fits; backoff;
                 maintenance; shutdown
    slots.py     the handler threads: run an attempt after its claim committed, retry or fail it
    renewer.py   renews leases until their final write, gives up on overdue ones, heartbeats
    leases.py    the lease keeper: each lease by (job id, attempt), its stage and local deadline
    probe.py     the idle worker's one-statement read
    config.py    WorkerConfig
"""

from .config import WorkerConfig
from .leases import Held, LeaseKeeper, LeaseState
from .loop import DB_ERRORS, Worker, process_id

__all__ = ["DB_ERRORS", "Held", "LeaseKeeper", "LeaseState", "Worker", "WorkerConfig", "process_id"]
