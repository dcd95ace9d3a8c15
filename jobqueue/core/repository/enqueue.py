"""enqueue: new jobs, idempotent by task_key.

A task_key is taken while its job is in job_queue and, once the job has been pruned, while its
record in pruned_key lasts (JOBQUEUE_KEEP_KEYS_DAYS): a replay of a pruned job's key answers
duplicate: true with the old job's id and status, and writes nothing.

A batch is, in one transaction:

    INSERT IGNORE INTO job_queue (...) VALUES (...), (...), ...      -- keys already there are skipped
    SELECT 'p', task_key, job_id, status FROM pruned_key WHERE task_key IN (...)
    COMMIT

In a transaction above READ COMMITTED (the caller's, REPEATABLE READ by default, whose consistent
reads miss rows committed after its snapshot) the reads after the INSERT lock what they must see:
pruned_key, and job_queue for our own rows and for known keys the consistent read does not find
(see _read). A deadlock or MariaDB 11.6.2+'s 1020 there has rolled the
caller's whole transaction back: TransactionConflict (db.callers_transaction).

The INSERT's row count says what happened. Every row went in: all ours, and their ids are
LAST_INSERT_ID() onwards where InnoDB numbered a statement's rows consecutively (promised by
the lock modes of _id_numbering, else checked by _numbered_in_a_row; where neither holds the read
below also reads job_queue for them). A key that turns out
to be in pruned_key is deleted again before the COMMIT (the read comes after the INSERT, so a
prune that committed while our INSERT waited on its row is seen). No row went in: all known, and
one read (job_queue UNION ALL pruned_key, by task_key) gives their ids and statuses. Only some
went in: the read cannot tell which rows are ours, so the try is undone and run again the exact
way: read the known keys first, insert only the others, then their ids.

Why INSERT IGNORE and not INSERT ... ON DUPLICATE KEY UPDATE id = id: SQLAlchemy's MySQL
dialects connect with CLIENT_FOUND_ROWS, under which a duplicate row that ODKU "updated" to
itself counts as affected, so the row count could not tell written rows from known ones.
IGNORE also turns other errors (a value too long, out of range, invalid JSON) into warnings and
stores something else (or skips the row); so every job is validated first (validation.new_job:
types, ranges, lengths, JSON, Unicode), NewJob objects passed in included, and an INSERT whose
warning count is not one per skipped row has its warnings read (SHOW WARNINGS): anything but a
duplicate key (1062) is raised as ServerRefusedRows and the batch rolled back. The warning
count comes with the INSERT's reply, so the check costs nothing when all is well. On SQLite,
INSERT OR IGNORE skips only constraint conflicts.

The statement text is built here rather than by SQLAlchemy: on MySQL as literals escaped by the
driver's own escaping (the same function PyMySQL applies to parameters, honouring
NO_BACKSLASH_ESCAPES), with the repeated values (task, queue, payload) escaped once per batch;
on SQLite with parameters. Building 1,000 rows through SQLAlchemy's executemany cost more than
the statement's time in the server.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from .. import retry, tracing
from ..db import (
    TRANSACTION_ROLLED_BACK,
    callers_transaction,
    error_code,
    is_mysql,
    reads_committed,
    require_primary,
    transaction,
    transient_kind,
)
from ..db.drivers import escaper
from ..errors import JobQueueError, ValidationError
from ..models import Enqueued, Status
from ..schema import job_queue
from ..tasks import TASKS, Registry
from ..validation import ENQUEUE_FIELDS, NewJob, max_payload_bytes, new_job
from . import batches, dependencies
from .common import execute_sql, jq
from .limits import ensure_buckets, ensure_keys

ER_DUP_ENTRY = 1062
READ_KEYS = 1000  # task_keys per read (an IN list)
STATEMENT_BYTES = 4 << 20  # an INSERT's text stays well under max_allowed_packet (16 MiB on MariaDB)
SQLITE_ROWS = 1000  # rows per INSERT on SQLite (11 parameters each; SQLite allows 32,766)

# A try undone on purpose (some rows of the batch were known, or another transaction inserted
# one of our keys between our read and our insert) runs again at once: the rows are there now.
_TRIES = retry.RetryPolicy(attempts=4, first_delay=0.0, max_delay=0.0)
CURRENT_SPAN = "current span"  # enqueue_many(trace=...): the caller's current span's context, if any


class ServerRefusedRows(JobQueueError):
    """INSERT IGNORE skipped rows for a reason other than a known task_key (the server's warning
    is in the message). Validation should have refused the job first: a bug, or a schema that
    does not match this version."""


class _Undo(Exception):
    """Roll this try back and run the batch again the exact way."""


class Validated(list):
    """Jobs that validate_jobs / validate_job checked: enqueue_many takes them as they are."""


def validate_job(
    spec: NewJob | Mapping[str, Any],
    *,
    registry: Registry = TASKS,
    limit: int | None = None,
    allow_unregistered: bool = False,
) -> NewJob:
    """One job checked (a NewJob again: it may have been built or changed by hand, and INSERT
    IGNORE must never meet a value the server would refuse); `limit` is the payload size limit."""
    if limit is None:
        limit = max_payload_bytes()
    try:
        if isinstance(spec, NewJob):
            return new_job(
                spec.task_name,
                spec.task_key,
                spec.payload,
                queue=spec.queue,
                priority=spec.priority,
                delay=spec.delay_seconds,
                max_attempts=spec.max_attempts,
                registry=registry,
                max_payload=limit,
                allow_unregistered=allow_unregistered,
            )
        if type(spec) is dict and spec.keys() <= ENQUEUE_FIELDS:
            # The fields of POST /api/jobs (what the CLI, the API and most callers pass): read
            # where they are, without a copy of the dict and a call by keywords.
            get = spec.get
            return new_job(
                get("task"),
                get("task_key"),
                get("payload"),
                queue=get("queue"),
                priority=get("priority", 0),
                delay=get("delay", 0),
                max_attempts=get("max_attempts"),
                registry=registry,
                max_payload=limit,
                allow_unregistered=get("allow_unregistered", allow_unregistered),
            )
        fields = dict(spec)
        fields.setdefault("allow_unregistered", allow_unregistered)
        return new_job(
            fields.pop("task", fields.pop("task_name", None)),
            fields.pop("task_key", None),
            fields.pop("payload", None),
            registry=registry,
            max_payload=limit,
            **fields,
        )
    except TypeError as exc:  # a field new_job does not take
        raise ValidationError(str(exc)) from None


def validate_jobs(
    jobs: Iterable[NewJob | Mapping[str, Any]], *, registry: Registry = TASKS, allow_unregistered: bool = False
) -> Validated:
    """Every job checked before anything is written; the error names the job's position."""
    validated = Validated()
    limit = max_payload_bytes()  # read once: the settings are not looked up again per job
    for i, item in enumerate(jobs):
        try:
            validated.append(validate_job(item, registry=registry, limit=limit, allow_unregistered=allow_unregistered))
        except ValidationError as exc:
            raise type(exc)(f"job {i}: {exc}", exc.field) from None
    return validated


