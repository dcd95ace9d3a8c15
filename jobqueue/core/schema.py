"""Table definitions the repository queries. The DDL itself lives in the Alembic migrations.

Indexes, and which statement each one serves:
- `ix_ready_pick (status, queue, priority, id)`: the claim (`status='ready' AND queue=?
  ORDER BY priority, id`) reads it in order with no filesort, and done rows sit under another
  `status` prefix, so the claim does not slow down as they pile up. Counts per status and queue
  are index-only.
- `ix_due (status, run_at, queue)`: promoting due `scheduled` jobs; the oldest ready job's age
  per queue, index-only.
- `ix_task (task_name, id)`: the dashboard's task filter, newest first.
- `ix_concurrency (concurrency_key, status)`: running jobs per concurrency key, for the claim's
  limit check (`concurrency_key IN (...) AND status = 'running'`: exact index ranges, however
  many done jobs a key has). Not an indexed virtual column: with one, MariaDB refuses every
  later online ADD COLUMN on this table (see migration 0005).
- `uk_task_key`: idempotent enqueue.
"""

from __future__ import annotations

import json

import sqlalchemy as sa
from sqlalchemy.dialects import mysql

from .models import Status

metadata = sa.MetaData()

Timestamp = sa.DateTime().with_variant(mysql.DATETIME(fsp=6), "mysql", "mariadb")
BigId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


class JsonText(sa.types.TypeDecorator):
    """A JSON document kept as the text it was written, byte for byte, on every server: LONGTEXT
    with a JSON_VALID check on MySQL and MariaDB (MariaDB's JSON type is exactly that; MySQL's is
    a binary document that sorts keys, drops escapes and turns integers beyond 64 bits into
    doubles: migration 0008), SQLite's JSON (text) there. Written as json.dumps writes it, read
    back with json.loads: a handler gets the keys in their order and every integer as it was."""

    impl = sa.JSON
    cache_ok = True

    def load_dialect_impl(self, dialect):
        return dialect.type_descriptor(mysql.LONGTEXT() if _as_text(dialect) else sa.JSON())

    def process_bind_param(self, value, dialect):
        return json.dumps(value) if value is not None and _as_text(dialect) else value

    def process_result_value(self, value, dialect):
        # SQLite's JSON type has decoded it already: a string there is a JSON string, not a document.
        return json.loads(value) if value is not None and _as_text(dialect) else value


def _as_text(dialect) -> bool:
    return dialect.name in ("mysql", "mariadb")


StatusType = sa.Enum(
    *[s.value for s in Status], name="job_status", native_enum=True, create_constraint=False, validate_strings=True
)

job_queue = sa.Table(
    "job_queue",
    metadata,
    sa.Column("id", BigId, primary_key=True, autoincrement=True),
    sa.Column("task_key", sa.String(80), nullable=False),
    sa.Column("task_name", sa.String(100), nullable=False),
    sa.Column("queue", sa.String(64), nullable=False),
    sa.Column("priority", sa.SmallInteger(), nullable=False),
    sa.Column("payload", JsonText(), nullable=False),
    sa.Column("status", StatusType, nullable=False),
    sa.Column("run_at", Timestamp, nullable=False),
    sa.Column("lease_owner", sa.String(64), nullable=True),
    sa.Column("lease_until", Timestamp, nullable=True),
    sa.Column("attempts", sa.Integer(), nullable=False, server_default="0"),
    sa.Column("max_attempts", sa.Integer(), nullable=False),
    sa.Column("started_at", Timestamp, nullable=True),
    sa.Column("last_error", sa.Text(), nullable=True),
    sa.Column("created_at", Timestamp, nullable=False),
    sa.Column("updated_at", Timestamp, nullable=False),
    sa.Column("finished_at", Timestamp, nullable=True),
    # "<task>:<payload value>" for tasks with a concurrency limit (see concurrency_key below).
    sa.Column("concurrency_key", sa.String(200), nullable=True),
    # Finishing this job has consequences: a job_dependency row names it as a parent, or it is a
    # batch member (repository/hooks.py). Set under the job's row lock (by the child's enqueue,
    # or when the job is written into its batch), read by the locks a completion takes anyway, so
    # only such a job pays for the look at its children and its batch.
    sa.Column("has_dependents", sa.Boolean(), nullable=False, server_default="0"),
    # "<task>" or "<task>:<payload value>" for tasks with a rate limit (see rate_window below).
    sa.Column("rate_bucket", sa.String(200), nullable=True),
    # The enqueuer's span (W3C traceparent [tracestate]) when OpenTelemetry was on: tracing.py.
    sa.Column("trace_context", sa.String(255), nullable=True),
    sa.UniqueConstraint("task_key", name="uk_task_key"),
    sa.Index("ix_ready_pick", "status", "queue", "priority", "id"),
    sa.Index("ix_due", "status", "run_at", "queue"),
    sa.Index("ix_task", "task_name", "id"),
    # A queue and a task together (/jobs?queue=mail&task=export_orders): without it a pair that
    # never goes together read every entry of the task and its row (see pinned_index).
    sa.Index("ix_queue_task", "queue", "task_name", "id"),
    sa.Index("ix_concurrency", "concurrency_key", "status"),
)

