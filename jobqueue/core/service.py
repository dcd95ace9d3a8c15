"""The queue's verbs as the rest of the process calls them: each one runs its repository
statement (jobqueue/core/repository/, where all the SQL is) and then tells the process what
happened: metrics, one log line per event, wake-ups of idle workers here and in other processes.

The repository's functions only run their transaction and return what happened; whatever has a
side effect beyond the database goes through here, so that an enqueue from the CLI, the HTTP API,
the dashboard, a recurring tick or the Python client is counted, logged and wakes workers the
same way. Reads with nothing to report are called on the repository module of their concern
(`repository.reads.get_job`, `repository.stats.queue_summaries`, ...).

State machine of a row in `job_queue`:

    enqueue ──> ready ──claim──> running ──complete──> done
         │        ^                 │ │ └──fail──────> failed
         v        │                 │ └──retry──> scheduled ──promote_due──> ready
     scheduled ───┘                 └──reap (lease expired) / release ──> ready (or failed)

    ready, scheduled, running, failed ──cancel (operator)──> cancelled
    done, failed, cancelled ──prune (after the keep time)──> gone; the task_key stays in pruned_key
"""

from __future__ import annotations

import collections
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from sqlalchemy import event as sa_event
from sqlalchemy.engine import Connection, Engine

from . import metrics, wakeup
from .errors import InvalidState, JobBusy, JobNotFound, LeaseLostError
from .logs import event
from .models import ClaimCycle, ClaimedJob, Enqueued, Lease, LeaseLoss, Outcome, Status
from .repository import batches as _batches
from .repository import claim as _claim
from .repository import enqueue as _enqueue
from .repository import leases as _leases
from .repository import locks as _locks
from .repository import maintenance as _maintenance
from .repository import operator as _operator
from .repository import queues as _queues
from .repository import recurring as _recurring
from .repository import retention as _retention
from .repository.locks import Transaction
from .repository.maintenance import PROMOTE_BATCH, REAP_BATCH, ReapResult
from .repository.operator import ActionResult, BulkResult, JobFilter
from .repository.queues import QueueState
from .repository.recurring import DueRuns
from .repository.replicas import Pause
from .repository.retention import PruneCounts
from .repository.stats import forget_counts
from .repository.task_definitions import KnownTasks
from .tasks import TASKS, Registry
from .validation import NewJob, new_job

log = logging.getLogger("jobqueue.repository")


# --- enqueue -------------------------------------------------------------------------------------


def enqueue(
    conn: Connection,
    task_name: str,
    task_key: str,
    payload: dict | None = None,
    *,
    queue: str | None = None,
    priority: int = 0,
    delay: float = 0,
    max_attempts: int | None = None,
    registry: Registry = TASKS,
    allow_unregistered: bool = False,
    after: Iterable[str] | None = None,
    on_parent_failure: str | None = None,
    batch: str | None = None,
) -> Enqueued:
    """Add one job. A known task_key writes nothing and returns the existing id, duplicate=True.
    The task is looked up in `registry`, then among the tasks workers registered (KnownTasks);
    `allow_unregistered` takes a name found in neither, with the default options. With `after`
    (task_keys), the job is blocked until those jobs are done (`on_parent_failure`: "cancel" or
    "run" when one fails or is cancelled). With `batch`, a member of that open batch."""
    job = new_job(
        task_name,
        task_key,
        payload,
        queue=queue,
        priority=priority,
        delay=delay,
        max_attempts=max_attempts,
        registry=KnownTasks(conn, base=registry),
        allow_unregistered=allow_unregistered,
    )
    result = _enqueue.enqueue(conn, job, after=after, on_parent_failure=on_parent_failure, batch=batch)
    engine = conn.engine
    _after_commit(conn, lambda: _report_enqueued([result], engine))
    return result


