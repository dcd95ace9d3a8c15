"""Statistics: counts by queue and status, the oldest ready job, per-minute activity, and one
queue's autoscaling signal (scale_signal).

Counts that do not grow with the table. The overview polls every 3 s per open tab,
and /metrics and /api/stats read the same figures; at 1,000,000 rows the old UNION of 25 counts
capped at 100,000 read about 600,000 index entries (~0.2-0.3 s) per call. Measured here at 1M
rows (MariaDB 10.11, 2 shared cores), an index-only count on ix_ready_pick reads about 2-4
million entries/s, so what a refresh costs is what it counts:

- Live states (scheduled, ready, running) are counted exactly at every refresh: what operators
  act on, and a queue keeps them small. While they were under LIVE_CAP in all at the last count,
  in one ordered pass over ix_ready_pick (the issue's 50,000 live jobs: 7-12 ms under load,
  against 13-31 for pair-by-pair counts); above it pair by pair, each capped at LIVE_CAP.
- History (done, cancelled) is counted only up to HISTORY_CAP per pair and shown as "10,000+"
  beyond it (the existing capped notion: honest, never a guess); failed, which operators act on,
  exactly up to FAILED_CAP. These move slowly, so CountsCache recounts them 15 times less often.
- Why not estimates: EXPLAIN's row estimate for (status, queue) on this table was 0.55x-2x the
  true count (index dives over a large range), too far off to print even with a "≈".
- Why not counters maintained in every claim / complete transaction: one counter row per
  (queue, status) is a hot row that every SKIP LOCKED claimer would queue behind (the lock is
  held until commit), and sharded triggers would need SUPER (or log_bin_trust_function_creators)
  for CREATE TRIGGER with binary logging on, which the queue refuses to run with (privileges.py),
  and would add a write per row to batch enqueue.
- CountsCache: one per web process and database, shared by every tab, /metrics, /api/stats and
  /api/queues, with a single-flight lock so concurrent polls never count twice; an operator
  action in this process forgets it at once (forget_counts), other processes see it within the
  cache's seconds. History that is due is recounted on a thread of its own while requests keep
  the figures they had (at 5,000,000 rows the failed jobs alone are 0.1-0.2 s of counting, which
  made one overview request in 20 slow when it ran in the request that found it due). Counts
  that are due are not read again while job_queue took no write (_change_stamp): a dashboard
  left open on a queue at rest costs one 0.2 ms statement per refresh. The CLI and direct
  callers of queue_summaries get fresh counts.
- Measured and left: counting at READ UNCOMMITTED halves the live count with a worker running
  (no visibility check of the entries it just wrote: pages read 3,000-5,000 -> 101), but a job
  changing state during the count could be counted twice or not at all: not exact.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from ..db import db_now, transaction
from ..models import Status
from ..schema import STAT_COLUMNS, audit_log, worker_stats
from ..validation import check_queue
from .common import as_datetime, database_now, jq, through_index

log = logging.getLogger(__name__)

LIVE = (Status.SCHEDULED, Status.READY, Status.RUNNING, Status.BLOCKED)
HISTORY = (Status.DONE, Status.FAILED, Status.CANCELLED)
LIVE_CAP = 100_000
FAILED_CAP = 100_000
HISTORY_CAP = 10_000
CAPS = {
    **{s.value: LIVE_CAP for s in LIVE},
    Status.FAILED.value: FAILED_CAP,
    Status.DONE.value: HISTORY_CAP,
    Status.CANCELLED.value: HISTORY_CAP,
}


@dataclass(frozen=True)
class QueueSummary:
    queue: str
    counts: dict[str, int]
    capped: frozenset[str]  # statuses whose count reached the cap ("N+")
    oldest_ready: datetime | None


def _counts(c: Connection, statuses: tuple[Status, ...], cap: int | None) -> dict[str, dict[str, int]]:
    """{queue: {status: n}} for these statuses, each pair read up to its cap + 1 rows (one more
    than the cap says the cap was reached)."""
    wanted = [s.value for s in statuses]
    # (status, queue) pairs: a loose scan of ix_ready_pick's prefix, not a read of every row.
    pairs = c.execute(sa.select(jq.status, jq.queue).where(jq.status.in_(wanted)).group_by(jq.status, jq.queue)).all()
    counts: dict[str, dict[str, int]] = {}
    if pairs:
        parts = [
            sa.select(
                sa.literal(str(status)).label("status"),
                sa.literal(queue).label("queue"),
                sa.select(sa.func.count())
                .select_from(
                    sa.select(sa.literal(1))
                    .where(jq.status == str(status), jq.queue == queue)
                    .limit((cap or CAPS[str(status)]) + 1)
                    .subquery()
                )
                .scalar_subquery()
                .label("n"),
            )
            for status, queue in pairs
        ]
        for status, queue, n in c.execute(sa.union_all(*parts)).all():
            counts.setdefault(queue, {})[str(status)] = int(n)
    return counts


def _grouped_counts(c: Connection, statuses: tuple[Status, ...]) -> dict[str, dict[str, int]]:
    """{queue: {status: n}} for these statuses, exact: one pass over their entries of
    ix_ready_pick in its order (index-only, no temporary table; the planner would rather read
    ix_due and sort, 2-4x the time). Reads every entry: for sets known to be small."""
    stmt = through_index(
        c,
        sa.select(jq.status, jq.queue, sa.func.count())
        .where(jq.status.in_([s.value for s in statuses]))
        .group_by(jq.status, jq.queue),
        "ix_ready_pick",
    )
    counts: dict[str, dict[str, int]] = {}
    for status, queue, n in c.execute(stmt).all():
        counts.setdefault(queue, {})[str(status)] = int(n)
    return counts


def _oldest_ready(c: Connection, window: int, counts: dict[str, dict[str, int]]) -> dict[str, Any]:
    """The oldest ready job's run_at for every queue with ready jobs in `counts` (read in the
    same transaction). Most are among the `window` oldest ready jobs of all queues: a short
    index-only read of ix_due. A queue whose ready jobs are all newer than those (beside another
    queue's backlog) had none, and /metrics said it waited 0 s: an alert on a stuck queue beside
    a busy one never fired. Such a queue is read apart: one with up to `window` ready jobs from
    its own entries (ix_ready_pick, each row read for its run_at), larger ones together in one
    pass over ix_due from where the window ended: no entry is read twice by one statement."""
    ready = (
        sa.select(jq.queue, jq.run_at)
        .where(jq.status == Status.READY.value)
        .order_by(jq.run_at)
        .limit(window)
        .subquery()
    )
    found = c.execute(
        sa.select(ready.c.queue, sa.func.min(ready.c.run_at), sa.func.max(ready.c.run_at)).group_by(ready.c.queue)
    ).all()
    oldest = {queue: first for queue, first, _ in found}
    missing = {
        queue: n
        for queue, by_status in counts.items()
        if (n := by_status.get(Status.READY.value, 0)) and queue not in oldest
    }
    if not missing or not found:
        return oldest
    is_ready = jq.status == Status.READY.value
    parts = [
        through_index(
            c,
            sa.select(sa.literal(queue).label("queue"), sa.func.min(jq.run_at).label("first")).where(
                is_ready, jq.queue == queue
            ),
            "ix_ready_pick",
        )
        for queue, n in missing.items()
        if n <= window
    ]
    large = [queue for queue, n in missing.items() if n > window]
    if large:
        edge = max(last for _, _, last in found)
        parts.append(
            through_index(
                c,
                sa.select(jq.queue, sa.func.min(jq.run_at))
                .where(is_ready, jq.run_at >= edge, jq.queue.in_(large))
                .group_by(jq.queue),
                "ix_due",
            )
        )
    oldest.update(c.execute(parts[0] if len(parts) == 1 else sa.union_all(*parts)).all())
    return oldest


def _summaries(counts: dict[str, dict[str, int]], oldest: dict[str, Any], cap: int | None) -> list[QueueSummary]:
    out = []
    for queue in sorted(counts):
        limit = {s.value: cap or CAPS[s.value] for s in Status}
        by_status = {s.value: min(counts[queue].get(s.value, 0), limit[s.value]) for s in Status}
        capped = frozenset(s for s, n in counts[queue].items() if n > limit[s])
        out.append(QueueSummary(queue, by_status, capped, as_datetime(oldest.get(queue))))
    return out


def queue_summaries(
    conn: Connection, *, cap: int | None = None, oldest_window: int = 5000
) -> tuple[list[QueueSummary], datetime]:
    """Counts by status for each queue, each (status, queue) capped (CAPS, or `cap` for every
    status), and the oldest ready job's run_at per queue; fresh (see CountsCache for the shared,
    cached figures). Cost is bounded by the caps, not by the table size."""

    def read(c: Connection):
        counts = _counts(c, tuple(Status), cap)
        return counts, _oldest_ready(c, oldest_window, counts), database_now(c)

    counts, oldest, now = transaction(conn, read, what="queue_summaries")
    return _summaries(counts, oldest, cap), now


_CACHES: weakref.WeakSet[CountsCache] = weakref.WeakSet()


def forget_counts() -> None:
    """After an operator action: this process's cached counts are read again on next use."""
    for cache in list(_CACHES):
        cache.forget()