# A child job waits (status blocked) for each parent; on_parent_failure is `cancel` (a parent
# failed or cancelled cancels the child) or `run` (such a parent counts as finished). Rows stay
# after the child is settled, for the job page's parents and children.
job_dependency = sa.Table(
    "job_dependency",
    metadata,
    sa.Column("parent_id", sa.BigInteger(), primary_key=True, autoincrement=False),
    sa.Column("child_id", sa.BigInteger(), primary_key=True, autoincrement=False),
    sa.Column("on_parent_failure", sa.String(10), nullable=False),
    sa.Index("ix_dependency_child", "child_id"),
)

# A batch of jobs with callbacks (repository/batches.py). The counters are kept here, updated
# under this row's lock in each member's finishing transaction, so they survive the pruning of
# finished members; *_job_id is the callback job once enqueued (never twice).
job_batch = sa.Table(
    "job_batch",
    metadata,
    sa.Column("id", BigId, primary_key=True, autoincrement=True),
    sa.Column("batch_key", sa.String(64), nullable=False),
    sa.Column("state", sa.String(10), nullable=False),  # open | closed | finished
    sa.Column("on_success", sa.String(100), nullable=True),
    sa.Column("on_failure", sa.String(100), nullable=True),
    sa.Column("on_complete", sa.String(100), nullable=True),
    sa.Column("payload", JsonText(), nullable=True),
    sa.Column("total", sa.Integer(), nullable=False, server_default="0"),
    sa.Column("done", sa.Integer(), nullable=False, server_default="0"),
    sa.Column("failed", sa.Integer(), nullable=False, server_default="0"),
    sa.Column("cancelled", sa.Integer(), nullable=False, server_default="0"),
    sa.Column("success_job_id", sa.BigInteger(), nullable=True),
    sa.Column("failure_job_id", sa.BigInteger(), nullable=True),
    sa.Column("complete_job_id", sa.BigInteger(), nullable=True),
    sa.Column("created_at", Timestamp, nullable=False),
    sa.Column("closed_at", Timestamp, nullable=True),
    sa.Column("finished_at", Timestamp, nullable=True),
    # The span the batch was opened in, which its callbacks' spans link to (tracing.py).
    sa.Column("trace_context", sa.String(255), nullable=True),
    sa.UniqueConstraint("batch_key", name="uk_batch_key"),
    # Retention's candidates: finished batches, oldest first.
    sa.Index("ix_batch_finished", "state", "finished_at"),
)

# A batch's member jobs; `counted` is the final status the batch's counters count it as (NULL:
# not finished), so a member that a later action moves (failed -> cancelled, requeued) is
# counted again correctly rather than twice.
job_batch_member = sa.Table(
    "job_batch_member",
    metadata,
    sa.Column("job_id", sa.BigInteger(), primary_key=True, autoincrement=False),
    sa.Column("batch_id", sa.BigInteger(), nullable=False),
    sa.Column("counted", sa.String(10), nullable=True),
    sa.Index("ix_batch_member", "batch_id", "job_id"),
)

# One downstream result per task_key: a replayed task_key records nothing new.
job_result = sa.Table(
    "job_result",
    metadata,
    sa.Column("id", BigId, primary_key=True, autoincrement=True),
    sa.Column("task_key", sa.String(80), nullable=False),
    sa.Column("job_id", sa.BigInteger(), nullable=False),
    sa.Column("attempt", sa.Integer(), nullable=False),
    sa.Column("worker", sa.String(64), nullable=False),
    sa.Column("result", JsonText(), nullable=False),
    sa.Column("created_at", Timestamp, nullable=False),
    sa.UniqueConstraint("task_key", name="uk_result_task_key"),
)