def enqueue_many(
    conn: Connection,
    jobs: Iterable[NewJob | Mapping[str, Any]],
    *,
    registry: Registry = TASKS,
    allow_unregistered: bool = False,
) -> list[Enqueued]:
    """Add many jobs in one transaction (multi-row INSERT); all validated before any is written
    (task names as `enqueue` looks them up)."""
    results = _enqueue.enqueue_many(
        conn, jobs, registry=KnownTasks(conn, base=registry), allow_unregistered=allow_unregistered
    )
    engine = conn.engine
    _after_commit(conn, lambda: _report_enqueued(results, engine))
    return results


def _after_commit(conn: Connection, report) -> None:
    """Report now, or, inside the caller's own transaction, once it commits: a job that is
    rolled back never woke anyone or was counted."""
    if not conn.in_transaction():
        report()
        return
    defer = conn.info.get("after_commit")
    if defer is not None:
        # A framework owns this transaction and its COMMIT (jobqueue.django: Django's atomic
        # blocks): it runs the report when that commits, and never after a rollback.
        defer(report)
        return
    # Whichever ends the transaction first decides; the other listener, left behind, does
    # nothing when it fires (once) at a later transaction's end. Without the rollback side, a
    # rolled-back job would be reported (counted, and would wake workers) at the connection's
    # next commit.
    pending = [True]

    def on_commit(_conn) -> None:
        if pending[0]:
            pending[0] = False
            report()

    def on_rollback(_conn) -> None:
        pending[0] = False

    sa_event.listen(conn, "commit", on_commit, once=True)
    sa_event.listen(conn, "rollback", on_rollback, once=True)


def _report_enqueued(results: list[Enqueued], engine: Engine | None = None) -> None:
    """Count and log, wake this process's idle workers, and ring other processes' idle workers
    serving the queues that got a ready job (jobqueue/core/doorbell.py)."""
    written: dict[str | None, int] = {}
    duplicates = 0
    for res in results:
        if res.duplicate:
            duplicates += 1
            event(
                log,
                logging.INFO,
                "duplicate_enqueue",
                job_id=res.id,
                task_key=res.task_key,
                detail="task_key already known; nothing written",
            )
        else:
            written[res.queue] = written.get(res.queue, 0) + 1
    # One increment per queue, not per job: a batch of 1,000 spent a tenth of its time here.
    if duplicates:
        metrics.DUPLICATE_ENQUEUES.inc(duplicates)
    for queue, count in written.items():
        metrics.ENQUEUED.labels(queue=queue).inc(count)
    if written:
        wakeup.notify()
        ready = {res.queue for res in results if not res.duplicate and res.status is Status.READY}
        if ready and engine is not None:
            from . import doorbell

            doorbell.ring_for(engine, ready)


def _report_callbacks(conn: Connection) -> None:
    """A batch's callbacks are enqueued inside whichever transaction finished its last member
    (a completion, a reap, an operator action, a close): reported, like any enqueue, when that
    transaction commits; dropped with a rollback, which undid them."""
    written = conn.info.pop(_batches.ENQUEUED, None)
    if written:
        _report_enqueued(written, conn.engine)


def _forget_callbacks(conn: Connection) -> None:
    # A rollback also runs when a connection that was lost or killed is closed: its info went with
    # it, and reading it would try to reconnect (PendingRollbackError) inside the close.
    if not conn.invalidated:
        conn.info.pop(_batches.ENQUEUED, None)


sa_event.listen(Engine, "commit", _report_callbacks)
sa_event.listen(Engine, "rollback", _forget_callbacks)


def close_batch(conn: Connection, key: str) -> dict[str, Any]:
    return _batches.close(conn, key)


# --- claim ---------------------------------------------------------------------------------------


def claim(
    conn: Connection, worker_id: str | Sequence[str], limit: int, queues: Sequence[str], *, lease_seconds: float
) -> list[ClaimedJob]:
    """Take up to `limit` ready jobs from `queues` (in that order) in one short transaction;
    `worker_id` is the lease owner, or one per slot. Only jobs the guarded UPDATE took come back."""
    cycle = _claim.claim(conn, worker_id, limit, queues, lease_seconds=lease_seconds)
    _report_cycle(cycle)
    return cycle.claimed


