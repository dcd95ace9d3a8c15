"""Statistics: counts by queue and status, the oldest ready job, per-minute activity."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from ..db import transaction
from ..models import Status
from ..schema import STAT_COLUMNS, audit_log, worker_stats
from .common import as_datetime, database_now, jq


@dataclass(frozen=True)
class QueueSummary:
    queue: str
    counts: dict[str, int]
    capped: frozenset[str]           # statuses whose count reached the cap ("N+")
    oldest_ready: datetime | None


def queue_summaries(conn: Connection, *, cap: int = 100_000, oldest_window: int = 5000
                    ) -> tuple[list[QueueSummary], datetime]:
    """Counts by status for each queue, each capped at `cap` rows read, and the oldest ready job's
    run_at per queue. Cost is bounded by the caps, not by the table size."""
    def read(c: Connection):
        # (status, queue) pairs: a loose scan of ix_ready_pick's prefix, not a read of every row.
        pairs = c.execute(sa.select(jq.status, jq.queue).group_by(jq.status, jq.queue)).all()
        counts: dict[str, dict[str, int]] = {}
        if pairs:
            parts = [sa.select(sa.literal(status).label("status"), sa.literal(queue).label("queue"),
                               sa.select(sa.func.count()).select_from(
                                   sa.select(sa.literal(1)).where(jq.status == status, jq.queue == queue)
                                   .limit(cap + 1).subquery()).scalar_subquery().label("n"))
                     for status, queue in pairs]
            for status, queue, n in c.execute(sa.union_all(*parts)).all():
                counts.setdefault(queue, {})[str(status)] = int(n)
        window = (sa.select(jq.queue, jq.run_at).where(jq.status == Status.READY.value)
                  .order_by(jq.run_at).limit(oldest_window).subquery())
        oldest = dict(c.execute(sa.select(window.c.queue, sa.func.min(window.c.run_at)).group_by(window.c.queue)).all())
        return counts, oldest, database_now(c)

    counts, oldest, now = transaction(conn, read, what="queue_summaries")
    out = []
    for queue in sorted(counts):
        by_status = {s.value: min(counts[queue].get(s.value, 0), cap) for s in Status}
        capped = frozenset(s for s, n in counts[queue].items() if n > cap)
        out.append(QueueSummary(queue, by_status, capped, as_datetime(oldest.get(queue))))
    return out, now


def count_by_status(conn: Connection) -> list[tuple[str, str, int]]:
    """(queue, status, count) for every pair present: index-only on ix_ready_pick."""
    rows = transaction(conn, lambda c: c.execute(
        sa.select(jq.queue, jq.status, sa.func.count()).group_by(jq.status, jq.queue)).all(), what="stats")
    return sorted((queue, str(status), n) for queue, status, n in rows)


def activity(conn: Connection, since: datetime) -> list[dict[str, Any]]:
    """Per-minute sums of every process's activity since `since` (a few rows per minute)."""
    cols = [sa.func.sum(worker_stats.c[k]).label(k) for k in STAT_COLUMNS]
    stmt = (sa.select(worker_stats.c.minute, *cols).where(worker_stats.c.minute >= since)
            .group_by(worker_stats.c.minute).order_by(worker_stats.c.minute))
    rows = transaction(conn, lambda c: c.execute(stmt).all(), what="activity")
    return [{**{k: int(v or 0) for k, v in r._mapping.items() if k != "minute"}, "minute": as_datetime(r.minute)}
            for r in rows]


OPERATOR_FAILS = ("fail", "bulk_fail")


def operator_failures(conn: Connection, since: datetime, *, newest: int = 2000) -> dict[datetime, int]:
    """Jobs failed by an operator per minute since `since`, from the audit log (workers' own
    failures are in worker_stats; an operator's are not, since no worker did them). Reads the
    newest `newest` audit rows at most (a bulk action writes one row per batch of 500), so its
    cost does not grow with the audit log."""
    recent = (sa.select(audit_log.c.at, audit_log.c.action, audit_log.c.count)
              .order_by(audit_log.c.id.desc()).limit(newest).subquery())
    stmt = sa.select(recent.c.at, recent.c.count).where(recent.c.at >= since,
                                                         recent.c.action.in_(OPERATOR_FAILS))
    rows = transaction(conn, lambda c: c.execute(stmt).all(), what="operator_failures")
    out: dict[datetime, int] = {}
    for at, count in rows:
        minute = as_datetime(at).replace(second=0, microsecond=0)
        out[minute] = out.get(minute, 0) + int(count)
    return out
def list_queues(conn: Connection) -> tuple[list[dict[str, Any]], datetime]:
    """Every known queue (with jobs, or paused or resumed once, even with no job yet): its paused
    state, who changed it and when, and its counts by status (capped as in queue_summaries)."""
    from .queues import queue_states

    summaries, now = queue_summaries(conn)
    states = queue_states(conn)
    by_name = {q.queue: q for q in summaries}
    out = []
    for name in sorted(set(by_name) | set(states)):
        state = states.get(name)
        summary = by_name.get(name)
        out.append({
            "queue": name, "paused": bool(state and state.paused),
            "changed_at": state.changed_at if state else None, "changed_by": state.changed_by if state else None,
            "counts": summary.counts if summary else {s.value: 0 for s in Status},
            "capped": sorted(summary.capped) if summary else [],
            "oldest_ready": summary.oldest_ready if summary else None,
        })
    return out, now