# Attempts that did not end in success (retries, failures, expired leases, releases). A
# successful attempt is the job row itself (lease_owner, started_at, finished_at), so the hot
# path writes nothing here.
job_attempt = sa.Table(
    "job_attempt",
    metadata,
    sa.Column("id", BigId, primary_key=True, autoincrement=True),
    sa.Column("job_id", sa.BigInteger(), nullable=False),
    sa.Column("attempt", sa.Integer(), nullable=False),
    sa.Column("worker", sa.String(64), nullable=True),
    sa.Column("started_at", Timestamp, nullable=True),
    sa.Column("finished_at", Timestamp, nullable=False),
    sa.Column("outcome", sa.String(20), nullable=False),
    sa.Column("error", sa.Text(), nullable=True),
    sa.Index("ix_attempt_job", "job_id", "attempt"),
)

# One row per worker process (standalone or embedded in a web process), kept fresh by its
# heartbeat. Rows whose heartbeat stopped show which processes died without a clean stop.
worker_process = sa.Table(
    "worker_process",
    metadata,
    sa.Column("id", sa.String(64), primary_key=True),  # host:pid[:name], the lease-owner prefix
    sa.Column("host", sa.String(255), nullable=False),
    sa.Column("pid", sa.Integer(), nullable=False),
    sa.Column("kind", sa.String(20), nullable=False),  # worker | embedded
    sa.Column("concurrency", sa.Integer(), nullable=False),
    sa.Column("queues", sa.String(1000), nullable=False),
    sa.Column("started_at", Timestamp, nullable=False),
    sa.Column("last_heartbeat", Timestamp, nullable=False),
    sa.Column("stopped_at", Timestamp, nullable=True),
    sa.Column("jobs_in_hand", sa.Integer(), nullable=False),
    sa.Column("processed", sa.BigInteger(), nullable=False),
    sa.Column("state", sa.Text(), nullable=True),  # JSON: claiming or not and why, what each slot holds
    sa.Index("ix_worker_heartbeat", "last_heartbeat"),
)

# What each process did per minute: the overview's throughput chart and activity panels read
# these few rows instead of scanning job_queue. Each process writes only its own rows, so the
# flush never contends with another process.
STAT_COLUMNS = (
    "completed",
    "failed",
    "retried",
    "reclaimed",
    "lease_lost",
    "claims",
    "claimed",
    "empty_idle",
    "empty_contended",
    "empty_waiting",
    "skipped",
    "sql_errors",
)
worker_stats = sa.Table(
    "worker_stats",
    metadata,
    sa.Column("minute", Timestamp, primary_key=True),
    sa.Column("process_id", sa.String(64), primary_key=True),
    *[sa.Column(name, sa.Integer(), nullable=False, server_default="0") for name in STAT_COLUMNS],
)

# Every operator action: who, when, what (one job or a filter), status before and after.
audit_log = sa.Table(
    "audit_log",
    metadata,
    sa.Column("id", BigId, primary_key=True, autoincrement=True),
    sa.Column("at", Timestamp, nullable=False),
    sa.Column("actor", sa.String(100), nullable=False),
    sa.Column("action", sa.String(20), nullable=False),
    sa.Column("job_id", sa.BigInteger(), nullable=True),
    sa.Column("selection", sa.Text(), nullable=True),  # for bulk actions: the ids or the filter
    sa.Column("before_status", sa.String(20), nullable=True),
    sa.Column("after_status", sa.String(20), nullable=True),
    sa.Column("count", sa.Integer(), nullable=False),
    sa.Column("detail", sa.Text(), nullable=True),
    sa.Index("ix_audit_job", "job_id"),
)

# Dashboard sessions, so that the server can end them: logout, a password change in
# JOBQUEUE_USERS (`credential` is a digest of the password hash at sign-in) and "sign out
# everywhere" end a session in every web process on every host at once. `id` is a digest of the
# token in the signed cookie, never the token itself.
web_session = sa.Table(
    "web_session",
    metadata,
    sa.Column("id", sa.String(64), primary_key=True),
    sa.Column("user_name", sa.String(100), nullable=False),
    sa.Column("credential", sa.String(64), nullable=False),
    sa.Column("address", sa.String(64), nullable=True),
    sa.Column("created_at", Timestamp, nullable=False),
    sa.Column("last_seen_at", Timestamp, nullable=False),
    sa.Column("ended_at", Timestamp, nullable=True),
    sa.Column("end_reason", sa.String(20), nullable=True),
    sa.Index("ix_session_user", "user_name", "ended_at"),
    sa.Index("ix_session_seen", "last_seen_at"),
)