def _change_stamp(c: Connection) -> tuple[tuple[datetime, datetime] | None, datetime]:
    """(when job_queue last took a committed write, the database's now: both in the session's
    time zone), or None for the first where the server does not say, and the database's UTC now.

    MariaDB and MySQL keep UPDATE_TIME of an InnoDB table in memory, set at the commit of every
    transaction that wrote to it (NULL after a restart), to the second. MySQL answers it from a
    cache of up to a day unless information_schema_stats_expiry is 0, which db.create_engine sets
    on every connection (measured on MySQL 9.7: a transaction that wrote at :26 and committed at
    :30 shows :30, as MariaDB does); a connection made elsewhere is not believed."""
    if not getattr(c.dialect, "is_mariadb", False) and not _fresh_statistics(c):
        return None, database_now(c)
    updated, local_now, now = c.execute(
        sa.text(
            "SELECT (SELECT UPDATE_TIME FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() AND "
            "TABLE_NAME = 'job_queue'), NOW(6), UTC_TIMESTAMP(6)"
        )
    ).one()
    return ((as_datetime(updated), as_datetime(local_now)) if updated is not None else None), as_datetime(now)


def _fresh_statistics(c: Connection) -> bool:
    if c.dialect.name != "mysql":
        return False
    info = c.info
    if "stats_expiry" not in info:
        info["stats_expiry"] = c.exec_driver_sql("SELECT @@SESSION.information_schema_stats_expiry").scalar()
    return str(info["stats_expiry"]) == "0"


