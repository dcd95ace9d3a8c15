"""The claim's SQL: every statement a claim cycle sends, the rows they answer, and when each is sent.

`SHAPES` below is the list; `docs/claim-sql.md` shows each one as MariaDB and MySQL receive it,
written by `python -m jobqueue.core.repository.claim_sql > docs/claim-sql.md` (a unit test keeps
it equal). claim.py decides which to send; this module only builds them, each once per shape:
statement building was a third of the worker's CPU.
"""

from __future__ import annotations

import dataclasses
import functools
import sys
from collections.abc import Callable
from typing import Any, NamedTuple

import sqlalchemy as sa
from sqlalchemy.engine import Dialect

from ..db import db_after, db_micros_since, db_now
from ..models import Status
from ..schema import concurrency_key, job_queue, queue_state, rate_window
from .common import by_id, jq
from .leases import fence_any

PICK_INDEX = "ix_ready_pick"
READ_ONLY_FLAGS = {
    "mariadb": ("read_only", "innodb_read_only"),
    "mysql": ("read_only", "innodb_read_only", "super_read_only"),
}
ER_PARSE_ERROR = 1064
ER_NO_SUCH_KEY = 1176
ER_WRONG_USAGE = 1221
ck = concurrency_key.c


@dataclasses.dataclass
class Refusals:
    """What the server refused, learnt from its errors once per process and kept for every later
    claim (reset() or monkeypatch in tests).

    index_missing: it said ix_ready_pick does not exist (1176). Claims then pick without the
        index hint, slower but working, and `jobqueue doctor` says what is wrong.
    union: it refused the one-statement lock-and-pick (1064 / 1221: a grammar with no locking
        clause inside a UNION). Cycles then send the lock and the pick apart, one round trip more.
    """

    index_missing: bool = False
    union: bool = False

    def reset(self) -> None:
        self.index_missing = self.union = False


REFUSED = Refusals()


# --- the rows -----------------------------------------------------------------------------------


QUEUE_STATE_ROW = 2  # `finishing` of a queue_states_statement row


class PickedRow(NamedTuple):
    """A row of pick_statement (or of lock_finished_statement, `finishing` 1, or of
    queue_states_statement, `finishing` 2, in the same columns so that they go in one UNION ALL)."""

    id: int
    task_key: str
    task_name: str
    priority: int
    payload: Any
    attempts: int
    max_attempts: int
    waited_us: int | None  # since run_at, by the database clock
    rate_bucket: str | None
    concurrency_key: str | None
    finishing: int  # 0: a ready row picked; 1: a finished job's row locked; 2: a queue's state
    read_only: Any = None  # any of the server's read-only flags on (not read on SQLite)


class LockedRow(NamedTuple):
    """A finished job's row the cycle locked to complete it."""

    id: int
    frees_key: str | None  # its concurrency key if it still runs under the lease: a place freed
    read_only: Any = None
    has_dependents: bool = False  # something waits for it: its completion settles its children


def split_rows(rows: list[tuple]) -> tuple[dict[str, bool], list[LockedRow], list[PickedRow]]:
    """The rows of the queue states, the lock, the pick or their UNION ALL, told apart by their
    `finishing` column: queue -> paused, the finished jobs' rows locked, the rows picked."""
    states: dict[str, bool] = {}
    locked: list[LockedRow] = []
    picked: list[PickedRow] = []
    for row in rows:
        row = PickedRow(*row)
        if row.finishing == QUEUE_STATE_ROW:
            # A queue state row: the queue's name in `task_key`, paused in `priority`.
            states[row.task_key] = bool(row.priority)
        elif row.finishing:
            # A locked row carries has_dependents in the pick's `priority` column.
            locked.append(LockedRow(row.id, row.concurrency_key, row.read_only, bool(row.priority)))
        else:
            picked.append(row)
    return states, locked, picked


# --- the statements -----------------------------------------------------------------------------


def read_only_column(flavour: str) -> sa.ColumnElement:
    """One column that is 0 unless one of the server's read-only flags is on: every pick and lock
    of the cycle reads it (one column, not three); which flag it was is read only when one is."""
    return sa.literal_column(f"({' OR '.join(f'@@global.{flag}' for flag in READ_ONLY_FLAGS[flavour])})")