def enqueue_many(
    conn: Connection,
    jobs: Iterable[NewJob | Mapping[str, Any]],
    *,
    registry: Registry = TASKS,
    allow_unregistered: bool = False,
    trace: str | None = CURRENT_SPAN,
) -> list[Enqueued]:
    """Add many jobs in one transaction (the caller's, if one is open). All are validated before
    anything is written; task_keys already known (in the table, pruned, or repeated in the
    batch) come back duplicate=True with the existing job's id and status. `trace`: the trace
    context stored with them (tracing.py), by default the current span's while tracing is on.

    A COMMIT whose reply was lost is retried by db.transaction; the retry then finds our own rows.
    A key that a try which may have committed wrote, and that now holds this call's job (same
    task, queue, priority and payload), is reported as written by us, not as a duplicate.
    """
    return _write(
        conn,
        jobs
        if type(jobs) is Validated
        else validate_jobs(jobs, registry=registry, allow_unregistered=allow_unregistered),
        trace,
    )


def _write(conn: Connection, validated: list[NewJob], trace: str | None = CURRENT_SPAN) -> list[Enqueued]:
    if not validated:
        return []
    # One context for the whole call: the rows' only extra column, written only when there is one.
    batch = _Batch(validated, tracing.current() if trace is CURRENT_SPAN else trace)
    if conn.in_transaction():
        # The caller's transaction: each try in a savepoint, so that undoing one leaves the
        # caller's own writes alone. A deadlock or a 1020 has rolled back the whole transaction
        # and its savepoint with it: TransactionConflict says so, and the caller retries.
        with callers_transaction("enqueue"):
            for _ in range(_TRIES.attempts):
                savepoint = conn.begin_nested()
                try:
                    written = batch.run(conn)
                except BaseException as exc:
                    if error_code(exc) not in TRANSACTION_ROLLED_BACK:  # else there is no savepoint left
                        savepoint.rollback()
                    if not isinstance(exc, _Undo):
                        raise
                    batch.undone()
                    continue
                savepoint.commit()
                return batch.results(written)
        raise ServerRefusedRows("enqueue: the batch kept meeting keys inserted by other transactions")

    def classify(exc: BaseException) -> str | None:
        if isinstance(exc, _Undo):
            batch.undone()
            return "key_race"
        return None

    try:
        written = retry.call(lambda: transaction(conn, batch.run, what="enqueue"), _TRIES, classify)
    except retry.RetriesExhausted as exc:
        raise ServerRefusedRows("enqueue: the batch kept meeting keys inserted by other transactions") from exc.last
    return batch.results(written)