def _unchanged(before: tuple[datetime, datetime] | None, now: tuple[datetime, datetime] | None) -> bool:
    """Whether no write was committed to job_queue since `before` was read (and the counts read
    after it): the same UPDATE_TIME, and that one a second older at least than the reading, so
    that a write in the same second could not hide behind it."""
    return (
        before is not None and now is not None and now[0] == before[0] and before[0] < before[1].replace(microsecond=0)
    )


@dataclass
class _Counted:
    at: float  # time.monotonic() of the count
    stamp: tuple[datetime, datetime] | None  # _change_stamp before it
    counts: dict[str, dict[str, int]]
    oldest: dict[str, Any]


class CountsCache:
    """queue_summaries shared by every reader of one process for `live_seconds` (live states) and
    15 times as long for history (done, failed, cancelled); 0 counts afresh every time. One
    thread counts while the others wait for its answer instead of counting too.

    Counts that are due are read again only if job_queue took a write since they were read
    (_change_stamp: one statement of 0.2 ms): an overview left open on a queue at rest costs
    that statement per refresh, not the counts. History counted before is recounted in the
    background when due (one thread at a time, on a connection of its own): no request waits for
    it. Forgotten history (an operator action) is counted in the request, so the action shows."""

    HISTORY_FACTOR = 15

    def __init__(self, live_seconds: float = 2.0, *, oldest_window: int = 5000):
        self.live_seconds = live_seconds
        self.history_seconds = live_seconds * self.HISTORY_FACTOR
        self.oldest_window = oldest_window
        self._lock = threading.Lock()
        self._live: _Counted | None = None
        self._history: _Counted | None = None
        self._now: datetime | None = None
        self._generation = 0  # forget() moves it: a recount begun before is dropped
        self._recounting: threading.Thread | None = None
        _CACHES.add(self)

    def forget(self) -> None:
        with self._lock:
            self._live = self._history = None
            self._generation += 1

    def summaries(self, conn: Connection) -> tuple[list[QueueSummary], datetime]:
        with self._lock:
            t = time.monotonic()
            live_due = self._live is None or t - self._live.at >= self.live_seconds
            # History counted before is recounted behind the request when due; counted in it
            # when there is none (first use, or forgotten) or the cache keeps nothing.
            if self.live_seconds and self._history is not None and t - self._history.at >= self.history_seconds:
                self._recount_history_behind(conn.engine)
            history_due = self._history is None or not self.live_seconds
            if live_due or history_due:
                self._live, self._history, self._now = transaction(
                    conn, lambda c: self._read(c, t, live_due, history_due), what="queue_summaries"
                )
            live, history, now = self._live, self._history, self._now
        counts: dict[str, dict[str, int]] = {}
        for part in (live.counts, history.counts):
            for queue, by_status in part.items():
                counts.setdefault(queue, {}).update(by_status)
        return _summaries(counts, live.oldest, None), now

    def wait(self, timeout: float | None = None) -> None:
        """Until the background history recount, if one runs, has finished."""
        thread = self._recounting
        if thread is not None:
            thread.join(timeout)

    def _recount_history_behind(self, engine: Engine) -> None:
        """Start the history recount on its own thread unless one runs (called under the lock)."""
        if self._recounting is not None and self._recounting.is_alive():
            return
        generation, previous = self._generation, self._history

        def recount() -> None:
            try:
                with engine.connect() as conn:
                    history = transaction(
                        conn,
                        lambda c: _read_history(c, time.monotonic(), previous, _change_stamp(c)[0]),
                        what="history_counts",
                    )
            except Exception:
                log.warning("counting finished jobs failed; the dashboard keeps the last figures", exc_info=True)
                return
            with self._lock:
                if self._generation == generation:
                    self._history = history

        self._recounting = threading.Thread(target=recount, name="jobqueue-history-counts", daemon=True)
        self._recounting.start()

    def _read(self, c: Connection, t: float, live_due: bool, history_due: bool) -> tuple[_Counted, _Counted, datetime]:
        stamp, now = _change_stamp(c)
        live, history = self._live, self._history
        if history_due:
            history = _read_history(c, t, history, stamp)
        if live_due:
            if live is not None and _unchanged(live.stamp, stamp):
                live = _Counted(t, live.stamp, live.counts, live.oldest)
            else:
                # Live sets small at the last count (under LIVE_CAP in all) are counted in one
                # pass, exactly; larger ones pair by pair, each capped.
                small = live is not None and sum(n for q in live.counts.values() for n in q.values()) < LIVE_CAP
                counts = _grouped_counts(c, LIVE) if small else _counts(c, LIVE, None)
                live = _Counted(t, stamp, counts, _oldest_ready(c, self.oldest_window, counts))
        return live, history, now