# The login throttle's counters, one row per client address and per (address, user name), keyed
# by a digest of that pair; every row expires, so the table stays as small as the guessing is.
login_throttle = sa.Table(
    "login_throttle",
    metadata,
    sa.Column("id", sa.String(64), primary_key=True),
    sa.Column("scope", sa.String(20), nullable=False),  # address | address_user
    sa.Column("failures", sa.Integer(), nullable=False),
    sa.Column("blocked_until", Timestamp, nullable=True),
    sa.Column("expires_at", Timestamp, nullable=False),
    sa.Index("ix_throttle_expiry", "expires_at"),
)

# Paused queues (and queues resumed since): who changed it and when. Workers leave a paused
# queue out of the queues they claim from; nothing else reads this on the hot path.
queue_state = sa.Table(
    "queue_state",
    metadata,
    sa.Column("queue", sa.String(64), primary_key=True),
    sa.Column("paused", sa.Boolean(), nullable=False),
    sa.Column("changed_at", Timestamp, nullable=False),
    sa.Column("changed_by", sa.String(100), nullable=False),
)

# Recurring jobs: every tick of `cron` (UTC) enqueues one job whose task_key is
# recurring:<name>:<tick as YYYY-MM-DDTHH:MM>, so however many processes see a tick due, the
# existing idempotency makes it one job. `source` is `operator` (CLI, API, dashboard) or `code`
# (@task(..., cron=...)).
recurring_job = sa.Table(
    "recurring_job",
    metadata,
    sa.Column("name", sa.String(50), primary_key=True),
    sa.Column("cron", sa.String(100), nullable=False),
    sa.Column("task_name", sa.String(100), nullable=False),
    sa.Column("payload", JsonText(), nullable=False),
    sa.Column("queue", sa.String(64), nullable=True),  # None: the task's queue
    sa.Column("enabled", sa.Boolean(), nullable=False),
    sa.Column("source", sa.String(10), nullable=False),
    sa.Column("next_run_at", Timestamp, nullable=False),
    sa.Column("last_run_at", Timestamp, nullable=True),  # the last tick enqueued
    sa.Column("last_job_id", sa.BigInteger(), nullable=True),
    sa.Column("created_at", Timestamp, nullable=False),
    sa.Column("updated_at", Timestamp, nullable=False),
    sa.Column("updated_by", sa.String(100), nullable=False),
)

# One row per concurrency key ("<task>:<value>"), with its limit. A claim that picked keyed jobs
# locks their key rows with SKIP LOCKED before counting the key's running jobs, so two claims
# never both take the last place of one key; a claim that finds a key row held elsewhere leaves
# that key's jobs ready for the next turn instead of waiting. The places themselves are the
# running rows (ix_concurrency), so they come back by themselves whenever a job stops running:
# completed, retried, failed, reaped, released, requeued or cancelled.
concurrency_key = sa.Table(
    "concurrency_key",
    metadata,
    sa.Column("name", sa.String(200), primary_key=True),
    sa.Column("max_running", sa.Integer(), nullable=False),
    sa.Column("updated_at", Timestamp, nullable=False),
)

# One row per rate bucket ("<task>" or "<task>:<value>"): its limit (max_starts per period_seconds,
# written by enqueue like concurrency_key's) and the starts counted in its current window.
# Windows are fixed and aligned to the database clock (window_start = floor(now / period)), so
# every process and host counts the same window. A claim that picked jobs of a bucket locks its
# row with SKIP LOCKED, takes at most the starts the window has left, and adds what it took
# before its COMMIT: two claims never both spend the last start. Jobs of other tasks never touch it.
rate_window = sa.Table(
    "rate_window",
    metadata,
    sa.Column("bucket", sa.String(200), primary_key=True),
    sa.Column("max_starts", sa.Integer(), nullable=False),
    sa.Column("period_seconds", sa.Integer(), nullable=False),
    sa.Column("window_start", Timestamp, nullable=True),
    sa.Column("starts", sa.Integer(), nullable=False, server_default="0"),
    sa.Column("updated_at", Timestamp, nullable=False),
)

