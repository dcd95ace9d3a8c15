"""Reads of jobs, results and attempts (all bounded: no OFFSET, no full-table COUNT)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from ..db import transaction
from ..models import Job, JobResult, Status
from ..schema import job_attempt, job_batch_member, job_queue, job_result
from .common import database_now as _now
from .common import job_from_row, jq, through_index
from .operator import SEARCH_WINDOW, SPARSE_SEARCH_WINDOW, JobFilter, batch_members


def get_job(conn: Connection, job_id: int) -> Job | None:
    row = transaction(conn, lambda c: c.execute(sa.select(job_queue).where(jq.id == job_id)).first(), what="get_job")
    return job_from_row(row) if row else None


def trace_contexts(conn: Connection, ids: Sequence[int]) -> dict[int, str]:
    """The stored trace contexts of jobs just claimed (by primary key; jobs with none left out).
    Sent only while tracing is on (tracing.py), so the claim itself stays the same."""
    if not ids:
        return {}
    rows = transaction(
        conn,
        lambda c: c.execute(
            sa.select(jq.id, jq.trace_context).where(jq.id.in_(sorted(ids)), jq.trace_context.is_not(None))
        ).all(),
        what="trace_contexts",
    )
    return {row.id: row.trace_context for row in rows}


def get_job_by_key(conn: Connection, task_key: str) -> Job | None:
    row = transaction(
        conn, lambda c: c.execute(sa.select(job_queue).where(jq.task_key == task_key)).first(), what="get_job"
    )
    return job_from_row(row) if row else None


def get_result(conn: Connection, task_key: str) -> dict[str, Any] | None:
    row = transaction(
        conn,
        lambda c: c.execute(sa.select(job_result).where(job_result.c.task_key == task_key)).first(),
        what="get_result",
    )
    return dict(row._mapping) if row else None


def job_outcome(conn: Connection, *, task_key: str | None = None, job_id: int | None = None) -> JobResult | None:
    """A job's status and last error by key or id (one statement on a unique index), and its
    result (a second one) once it is done: what a waiter polls."""
    where = jq.task_key == task_key if task_key is not None else jq.id == job_id
    row = transaction(
        conn,
        lambda c: c.execute(
            sa.select(jq.id, jq.task_key, jq.status, jq.last_error, jq.finished_at).where(where)
        ).first(),
        what="job_outcome",
    )
    if row is None:
        return None
    status = Status(row.status)
    result = get_result(conn, row.task_key) if status is Status.DONE else None
    return JobResult(
        row.id,
        row.task_key,
        status,
        result["result"] if result else None,
        row.last_error if status is not Status.DONE else None,
        row.finished_at,
    )


def list_attempts(conn: Connection, job_id: int) -> list[dict[str, Any]]:
    rows = transaction(
        conn,
        lambda c: c.execute(
            sa.select(job_attempt)
            .where(job_attempt.c.job_id == job_id)
            .order_by(job_attempt.c.attempt, job_attempt.c.id)
        ).all(),
        what="list_attempts",
    )
    return [dict(r._mapping) for r in rows]


def running_jobs(conn: Connection, *, limit: int = 50) -> list[Job]:
    """Running jobs, soonest lease expiry first."""
    stmt = sa.select(job_queue).where(jq.status == Status.RUNNING.value).order_by(jq.lease_until).limit(limit)
    return [job_from_row(r) for r in transaction(conn, lambda c: c.execute(stmt).all(), what="running_jobs")]


def list_jobs(
    conn: Connection, job_filter: JobFilter | None = None, *, before_id: int | None = None, limit: int = 50
) -> list[Job]:
    """A page of jobs, newest first, continuing below `before_id` (keyset paging). Not for a
    search (see page_jobs, which bounds it)."""
    stmt = sa.select(job_queue).order_by(jq.id.desc()).limit(limit)
    if job_filter is not None:
        stmt = stmt.where(*job_filter.where())
    if before_id is not None:
        stmt = stmt.where(jq.id < before_id)
    return [job_from_row(r) for r in transaction(conn, lambda c: c.execute(stmt).all(), what="list_jobs")]


def distinct_values(conn: Connection) -> tuple[list[str], list[str]]:
    """Known queue and task names, for the filter menus (loose index scans)."""

    def read(c: Connection):
        queues = c.execute(sa.select(jq.queue).group_by(jq.status, jq.queue)).scalars().all()
        tasks = c.execute(sa.select(jq.task_name).group_by(jq.task_name)).scalars().all()
        return sorted(set(queues)), sorted(set(tasks))

    return transaction(conn, read, what="distinct_values")


def database_now(conn: Connection) -> datetime:
    return transaction(conn, _now, what="now")


# --- pages of jobs (dashboard, GET /api/jobs, `jobqueue list`) -------------------------------------

COUNT_CAP = 10_000


@dataclass(frozen=True)
class JobPage:
    """One keyset page of jobs, newest first.

    `older` / `newer`: the `before` / `after` id of the next page each way (None: no such page).
    For a search, `window_floor` is the lowest id this page's bounded scan read when it stopped
    short of the oldest job (None: it reached the end), and `older` continues below it even when
    this window held no more matches. `matches` counts the filter's matches (capped at
    COUNT_CAP; for a search, within this window), `capped` says the cap was reached.
    """

    jobs: list[Job]
    older: int | None
    newer: int | None
    matches: int
    capped: bool
    window_floor: int | None = None
    window: int | None = None

    def as_dict(self) -> dict[str, Any]:
        """As GET /api/jobs and `jobqueue list --json` answer: next_before is the `before` of the
        next (older) page, null when there is none."""
        data: dict[str, Any] = {
            "jobs": [j.as_dict() for j in self.jobs],
            "next_before": self.older,
            "matches": self.matches,
            "matches_capped": self.capped,
        }
        if self.window is not None:
            # A search read at most `search_window` rows; next_before continues below them.
            data["search_window"] = self.window
            data["search_window_floor"] = self.window_floor
        return data


def _count(c: Connection, where: list[Any], cap: int) -> tuple[int, bool]:
    inner = sa.select(sa.literal(1)).select_from(job_queue).where(*where).limit(cap + 1).subquery()
    n = c.execute(sa.select(sa.func.count()).select_from(inner)).scalar()
    return min(n, cap), n > cap


jm = job_batch_member.c


def _count_members(c: Connection, members: sa.Select, cap: int) -> tuple[int, bool]:
    n = c.execute(sa.select(sa.func.count()).select_from(members.limit(cap + 1).subquery())).scalar()
    return min(n, cap), n > cap


def count_matching(
    conn: Connection,
    job_filter: JobFilter,
    *,
    statuses: Sequence[str] | None = None,
    below: int | None = None,
    cap: int = COUNT_CAP,
) -> tuple[int, bool]:
    """How many jobs a filter matches (of those in `statuses`, below id `below`), reading at most
    `cap` + 1 index entries: (count, capped). A search counts within its window (`min_id` and up,
    or the newest search_window rows)."""

    def read(c: Connection):
        if job_filter.batch and not job_filter.search and c.dialect.name in ("mysql", "mariadb"):
            members = batch_members(c, job_filter)
            if statuses is not None:
                members = members.where(jq.status.in_(list(statuses)))
            if below is not None:
                members = members.where(jm.job_id < below)
            return _count_members(c, members, cap)
        where = job_filter.where()
        if statuses is not None:
            where.append(jq.status.in_(list(statuses)))
        if below is not None:
            where.append(jq.id < below)
        if job_filter.search and job_filter.min_id is None:
            ids, size = _search_window_ids(c, job_filter, None, "older")
            floor, *_ = _window(c, ids, "older", size)
            if floor is not None:
                where.append(jq.id >= floor)
        return _count(c, where, cap)

    return transaction(conn, read, what="count_jobs")


def _search_window_ids(
    c: Connection, job_filter: JobFilter, start: int | None, direction: str, size: int | None = None
) -> tuple[sa.Select, int]:
    """A search's window from `start` going `direction`: its ids (_window_ids, through
    search_index) and how many rows it holds at most (`size`, default search_window)."""
    index = search_index(c, job_filter)
    size = size if size is not None else search_window(index)
    return _window_ids(c, job_filter, start, direction, size, index), size


def _window_ids(
    c: Connection, job_filter: JobFilter, start: int | None, direction: str, size: int, index: str
) -> sa.Select:
    """The ids of a search's window: the next `size` rows matching the filter but for its search,
    from `start` going `direction`, read through `index` (search_index: index-only but for a key
    prefix beside a status)."""
    bound = [] if start is None else [jq.id < start if direction == "older" else jq.id > start]
    if (
        index == "ix_ready_pick"
        and not job_filter.task
        and (merged := _merged_ids(c, job_filter, bound, direction == "older", size)) is not None
    ):
        # A status's entries are in id order only within each (queue, priority): sorting them
        # all to find the newest `size` grew with the table (every failed job's entry).
        return merged
    if index == "ix_ready_pick" and job_filter.task:
        # The task's entries as well (ix_task: task_name, id), joined by id: both index-only,
        # where checking the task row by row read every row of the status (7 s for failed
        # jobs at 1,000,000 rows, against 0.2 s).
        by_task = job_queue.alias("by_task")
        ids = (
            sa.select(jq.id)
            .select_from(job_queue.join(by_task, by_task.c.id == jq.id))
            .where(*replace(job_filter, task=None).where(search=False), by_task.c.task_name == job_filter.task)
        )
        ids = through_index(c, ids, index)
        if c.dialect.name in ("mysql", "mariadb"):
            ids = ids.with_hint(by_task, "FORCE INDEX (ix_task)", c.dialect.name).prefix_with(
                "STRAIGHT_JOIN", dialect=c.dialect.name
            )
    else:
        ids = through_index(c, sa.select(jq.id).where(*job_filter.where(search=False)), index)
    ids = ids.where(*bound)
    return ids.order_by(jq.id.desc() if direction == "older" else jq.id.asc()).limit(size)


def search_window(index: str) -> int:
    """How many rows a search reads at most, by the index its window is read through
    (search_index): SEARCH_WINDOW where the window is the newest rows of the table, read as one
    range of the primary key (80 ms for 50,000 at 1,000,000 rows); SPARSE_SEARCH_WINDOW where it
    is read through a status's, a task's or a prefix's own index, its rows then read by id, each
    a random read once the table outgrows the buffer pool (14 us a row at 1,000,000 rows: 0.6 s
    for 50,000 failed jobs). At 5,000,000 rows a search in the failed jobs took 111-130 ms for
    10,000 of them, 65-72 ms for 5,000."""
    return SEARCH_WINDOW if index == "PRIMARY" else SPARSE_SEARCH_WINDOW


def _window(c: Connection, ids: sa.Select, direction: str, size: int) -> tuple[int | None, int, int, int]:
    """For a window's ids (_window_ids): (its far end when it holds `size` rows, None when fewer:
    it reached the last row; its lowest id; its highest; how many rows it holds)."""
    sub = ids.subquery()
    low, high, n = c.execute(
        sa.select(sa.func.min(sub.c.id), sa.func.max(sub.c.id), sa.func.count()).select_from(sub)
    ).one()
    far = (low if direction == "older" else high) if n >= size else None
    return far, low or 0, high or 0, n


LIVE_STATUSES = (Status.SCHEDULED, Status.READY, Status.RUNNING)
SPARSE_WINDOW = 8  # a window spanning more ids than 8 per row of it reads its rows one by one


SMALL_STATUS = 20_000  # a terminal status this small is read before a key prefix (a capped count says)


def search_index(c: Connection, job_filter: JobFilter) -> str:
    """The index a search's window (the newest SEARCH_WINDOW rows matching the other filters) is
    read through.

    The planner chose by a guess that went wrong both ways at 1,000,000 rows: for a status it
    read the window through ix_due, then matched its rows by walking the primary key backwards
    over the whole id range the window spans (status=failed, 1 row in 19: 1.2-2.4 s), or sorted
    every `done` entry to find the newest 50,000 (1 s). A status's own entries (ix_ready_pick:
    status, queue, ...) hold only its rows, a task's (ix_task) only the task's, in id order, a
    key prefix's (uk_task_key) only the prefix's. `done` is the bulk of a table (kept 7 days
    against 30 for failures), so its window is the newest rows by primary key. A status and a
    key prefix: no index holds both, so the smaller side is read and the other checked row by
    row: a live status (small by design), or failed / cancelled when a capped count finds fewer
    than SMALL_STATUS; the prefix otherwise. The rows of a sparse window are then read by id
    (page_jobs: SPARSE_WINDOW), not by walking the ids between them; a dense one as its id range."""
    status = Status(job_filter.status) if job_filter.status is not None else None
    if status in LIVE_STATUSES:
        return "ix_ready_pick"
    if status in (Status.FAILED, Status.CANCELLED):
        own = [jq.status == status.value] + ([jq.queue == job_filter.queue] if job_filter.queue else [])
        if not job_filter.key_prefix or not _count(c, own, SMALL_STATUS)[1]:
            return "ix_ready_pick"
    if job_filter.key_prefix:
        return "uk_task_key"
    if job_filter.task:
        return "ix_queue_task" if job_filter.queue else "ix_task"
    return "PRIMARY"


def pinned_index(job_filter: JobFilter) -> str | None:
    """The index a page of this filter must be read through, where the planner goes wrong.

    For `ORDER BY id DESC LIMIT 51` the planner prefers walking the primary key backwards,
    expecting matches spread evenly over the ids. A task_key prefix and a live status are not:
    a week-old prefix's keys, and the last page of `status=scheduled`, sit below hundreds of
    thousands of newer rows, and the walk read up to 940,000 of them (2 s at 1,000,000
    rows). Their own index reads only the matches: uk_task_key (task_key, id) for a prefix,
    however old; ix_ready_pick (status, queue, priority, id) for a live status, a set the queue
    keeps small. A terminal status (done, failed, cancelled) is dense enough for the walk, and
    its set is not small: no hint. A queue and a task read their pair's index (ix_queue_task):
    through the task's, a pair that never goes together read every entry of the task and its
    row to check the queue (0.7 s at 1,000,000 rows), and one that always does was the
    intersection of both indexes whole, sorted. A status alone or with a queue does not come
    here: it reads each (queue, priority) group's first rows (_status_page_ids). MySQL 8.0 takes
    the same FORCE INDEX."""
    if job_filter.key_prefix:
        return "uk_task_key"
    if job_filter.status is not None and Status(job_filter.status) in LIVE_STATUSES:
        return "ix_ready_pick"
    if job_filter.queue and job_filter.task:
        return "ix_queue_task"
    return None


MERGED_GROUPS = 64  # (queue, priority) groups of a status merged at most; more: the page as before


def _status_page_ids(
    c: Connection, job_filter: JobFilter, bound: list[Any], descending: bool, n: int
) -> list[int] | None:
    """The first `n` ids (newest first when `descending`) of a status, or of a status and queue,
    beyond `bound`: each (queue, priority) group's first `n` in ix_ready_pick (status, queue,
    priority, id), merged. None where this does not apply (other filters, other servers, more
    than MERGED_GROUPS groups).

    ix_ready_pick holds a status's ids in order only within each (queue, priority), so reading
    the status through it sorted every entry (40,000 for ready, and every failed job, growing
    with the table), and the planner's other way, walking the primary key, read every newer row
    of other statuses: the first page of status=failed read 100,000 rows once a burst of done
    jobs sat above the last failure. Each group's first `n` is an index range read backwards (or
    forwards) that stops after `n`: the page costs groups x n entries, at any depth, for any
    status. The groups come from a loose index scan of the same index."""
    if (
        job_filter.status is None
        or job_filter.task
        or job_filter.key_prefix
        or job_filter.min_id is not None
        or job_filter.search
    ):
        return None
    merged = _merged_ids(c, job_filter, bound, descending, n)
    return None if merged is None else c.execute(merged).scalars().all()


def _merged_ids(c: Connection, job_filter: JobFilter, bound: list[Any], descending: bool, n: int) -> sa.Select | None:
    """The statement of _status_page_ids: each (queue, priority) group's first `n` ids of the
    filter's status (and queue) that also match the filter's other conditions, merged and cut to
    `n`. None on other servers or beyond MERGED_GROUPS groups."""
    if c.dialect.name not in ("mysql", "mariadb"):
        return None
    status = jq.status == Status(job_filter.status).value
    own = [status] + ([jq.queue == job_filter.queue] if job_filter.queue else [])
    # Grouped by status too: without it the planner reads every entry of the status instead of
    # jumping from group to group (0.65 s for done at 1,000,000 rows).
    groups = c.execute(
        sa.select(jq.queue, jq.priority).where(*own).group_by(jq.status, jq.queue, jq.priority).limit(MERGED_GROUPS + 1)
    ).all()
    if len(groups) > MERGED_GROUPS:
        return None
    order = jq.id.desc() if descending else jq.id.asc()
    if not groups:
        return sa.select(jq.id).where(sa.false()).limit(n)
    rest = job_filter.where(search=False)
    parts = [
        through_index(
            c,
            sa.select(jq.id).where(*rest, jq.queue == queue, jq.priority == priority, *bound).order_by(order).limit(n),
            "ix_ready_pick",
        )
        for queue, priority in groups
    ]
    merged = sa.union_all(*parts).subquery()
    return sa.select(merged.c.id).order_by(merged.c.id.desc() if descending else merged.c.id.asc()).limit(n)


def page_jobs(
    conn: Connection,
    job_filter: JobFilter | None = None,
    *,
    before: int | None = None,
    after: int | None = None,
    limit: int = 50,
    window: int | None = None,
    cap: int = COUNT_CAP,
) -> JobPage:
    """A keyset page of jobs matching `job_filter`, newest first: below `before` (older pages) or
    above `after` (newer pages), never OFFSET. A search (`job_filter.search`) reads at most
    `window` rows matching the other filters (default: search_window), starting where the page
    starts. A deep page costs what the first does, also for a prefix and a status (see
    _status_page_ids, pinned_index)."""
    job_filter = job_filter or JobFilter()
    if before is not None and after is not None:
        raise ValueError("give before or after, not both")
    direction = "newer" if after is not None else "older"
    start = after if after is not None else before

    def read(c: Connection) -> JobPage:
        base = job_filter.where(search=False)
        where = list(base)
        if start is not None:
            where.append(jq.id < start if direction == "older" else jq.id > start)
        order = jq.id.desc() if direction == "older" else jq.id.asc()
        floor = size = None
        if job_filter.search:
            # One scan of the window: the ids of every match (up to the cap) give the count and
            # the page, whose rows are then read by primary key.
            window_ids, size = _search_window_ids(c, job_filter, start, direction, window)
            floor, low, high, n = _window(c, window_ids, direction, size)
            if not n:
                stmt = None
            elif high - low + 1 > SPARSE_WINDOW * n:
                # The window's own rows, one by one in id order (see search_index).
                inner = window_ids.subquery()
                stmt = (
                    sa.select(jq.id)
                    .select_from(inner.join(job_queue, jq.id == inner.c.id))
                    .where(job_filter.search_clause())
                )
                for dialect in ("mysql", "mariadb"):
                    stmt = stmt.prefix_with("STRAIGHT_JOIN", dialect=dialect)
            else:
                # Dense: the id range of the window, read in order (a page of the table holds
                # several of its rows).
                stmt = through_index(
                    c, sa.select(jq.id).where(*base, jq.id.between(low, high), job_filter.search_clause()), "PRIMARY"
                )
            ids = c.execute(stmt.order_by(order).limit(cap + 1)).scalars().all() if stmt is not None else []
            matches, capped = min(len(ids), cap), len(ids) > cap
            wanted = ids[: limit + 1]
            rows = (
                [
                    job_from_row(r)
                    for r in c.execute(sa.select(job_queue).where(jq.id.in_(wanted)).order_by(order)).all()
                ]
                if wanted
                else []
            )
        elif job_filter.batch and c.dialect.name in ("mysql", "mariadb"):
            members = batch_members(c, job_filter)
            ends = [] if start is None else [jm.job_id < start if direction == "older" else jm.job_id > start]
            ids = (
                c.execute(
                    members.where(*ends)
                    .order_by(jm.job_id.desc() if direction == "older" else jm.job_id)
                    .limit(limit + 1)
                )
                .scalars()
                .all()
            )
            rows = _rows_by_id(c, ids, order)
            matches, capped = _count_members(c, members, cap)
        elif (ids := _status_page_ids(c, job_filter, where[len(base) :], direction == "older", limit + 1)) is not None:
            rows = _rows_by_id(c, ids, order)
            matches, capped = _count(c, base, cap)
        elif (pinned := pinned_index(job_filter)) and c.dialect.name in ("mysql", "mariadb"):
            # The page's ids from the filter's own index (index-only for a prefix, or a live
            # status and queue), then their rows by primary key.
            ids = (
                c.execute(
                    sa.select(jq.id)
                    .with_hint(job_queue, f"FORCE INDEX ({pinned})", c.dialect.name)
                    .where(*where)
                    .order_by(order)
                    .limit(limit + 1)
                )
                .scalars()
                .all()
            )
            rows = _rows_by_id(c, ids, order)
            matches, capped = _count(c, base, cap)
        else:
            rows = [
                job_from_row(r)
                for r in c.execute(sa.select(job_queue).where(*where).order_by(order).limit(limit + 1)).all()
            ]
            matches, capped = _count(c, base, cap)
        more = len(rows) > limit
        rows = rows[:limit]
        if direction == "newer":
            rows.reverse()
        # A page reached from another (`before` / `after` given) has that page on its other side.
        if direction == "older":
            older = rows[-1].id if more else None
            newer = (rows[0].id if rows else start) if start is not None else None
        else:
            newer = rows[0].id if more else None
            older = rows[-1].id if rows else after
        if job_filter.search and not more and floor is not None:
            # A search knows only its window: the next one starts where this one stopped, even
            # when this one held no more matches.
            if direction == "older":
                older = floor
            else:
                newer = floor
        return JobPage(rows, older, newer, matches, capped, floor, size if job_filter.search else None)

    return transaction(conn, read, what="page_jobs")


def jobs_by_id(conn: Connection, ids: Sequence[int]) -> list[Job]:
    """The jobs with these ids (at most a page's worth), for the dashboard's live refresh."""
    if not ids:
        return []
    stmt = sa.select(job_queue).where(jq.id.in_([int(i) for i in ids]))
    return [job_from_row(r) for r in transaction(conn, lambda c: c.execute(stmt).all(), what="jobs_by_id")]


def _rows_by_id(c: Connection, ids: list[int], order) -> list[Job]:
    """A page's jobs by primary key, in the page's order (the ids came from an index read)."""
    if not ids:
        return []
    return [job_from_row(r) for r in c.execute(sa.select(job_queue).where(jq.id.in_(ids)).order_by(order)).all()]