def _read_history(
    c: Connection, t: float, previous: _Counted | None, stamp: tuple[datetime, datetime] | None
) -> _Counted:
    if previous is not None and _unchanged(previous.stamp, stamp):
        return _Counted(t, previous.stamp, previous.counts, {})
    return _Counted(t, stamp, _counts(c, HISTORY, None), {})


@dataclass(frozen=True)
class ScaleSignal:
    queue: str
    ready: int
    running: int
    oldest_ready_age_seconds: float  # 0 with no ready job
    capped: frozenset[str]  # "ready" / "running" when that count reached SCALE_CAP
    now: datetime


SCALE_CAP = LIVE_CAP
AGE_WINDOW = 10_000


def scale_signal(conn: Connection, queue: str) -> ScaleSignal:
    """What an autoscaler needs of one queue (GET /api/queues/<name>/scale): its ready and running
    counts and how long its oldest ready job has waited (database clock), fresh, in one
    transaction. A queue without jobs answers zeros: scaling it to zero is legitimate.

    Each figure is one read of an index range of this queue alone, so its cost does not grow with
    the table (done rows sit under another status prefix):
    - the counts: index-only on ix_ready_pick's (status, queue) prefix, exact up to SCALE_CAP
      (100,000) and reported capped beyond it. An autoscaler needs the real backlog up to the
      most workers it would ever start; past 100,000 waiting jobs the answer is "as many as
      allowed" whatever the exact figure, and an exact count of millions would read millions of
      entries on every poll.
    - the age: with up to AGE_WINDOW ready jobs, MIN(run_at) over the queue's entries of
      ix_ready_pick (each row read for its run_at: at most AGE_WINDOW rows); with more, the
      queue's first entry in ix_due (status, run_at, queue) order, index-only, which stops at
      that entry but passes the older ready entries of other queues: few unless another queue
      holds a larger, older backlog (then 2-4 million entries a second). An index (status,
      queue, run_at) would make it one entry always, at the price of one more index entry
      rewritten by every claim and every completion."""
    queue = check_queue(queue)

    def read(c: Connection) -> ScaleSignal:
        ready, running, now = c.execute(
            sa.select(_capped_count(c, Status.READY, queue), _capped_count(c, Status.RUNNING, queue), db_now())
        ).one()
        now = as_datetime(now)
        oldest = _oldest_ready_of(c, queue, ready) if ready else None
        age = max(0.0, round((now - oldest).total_seconds(), 3)) if oldest is not None else 0.0
        capped = frozenset(name for name, n in (("ready", ready), ("running", running)) if n > SCALE_CAP)
        return ScaleSignal(queue, min(ready, SCALE_CAP), min(running, SCALE_CAP), age, capped, now)

    return transaction(conn, read, what="scale_signal")