def claim_cycle(
    conn: Connection,
    owners: Sequence[str],
    queues: Sequence[str],
    *,
    lease_seconds: float,
    completions: Sequence[Lease] = (),
    classify_queues: Sequence[str] | None = None,
    refill: bool = True,
) -> ClaimCycle:
    """Complete `completions` and claim for `owners` (and, with `refill`, the completed jobs'
    slots) in one COMMIT."""
    cycle = _claim.claim_cycle(
        conn,
        owners,
        queues,
        lease_seconds=lease_seconds,
        completions=completions,
        classify_queues=classify_queues,
        refill=refill,
    )
    _report_cycle(cycle)
    return cycle


def _report_cycle(cycle: ClaimCycle) -> None:
    for queue in cycle.queues:
        metrics.labelled("CLAIMS", queue).inc()
    for queue, n in collections.Counter(item.job.queue for item in cycle.claimed).items():
        metrics.labelled("CLAIMED", queue).inc(n)
    if cycle.skipped:
        metrics.SKIPPED.inc(cycle.skipped)
    if cycle.limited:
        metrics.CONCURRENCY_LIMITED.inc(cycle.limited)
    _report_losses(cycle.losses)


# --- fenced lease writes -------------------------------------------------------------------------


def _report_losses(losses: Iterable[LeaseLoss]) -> None:
    for loss in losses:
        metrics.LEASES_LOST.labels(operation=loss.operation).inc()
        event(
            log,
            logging.WARNING,
            "lease_lost",
            operation=loss.operation,
            job_id=loss.lease.job_id,
            task_key=loss.task_key,
            attempt=loss.lease.attempt,
            worker=loss.lease.owner,
            now_status=loss.now_status,
            now_owner=loss.now_owner,
            now_attempt=loss.now_attempt,
        )


def renew(conn: Connection, leases: Sequence[Lease], lease_seconds: float) -> dict[Lease, Outcome]:
    """Extend each lease still held: OK, LEASE_LOST, or BUSY (held elsewhere this instant)."""
    outcomes, losses = _leases.renew_leases(conn, leases, lease_seconds)
    metrics.RENEWALS.inc(sum(1 for o in outcomes.values() if o is Outcome.OK))
    _report_losses(losses)
    return outcomes


def start_lease(conn: Connection, lease: Lease, queue: str, lease_seconds: float) -> Outcome:
    """Before the handler of a job that waited in hand starts: renew its lease under the fence
    and check its queue is not paused (OK, LEASE_LOST, PAUSED or BUSY; see leases.start_lease)."""
    return _finished(_leases.start_lease(conn, lease, queue, lease_seconds))


def renew_leases(conn: Connection, leases: Sequence[Lease], lease_seconds: float) -> dict[int, Outcome]:
    """`renew`, keyed by job id."""
    return {lease.job_id: outcome for lease, outcome in renew(conn, leases, lease_seconds).items()}


def complete_many(conn: Connection, leases: Sequence[Lease]) -> dict[int, Outcome]:
    """running -> done for every lease still held: one fenced UPDATE and one COMMIT for the lot."""
    outcomes, losses = _leases.complete_many(conn, leases)
    _report_losses(losses)
    return {lease.job_id: outcome for lease, outcome in outcomes.items()}


def complete_with(conn: Connection, lease: Lease) -> Outcome:
    """running -> done inside the caller's open transaction (see leases.complete_with)."""
    outcome, loss = _leases.complete_with(conn, lease)
    if loss is not None:
        _report_losses([loss])
    return outcome


def complete(conn: Connection, lease: Lease) -> Outcome:
    """running -> done, only for the holder of this lease."""
    return complete_many(conn, [lease])[lease.job_id]


def _finished(result: tuple[Outcome, LeaseLoss | None]) -> Outcome:
    outcome, loss = result
    if loss is not None:
        _report_losses([loss])
    return outcome


def retry(conn: Connection, lease: Lease, error: str, delay_seconds: float, *, outcome: str = "retry") -> Outcome:
    """running -> scheduled, to be promoted to ready after `delay_seconds` of backoff."""
    return _finished(_leases.retry(conn, lease, error, delay_seconds, outcome=outcome))