class _Batch:
    """One enqueue_many call: its jobs, the first job of each task_key, and what its tries did."""

    def __init__(self, validated: list[NewJob], trace: str | None):
        self.validated = validated
        self.trace = trace
        self.firsts: dict[str, NewJob] = {}
        for job in validated:
            self.firsts.setdefault(job.task_key, job)
        self.exact = False  # after an undone try: read first, insert only new keys
        self.pending: set[str] = set()  # keys the current try inserts
        self.unsure: set[str] = set()  # keys a try that may have committed inserted
        self.by_key = False  # after a deadlock: insert in task_key order

    def undone(self) -> None:
        """The try was rolled back on purpose: what it inserted is gone."""
        self.pending.clear()
        self.exact = True

    def run(self, c: Connection) -> dict[str, tuple[int, Status, bool]]:
        """One try: task_key -> (id, status, written by this call)."""
        require_primary(c)
        # The last try raised nothing here but its COMMIT did not answer (a lost connection,
        # retried by db.transaction): it may have committed.
        self.unsure |= self.pending
        self.pending = set()
        try:
            ensure_keys(
                c,
                {
                    job.concurrency_key: job.concurrency_limit
                    for job in self.firsts.values()
                    if job.concurrency_key is not None
                },
            )
            ensure_buckets(
                c, {job.rate_bucket: job.rate_limit for job in self.firsts.values() if job.rate_bucket is not None}
            )
            return self._exact(c) if self.exact else self._optimistic(c)
        except BaseException as exc:
            # Raised before the COMMIT was sent (a deadlock, a lost connection, an undo): rolled
            # back for certain. Were these keys kept as "maybe ours", a retry would claim rows
            # that another caller wrote with the same job meanwhile.
            self.pending.clear()
            if transient_kind(exc) == "deadlock" and not self.by_key:
                # Another caller inserts some of the same keys in another order: each held a
                # row the other wanted. The retries insert in task_key order, the order every
                # retrying caller takes, so they stop deadlocking each other (four callers
                # over 300 shared keys ran out of six tries in caller order now and then).
                # The ids of a batch retried this way follow task_key order.
                self.firsts = dict(sorted(self.firsts.items()))
                self.by_key = True
            raise

    def _optimistic(self, c: Connection) -> dict[str, tuple[int, Status, bool]]:
        keys = list(self.firsts)
        self.pending = set(keys)
        inserted, ids = _insert(c, self.firsts.values(), self.trace)
        if inserted == len(keys) and ids is not None:
            # All ours, ids known: only pruned keys are left to check (after the INSERT: a prune
            # that committed while our INSERT waited on its row is seen).
            _, pruned = _read(c, keys, queue=False)
            if not pruned:  # the common case: one tuple per key and nothing else
                return {key: (job_id, _status(job), True) for (key, job), job_id in zip(self.firsts.items(), ids)}
            rows = {key: (job_id, _status(job)) for (key, job), job_id in zip(self.firsts.items(), ids)}
        else:
            # All inserted: our own rows, read with a lock so that at REPEATABLE READ an older
            # job of the same key (pruned after the caller's snapshot) is not read instead.
            rows, pruned = _read(c, keys, lock_jobs=inserted == len(keys))
            if inserted == 0 and len(rows) < len(keys):
                # At REPEATABLE READ a key that another transaction committed after the caller's
                # snapshot made our INSERT skip it, yet the consistent read above does not see
                # it: the locking read does. (Only these keys: a locking read of a job a worker
                # changed since the snapshot is refused on MariaDB 11.6.2+, error 1020.)
                more, _ = _read(c, [key for key in keys if key not in rows], pruned=False, lock_jobs=True)
                rows.update(more)
        if inserted == len(keys):
            # All ours; but a pruned key's job must not come back.
            if pruned:
                _delete(c, [rows[key][0] for key in pruned])
                self.pending -= set(pruned)
            return {key: (pruned[key] + (False,)) if key in pruned else (rows[key] + (True,)) for key in keys}
        if inserted == 0 and len(rows) == len(keys):
            ours = self._ours(c, list(rows))
            return {key: rows[key] + (key in ours,) for key in keys}
        raise _Undo()

    def _exact(self, c: Connection) -> dict[str, tuple[int, Status, bool]]:
        keys = list(self.firsts)
        rows, pruned = _read(c, keys)
        ours = self._ours(c, list(rows))
        out = {key: rows[key] + (key in ours,) for key in rows}
        out.update({key: pruned[key] + (False,) for key in pruned if key not in rows})
        fresh = [job for key, job in self.firsts.items() if key not in out]
        if fresh:
            # One row per statement: each INSERT IGNORE's row count says whether the key is ours,
            # so a key another transaction inserts since our read (its row lock makes ours wait
            # for its COMMIT, then skip) is simply theirs. No undo, so no run of retries to lose
            # when several callers race over the same keys (the batch statement is the fast path;
            # this one runs only after it met such a race).
            self.pending = {job.task_key for job in fresh}
            mine = {job.task_key for job in fresh if _insert(c, [job], self.trace)[0] == 1}
            written, _ = _read(c, [job.task_key for job in fresh], pruned=False, lock_jobs=True)
            out.update({key: written[key] + (key in mine,) for key in written})
        return {key: out[key] for key in keys}

    def _ours(self, c: Connection, existing: list[str]) -> set[str]:
        """Of keys found in the table, those a try that may have committed wrote with this
        call's job (same task, queue, priority and payload)."""
        maybe = [key for key in existing if key in self.unsure]
        if not maybe:
            return set()
        found = c.execute(
            sa.select(jq.task_key, jq.task_name, jq.queue, jq.priority, jq.payload).where(jq.task_key.in_(maybe))
        ).all()
        return {row.task_key for row in found if _same_job(row, self.firsts[row.task_key])}

    def results(self, written: dict[str, tuple[int, Status, bool]]) -> list[Enqueued]:
        out, reported = [], set()
        for job in self.validated:
            key = job.task_key
            job_id, status, ours = written[key]
            if ours and key not in reported:
                reported.add(key)
                out.append(Enqueued(job_id, key, False, status, job.queue))
            else:
                out.append(Enqueued(job_id, key, True, status))
        return out


