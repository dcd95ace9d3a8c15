"""The repository: every SQL statement the queue runs, one module per concern, one function per
verb. Each function takes the Connection it runs on and is just its transaction (see
`db.transaction`, retried on deadlocks, lock-wait timeouts and lost connections); it returns what
happened and tells no one else. Verbs whose effects the rest of the process must hear about
(metrics, log lines, wake-ups) are called through `jobqueue.core.service`; reads are called here,
on the module of their concern.

    enqueue.py      enqueue, enqueue_many              (idempotent by task_key)
    dependencies.py enqueue_after, settle, parents_of  (jobs blocked until their `after` jobs are done)
    batches.py      open_batch, close, show, settle    (member jobs counted; callbacks enqueued exactly once)
    hooks.py        settle                             (what finishing a job sets off: dependencies, batches)
    claim.py        claim, claim_cycle, classify_empty (the claim cycle; why a claim found nothing)
    claim_sql.py    every statement of the claim and when each is sent (docs/claim-sql.md)
    leases.py       renew, start_lease, complete, retry, fail, release, record_result (fenced by the lease)
    maintenance.py  reap, promote_due, prune_history   (what happens when a worker dies)
    retention.py    prune, last_prune, prune_due(_in)  (finished jobs past their keep time; their keys kept)
    queues.py       set_paused, queue_states
    recurring.py    upsert_recurring, list_recurring, enqueue_due_recurring, ...
    operator.py     requeue_job, fail_job, cancel_job, bulk_action, list_audit, JobFilter (the job filter and search)
    processes.py    register_process, heartbeat, list_processes
    task_definitions.py  KnownTasks: the tasks workers registered, for enqueue by name
    reads.py        get_job, page_jobs, count_matching, get_result, list_attempts, ...
    stats.py        queue_summaries, count_by_status, activity, operator_failures, CountsCache
    sessions.py     start_session, session_state, end_session(s), login_attempt, ... (sign-in state)
    replicas.py     replica_lag, ReplicaReport, Pause  (pages that read from a replica; bulk pacing)
    explain.py      explain                            (why a job is not running: ordered reasons)
    locks.py        row_lock, lock_report, kill_connection, latest_deadlock, lock_counters (job row locks)
    doorbell.py     the marked SLEEP an idle worker waits in, and the KILL QUERY that wakes it

The package defines no names of its own, so `repository.claim` is always the module.
"""

from . import (
    batches,
    claim,
    claim_sql,
    dependencies,
    doorbell,
    enqueue,
    explain,
    hooks,
    leases,
    locks,
    maintenance,
    operator,
    processes,
    queues,
    reads,
    recurring,
    replicas,
    retention,
    sessions,
    stats,
    task_definitions,
)

__all__ = [
    "batches",
    "claim",
    "claim_sql",
    "dependencies",
    "doorbell",
    "enqueue",
    "explain",
    "hooks",
    "leases",
    "locks",
    "maintenance",
    "operator",
    "processes",
    "queues",
    "reads",
    "recurring",
    "replicas",
    "retention",
    "sessions",
    "stats",
    "task_definitions",
]