def _force(stmt, table: sa.Table, index: str):
    hint = f"FORCE INDEX ({index})"
    return stmt.with_hint(table, hint, "mysql").with_hint(table, hint, "mariadb")


@functools.lru_cache(maxsize=8)
def pick_statement(flavour: str, hinted: bool = True) -> sa.Select:
    """The claim's locking SELECT for 'mariadb', 'mysql' or 'sqlite': ready rows of one queue in
    ix_ready_pick's order, rows other transactions hold skipped. The index is forced so that MySQL
    and MariaDB take the same plan whatever their statistics say."""
    columns = [
        jq.id,
        jq.task_key,
        jq.task_name,
        jq.priority,
        jq.payload,
        jq.attempts,
        jq.max_attempts,
        db_micros_since(jq.run_at),
        jq.rate_bucket,
        jq.concurrency_key,
        sa.literal_column("0").label("finishing"),
    ]
    if flavour != "sqlite":
        columns.append(read_only_column(flavour))
    stmt = (
        sa.select(*columns)
        .where(jq.status == Status.READY.value, jq.queue == sa.bindparam("queue"))
        .order_by(jq.priority, jq.id)
        .limit(sa.bindparam("limit", type_=sa.Integer))
    )
    if flavour != "sqlite" and hinted:
        stmt = _force(stmt, job_queue, PICK_INDEX)
    return stmt.with_for_update(skip_locked=True)


@functools.lru_cache(maxsize=8)
def pick_after_statement(flavour: str) -> sa.Select:
    """The pick again, continuing after a (priority, id) in claim order: an index range that
    starts where the last pick ended, so each look further reads at most its LIMIT more rows."""
    after_p = sa.bindparam("after_priority", type_=sa.SmallInteger)
    after_id = sa.bindparam("after_id", type_=sa.BigInteger)
    after = sa.or_(jq.priority > after_p, sa.and_(jq.priority == after_p, jq.id > after_id))
    return pick_statement(flavour).where(after)


@functools.lru_cache(maxsize=512)
def lock_finished_statement(n: int, flavour: str) -> sa.Select:
    """Lock the rows of n finished leases by primary key without waiting (rows another
    transaction holds are left out), in the pick's columns. Where the pick has the concurrency
    key, the row has its key if it still runs under the lease (parameters as for fence_any).
    PRIMARY is forced: on a small table MariaDB would rather scan, and a locking scan touches
    every row."""
    ids = [sa.bindparam(f"id_{i}", type_=sa.BigInteger) for i in range(n)]
    blanks: list[Any] = [sa.literal_column("NULL") for _ in range(PickedRow._fields.index("concurrency_key") - 1)]
    # has_dependents in the `priority` column (see split_rows): read where the row is locked anyway.
    blanks[PickedRow._fields.index("priority") - 1] = jq.has_dependents
    running = sa.bindparam("lock_status", Status.RUNNING.value)  # its own name: the pick's status_1 is 'ready'
    key = sa.case((sa.and_(jq.status == running, fence_any(n)), jq.concurrency_key))
    finishing = sa.literal_column("1").label("finishing")
    if flavour == "sqlite":
        return sa.select(jq.id, *blanks, key, finishing).where(jq.id.in_(ids))
    stmt = sa.select(jq.id, *blanks, key, finishing, read_only_column(flavour)).where(jq.id.in_(ids))
    return _force(stmt, job_queue, "PRIMARY").with_for_update(skip_locked=True)


_unions: dict[tuple[Any, ...], tuple[str, dict[str, Any]]] = {}


def union_sql(dialect: Dialect, *parts: sa.Select) -> tuple[str, dict[str, Any]]:
    """`(part) UNION ALL (part) ...` as SQL text with their default parameters, built once. Their
    parameter names must not clash: one dictionary carries them all. The server runs the parts in
    order, so their locks are taken in that order."""
    key = (dialect.name, *parts)
    if key not in _unions:
        compiled = [stmt.compile(dialect=dialect) for stmt in parts]
        merged: dict[str, Any] = {}
        for one in compiled:
            clash = {k for k, v in one.params.items() if k in merged and merged[k] != v}
            if clash:
                raise AssertionError(f"parameters named alike in two SELECTs: {sorted(clash)}")
            merged.update(one.params)
        _unions[key] = " UNION ALL ".join(f"({one.string})" for one in compiled), merged
    return _unions[key]