def _same_job(row, job: NewJob) -> bool:
    payload = json.loads(row.payload) if isinstance(row.payload, (str, bytes)) else row.payload
    return (row.task_name, row.queue, row.priority, payload) == (job.task_name, job.queue, job.priority, job.payload)


# --- the statements ----------------------------------------------------------------------------------

_COLUMNS = (
    "task_key, task_name, queue, priority, payload, status, run_at, attempts, max_attempts, "
    "concurrency_key, rate_bucket, created_at, updated_at"
)
# The same columns, the two that differ from job to job first (see _mysql_inserts).
_MYSQL_COLUMNS = (
    "task_key, payload, task_name, queue, priority, status, run_at, attempts, max_attempts, "
    "concurrency_key, rate_bucket, created_at, updated_at"
)


def _status(job: NewJob) -> Status:
    return Status.SCHEDULED if job.delay_seconds > 0 else Status.READY


def _payload_json(job: NewJob) -> str:
    return job.payload_json if job.payload_json is not None else json.dumps(job.payload)


def _insert(c: Connection, jobs: Iterable[NewJob], trace: str | None = None) -> tuple[int, list[int] | None]:
    """INSERT IGNORE the jobs (with `trace` as their trace_context); returns how many rows went in
    and, when every row went in and each statement's rows were numbered consecutively, their ids
    in order (None: read them)."""
    if not is_mysql(c):
        return sum(c.exec_driver_sql(sql, params).rowcount for sql, params in _sqlite_inserts(jobs, trace)), None
    jobs = list(jobs)
    inserted, ids, done = 0, [], 0
    numbering = _id_numbering(c)
    for sql, rows in _mysql_inserts(c, jobs, trace):
        result = execute_sql(c, sql)
        if result.warnings != rows - result.rowcount:
            _refusals(c)  # a warning besides one per known key: raised unless all are duplicates
        inserted += result.rowcount
        in_a_row = ids is not None and result.rowcount == rows and numbering != "read"
        if in_a_row and numbering == "checked":
            in_a_row = _numbered_in_a_row(c, jobs[done : done + rows], result.lastrowid)
        if in_a_row:
            ids.extend(range(result.lastrowid, result.lastrowid + rows))
        else:
            ids = None
        done += rows
    return inserted, ids