def fail(conn: Connection, lease: Lease, error: str, *, outcome: str = "fail") -> Outcome:
    """running -> failed for good, with the error kept."""
    return _finished(_leases.fail(conn, lease, error, outcome=outcome))


def release(conn: Connection, lease: Lease, reason: str = "worker shutting down") -> Outcome:
    """running -> ready without waiting for the lease to expire; attempts kept."""
    return _finished(_leases.release(conn, lease, reason))


def record_result(conn: Connection, lease: Lease, task_key: str, result: Any) -> bool:
    """Store the downstream result of `task_key`, at most once, only while `lease` is held.
    True when written, False for a duplicate; LeaseLostError when the lease is gone."""
    try:
        written = _leases.record_result(conn, lease, task_key, result)
    except LeaseLostError as exc:
        loss = exc.args[0] if exc.args and isinstance(exc.args[0], LeaseLoss) else None
        if loss is not None:
            _report_losses([loss])
        raise LeaseLostError(f"job {lease.job_id} attempt {lease.attempt}: lease lost; result not recorded") from None
    if not written:
        metrics.DUPLICATE_RESULTS.inc()
        event(
            log,
            logging.WARNING,
            "duplicate_result",
            job_id=lease.job_id,
            task_key=task_key,
            attempt=lease.attempt,
            worker=lease.owner,
            detail="result already recorded for this task_key; nothing written",
        )
    return written


# --- maintenance ---------------------------------------------------------------------------------


def reap(
    conn: Connection, *, batch_size: int = REAP_BATCH, max_batches: int = 100, keep: Sequence[tuple[int, int]] = ()
) -> ReapResult:
    """Expired leases back to ready (or failed when attempts are used up); attempts kept. `keep`:
    the caller's own leases whose final write is pending (see maintenance.reap)."""
    result = _maintenance.reap(conn, batch_size=batch_size, max_batches=max_batches, keep=keep)
    for job in result.jobs:
        event(
            log,
            logging.WARNING,
            "reclaimed",
            job_id=job.job_id,
            task_key=job.task_key,
            attempt=job.attempt,
            worker=job.owner,
            to=job.to,
        )
    if result.reclaimed:
        metrics.RECLAIMED.labels(to_status="ready").inc(result.reclaimed)
        wakeup.notify()
    if result.failed:
        metrics.RECLAIMED.labels(to_status="failed").inc(result.failed)
    return result


def promote_due(conn: Connection, *, batch_size: int = PROMOTE_BATCH, max_batches: int = 20) -> int:
    """scheduled -> ready for delayed jobs and retries whose time has come."""
    n = _maintenance.promote_due(conn, batch_size=batch_size, max_batches=max_batches)
    if n:
        metrics.PROMOTED.inc(n)
        wakeup.notify()
    return n


# --- operator actions ----------------------------------------------------------------------------


def _operator_action(action: str, job_id: int, actor: str, run) -> ActionResult:
    try:
        result = run()
    except JobBusy:
        metrics.OPERATOR_ACTIONS.labels(action=action, outcome="busy").inc()
        event(log, logging.INFO, "operator_busy", action=action, job_id=job_id, actor=actor)
        raise
    except (JobNotFound, InvalidState) as exc:
        metrics.OPERATOR_ACTIONS.labels(action=action, outcome="refused").inc()
        event(log, logging.INFO, "operator_refused", action=action, job_id=job_id, actor=actor, reason=str(exc))
        raise
    metrics.OPERATOR_ACTIONS.labels(action=action, outcome="ok" if result.changed else "noop").inc()
    event(
        log,
        logging.INFO,
        "operator_" + action,
        job_id=job_id,
        actor=actor,
        before=result.before.value,
        after=result.after.value,
        changed=result.changed,
    )
    if result.changed:
        forget_counts()  # the operator's next page shows what they did
    if result.changed and result.after.value == "ready":
        wakeup.notify()
    return result


