"""claim: take ready jobs in one short transaction, and say why a claim found nothing.

The claim (the source document's rule 2):

    SELECT ... FROM job_queue FORCE INDEX (ix_ready_pick)
     WHERE status = 'ready' AND queue = ? ORDER BY priority, id LIMIT n FOR UPDATE SKIP LOCKED
    UPDATE job_queue SET status = 'running', lease_owner = ..., lease_until = now + lease,
           attempts = attempts + 1 WHERE id IN (...) AND status = 'ready'
    COMMIT

Every statement the claim sends is built in claim_sql.py, which also says when each is sent;
docs/claim-sql.md shows them as MariaDB and MySQL receive them.

WHERE status = 'ready' AND queue = ? ORDER BY priority, id is exactly the order of ix_ready_pick,
so InnoDB walks the index from the first claimable row and stops after `n` rows it could lock:
no filesort, and rows other workers hold are skipped, not waited for. The index is forced so
that MySQL and MariaDB take the same plan whatever their statistics say (Solid Queue needed the
same hint, its issue 694). Only rows the guarded UPDATE really took are returned; the handler
runs after the COMMIT, never inside it.

A claim is not sent at all on a connection whose server was not writable when last checked
(db.require_primary), and its locking SELECT also reads the server's read-only flags, so a claim
that reaches a demoted primary (or a replica) rolls back before its UPDATE: no claim is ever
written on a read-only server.

A claim may first complete the jobs that finished since the last one (`completions`), in the
same transaction: one COMMIT per cycle of the worker instead of two. Where the server takes it, a
cycle sends one SELECT (queue states, finished rows, pick), one UPDATE and the COMMIT.

Concurrency limits and rate limits: which picked jobs a claim may take is decided in limits.py
(`Places`), inside the claim's transaction, without ever waiting on a lock.

Paused queues: the claim share-locks the queue_state rows of the queues it was given and leaves
out the paused ones, in its own transaction: in the same statement as its pick (the UNION ALL of
_lock_and_pick, which drops the rows it picked from a queue it then finds paused), or apart
(_open_queues). A pause locks its row exclusively,
so it waits for the claims in flight that read the queue open, and the claims after it read it
paused: once `pause` has answered, no claim of that queue commits, whatever the worker read
before (workers still leave paused queues out of the lists they pass in, see ready_queues and
paused_queues, so that an idle worker does not claim from them in vain). The pick's statement is
the same with or without paused queues.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError

from ..db import db_now, error_code, is_mysql, require_primary, transaction
from ..errors import NotPrimary
from ..models import ClaimCycle, ClaimedJob, EmptyClaim, EmptyClaimReport, Job, Lease, LeaseLoss, Outcome, Status
from ..schema import queue_state
from .claim_sql import (
    ADD_QUEUE_STATE,
    ER_NO_SUCH_KEY,
    ER_PARSE_ERROR,
    ER_WRONG_USAGE,
    QUEUE_STATES,
    QUEUE_STATES_SHARED,
    READ_ONLY_FLAGS,
    REFUSED,
    LockedRow,
    PickedRow,
    complete_and_take_statement,
    lock_finished_statement,
    pick_after_statement,
    pick_statement,
    queue_states_statement,
    split_rows,
    union_sql,
)
from .common import NO_ROW, as_datetime, execute_fast, execute_sql, jq, shape
from .hooks import settle
from .leases import completions_read_back, fence_params
from .limits import Places, ensure_keys

LOOKAHEAD_ROUNDS = 2  # extra picks past jobs whose concurrency key is full, per queue and claim
LOOKAHEAD_MAX = 200  # rows each of them may return


def flavour(conn: Connection) -> str:
    if not is_mysql(conn):
        return "sqlite"
    return "mariadb" if getattr(conn.dialect, "is_mariadb", False) else "mysql"


def claim_cycle(
    conn: Connection,
    owners: Sequence[str],
    queues: Sequence[str],
    *,
    lease_seconds: float,
    completions: Sequence[Lease] = (),
    classify_queues: Sequence[str] | None = None,
    refill: bool = True,
) -> ClaimCycle:
    """One cycle in one short transaction: complete `completions` (fenced, rows held elsewhere
    left BUSY), then claim up to one job per owner in `owners` plus (with `refill`) one per
    completed job, which takes over that job's owner, i.e. its slot, from `queues` in that order.

    Whenever it took fewer jobs than it asked for, one plain read in the same transaction says
    why (`report`, see classify_row, over `classify_queues`, None for all): ready rows it still
    sees were held by other transactions (a plain read after the UPDATE sees them as ready), and
    are counted as skipped.
    """
    lease_us = int(round(lease_seconds * 1_000_000))
    missing: set[str] = set()

    def write(c: Connection) -> ClaimCycle:
        # Known not to be the primary (checked on this connection at most a second or a few ago):
        # send it nothing; the flags in the locking SELECTs below catch a demotion since.
        require_primary(c)
        kind = flavour(c)
        wanted = owners or (refill and completions)
        # One statement reads the queues' states, locks the finished jobs' rows and picks from the
        # first queue, as if every finished job's slot will take new work; a slot whose row was
        # held elsewhere (BUSY: the lease is still ours, its completion is tried again next cycle)
        # takes none.
        optimistic = len(owners) + (len(completions) if refill else 0)
        open_queues, first, first_rows, mine, finishing, parents = _lock_and_pick(
            c, kind, completions, queues if wanted else [], optimistic
        )
        done = [lease for lease in completions if lease.job_id in mine]
        completed = {lease: Outcome.BUSY for lease in completions if lease.job_id not in mine}
        slots = list(owners) + ([lease.owner for lease in done] if refill else [])
        limit = len(slots)
        picked: list[tuple[PickedRow, str]] = []
        tried: list[str] = []
        places = Places(c, kind, finishing)
        if limit and open_queues:
            for queue in open_queues:
                tried.append(queue)
                room = limit - len(picked)
                rows = (
                    first_rows[:room]
                    if queue == first and len(tried) == 1
                    else _pick(c, kind, {"queue": queue, "limit": room})
                )
                taken, refused = places.admit(rows, room)
                more_there = len(rows) >= room
                rounds = 0
                # Only jobs of full keys at the head of the queue: look a bounded way past them for
                # jobs of other keys (the rows passed stay ready; our locks on them end at COMMIT).
                # A pick that took something does not look further: the next turn will if needed.
                while refused and not taken and more_there and rounds < LOOKAHEAD_ROUNDS:
                    rounds += 1
                    asked = min(LOOKAHEAD_MAX, (room * 4 + 16) << (rounds - 1))
                    rows = _pick_after(c, kind, queue, asked, rows[-1])
                    taken, refused = places.admit(rows, room)
                    more_there = len(rows) >= asked
                picked.extend((row, queue) for row in taken)
                if len(picked) >= limit:
                    break
        missing.update(places.missing)
        owner_of = {row.id: slots[i] for i, (row, _) in enumerate(picked)}
        picked, losses = _write(c, done, picked, owner_of, lease_us, completed)
        places.spend([row for row, _ in picked])
        if parents:
            settle(c, [lease.job_id for lease in done if lease.job_id in parents and completed[lease] is Outcome.OK])
        claimed: list[ClaimedJob] = []
        for row, queue in picked:
            payload = json.loads(row.payload) if isinstance(row.payload, (str, bytes)) else row.payload
            owner = owner_of[row.id]
            claimed.append(
                ClaimedJob(
                    job=Job(
                        id=row.id,
                        task_key=row.task_key,
                        task_name=row.task_name,
                        queue=queue,
                        priority=row.priority,
                        payload=payload,
                        status=Status.RUNNING,
                        attempts=row.attempts + 1,
                        max_attempts=row.max_attempts,
                        lease_owner=owner,
                        concurrency_key=row.concurrency_key,
                    ),
                    lease=Lease(row.id, owner, row.attempts + 1),
                    start_delay=None if row.waited_us is None else max(0.0, int(row.waited_us) / 1e6),
                )
            )
        report = None
        if limit and len(claimed) < limit:
            report = classify_row(tuple(c.execute(classify_statement(classify_queues)).one()))
            if places.refused:
                # We left ready rows for their concurrency key, and did not look at all the others:
                # the ready rows the read counts are not known to be held by anyone else.
                report = dataclasses.replace(
                    report, skipped=0, kind=EmptyClaim.LIMITED, next_allowed=places.next_allowed
                )
        return ClaimCycle(
            claimed,
            {(lease.job_id, lease.attempt): o for lease, o in completed.items()},
            losses,
            report.skipped if report else 0,
            tried,
            limit,
            report,
            places.refused,
        )

    cycle = transaction(conn, write, what="claim")
    if missing:
        # A keyed job whose key row is gone (removed by hand): recreate it with the safest limit
        # (the next enqueue of that task sets the task's own); its jobs wait until then.
        transaction(conn, lambda c: ensure_keys(c, {key: 1 for key in missing}), what="concurrency_keys")
    return cycle


def _open_queues(c: Connection, kind: str, queues: Sequence[str]) -> list[str]:
    """`queues` without the paused ones, their queue_state rows share-locked until this claim
    commits. A pause locks its row exclusively: it waits for the claims that read the queue open,
    and every claim after it reads it paused; so once `pause` has answered, no claim of that
    queue commits. A queue without a row gets one (not paused) first: a missing row could not be
    locked, and a pause that created it would not wait for this claim. That happens once per
    queue; a pause creating the same row meanwhile makes the insert wait for it."""
    statement = QUEUE_STATES if kind == "sqlite" else QUEUE_STATES_SHARED  # SQLite: the claim holds the database
    names = list(dict.fromkeys(queues))
    paused = dict(c.execute(statement, {"queues": names}).all())
    missing = [q for q in names if q not in paused]
    if missing:
        c.execute(ADD_QUEUE_STATE, [{"name": q} for q in sorted(missing)])
        paused = dict(c.execute(statement, {"queues": names}).all())
    return [q for q in queues if q in paused and not paused[q]]


def _pick_after(c: Connection, kind: str, queue: str, limit: int, last: PickedRow) -> list[PickedRow]:
    rows = execute_fast(
        c,
        pick_after_statement(kind),
        {"queue": queue, "limit": limit, "after_priority": last.priority, "after_id": last.id},
    ).rows
    return split_rows(rows)[2]


def _write(
    c: Connection,
    done: list[Lease],
    picked: list[tuple[PickedRow, str]],
    owner_of: dict[int, str],
    lease_us: int,
    completed: dict[Lease, Outcome],
) -> tuple[list[tuple[PickedRow, str]], list[LeaseLoss]]:
    """The cycle's one UPDATE (complete_and_take_statement). Fills `completed` with each finished lease's outcome;
    returns the picked rows that now carry our lease, and the leases found lost."""
    if not done and not picked:
        return picked, []
    done_size, take_size = shape(len(done)), shape(len(picked))
    params = fence_params(done, done_size)
    params["lease_us"] = lease_us
    for i in range(take_size):
        job_id = picked[i][0].id if i < len(picked) else NO_ROW
        params[f"take_{i}"], params[f"owner_take_{i}"] = job_id, owner_of.get(job_id, "")
    changed = execute_fast(c, complete_and_take_statement(done_size, take_size), params).rowcount
    if changed == len(done) + len(picked):
        completed.update({lease: Outcome.OK for lease in done})
        return picked, []
    # Fewer rows changed than asked, though this transaction holds every one of them: a finished
    # job whose lease was taken (reaped, requeued by an operator) is lost; a picked row is ours
    # only if it now carries our lease.
    losses = completions_read_back(c, done, completed) if done else []
    if picked:
        now = {
            r.id: r
            for r in c.execute(
                sa.select(jq.id, jq.attempts, jq.lease_owner, jq.status).where(jq.id.in_(list(owner_of)))
            ).all()
        }
        picked = [
            (row, q)
            for row, q in picked
            if (r := now.get(row.id)) is not None
            and r.status == Status.RUNNING.value
            and r.lease_owner == owner_of[row.id]
            and r.attempts == row.attempts + 1
        ]
    return picked, losses


def _lock_and_pick(
    c: Connection, kind: str, finished: Sequence[Lease], queues: Sequence[str], limit: int
) -> tuple[list[str], str | None, list[PickedRow], set[int], list[str], set[int]]:
    """Share-lock the queue_state rows of `queues` (see _open_queues), lock the finished leases'
    rows (those another transaction holds this instant stay out) and pick up to `limit` ready rows
    of the first queue: in one round trip where the server takes a UNION ALL of the locking
    SELECTs (two round trips less per cycle), else apart. Returns the open queues, the queue
    whose rows were picked (None when none was: its rows are dropped if it turned out paused),
    the picked rows, the ids locked, the concurrency keys whose places the completions free and
    the ids of the finished jobs something waits for. Every SELECT reads the server's read-only
    flags: on a demoted primary the cycle stops here, before any write."""
    names = list(dict.fromkeys(queues))
    if names and limit and kind != "sqlite" and not REFUSED.union and not REFUSED.index_missing:
        # Built for a few counts of queues (see shape); the places past them repeat the first.
        places = shape(len(names))
        parts = [queue_states_statement(places, kind)]
        params: dict[str, Any] = {f"state_{i}": names[i if i < len(names) else 0] for i in range(places)}
        if finished:
            size = shape(len(finished))
            parts.append(lock_finished_statement(size, kind))
            params.update(fence_params(finished, size))
        sql, defaults = union_sql(c.dialect, *parts, pick_statement(kind))
        try:
            rows = execute_sql(c, sql, {**defaults, **params, "queue": queues[0], "limit": limit}).rows
        except DBAPIError as exc:
            code = error_code(exc)
            if code not in (ER_PARSE_ERROR, ER_WRONG_USAGE, ER_NO_SUCH_KEY):
                raise
            # A statement error; the transaction goes on. (A missing index is _pick's to note.)
            REFUSED.union = REFUSED.union or code != ER_NO_SUCH_KEY
        else:
            if rows:
                _refuse_if_read_only(c, [PickedRow(*rows[0])], kind)
            states, locked, picked = split_rows(rows)
            if len(states) < len(names):
                open_queues = _open_queues(c, kind, queues)  # adds the missing rows, reads all again
            else:
                open_queues = [q for q in queues if not states[q]]
            first = queues[0] if queues[0] in open_queues else None
            return open_queues, first, picked if first else [], {r.id for r in locked}, _freed(locked), _parents(locked)
    open_queues = _open_queues(c, kind, queues) if queues else []
    first = open_queues[0] if open_queues and limit else None
    locked: list[LockedRow] = []
    mine: set[int] = set()
    if finished:
        size = shape(len(finished))
        locked = split_rows(execute_fast(c, lock_finished_statement(size, kind), fence_params(finished, size)).rows)[1]
        if kind == "sqlite":
            mine = {lease.job_id for lease in finished}  # BEGIN IMMEDIATE already holds the whole database
        else:
            _refuse_if_read_only(c, locked, kind)
            mine = {row.id for row in locked}
    picked = _pick(c, kind, {"queue": first, "limit": limit}) if first else []
    return open_queues, first, picked, mine, _freed(locked), _parents(locked)


def _parents(locked: list[LockedRow]) -> set[int]:
    return {row.id for row in locked if row.has_dependents}


def _freed(locked: list[LockedRow]) -> list[str]:
    return [row.frees_key for row in locked if row.frees_key is not None]


def _refuse_if_read_only(c: Connection, rows: Sequence[PickedRow | LockedRow], kind: str) -> None:
    if rows and str(rows[0].read_only) not in ("0", "None"):
        names = READ_ONLY_FLAGS[kind]
        values = c.exec_driver_sql("SELECT " + ", ".join(f"@@global.{name}" for name in names)).one()
        flags = [name for name, value in zip(names, values) if str(value) in ("1", "ON")]
        raise NotPrimary(f"the server turned read-only ({', '.join(flags) or 'read_only'} is ON); nothing written")


def _pick(c: Connection, kind: str, params: dict[str, Any]) -> list[PickedRow]:
    rows = None
    if not REFUSED.index_missing:
        try:
            rows = execute_fast(c, pick_statement(kind), params).rows
        except DBAPIError as exc:
            if error_code(exc) != ER_NO_SUCH_KEY:
                raise
            REFUSED.index_missing = True  # a statement error; the transaction goes on
    if rows is None:
        rows = execute_fast(c, pick_statement(kind, hinted=False), params).rows
    picked = split_rows(rows)[2]
    if kind != "sqlite":
        _refuse_if_read_only(c, picked, kind)
    return picked


def claim(
    conn: Connection, worker_id: str | Sequence[str], limit: int, queues: Sequence[str], *, lease_seconds: float
) -> ClaimCycle:
    """Take up to `limit` ready jobs from `queues` (in that order) in one short transaction.
    `worker_id` is the lease owner, or one owner per slot (job i goes to worker_id[i])."""
    if limit <= 0 or not queues:
        return ClaimCycle([], {}, [], 0, [], 0, None)
    owners = [worker_id] * limit if isinstance(worker_id, str) else list(worker_id)[:limit]
    if len(owners) < limit:
        raise ValueError("need one worker id per slot")
    return claim_cycle(conn, owners, queues, lease_seconds=lease_seconds)


def _paused():
    return sa.select(queue_state.c.queue).where(queue_state.c.paused == sa.true())


def ready_queues(conn: Connection) -> list[str]:
    """Queues that have ready jobs right now and are not paused (a loose scan of ix_ready_pick,
    no locks): what a worker on every queue claims from."""
    return list(
        transaction(
            conn,
            lambda c: (
                c.execute(
                    sa.select(jq.queue).where(jq.status == Status.READY.value, jq.queue.notin_(_paused())).distinct()
                )
                .scalars()
                .all()
            ),
            what="ready_queues",
        )
    )


def paused_queues(conn: Connection) -> set[str]:
    """The paused queues: what a worker with a list of queues leaves out of it."""
    return set(transaction(conn, lambda c: c.execute(_paused()).scalars().all(), what="paused_queues"))


def explain_claim(conn: Connection, queue: str = "default", limit: int = 1) -> list[dict[str, Any]]:
    """The server's plan for the claim's SELECT, as EXPLAIN's traditional rows. On MySQL 8.0.32+
    `explain_format` may make a bare EXPLAIN answer JSON or TREE, so the format is named."""
    kind = flavour(conn)
    prefix = "EXPLAIN FORMAT=TRADITIONAL" if kind == "mysql" else "EXPLAIN"

    def explain(hinted: bool) -> list[dict[str, Any]]:
        stmt = pick_statement(kind, hinted).params(queue=queue, limit=limit)
        compiled = stmt.compile(dialect=conn.dialect, compile_kwargs={"literal_binds": True})
        return [dict(row._mapping) for row in conn.exec_driver_sql(f"{prefix} {compiled}").all()]

    try:
        return explain(True)
    except DBAPIError as exc:
        if error_code(exc) != ER_NO_SUCH_KEY:
            raise
        return explain(False)  # the index is missing: what the server does without it


# --- why a claim found nothing ----------------------------------------------------------------


def classify_statement(queues: Sequence[str] | None, flavour_name: str | None = None) -> sa.Select:
    """The plain read behind classify_empty: ready rows of queues not paused (up to 1000), the next lease expiry and
    the next scheduled job, for these queues, and the database's now. With a server flavour
    ('mariadb' / 'mysql') it also reads the read-only flags, for the idle worker's probe."""
    in_queues = (lambda q: q) if queues is None else (lambda q: q.where(jq.queue.in_(list(queues))))
    # Ready jobs of a paused queue are nobody's to claim: they count as nothing to do, not as
    # rows held by someone else (which would make idle workers retry fast).
    ready_sample = (
        in_queues(sa.select(sa.literal(1)).where(jq.status == Status.READY.value, jq.queue.notin_(_paused())))
        .limit(1000)
        .subquery()
    )
    columns = [
        sa.select(sa.func.count()).select_from(ready_sample).scalar_subquery().label("ready"),
        in_queues(sa.select(sa.func.min(jq.lease_until)).where(jq.status == Status.RUNNING.value))
        .scalar_subquery()
        .label("next_lease_expiry"),
        in_queues(sa.select(sa.func.min(jq.run_at)).where(jq.status == Status.SCHEDULED.value))
        .scalar_subquery()
        .label("next_scheduled"),
        db_now().label("now"),
    ]
    if flavour_name in ("mariadb", "mysql"):
        columns += [sa.literal_column(f"@@global.{flag}") for flag in READ_ONLY_FLAGS[flavour_name]]
    return sa.select(*columns)