def _id_numbering(c: Connection) -> str:
    """How one multi-row INSERT's rows are numbered from LAST_INSERT_ID() on: "consecutive", as
    InnoDB promises in the "traditional" and "consecutive" lock modes (0, 1: MariaDB's default)
    with auto_increment_increment 1; "checked" in "interleaved" mode (2: MySQL 8.0's default),
    which promises rising ids only, so each statement's are checked (_numbered_in_a_row); "read"
    with another increment: the ids are read back. Asked once per connection (a failover gets a
    new one)."""
    info = c.connection.info
    if "jq_id_numbering" not in info:
        ((mode, step),) = execute_sql(c, "SELECT @@innodb_autoinc_lock_mode, @@auto_increment_increment").rows
        info["jq_id_numbering"] = "read" if int(step) != 1 else "consecutive" if int(mode) in (0, 1) else "checked"
    return info["jq_id_numbering"]


def _numbered_in_a_row(c: Connection, jobs: list[NewJob], first: int) -> bool:
    """Whether the rows one INSERT statement wrote (every one of `jobs`) hold the ids first,
    first + 1, ..., in their order. In "interleaved" mode a statement's rows get rising ids in
    their order, yet rows of other statements may take ids in between: n rising ids from first on
    are those exactly when the last row's is first + n - 1. One index lookup, the last row's,
    instead of n (MySQL: the statement's n lookups were 7 % of its server CPU, docs/benchmarks.md)."""
    ((last,),) = execute_sql(c, "SELECT id FROM job_queue WHERE task_key = %(key)s", {"key": jobs[-1].task_key}).rows
    return last == first + len(jobs) - 1