def requeue_job(
    conn: Connection, job_id: int, *, force: bool = False, again: bool = False, actor: str = "operator"
) -> ActionResult:
    """Put a job back to ready now (NOWAIT); a running job with a valid lease needs `force`, a
    done job `again` (its handler runs again; its task_key keeps its one result row)."""
    return _operator_action(
        "requeue", job_id, actor, lambda: _operator.requeue_job(conn, job_id, force=force, again=again, actor=actor)
    )


def fail_job(conn: Connection, job_id: int, reason: str | None = None, *, actor: str = "operator") -> ActionResult:
    """Mark a job failed now (NOWAIT), with the reason kept; a running job's lease is fenced."""
    return _operator_action("fail", job_id, actor, lambda: _operator.fail_job(conn, job_id, reason, actor=actor))


def cancel_job(conn: Connection, job_id: int, reason: str | None = None, *, actor: str = "operator") -> ActionResult:
    """Cancel a job now (NOWAIT): a running job's lease is fenced; a done job is refused."""
    result = _operator_action("cancel", job_id, actor, lambda: _operator.cancel_job(conn, job_id, reason, actor=actor))
    if result.changed:
        metrics.CANCELLED.inc()
    return result


def bulk_action(
    conn: Connection,
    action: str,
    *,
    actor: str,
    ids: Sequence[int] | None = None,
    job_filter: JobFilter | None = None,
    after_id: int | None = None,
    reason: str | None = None,
    force: bool = False,
    batch_size: int = 500,
    deadline: float | None = None,
    pace: Callable[[float | None], Pause] | None = None,
) -> BulkResult:
    """Requeue, fail or cancel many jobs in bounded SKIP LOCKED batches, each after `pace` (the
    replicas' lag) allows it (see operator.bulk_action)."""
    result = _operator.bulk_action(
        conn,
        action,
        actor=actor,
        ids=ids,
        job_filter=job_filter,
        after_id=after_id,
        reason=reason,
        force=force,
        batch_size=batch_size,
        deadline=deadline,
        pace=pace,
    )
    if result.paused_seconds or (not result.finished and result.replica_note):
        event(
            log,
            logging.INFO,
            f"operator_bulk_{action}_paused",
            actor=actor,
            seconds=round(result.paused_seconds, 1),
            replicas=result.replica_note,
        )
    metrics.OPERATOR_ACTIONS.labels(action=f"bulk_{action}", outcome="ok").inc(result.changed)
    event(
        log,
        logging.INFO,
        f"operator_bulk_{action}",
        actor=actor,
        selection=result.selection,
        changed=result.changed,
        busy=result.busy,
        skipped=result.skipped,
        finished=result.finished,
    )
    if result.changed:
        forget_counts()
    if result.changed and action == "requeue":
        wakeup.notify()
    if result.changed and action == "cancel":
        metrics.CANCELLED.inc(result.changed)
    return result


# --- locks ----------------------------------------------------------------------------------------


def kill_connection(conn: Connection, connection_id: int, *, actor: str) -> Transaction:
    """End a connection that holds job_queue rows (KILL CONNECTION), audited; InvalidState for
    any other connection."""
    try:
        found = _locks.kill_connection(conn, connection_id, actor=actor)
    except InvalidState as exc:
        metrics.OPERATOR_ACTIONS.labels(action="kill", outcome="refused").inc()
        event(
            log,
            logging.INFO,
            "operator_refused",
            action="kill",
            connection_id=connection_id,
            actor=actor,
            reason=str(exc),
        )
        raise
    metrics.OPERATOR_ACTIONS.labels(action="kill", outcome="ok").inc()
    event(
        log,
        logging.WARNING,
        "operator_kill",
        connection_id=connection_id,
        actor=actor,
        account=found.account,
        jobs=",".join(map(str, found.jobs)) or None,
        age_seconds=found.age_seconds,
    )
    if found.jobs:
        wakeup.notify()  # the rows it held are claimable again
    return found


# --- queues: pause and resume ----------------------------------------------------------------------