# What is left of a pruned job: its task_key, so that a replay still answers duplicate: true and
# never runs again. Kept JOBQUEUE_KEEP_KEYS_DAYS after pruning (see retention.py).
pruned_key = sa.Table(
    "pruned_key",
    metadata,
    sa.Column("task_key", sa.String(80), primary_key=True),
    sa.Column("job_id", sa.BigInteger(), nullable=False),
    sa.Column("status", sa.String(10), nullable=False),
    sa.Column("finished_at", Timestamp, nullable=True),
    sa.Column("pruned_at", Timestamp, nullable=False),
    sa.Index("ix_pruned_at", "pruned_at"),
)

# What is left of a pruned batch: the batch as it finished (its key, counters and callbacks), so
# that opening its key again finds that finished batch (created: false, no callback fires again)
# rather than a new one. A table of its own, not a row of pruned_key: a batch key is any task_key
# of 1-64 characters, so no prefix could keep it apart from some job's task_key. Kept
# JOBQUEUE_KEEP_KEYS_DAYS after pruning, as the keys of jobs are.
pruned_batch = sa.Table(
    "pruned_batch",
    metadata,
    sa.Column("batch_key", sa.String(64), primary_key=True),
    sa.Column("batch_id", sa.BigInteger(), nullable=False),
    sa.Column("on_success", sa.String(100), nullable=True),
    sa.Column("on_failure", sa.String(100), nullable=True),
    sa.Column("on_complete", sa.String(100), nullable=True),
    sa.Column("payload", JsonText(), nullable=True),
    sa.Column("total", sa.Integer(), nullable=False),
    sa.Column("done", sa.Integer(), nullable=False),
    sa.Column("failed", sa.Integer(), nullable=False),
    sa.Column("cancelled", sa.Integer(), nullable=False),
    sa.Column("success_job_id", sa.BigInteger(), nullable=True),
    sa.Column("failure_job_id", sa.BigInteger(), nullable=True),
    sa.Column("complete_job_id", sa.BigInteger(), nullable=True),
    sa.Column("created_at", Timestamp, nullable=False),
    sa.Column("closed_at", Timestamp, nullable=True),
    sa.Column("finished_at", Timestamp, nullable=True),
    sa.Column("pruned_at", Timestamp, nullable=False),
    sa.Index("ix_pruned_batch_at", "pruned_at"),
)

# One row per prune pass (any process), for the dashboard's "last prune" and so that processes
# do not all prune at once.
prune_run = sa.Table(
    "prune_run",
    metadata,
    sa.Column("id", BigId, primary_key=True, autoincrement=True),
    sa.Column("started_at", Timestamp, nullable=False),
    sa.Column("finished_at", Timestamp, nullable=True),
    sa.Column("run_by", sa.String(100), nullable=False),
    sa.Column("done_rows", sa.Integer(), nullable=False, server_default="0"),
    sa.Column("failed_rows", sa.Integer(), nullable=False, server_default="0"),
    sa.Column("cancelled_rows", sa.Integer(), nullable=False, server_default="0"),
    sa.Column("attempt_rows", sa.Integer(), nullable=False, server_default="0"),
    sa.Column("keys_expired", sa.Integer(), nullable=False, server_default="0"),
    sa.Column("batches", sa.Integer(), nullable=False, server_default="0"),
    sa.Column("seconds", sa.Float(), nullable=True),
    sa.Column("batch_rows", sa.Integer(), nullable=False, server_default="0"),  # job_batch rows pruned
)

# The tasks that worker processes have registered (each worker writes its own on start), so a
# process that imports no handler can still enqueue by name, with the task's queue, attempts and
# concurrency key, and a misspelt name is still caught. One row per task name; the latest worker
# to start wins (workers of one deploy register the same code).
task_definition = sa.Table(
    "task_definition",
    metadata,
    sa.Column("name", sa.String(100), primary_key=True),
    sa.Column("queue", sa.String(64), nullable=False),
    sa.Column("max_attempts", sa.Integer(), nullable=False),
    sa.Column("concurrency_key", sa.String(100), nullable=True),
    sa.Column("concurrency_limit", sa.Integer(), nullable=True),
    sa.Column("rate_limit", sa.String(20), nullable=True),
    sa.Column("rate_key", sa.String(100), nullable=True),
    sa.Column("registered_by", sa.String(64), nullable=False),
    sa.Column("registered_at", Timestamp, nullable=False),
)