def _mysql_inserts(c: Connection, jobs: Iterable[NewJob], trace: str | None = None) -> Iterator[tuple[str, int]]:
    """Multi-row INSERT IGNORE statements as literal text, each under STATEMENT_BYTES, and how
    many rows each holds. A row is its escaped task_key, its payload's literal and the literals of
    its other values; the last two are escaped once per distinct value in a batch, since most
    batches repeat them (1,000 jobs of one task with no payload: three escapes in all)."""
    escape = escaper(c.connection.dbapi_connection)  # quotes and escapes a str as the driver's parameters are
    payloads: dict[str, str] = {}
    tails: dict[tuple, str] = {}
    columns, end = (
        (_MYSQL_COLUMNS, ")") if trace is None else (_MYSQL_COLUMNS + ", trace_context", f",{escape(trace)})")
    )
    head = f"INSERT IGNORE INTO job_queue ({columns}) VALUES "
    rows: list[str] = []
    size = len(head)
    for job in jobs:
        payload = _payload_json(job)
        payload_literal = payloads.get(payload)
        if payload_literal is None:
            payload_literal = payloads[payload] = escape(payload)
        shape = (
            job.task_name,
            job.queue,
            job.priority,
            job.delay_seconds,
            job.max_attempts,
            job.concurrency_key,
            job.rate_bucket,
        )
        tail = tails.get(shape)
        if tail is None:
            tail = tails[shape] = _row_tail(escape, job)
        row = f"({escape(job.task_key)},{payload_literal},{tail}{end}"
        if rows and size + len(row) > STATEMENT_BYTES:
            yield head + ",".join(rows), len(rows)
            rows, size = [], len(head)
        rows.append(row)
        size += len(row) + 1
    if rows:
        yield head + ",".join(rows), len(rows)


def _row_tail(escape: Callable[[str], str], job: NewJob) -> str:
    """A row's values after task_key and payload (_MYSQL_COLUMNS), as literals."""
    micros = int(round(job.delay_seconds * 1_000_000))
    run_at = f"UTC_TIMESTAMP(6) + INTERVAL {micros:d} MICROSECOND" if micros else "UTC_TIMESTAMP(6)"
    key = "NULL" if job.concurrency_key is None else escape(job.concurrency_key)
    bucket = "NULL" if job.rate_bucket is None else escape(job.rate_bucket)
    return (
        f"{escape(job.task_name)},{escape(job.queue)},{int(job.priority):d},'{_status(job).value}',{run_at},0,"
        f"{int(job.max_attempts):d},{key},{bucket},UTC_TIMESTAMP(6),UTC_TIMESTAMP(6)"
    )


def _sqlite_inserts(jobs: Iterable[NewJob], trace: str | None = None) -> Iterator[tuple[str, tuple]]:
    """Multi-row INSERT OR IGNORE statements with parameters; run_at, created_at and updated_at
    from the database clock (db.jq_now, jq_now_plus)."""
    jobs = list(jobs)
    for lo in range(0, len(jobs), SQLITE_ROWS):
        chunk = jobs[lo : lo + SQLITE_ROWS]
        params: list[Any] = []
        for job in chunk:
            params += (
                job.task_key,
                job.task_name,
                job.queue,
                job.priority,
                _payload_json(job),
                _status(job).value,
                int(round(job.delay_seconds * 1_000_000)),
                job.max_attempts,
                job.concurrency_key,
                job.rate_bucket,
            )
            if trace is not None:
                params.append(trace)
        columns, extra = (_COLUMNS, "") if trace is None else (_COLUMNS + ", trace_context", ",?")
        values = ",".join([f"(?,?,?,?,?,?,jq_now_plus(?),0,?,?,?,jq_now(),jq_now(){extra})"] * len(chunk))
        yield f"INSERT OR IGNORE INTO job_queue ({columns}) VALUES {values}", tuple(params)