@functools.lru_cache(maxsize=64)
def queue_states_statement(n: int, flavour: str) -> sa.Select:
    """The queue_state rows of n queues (parameters state_0 ...), share-locked: a pause, which
    locks its row exclusively, waits for the claim that read it open. In the pick's columns, so
    that it goes first in the cycle's UNION ALL: the name in `task_key`, paused in `priority`."""
    names = [sa.bindparam(f"state_{i}", type_=sa.String) for i in range(n)]
    qs = queue_state.c
    null = sa.literal_column("NULL")
    columns = [null, qs.queue, null, qs.paused, *[null] * 6, sa.literal_column(str(QUEUE_STATE_ROW)).label("finishing")]
    stmt = sa.select(*columns, read_only_column(flavour)).where(qs.queue.in_(names))
    return _force(stmt, queue_state, "PRIMARY").with_for_update(read=True)


@functools.lru_cache(maxsize=1024)
def complete_and_take_statement(done: int, take: int) -> sa.Update:
    """The cycle's one UPDATE: running -> done for `done` finished leases (each row fenced by its
    own id, lease_owner and attempts) and ready -> running for `take` picked rows (guarded by
    status = 'ready'), each with its slot's lease owner. Every assignment tests the row's id,
    never a column this statement sets: MySQL evaluates SET left to right and later terms would
    see new values."""
    done_ids = [sa.bindparam(f"id_{i}", type_=sa.BigInteger) for i in range(done)]
    take_ids = [sa.bindparam(f"take_{i}", type_=sa.BigInteger) for i in range(take)]
    guards = []
    if done:
        guards.append(sa.and_(jq.status == Status.RUNNING.value, fence_any(done)))
    if take:
        guards.append(sa.and_(jq.status == Status.READY.value, jq.id.in_(take_ids)))
    stmt = by_id(sa.update(job_queue).where(jq.id.in_(done_ids + take_ids), sa.or_(*guards)))
    lease_until = db_after(micros=sa.bindparam("lease_us", type_=sa.BigInteger))
    if not take:
        return stmt.values(status=Status.DONE.value, finished_at=db_now(), lease_until=None, updated_at=db_now())
    owner = sa.case({take_ids[i]: sa.bindparam(f"owner_take_{i}", type_=sa.String) for i in range(take)}, value=jq.id)
    if not done:
        return stmt.values(
            status=Status.RUNNING.value,
            lease_owner=owner,
            lease_until=lease_until,
            attempts=jq.attempts + 1,
            started_at=db_now(),
            updated_at=db_now(),
        )
    taking = jq.id.in_(take_ids)
    return stmt.values(
        status=sa.case((taking, Status.RUNNING.value), else_=Status.DONE.value),
        lease_owner=sa.case((taking, owner), else_=jq.lease_owner),
        lease_until=sa.case((taking, lease_until), else_=sa.null()),
        attempts=sa.case((taking, jq.attempts + 1), else_=jq.attempts),
        started_at=sa.case((taking, db_now()), else_=jq.started_at),
        finished_at=sa.case((taking, jq.finished_at), else_=db_now()),
        updated_at=db_now(),
    )


# Built once (expanding IN lists keep them in SQLAlchemy's statement cache whatever the count).
_QUEUES = sa.bindparam("queues", expanding=True)
QUEUE_STATES = sa.select(queue_state.c.queue, queue_state.c.paused).where(queue_state.c.queue.in_(_QUEUES))
QUEUE_STATES_SHARED = QUEUE_STATES.with_for_update(read=True)
ADD_QUEUE_STATE = (
    sa.insert(queue_state)
    .values(queue=sa.bindparam("name"), paused=False, changed_at=db_now(), changed_by="")
    .prefix_with("IGNORE", dialect="mysql")
    .prefix_with("IGNORE", dialect="mariadb")
    .prefix_with("OR IGNORE", dialect="sqlite")
)
_KEYS = sa.bindparam("keys", expanding=True)
KEYS_PRESENT = sa.select(ck.name).where(ck.name.in_(_KEYS))
RUNNING_PER_KEY = (
    sa.select(jq.concurrency_key, sa.func.count())
    .where(jq.concurrency_key.in_(_KEYS), jq.status == Status.RUNNING.value)
    .group_by(jq.concurrency_key)
)


