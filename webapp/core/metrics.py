"""Counters for what the queue does, in the Prometheus client's types, and their exposition.

Every label set is small and fixed (queue names, outcome kinds), never a job id or task_key.

Under gunicorn every web process counts for itself: prometheus_client's multiprocess mode
(PROMETHEUS_MULTIPROC_DIR, set up by webapp/web/gunicorn_conf.py) keeps each process's values in
a file and /metrics adds them up. A standalone `jobqueue worker --metrics-port N` serves its own.
Queue depth and the oldest ready job's age are read from the database at scrape time, so they
are right however many processes and hosts there are.
"""

from __future__ import annotations

import os

from prometheus_client import REGISTRY, CollectorRegistry, Counter, generate_latest
from prometheus_client.core import GaugeMetricFamily

CLAIMS = Counter("jobqueue_claims", "Claim transactions attempted", ["queue"])
CLAIMED = Counter("jobqueue_jobs_claimed", "Jobs taken by claims", ["queue"])
EMPTY_CLAIMS = Counter("jobqueue_empty_claims", "Claims that returned nothing, by cause", ["kind", "queues"])
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


class QueueCollector:
    """Gauges read from the database when scraped: jobs by queue and status (capped counts, see
    repository.queue_summaries) and the oldest ready job's age per queue."""

    def __init__(self, engine):
        self.engine = engine

    def collect(self):
        from . import repository

        with self.engine.connect() as conn:
            summaries, now = repository.queue_summaries(conn)
        jobs = GaugeMetricFamily("jobqueue_queue_jobs", "Jobs by queue and status (capped at 100,000 per pair)",
                                 labels=["queue", "status"])
        oldest = GaugeMetricFamily("jobqueue_queue_oldest_ready_age_seconds",
                                   "How long the oldest ready job of each queue has waited", labels=["queue"])
        for q in summaries:
            for status, n in q.counts.items():
                jobs.add_metric([q.queue, status], n)
            oldest.add_metric([q.queue], (now - q.oldest_ready).total_seconds() if q.oldest_ready else 0.0)
        yield jobs
        yield oldest


def exposition(engine=None) -> bytes:
    """The Prometheus text format: this process's counters (or every gunicorn worker's, in
    multiprocess mode), plus the queue gauges when an engine is given."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess

        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
        out = generate_latest(registry)
    else:
        out = generate_latest(REGISTRY)
    if engine is not None:
        gauges = CollectorRegistry()
        gauges.register(QueueCollector(engine))
        out += generate_latest(gauges)
    return out