def _capped_count(c: Connection, status: Status, queue: str) -> sa.ScalarSelect:
    """The queue's jobs in `status`, up to SCALE_CAP + 1 (one more says the cap was reached)."""
    entries = through_index(
        c,
        sa.select(sa.literal(1)).where(jq.status == status.value, jq.queue == queue).limit(SCALE_CAP + 1),
        "ix_ready_pick",
    )
    return sa.select(sa.func.count()).select_from(entries.subquery()).scalar_subquery()


def _oldest_ready_of(c: Connection, queue: str, ready: int) -> datetime | None:
    is_ready = sa.and_(jq.status == Status.READY.value, jq.queue == queue)
    if ready <= AGE_WINDOW:
        stmt = through_index(c, sa.select(sa.func.min(jq.run_at)).where(is_ready), "ix_ready_pick")
    else:
        stmt = through_index(c, sa.select(jq.run_at).where(is_ready).order_by(jq.run_at).limit(1), "ix_due")
    return as_datetime(c.execute(stmt).scalar())


def count_by_status(conn: Connection) -> list[tuple[str, str, int]]:
    """(queue, status, count) for every pair present: index-only on ix_ready_pick."""
    rows = transaction(
        conn,
        lambda c: c.execute(sa.select(jq.queue, jq.status, sa.func.count()).group_by(jq.status, jq.queue)).all(),
        what="stats",
    )
    return sorted((queue, str(status), n) for queue, status, n in rows)


def activity(conn: Connection, since: datetime) -> list[dict[str, Any]]:
    """Per-minute sums of every process's activity since `since` (a few rows per minute)."""
    cols = [sa.func.sum(worker_stats.c[k]).label(k) for k in STAT_COLUMNS]
    stmt = (
        sa.select(worker_stats.c.minute, *cols)
        .where(worker_stats.c.minute >= since)
        .group_by(worker_stats.c.minute)
        .order_by(worker_stats.c.minute)
    )
    rows = transaction(conn, lambda c: c.execute(stmt).all(), what="activity")
    return [
        {**{k: int(v or 0) for k, v in r._mapping.items() if k != "minute"}, "minute": as_datetime(r.minute)}
        for r in rows
    ]


OPERATOR_FAILS = ("fail", "bulk_fail")


def operator_failures(conn: Connection, since: datetime, *, newest: int = 2000) -> dict[datetime, int]:
    """Jobs failed by an operator per minute since `since`, from the audit log (workers' own
    failures are in worker_stats; an operator's are not, since no worker did them). Reads the
    newest `newest` audit rows at most (a bulk action writes one row per batch of 500), so its
    cost does not grow with the audit log."""
    recent = (
        sa.select(audit_log.c.at, audit_log.c.action, audit_log.c.count)
        .order_by(audit_log.c.id.desc())
        .limit(newest)
        .subquery()
    )
    stmt = sa.select(recent.c.at, recent.c.count).where(recent.c.at >= since, recent.c.action.in_(OPERATOR_FAILS))
    rows = transaction(conn, lambda c: c.execute(stmt).all(), what="operator_failures")
    out: dict[datetime, int] = {}
    for at, count in rows:
        minute = as_datetime(at).replace(second=0, microsecond=0)
        out[minute] = out.get(minute, 0) + int(count)
    return out


def list_queues(conn: Connection, *, counts: CountsCache | None = None) -> tuple[list[dict[str, Any]], datetime]:
    """Every known queue (with jobs, or paused or resumed once, even with no job yet): its paused
    state, who changed it and when, and its counts by status (capped as in queue_summaries;
    from `counts` when given)."""
    from .queues import queue_states

    summaries, now = counts.summaries(conn) if counts is not None else queue_summaries(conn)
    states = queue_states(conn)
    by_name = {q.queue: q for q in summaries}
    out = []
    for name in sorted(set(by_name) | set(states)):
        state = states.get(name)
        summary = by_name.get(name)
        out.append(
            {
                "queue": name,
                "paused": bool(state and state.paused),
                "changed_at": state.changed_at if state else None,
                "changed_by": state.changed_by if state else None,
                "counts": summary.counts if summary else {s.value: 0 for s in Status},
                "capped": sorted(summary.capped) if summary else [],
                "oldest_ready": summary.oldest_ready if summary else None,
            }
        )
    return out, now