@functools.lru_cache(maxsize=4)
def lock_keys_statement(flavour: str) -> sa.Select:
    """The key rows, locked by this claim unless another holds them this instant (SKIP LOCKED:
    never a wait, so never a deadlock)."""
    stmt = sa.select(ck.name, ck.max_running).where(ck.name.in_(_KEYS))
    if flavour == "sqlite":
        return stmt
    return _force(stmt, concurrency_key, "PRIMARY").with_for_update(skip_locked=True)


rw = rate_window.c
# Read after the UPDATE that took rate-limited jobs: which window their starts count in.
READ_CLOCK = sa.select(db_now().label("now"))

SAVE_WINDOW = (
    sa.update(rate_window)
    .where(rw.bucket == sa.bindparam("b_bucket"))
    .values(window_start=sa.bindparam("b_window_start"), starts=sa.bindparam("b_starts"), updated_at=db_now())
)


@functools.lru_cache(maxsize=4)
def lock_buckets_statement(flavour: str) -> sa.Select:
    """The rate buckets' rows with the database's now, locked by this claim unless another holds
    them this instant (SKIP LOCKED, as lock_keys_statement: never a wait, so never a deadlock)."""
    stmt = sa.select(rw.bucket, rw.max_starts, rw.period_seconds, rw.window_start, rw.starts, db_now()).where(
        rw.bucket.in_(_KEYS)
    )
    if flavour == "sqlite":
        return stmt
    return _force(stmt, rate_window, "PRIMARY").with_for_update(skip_locked=True)


# --- which statement, when ----------------------------------------------------------------------

# Example values for the document: two finished leases (ids 101, 102) and two jobs taken (103, 104).
_EXAMPLE = {
    "queue": "default",
    "limit": 4,
    "queues": ["default", "mail"],
    "state_0": "default",
    "state_1": "mail",
    "name": "mail",
    "keys": ["mail"],
    "after_priority": 0,
    "after_id": 104,
    "lease_us": 60_000_000,
    "b_bucket": "send_sms:42",
    "b_window_start": "2026-12-04 14:00:00",
    "b_starts": 5,
    **{f"id_{i}": 101 + i for i in range(2)},
    **{f"owner_{i}": f"host:7:{i + 1}" for i in range(2)},
    **{f"attempt_{i}": 1 for i in range(2)},
    **{f"take_{i}": 103 + i for i in range(2)},
    **{f"owner_take_{i}": f"host:7:{i + 1}" for i in range(2)},
}


@dataclasses.dataclass(frozen=True)
class Shape:
    name: str
    when: str
    build: Callable[[str], Any]  # flavour -> a statement, or a tuple of them for a UNION ALL


