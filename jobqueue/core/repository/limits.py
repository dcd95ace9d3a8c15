"""limits: which of the jobs a claim picked it may take, under their tasks' concurrency limits
and rate limits (`Places`, used by claim.py inside the claim's transaction), and the rows those
limits keep (`ensure_keys`, `ensure_buckets`, written with the jobs by enqueue.py).

Concurrency limits (tasks with a `concurrency_key`): when the pick returned keyed jobs, the claim
locks those keys' rows in `concurrency_key` with SKIP LOCKED and counts each key's running jobs
(ix_concurrency). A key at its limit, or whose row another claim holds this instant, keeps its
jobs `ready` for a later turn; the claim then looks a little further down the same index for
jobs of other keys (at most LOOKAHEAD_ROUNDS ranges of LOOKAHEAD_MAX rows, each starting where
the last one ended, so a long backlog of one full key costs a claim a bounded read, not a scan). Nothing waits on a lock, so the claim stays
deadlock-free, and a place is just a running row: it comes back whenever the job stops running.

Rate limits (tasks with a `rate_limit`): the same way, for the rate buckets of the picked jobs.
The claim locks their rate_window rows with SKIP LOCKED, reads the database's now with them, and
takes at most the starts left in the bucket's current window (fixed, aligned to the database
clock: window_start = floor(now / period), so every host counts the same window whatever its own
clock says); it adds the starts it really took before its COMMIT. A bucket whose window is spent
(or whose row another claim holds) keeps its jobs `ready`, counted as `limited`, and the report
says when the window ends (`next_allowed`), so idle workers sleep until then instead of retrying.
Claims of one bucket thus take turns on its row, which is the price of one limit for every host;
claims of jobs without a rate limit never read the table.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Sequence
from datetime import datetime, timedelta

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from ..db import db_now, transaction
from ..schema import concurrency_key, rate_window, task_definition
from ..tasks import parse_rate_limit
from .claim_sql import (
    KEYS_PRESENT,
    READ_CLOCK,
    RUNNING_PER_KEY,
    SAVE_WINDOW,
    PickedRow,
    lock_buckets_statement,
    lock_keys_statement,
)
from .common import as_datetime

ck = concurrency_key.c


class Places:
    """The concurrency places one claim transaction may hand out: for each key it met, the key
    row locked by this transaction (SKIP LOCKED) and how many more of its jobs may run."""

    def __init__(self, c: Connection, kind: str, finishing: Sequence[str] = ()):
        self.c = c
        self.kind = kind
        # Keys of jobs this cycle completes: still running when the places are counted, done
        # when the cycle's UPDATE lands, so their places are free for this claim already.
        self.finishing = collections.Counter(finishing)
        self.left: dict[str, int] = {}  # key -> places left (keys whose row we hold)
        self.blocked: set[str] = set()  # keys that are full, held by another claim, or missing
        self.missing: set[str] = set()
        self.refused = 0  # rows left ready for their key or rate bucket
        self.windows: dict[str, Window] = {}  # rate bucket -> its window (buckets whose row we hold)
        self.held: set[str] = set()  # rate buckets another claim holds, or without a row
        self.next_allowed: datetime | None = None  # the earliest end of a window found spent

    def admit(self, rows: list[PickedRow], room: int) -> tuple[list[PickedRow], int]:
        """The rows (in claim order) this claim may take, at most `room`, and how many it left
        for their key."""
        new = sorted(
            {row.concurrency_key for row in rows if row.concurrency_key is not None} - set(self.left) - self.blocked
        )
        if new:
            self._acquire(new)
        buckets = sorted(
            {row.rate_bucket for row in rows if row.rate_bucket is not None} - set(self.windows) - self.held
        )
        if buckets:
            self._acquire_buckets(buckets)
        out: list[PickedRow] = []
        refused = 0
        for row in rows:
            if len(out) >= room:
                break
            key, bucket = row.concurrency_key, row.rate_bucket
            if key is not None and self.left.get(key, 0) <= 0:
                refused += 1
                self.blocked.add(key)
                continue
            if bucket is not None:
                window = self.windows.get(bucket)
                if window is None or window.left <= 0:
                    refused += 1
                    if window is not None and (self.next_allowed is None or window.end < self.next_allowed):
                        self.next_allowed = window.end
                    continue
                window.left -= 1
            if key is not None:
                self.left[key] -= 1
            out.append(row)
        self.refused += refused
        return out, refused

    def _acquire_buckets(self, buckets: list[str]) -> None:
        rows = self.c.execute(lock_buckets_statement(self.kind), {"keys": buckets}).all()
        for bucket, max_starts, period, stored, starts, now in rows:
            current = window_start(as_datetime(now), int(period))
            used = int(starts) if as_datetime(stored) == current else 0
            end = current + timedelta(seconds=int(period))
            self.windows[bucket] = Window(max(0, int(max_starts) - used), current, used, end, int(period))
        # Held by another claim this instant, or without a row (removed by hand; the next
        # enqueue of the task writes it again): their jobs wait for a later turn.
        self.held.update(b for b in buckets if b not in self.windows)

    def spend(self, taken: list[PickedRow]) -> None:
        """Count the jobs the claim really took in their buckets' windows (before its COMMIT)."""
        counts = collections.Counter(row.rate_bucket for row in taken if row.rate_bucket is not None)
        if not counts:
            return
        # The UPDATE stamped started_at with its own statement time, later than the now read with
        # the buckets' locks: if a window ended in between, the jobs count in the window the clock
        # is in now (at or after their started_at), so that starts counted by started_at never
        # exceed the limit in any window. No other claim has counted there: we hold the row.
        now = as_datetime(self.c.execute(READ_CLOCK).scalar())
        saved = []
        for b, n in sorted(counts.items()):
            window = self.windows[b]
            later = window_start(now, window.period)
            start, starts = (window.start, window.used + n) if later <= window.start else (later, n)
            saved.append({"b_bucket": b, "b_window_start": start, "b_starts": starts})
        self.c.execute(SAVE_WINDOW, saved)

    def _acquire(self, keys: list[str]) -> None:
        held = dict(self.c.execute(lock_keys_statement(self.kind), {"keys": keys}).all())
        others = [k for k in keys if k not in held]
        if others:
            self.blocked.update(others)
            present = set(self.c.execute(KEYS_PRESENT, {"keys": others}).scalars().all())
            self.missing.update(k for k in others if k not in present)
        if held:
            running = dict(self.c.execute(RUNNING_PER_KEY, {"keys": list(held)}).all())
            for key, max_running in held.items():
                self.left[key] = max(0, int(max_running) - int(running.get(key, 0)) + self.finishing[key])


