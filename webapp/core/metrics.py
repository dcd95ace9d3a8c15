"""Counters for what the queue does, in the Prometheus client's types.

Every label set is small and fixed (queue names, outcome kinds), never a job id or task_key.
"""

from __future__ import annotations

from prometheus_client import Counter

CLAIMS = Counter("jobqueue_claims", "Claim transactions attempted", ["queue"])
CLAIMED = Counter("jobqueue_jobs_claimed", "Jobs taken by claims", ["queue"])
EMPTY_CLAIMS = Counter("jobqueue_empty_claims", "Claims that returned nothing, by cause", ["kind"])
SKIPPED = Counter("jobqueue_rows_skipped", "Ready rows skipped because another transaction held them")
COMPLETED = Counter("jobqueue_jobs_completed", "Jobs finished successfully", ["queue"])
RETRIED = Counter("jobqueue_jobs_retried", "Handler errors scheduled for another attempt", ["queue"])
FAILED = Counter("jobqueue_jobs_failed", "Jobs failed for good", ["queue"])
RENEWALS = Counter("jobqueue_lease_renewals", "Leases renewed")
LEASES_LOST = Counter("jobqueue_leases_lost", "Fenced writes refused because the lease was gone", ["operation"])
RECLAIMED = Counter("jobqueue_jobs_reclaimed", "Expired leases returned by the reaper", ["to_status"])
RELEASED = Counter("jobqueue_jobs_released", "Jobs handed back to ready on shutdown")
PROMOTED = Counter("jobqueue_jobs_promoted", "Delayed jobs and retries made ready")
ENQUEUED = Counter("jobqueue_jobs_enqueued", "Jobs accepted", ["queue"])
DUPLICATE_ENQUEUES = Counter("jobqueue_duplicate_enqueues", "Enqueues of a known task_key (nothing written)")
DUPLICATE_RESULTS = Counter("jobqueue_duplicate_results", "Results recorded again for a known task_key (nothing written)")
TRANSIENT_RETRIES = Counter("jobqueue_transient_retries", "Transactions retried after a deadlock, lock-wait timeout or lost connection", ["kind", "operation"])
SQL_ERRORS = Counter("jobqueue_sql_errors", "Database errors seen by the worker loop", ["operation"])
OPERATOR_ACTIONS = Counter("jobqueue_operator_actions", "Operator requeue and fail actions", ["action", "outcome"])

# The per-minute activity each process writes to `worker_stats` (see repository.heartbeat),
# read from the counters above so that nothing is counted twice by hand.
_STAT_SOURCES = {
    "completed": (COMPLETED, {}), "failed": (FAILED, {}), "retried": (RETRIED, {}),
    "reclaimed": (RECLAIMED, {}), "lease_lost": (LEASES_LOST, {}), "claims": (CLAIMS, {}),
    "claimed": (CLAIMED, {}), "empty_idle": (EMPTY_CLAIMS, {"kind": "idle"}),
    "empty_contended": (EMPTY_CLAIMS, {"kind": "contended"}),
    "empty_waiting": (EMPTY_CLAIMS, {"kind": "waiting_on_leases"}), "skipped": (SKIPPED, {}),
    "sql_errors": (SQL_ERRORS, {}),
}


def stat_totals() -> dict[str, int]:
    """This process's running totals of the activity columns."""
    out = {}
    for column, (metric, match) in _STAT_SOURCES.items():
        total = 0.0
        for family in metric.collect():
            for sample in family.samples:
                if sample.name.endswith("_total") and all(sample.labels.get(k) == v for k, v in match.items()):
                    total += sample.value
        out[column] = int(total)
    return out