SHAPES = (
    Shape(
        "open queues, lock and pick",
        "First in a cycle with finished jobs and room to claim, in one round trip: share-locks the "
        "queue_state rows of its queues (a pause waits for it), locks the finished jobs' rows and "
        "picks from its first queue (its rows are dropped if that queue is paused). Not sent once the "
        "server refused it (`REFUSED.union`) or said the index is missing (`REFUSED.index_missing`).",
        lambda f: (queue_states_statement(2, f), lock_finished_statement(2, f), pick_statement(f)),
    ),
    Shape(
        "open queues and pick",
        "The same in a cycle with no finished job.",
        lambda f: (queue_states_statement(2, f), pick_statement(f)),
    ),
    Shape(
        "open queues",
        "When the UNION ALL is not sent; and after it, only when one of the queues had no "
        "queue_state row (then `add queue state` first, and this reads them all again).",
        lambda f: QUEUE_STATES_SHARED,
    ),
    Shape(
        "add queue state",
        "Only for a queue that has no queue_state row yet (once per queue).",
        lambda f: ADD_QUEUE_STATE,
    ),
    Shape(
        "lock finished",
        "A cycle with finished jobs when the UNION ALL is not sent: nothing to pick, or refused.",
        lambda f: lock_finished_statement(2, f),
    ),
    Shape(
        "pick",
        "Each queue a cycle claims from (the first one's rows come from the UNION ALL when that was sent).",
        lambda f: pick_statement(f),
    ),
    Shape(
        "pick without the index",
        "Instead of `pick` once the server said ix_ready_pick does not exist (`REFUSED.index_missing`).",
        lambda f: pick_statement(f, hinted=False),
    ),
    Shape(
        "pick after",
        "Only jobs of full concurrency keys at the head of a queue: looks past them (at most LOOKAHEAD_ROUNDS times).",
        lambda f: pick_after_statement(f),
    ),
    Shape(
        "lock keys", "Picked rows carry concurrency keys this cycle has not met yet.", lambda f: lock_keys_statement(f)
    ),
    Shape(
        "keys present",
        "Some keys were not locked: held by another claim, or their row is missing.",
        lambda f: KEYS_PRESENT,
    ),
    Shape("running per key", "Some keys were locked: how many of their jobs run.", lambda f: RUNNING_PER_KEY),
    Shape(
        "lock buckets",
        "Picked rows carry rate buckets (tasks with a rate_limit) this cycle has not met yet.",
        lambda f: lock_buckets_statement(f),
    ),
    Shape(
        "read clock",
        "After the UPDATE that took rate-limited jobs: the window their starts count in.",
        lambda f: READ_CLOCK,
    ),
    Shape(
        "save window",
        "After the UPDATE, once per rate bucket whose jobs it took: the window and its starts.",
        lambda f: SAVE_WINDOW,
    ),
    Shape("complete", "Finished jobs locked, nothing taken.", lambda f: complete_and_take_statement(2, 0)),
    Shape("take", "Jobs taken, no finished job.", lambda f: complete_and_take_statement(0, 2)),
    Shape("complete and take", "Both: the cycle's one UPDATE.", lambda f: complete_and_take_statement(2, 2)),
)


def _dialect(flavour: str) -> Dialect:
    dialect = sa.create_engine(f"{flavour}+pymysql://").dialect
    if flavour == "mysql":
        dialect.use_mysql_for_share = True  # what a connection to MySQL 8.0.1 or later says
    return dialect


def as_sent(dialect: Dialect, built: Any, params: dict[str, Any]) -> str:
    """The text the server receives for `built` with `params`: compiled for `dialect`, the
    values escaped and put in by PyMySQL's own rules."""
    from pymysql.converters import escape_item

    if isinstance(built, tuple):
        sql, defaults = union_sql(dialect, *built)
        values = {**defaults, **params}
    else:
        compiled = built.compile(dialect=dialect)
        expanded = compiled.construct_expanded_state({k: v for k, v in params.items() if k in compiled.binds})
        sql, values = expanded.statement, expanded.parameters
    return sql % {k: escape_item(v, "utf8mb4") for k, v in values.items() if not isinstance(v, list)}


def document() -> str:
    """docs/claim-sql.md."""
    out = [
        "# The claim's SQL",
        "",
        "Every statement a claim cycle (`jobqueue/core/repository/claim.py`) sends, as MariaDB and MySQL",
        "receive it, with example values (two finished leases, ids 101 and 102; two jobs taken, 103 and 104).",
        "Built in `jobqueue/core/repository/claim_sql.py`; written by",
        "`python -m jobqueue.core.repository.claim_sql > docs/claim-sql.md` (a unit test keeps it equal).",
        "A statement over n rows is built for n up to 2, else the next power of two; the places past n get",
        "ids no row has. Each SELECT below can be run with `EXPLAIN` in front.",
        "",
        "One cycle: `open queues, lock and pick` (or `open queues`, `lock finished` and `pick`), `complete and take`,",
        "COMMIT. When it took fewer jobs than it asked for, one plain read says why",
        "(`claim.classify_statement`).",
        "",
    ]
    for shape in SHAPES:
        out += [f"## {shape.name}", "", shape.when, ""]
        for flavour, title in (("mariadb", "MariaDB"), ("mysql", "MySQL")):
            out += [f"{title}:", "", "```sql", as_sent(_dialect(flavour), shape.build(flavour), _EXAMPLE), "```", ""]
    return "\n".join(line.rstrip() for line in "\n".join(out).split("\n"))


if __name__ == "__main__":
    sys.stdout.write(document())
