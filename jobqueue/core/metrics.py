"""Counters and histograms for what the queue does, in the Prometheus client's types, and their
exposition.

Every label set is small and fixed (queue names, task names, outcome kinds), never a job id or
task_key.

Under gunicorn every web process counts for itself: prometheus_client's multiprocess mode
(PROMETHEUS_MULTIPROC_DIR, set up by jobqueue/web/gunicorn_conf.py) keeps each process's values in
a file and /metrics adds them up (histograms too: their buckets are counters). A standalone
`jobqueue worker --metrics-port N` serves its own. The web's /metrics adds queue depth and the
oldest ready job's age, read from the database at scrape time (jobqueue.web.health), so they are
right however many processes and hosts there are.

The metrics are made on first use, so a one-shot command (`jobqueue enqueue`) does not pay for
importing prometheus_client; such commands call `off()`, after which every metric is a no-op.
"""

from __future__ import annotations

import os
import threading
from typing import Any

# Buckets that suit a 5 ms no-op job and a 10-minute export alike (seconds).
DURATION_BUCKETS = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    120.0,
    300.0,
    600.0,
    1800.0,
    3600.0,
)
# A claim transaction: a fraction of a millisecond when quiet, seconds when the server struggles.
CLAIM_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)

_COUNTERS: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "CLAIMS": ("jobqueue_claims", "Claim transactions attempted", ("queue",)),
    "CLAIMED": ("jobqueue_jobs_claimed", "Jobs taken by claims", ("queue",)),
    "EMPTY_CLAIMS": ("jobqueue_empty_claims", "Claims that returned nothing, by cause", ("kind", "queues")),
    "PROBES": (
        "jobqueue_idle_probes",
        "Reads an idle worker made instead of a claim, by what they found",
        ("kind", "queues"),
    ),
    "SKIPPED": ("jobqueue_rows_skipped", "Ready rows a claim passed by because another transaction held them", ()),
    "COMPLETED": ("jobqueue_jobs_completed", "Jobs finished successfully", ("queue",)),
    "RETRIED": ("jobqueue_jobs_retried", "Handler errors scheduled for another attempt", ("queue",)),
    "FAILED": ("jobqueue_jobs_failed", "Jobs failed for good", ("queue",)),
    "RENEWALS": ("jobqueue_lease_renewals", "Leases renewed", ()),
    "LEASES_LOST": (
        "jobqueue_leases_lost",
        "Leases a worker lost (fence refused a write, or its local deadline passed)",
        ("operation",),
    ),
    "RECLAIMED": ("jobqueue_jobs_reclaimed", "Expired leases returned by the reaper", ("to_status",)),
    "RELEASED": ("jobqueue_jobs_released", "Jobs handed back to ready on shutdown", ()),
    "PROMOTED": ("jobqueue_jobs_promoted", "Delayed jobs and retries made ready", ()),
    "ENQUEUED": ("jobqueue_jobs_enqueued", "Jobs accepted", ("queue",)),
    "DUPLICATE_ENQUEUES": ("jobqueue_duplicate_enqueues", "Enqueues of a known task_key (nothing written)", ()),
    "DUPLICATE_RESULTS": (
        "jobqueue_duplicate_results",
        "Results recorded again for a known task_key (nothing written)",
        (),
    ),
    "TRANSIENT_RETRIES": (
        "jobqueue_transient_retries",
        "Transactions retried after a deadlock, lock-wait timeout or lost connection",
        ("kind", "operation"),
    ),
    "SQL_ERRORS": ("jobqueue_sql_errors", "Database errors seen by the worker loop", ("operation",)),
    "NOT_PRIMARY": (
        "jobqueue_not_primary",
        "Claims and writes refused because the server was not a writable primary",
        ("operation",),
    ),
    "LOGINS": ("jobqueue_login_attempts", "Dashboard sign-in attempts: ok, failed, throttled", ("outcome",)),
    "LOGINS_THROTTLED": (
        "jobqueue_logins_throttled",
        "Sign-in attempts refused by the throttle, by the limit that held (address, address_user)",
        ("limit",),
    ),
    "SESSIONS_ENDED": (
        "jobqueue_sessions_ended",
        "Dashboard sessions ended: logout, signed_out_all, idle, expired, credential_changed, ...",
        ("reason",),
    ),
    "OPERATOR_ACTIONS": (
        "jobqueue_operator_actions",
        "Operator requeue, fail and cancel actions",
        ("action", "outcome"),
    ),
    "CANCELLED": ("jobqueue_jobs_cancelled", "Jobs cancelled by an operator", ()),
    "CONCURRENCY_LIMITED": (
        "jobqueue_concurrency_limited",
        "Ready jobs a claim left alone because their concurrency key was full",
        (),
    ),
    "PRUNED": ("jobqueue_jobs_pruned", "Finished jobs deleted by retention", ("status",)),
}