@dataclasses.dataclass
class Window:
    left: int  # starts still allowed in it
    start: datetime
    used: int  # starts counted in it before this claim
    end: datetime
    period: int  # seconds


_EPOCH = datetime(1970, 1, 1)


def window_start(now: datetime, period: int) -> datetime:
    """The start of the fixed window of `period` seconds holding `now` (naive UTC, the database
    clock): floor(now / period), so that every process counts the same window."""
    seconds = int((now.replace(tzinfo=None) - _EPOCH) // timedelta(seconds=1))
    return _EPOCH + timedelta(seconds=seconds - seconds % period)


def ensure_buckets(c: Connection, wanted: dict[str, str]) -> None:
    """Make sure each rate bucket has its row, with the limit `wanted[bucket]` ("100/m"): missing
    rows inserted in bucket order, a limit that changed (the task's code did) updated."""
    if not wanted:
        return
    limits = {b: parse_rate_limit(text, b) for b, text in wanted.items()}
    rw = rate_window.c
    have = {
        row.bucket: (row.max_starts, row.period_seconds)
        for row in c.execute(
            sa.select(rw.bucket, rw.max_starts, rw.period_seconds).where(rw.bucket.in_(sorted(limits)))
        ).all()
    }
    missing = [b for b in sorted(limits) if b not in have]
    if missing:
        insert = (
            sa.insert(rate_window)
            .values(
                bucket=sa.bindparam("b"),
                max_starts=sa.bindparam("n"),
                period_seconds=sa.bindparam("p"),
                starts=0,
                updated_at=db_now(),
            )
            .prefix_with("IGNORE", dialect="mysql")
            .prefix_with("IGNORE", dialect="mariadb")
            .prefix_with("OR IGNORE", dialect="sqlite")
        )
        c.execute(insert, [{"b": b, "n": limits[b][0], "p": limits[b][1]} for b in missing])
    for b in sorted(b for b, limit in have.items() if tuple(limit) != limits[b]):
        c.execute(
            sa.update(rate_window)
            .where(rw.bucket == b)
            .values(max_starts=limits[b][0], period_seconds=limits[b][1], updated_at=db_now())
        )


def ensure_keys(c: Connection, wanted: dict[str, int]) -> None:
    """Make sure each concurrency key has its row, with `wanted[key]` as its limit. Missing rows
    are inserted in key order (two enqueues never wait on each other in a cycle); a limit that
    changed (the task's code did) is updated."""
    if not wanted:
        return
    have = dict(c.execute(sa.select(ck.name, ck.max_running).where(ck.name.in_(sorted(wanted)))).all())
    missing = [key for key in sorted(wanted) if key not in have]
    if missing:
        insert = (
            sa.insert(concurrency_key)
            .values(name=sa.bindparam("key"), max_running=sa.bindparam("limit"), updated_at=db_now())
            .prefix_with("IGNORE", dialect="mysql")
            .prefix_with("IGNORE", dialect="mariadb")
            .prefix_with("OR IGNORE", dialect="sqlite")
        )
        c.execute(insert, [{"key": key, "limit": wanted[key]} for key in missing])
    for key in sorted(k for k, n in have.items() if n != wanted[k]):
        c.execute(sa.update(concurrency_key).where(ck.name == key).values(max_running=wanted[key], updated_at=db_now()))


def rate_limits(conn: Connection) -> dict[str, list[dict]]:
    """The rate limits of the tasks the workers registered, by queue (the overview's queue rows):
    for each, its limit ("100/m"), its rate_key if every value has its own window, and for a
    task's one bucket the starts left in the current window and when it ends. One read of
    task_definition (a row per task) and its buckets' rows by primary key."""
    td, rw = task_definition.c, rate_window.c
    stmt = (
        sa.select(
            td.name,
            td.queue,
            td.rate_limit,
            td.rate_key,
            rw.max_starts,
            rw.period_seconds,
            rw.window_start,
            rw.starts,
            db_now().label("now"),
        )
        .select_from(task_definition.outerjoin(rate_window, rw.bucket == td.name))
        .where(td.rate_limit.is_not(None))
        .order_by(td.queue, td.name)
    )
    out: dict[str, list[dict]] = {}
    for r in transaction(conn, lambda c: c.execute(stmt).all(), what="rate_limits"):
        limit = {"task": r.name, "limit": r.rate_limit, "rate_key": r.rate_key, "left": None, "window_end": None}
        if r.rate_key is None and r.max_starts is not None:
            now = as_datetime(r.now)
            current = window_start(now, int(r.period_seconds))
            used = int(r.starts) if as_datetime(r.window_start) == current else 0
            limit["left"] = max(0, int(r.max_starts) - used)
            limit["window_end"] = current + timedelta(seconds=int(r.period_seconds))
        out.setdefault(r.queue, []).append(limit)
    return out