def _read(
    c: Connection, keys: list[str], *, queue: bool = True, pruned: bool = True, lock_jobs: bool = False
) -> tuple[dict[str, tuple[int, Status]], dict[str, tuple[int, Status]]]:
    """The jobs holding `keys` (task_key -> (id, status)) and the records of pruned jobs holding
    them, each unless told not to, in one statement per READ_KEYS keys.

    Above READ COMMITTED (an application's transaction: REPEATABLE READ by default), pruned_key
    is read with a lock (LOCK IN SHARE MODE, which MySQL 9 still takes): a consistent read misses
    a prune that committed after the snapshot, and the key would be taken twice; job_queue too
    when `lock_jobs` (see the callers). Such a read locks the gaps of absent keys until the caller
    commits, and on MariaDB 11.6.2+ fails with 1020 where the snapshot is stale. The queue's own
    transactions (READ COMMITTED) read plainly."""
    rows: dict[str, tuple[int, Status]] = {}
    gone: dict[str, tuple[int, Status]] = {}
    mysql = is_mysql(c)
    escape = escaper(c.connection.dbapi_connection) if mysql else None
    # At READ COMMITTED every statement reads what is committed, the rows our INSERT waited on
    # included, and a locking read would only add waits: on MySQL-family servers its IN-list range
    # scan locks the record past each key, which an enqueue of a neighbouring key may hold
    # uncommitted (4 concurrent batches over the same keys deadlocked six times running).
    lock = mysql and not reads_committed(c)
    for lo in range(0, len(keys), READ_KEYS):
        chunk = keys[lo : lo + READ_KEYS]
        if mysql:
            in_list, params = ",".join(map(escape, chunk)), None
        else:
            in_list, params = ",".join("?" * len(chunk)), tuple(chunk) * (queue + pruned)
        selects = []
        if queue:
            hint = " FORCE INDEX (uk_task_key)" if mysql else ""
            selects.append(
                _locked(
                    f"SELECT 'q', task_key, id, status FROM job_queue{hint} WHERE task_key IN ({in_list})",
                    lock and lock_jobs,
                )
            )
        if pruned:
            hint = " FORCE INDEX (PRIMARY)" if mysql else ""
            selects.append(
                _locked(
                    f"SELECT 'p', task_key, job_id, status FROM pruned_key{hint} WHERE task_key IN ({in_list})", lock
                )
            )
        sql = " UNION ALL ".join(selects)
        found = execute_sql(c, sql).rows if mysql else c.exec_driver_sql(sql, params).all()
        for table, key, job_id, status in found:
            (rows if table == "q" else gone)[key] = (job_id, Status(status))
    return rows, gone


def _locked(select: str, lock: bool) -> str:
    # In parentheses, a UNION ALL's part takes its own locking clause (MariaDB and MySQL alike).
    # Both reads force their key's index: a locking read waits on every row it scans, matching
    # or not, and when the optimizer scanned the small table instead of looking 15 keys up, the
    # read waited on rows other enqueues held and deadlocked with them (1213, six times running).
    return f"({select} LOCK IN SHARE MODE)" if lock else select


def _delete(c: Connection, ids: list[int]) -> None:
    if ids:
        c.execute(sa.delete(job_queue).where(jq.id.in_(ids)))


def _refusals(c: Connection) -> None:
    """Raise ServerRefusedRows if the last INSERT IGNORE warned about anything but a duplicate
    key: a row skipped for another reason, or a value the server changed to store it."""
    for level, code, message in execute_sql(c, "SHOW WARNINGS").rows:
        if int(code) != ER_DUP_ENTRY:
            raise ServerRefusedRows(
                f"enqueue: the server refused a row ({level} {code}: {message}); nothing was written"
            )


def enqueue(
    conn: Connection,
    job: NewJob,
    *,
    after: Iterable[str] | None = None,
    on_parent_failure: str | None = None,
    batch: str | None = None,
) -> Enqueued:
    """Add one job (validated by validation.new_job). A known task_key writes nothing and returns
    the existing id, duplicate=True. With `after`, the job waits (blocked) for those jobs: see
    dependencies.py. With `batch`, it is a member of that open batch: see batches.py."""
    parents, mode = dependencies.check_after(after, on_parent_failure)

    def write(c: Connection) -> Enqueued:
        if parents:
            return dependencies.enqueue_after(c, job, parents, mode)
        return _write(c, [job])[0]

    if batch is not None:
        return batches.enqueue_member(conn, batch, write)
    return write(conn)