def read_only_flags(row: Sequence[Any], flavour_name: str) -> list[str]:
    """The flags that are ON in a classify row read with `flavour_name`."""
    if flavour_name not in ("mariadb", "mysql"):
        return []
    return [f for f, v in zip(READ_ONLY_FLAGS[flavour_name], row[4:]) if str(v) in ("1", "ON")]


def classify_row(row: Sequence[Any]) -> EmptyClaimReport:
    """(ready, next_lease_expiry, next_scheduled, now[, flags]) -> why a claim would find nothing."""
    ready, next_lease_expiry, next_scheduled, now = row[:4]
    if ready:
        kind = EmptyClaim.CONTENDED
    elif next_lease_expiry is not None:
        kind = EmptyClaim.WAITING
    else:
        kind = EmptyClaim.IDLE
    return EmptyClaimReport(
        kind,
        skipped=int(ready or 0),
        next_lease_expiry=as_datetime(next_lease_expiry),
        next_scheduled=as_datetime(next_scheduled),
        db_now=as_datetime(now),
    )


def classify_empty(conn: Connection, queues: Sequence[str] | None) -> EmptyClaimReport:
    """Why a claim found nothing: one plain, non-locking read.

    A plain read still sees rows other transactions hold locked, so ready rows here after an
    empty SKIP LOCKED claim mean they were all taken by someone else's transaction (contended).
    """
    stmt = classify_statement(queues)
    return classify_row(tuple(transaction(conn, lambda c: c.execute(stmt).one(), what="classify_empty")))