def pause_queue(conn: Connection, queue: str, *, actor: str) -> QueueState:
    """Stop claims from `queue` (within about a second, in every process); enqueue still works."""
    state = _queues.set_paused(conn, queue, True, actor=actor)
    if state.changed:
        event(log, logging.WARNING, "queue_paused", queue=queue, actor=actor)
    return state


def resume_queue(conn: Connection, queue: str, *, actor: str) -> QueueState:
    """Let claims from `queue` go on; idle workers in this process wake at once."""
    state = _queues.set_paused(conn, queue, False, actor=actor)
    if state.changed:
        event(log, logging.WARNING, "queue_resumed", queue=queue, actor=actor)
        wakeup.notify()
    return state


# --- recurring jobs --------------------------------------------------------------------------------


def upsert_recurring(
    conn: Connection,
    name: str,
    *,
    cron: str,
    task: str,
    payload: dict | None = None,
    queue: str | None = None,
    actor: str,
    registry: Registry = TASKS,
) -> tuple[dict, bool]:
    """Add a recurring job or replace its definition; validated first, nothing written on error."""
    row, created = _recurring.upsert_recurring(
        conn, name, cron=cron, task=task, payload=payload, queue=queue, actor=actor, registry=registry
    )
    event(
        log,
        logging.INFO,
        "recurring_added" if created else "recurring_changed",
        schedule=name,
        cron=row["cron"],
        task=task,
        actor=actor,
    )
    return row, created


def remove_recurring(conn: Connection, name: str, *, actor: str) -> None:
    _recurring.remove_recurring(conn, name, actor=actor)
    event(log, logging.INFO, "recurring_removed", schedule=name, actor=actor)


def set_recurring_enabled(conn: Connection, name: str, enabled: bool, *, actor: str) -> tuple[dict, bool]:
    row, changed = _recurring.set_recurring_enabled(conn, name, enabled, actor=actor)
    if changed:
        event(log, logging.INFO, "recurring_enabled" if enabled else "recurring_disabled", schedule=name, actor=actor)
    return row, changed


def sync_code_schedules(conn: Connection, *, registry: Registry = TASKS, actor: str = "code") -> int:
    """Add the schedules declared in code (@task(..., cron=...)) that the table lacks."""
    return _recurring.sync_code_schedules(conn, registry=registry, actor=actor)


def enqueue_due_recurring(conn: Connection, *, now=None, registry: Registry = TASKS) -> DueRuns:
    """Enqueue the runs that are due: one job per tick, whoever else does the same."""
    result = _recurring.enqueue_due_recurring(conn, now=now, registry=registry)
    for name, res in zip(result.names, result.runs):
        if not res.duplicate:
            event(log, logging.INFO, "recurring_enqueued", schedule=name, job_id=res.id, task_key=res.task_key)
    _report_enqueued([r for r in result.runs if not r.duplicate], conn.engine)
    return result


# --- retention -------------------------------------------------------------------------------------


def prune(
    conn: Connection,
    *,
    done_days: float | None,
    failed_days: float | None,
    keys_days: float | None = None,
    dry_run: bool = False,
    by: str = "operator",
    **options,
) -> PruneCounts:
    """Delete finished jobs past their keep time in batches of at most 1,000 with pauses; their
    attempts and results go with them, their task_keys stay in pruned_key."""
    counts = _retention.prune(
        conn, done_days=done_days, failed_days=failed_days, keys_days=keys_days, dry_run=dry_run, by=by, **options
    )
    if not dry_run and (counts.done or counts.failed or counts.cancelled or counts.keys_expired or counts.job_batches):
        metrics.PRUNED.labels(status="done").inc(counts.done)
        metrics.PRUNED.labels(status="failed").inc(counts.failed)
        metrics.PRUNED.labels(status="cancelled").inc(counts.cancelled)
        event(
            log,
            logging.INFO,
            "pruned",
            by=by,
            done=counts.done,
            failed=counts.failed,
            cancelled=counts.cancelled,
            attempts=counts.attempts,
            keys_expired=counts.keys_expired,
            job_batches=counts.job_batches,
            batches=counts.batches,
            seconds=f"{counts.seconds:.1f}",
            finished=counts.finished,
        )
    return counts