_HISTOGRAMS: dict[str, tuple[str, str, tuple[str, ...], tuple[float, ...]]] = {
    "ATTEMPT_SECONDS": (
        "jobqueue_attempt_duration_seconds",
        "Run time of attempts, from handler start to its end",
        ("task", "outcome"),
        DURATION_BUCKETS,
    ),
    "START_DELAY_SECONDS": (
        "jobqueue_start_delay_seconds",
        "Wait from a job's run_at to its claim",
        ("queue",),
        DURATION_BUCKETS,
    ),
    "CLAIM_SECONDS": ("jobqueue_claim_duration_seconds", "Claim transactions, from BEGIN to COMMIT", (), CLAIM_BUCKETS),
}

_made: dict[str, Any] = {}
_lock = threading.Lock()
_enabled = True


class _Null:
    """What every metric is after off(): accepts the same calls and does nothing."""

    def labels(self, *args: Any, **kwargs: Any) -> _Null:
        return self

    def inc(self, amount: float = 1) -> None:
        pass

    def observe(self, amount: float) -> None:
        pass

    def collect(self) -> list:
        return []


_NULL = _Null()


_children: dict[tuple[str, tuple[str, ...]], Any] = {}


def labelled(name: str, *values: str) -> Any:
    """Metric `name`'s child for these label values (in the metric's label order), looked up once:
    the worker counts every job, and `labels()` costs a lock and a tuple each time."""
    key = (name, values)
    child = _children.get(key)
    if child is None:
        if not _enabled:
            return _NULL
        child = _children[key] = __getattr__(name).labels(*values)
    return child


def off() -> None:
    """This process serves no metrics (a one-shot command): make every metric a no-op."""
    global _enabled
    _enabled = False
    _children.clear()


def on() -> None:
    """Undo off() (a test that ran a one-shot command in-process)."""
    global _enabled
    _enabled = True


def __getattr__(name: str) -> Any:
    if name == "REGISTRY":
        from prometheus_client import REGISTRY

        return REGISTRY
    if name not in _COUNTERS and name not in _HISTOGRAMS:
        raise AttributeError(name)
    if not _enabled:
        return _NULL
    with _lock:
        if name not in _made:
            from prometheus_client import Counter, Histogram

            if name in _COUNTERS:
                metric, doc, labels = _COUNTERS[name]
                _made[name] = Counter(metric, doc, list(labels))
            else:
                metric, doc, labels, buckets = _HISTOGRAMS[name]
                _made[name] = Histogram(metric, doc, list(labels), buckets=buckets)
        return _made[name]


def make_all() -> None:
    """Create every metric now, so that a scrape lists them (with zero values) from the start."""
    for name in (*_COUNTERS, *_HISTOGRAMS):
        __getattr__(name)


# The per-minute activity each process writes to `worker_stats` (see repository.processes.heartbeat),
# read from the counters above so that nothing is counted twice by hand.
_STAT_SOURCES = {
    "completed": ("COMPLETED", {}),
    "failed": ("FAILED", {}),
    "retried": ("RETRIED", {}),
    "reclaimed": ("RECLAIMED", {}),
    "lease_lost": ("LEASES_LOST", {}),
    "claims": ("CLAIMS", {}),
    "claimed": ("CLAIMED", {}),
    "empty_idle": ("EMPTY_CLAIMS", {"kind": "idle"}),
    "empty_contended": ("EMPTY_CLAIMS", {"kind": "contended"}),
    "empty_waiting": ("EMPTY_CLAIMS", {"kind": "waiting_on_leases"}),
    "skipped": ("SKIPPED", {}),
    "sql_errors": ("SQL_ERRORS", {}),
}


def stat_totals() -> dict[str, int]:
    """This process's running totals of the activity columns. A metric not made yet has counted
    nothing: it is not made here either, so that a worker's registration (which reads the totals
    it starts from) does not import prometheus_client ahead of its first claim."""
    out = {}
    for column, (name, match) in _STAT_SOURCES.items():
        total = 0.0
        with _lock:
            metric = _made.get(name)
        for family in metric.collect() if metric is not None and _enabled else ():
            for sample in family.samples:
                if sample.name.endswith("_total") and all(sample.labels.get(k) == v for k, v in match.items()):
                    total += sample.value
        out[column] = int(total)
    return out


def exposition(*collectors) -> bytes:
    """The Prometheus text format: this process's metrics (or every gunicorn worker's, in
    multiprocess mode), plus what `collectors` yield (the web's queue gauges)."""
    from prometheus_client import REGISTRY, CollectorRegistry, generate_latest

    make_all()
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess

        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
        out = generate_latest(registry)
    else:
        out = generate_latest(REGISTRY)
    if collectors:
        extra = CollectorRegistry()
        for collector in collectors:
            extra.register(collector)
        out += generate_latest(extra)
    return out
