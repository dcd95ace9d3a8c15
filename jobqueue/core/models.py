"""The queue's own vocabulary: job states, a claimed job, and the outcomes of fenced writes."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import datetime
from typing import Any


class Status(str, enum.Enum):
    # `scheduled` holds delayed jobs and retries waiting out their backoff, so that the claim
    # query never has to look past rows that are not due yet.
    SCHEDULED = "scheduled"
    READY = "ready"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    # An operator's decision that the job must not run (any more): terminal like done and
    # failed, and its task_key stays taken.
    CANCELLED = "cancelled"
    # Waiting for the jobs named in `after` (job_dependency): never under the claim's index
    # prefix (status = 'ready'). Last in the enum so that MySQL adds it in place.
    BLOCKED = "blocked"

    def __str__(self) -> str:
        return self.value


TERMINAL = (Status.DONE, Status.FAILED, Status.CANCELLED)


def iso(value: datetime | None) -> str | None:
    """A database time (UTC, naive) as ISO 8601 with a Z."""
    return value.isoformat(timespec="microseconds") + "Z" if value else None


@dataclass(frozen=True)
class Job:
    """A row of `job_queue` as the repository read it."""

    id: int
    task_key: str
    task_name: str
    queue: str
    priority: int
    payload: dict[str, Any]
    status: Status
    attempts: int
    max_attempts: int
    lease_owner: str | None = None
    lease_until: datetime | None = None
    run_at: datetime | None = None
    concurrency_key: str | None = None
    started_at: datetime | None = None
    last_error: str | None = None
    created_at: datetime | None = None
    updated_at: datetime | None = None
    finished_at: datetime | None = None

    def as_dict(self) -> dict[str, Any]:
        """The job as the JSON API and `jobqueue show --json` give it."""
        return {
            "id": self.id,
            "task_key": self.task_key,
            "task": self.task_name,
            "queue": self.queue,
            "priority": self.priority,
            "status": self.status.value,
            "attempts": self.attempts,
            "max_attempts": self.max_attempts,
            "payload": self.payload,
            "lease_owner": self.lease_owner,
            "lease_until": iso(self.lease_until),
            "run_at": iso(self.run_at),
            "started_at": iso(self.started_at),
            "last_error": self.last_error,
            "created_at": iso(self.created_at),
            "updated_at": iso(self.updated_at),
            "finished_at": iso(self.finished_at),
        }


FINISHED = frozenset({Status.DONE, Status.FAILED, Status.CANCELLED})


@dataclass(frozen=True)
class JobResult:
    """Where a job stands for someone waiting on it: `result` is what its handler returned or
    recorded (None until done, or when it gave none), `error` its last error."""

    id: int
    task_key: str
    status: Status
    result: Any
    error: str | None
    finished_at: datetime | None

    @property
    def finished(self) -> bool:
        return self.status in FINISHED

    def as_dict(self) -> dict[str, Any]:
        """`jobqueue result --json` and GET /api/jobs/<id>/result."""
        return {
            "id": self.id,
            "task_key": self.task_key,
            "status": self.status.value,
            "result": self.result,
            "error": self.error,
            "finished_at": iso(self.finished_at),
        }


@dataclass(frozen=True)
class Lease:
    """What a worker holds after a claim: the fencing token for every later write.

    `attempt` is the value of `attempts` that this claim set; together with the owner it names
    exactly one lease, so a write guarded by both can never land on a later lease of the same job.
    """

    job_id: int
    owner: str
    attempt: int


@dataclass(frozen=True)
class ClaimedJob:
    job: Job
    lease: Lease
    start_delay: float | None = None  # seconds from the job's run_at to the claim, by the database's clock


@dataclass(frozen=True)
class ClaimCycle:
    """One claim transaction: the jobs it took and, when it also completed finished jobs in the
    same COMMIT, what became of each of them."""

    claimed: list[ClaimedJob]
    completed: dict[tuple[int, int], Outcome]  # (job_id, attempt) -> OK, LEASE_LOST or BUSY
    losses: list[LeaseLoss]
    skipped: int  # ready rows passed by: held by other transactions
    queues: list[str]  # queues whose pick ran
    asked: int  # how many jobs the claim asked for
    report: EmptyClaimReport | None = None  # why it took fewer than it asked for
    limited: int = 0  # ready rows left alone: their concurrency key was full


@dataclass(frozen=True)
class Enqueued:
    id: int
    task_key: str
    duplicate: bool
    status: Status | None = None
    queue: str | None = None  # the job's queue, for a job this call wrote

    # Frozen as declared; the fields set in one step (a batch makes 1,000), not one
    # object.__setattr__ each as dataclass's frozen __init__ does.
    def __init__(
        self, id: int, task_key: str, duplicate: bool, status: Status | None = None, queue: str | None = None
    ) -> None:
        vars(self).update(id=id, task_key=task_key, duplicate=duplicate, status=status, queue=queue)


@dataclass(frozen=True)
class LeaseLoss:
    """A fenced write that changed nothing, and what the row said instead."""

    lease: Lease
    operation: str
    task_key: str | None
    now_status: str  # "missing" when the row is gone
    now_owner: str | None
    now_attempt: int | None


class EmptyClaim(str, enum.Enum):
    """Why a claim came back with nothing. None of these is an error."""

    IDLE = "idle"  # nothing ready for these queues
    CONTENDED = "contended"  # ready rows exist, all locked by other transactions
    WAITING = "waiting_on_leases"  # nothing ready, but running jobs may come back when leases expire
    LIMITED = "concurrency_limited"  # ready rows exist, but their concurrency keys or rate windows are full


@dataclass(frozen=True)
class EmptyClaimReport:
    kind: EmptyClaim
    skipped: int = 0  # ready rows seen but locked by others
    next_lease_expiry: datetime | None = None
    next_scheduled: datetime | None = None  # earliest delayed job or retry in these queues
    db_now: datetime | None = None
    next_allowed: datetime | None = None  # LIMITED by a spent rate window: when it ends


class Outcome(str, enum.Enum):
    """Result of a fenced write (renew, start, complete, retry, fail, release)."""

    OK = "ok"
    LEASE_LOST = "lease_lost"
    BUSY = "busy"  # the row was held by another transaction this instant; try again
    PAUSED = "paused"  # start: the job's queue is paused; its lease is still held


@dataclass(frozen=True)
class Reason:
    """One reason in the explanation of a job: a code (runnable, scheduled, retry_backoff,
    queue_paused, no_live_worker, concurrency_limit, locked_by_transaction, lease_held,
    lease_expired, attempts_exhausted, cancelled, done, failed), one sentence, and the facts behind
    it (`data`: JSON-ready values, times as ISO 8601)."""

    code: str
    detail: str
    data: dict[str, Any]

    def as_dict(self) -> dict[str, Any]:
        return {"code": self.code, "detail": self.detail, **self.data}


@dataclass(frozen=True)
class Explanation:
    """Why a job is (or is not) running, the main reason first."""

    job_id: int
    status: Status
    reasons: list[Reason]

    @property
    def codes(self) -> list[str]:
        return [r.code for r in self.reasons]

    def as_dict(self) -> dict[str, Any]:
        """As `jobqueue explain --json` and GET /api/jobs/<id>/explain answer."""
        return {"job_id": self.job_id, "status": self.status.value, "reasons": [r.as_dict() for r in self.reasons]}
