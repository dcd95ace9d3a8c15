"""Worker processes: registration, heartbeats with per-minute activity, and the list of them."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from ..db import db_now, require_primary, transaction
from ..schema import worker_process, worker_stats
from ..tasks import TaskSpec
from .common import as_datetime, database_now, upsert
from .task_definitions import register_tasks

wp = worker_process.c


class db_minute(sa.sql.expression.FunctionElement):
    """The database clock's current minute (seconds and microseconds zeroed): the bucket of the
    per-minute activity, so that every host agrees on which minute it is."""

    inherit_cache = True


@sa.ext.compiler.compiles(db_minute, "mysql")
@sa.ext.compiler.compiles(db_minute, "mariadb")
def _db_minute_mysql(element, compiler, **kw):
    # UTC_TIMESTAMP() is the statement's start time wherever it appears, so both agree.
    return "(UTC_TIMESTAMP() - INTERVAL SECOND(UTC_TIMESTAMP()) SECOND)"


@sa.ext.compiler.compiles(db_minute, "sqlite")
def _db_minute_sqlite(element, compiler, **kw):
    return "(substr(jq_now(), 1, 17) || '00.000000')"


def register_process(
    conn: Connection,
    *,
    process_id: str,
    host: str,
    pid: int,
    kind: str,
    concurrency: int,
    queues: str,
    tasks: Iterable[TaskSpec] = (),
) -> None:
    """Record the process (and, in the same transaction, the tasks it can run: task_definitions)."""
    values = dict(
        id=process_id,
        host=host[:255],
        pid=pid,
        kind=kind,
        concurrency=concurrency,
        queues=queues[:1000],
        started_at=db_now(),
        last_heartbeat=db_now(),
        stopped_at=None,
        jobs_in_hand=0,
        processed=0,
        state=None,
    )

    def write(c: Connection) -> None:
        require_primary(c)  # bookkeeping too: a write on a replica is an errant transaction there
        upsert(c, worker_process, ["id"], values, {k: (lambda new, k=k: getattr(new, k)) for k in values if k != "id"})
        register_tasks(c, process_id, tasks)

    transaction(conn, write, what="register_process")


def heartbeat(
    conn: Connection,
    process_id: str,
    *,
    jobs_in_hand: int,
    processed: int,
    stats: Mapping[str, int],
    state: Mapping[str, Any] | None = None,
    minute: datetime | None = None,
) -> bool:
    """Mark the process alive, say how it is doing (`state`: claiming or not and why, what each
    slot holds; see worker.Worker.state), and add its activity counts
    since the last heartbeat to its row for this minute of the database clock (each process
    writes only its own rows: no contention between processes). False when the server has no
    row for the process (a primary it moved to that never had it): register it there."""
    stats = {k: int(v) for k, v in stats.items() if v}

    def write(c: Connection) -> bool:
        require_primary(c)
        # last_heartbeat moves on every time (microseconds), so a known row always counts as changed.
        known = (
            c.execute(
                sa.update(worker_process)
                .where(wp.id == process_id)
                .values(
                    last_heartbeat=db_now(),
                    jobs_in_hand=jobs_in_hand,
                    processed=processed,
                    stopped_at=None,
                    state=json.dumps(state, default=str) if state is not None else None,
                )
            ).rowcount
            > 0
        )
        if stats:
            upsert(
                c,
                worker_stats,
                ["minute", "process_id"],
                {"minute": minute if minute is not None else db_minute(), "process_id": process_id, **stats},
                {k: (lambda new, k=k: worker_stats.c[k] + getattr(new, k)) for k in stats},
            )
        return known

    return transaction(conn, write, what="heartbeat")


def mark_stopped(conn: Connection, process_id: str) -> None:
    transaction(
        conn,
        lambda c: c.execute(
            sa.update(worker_process).where(wp.id == process_id).values(stopped_at=db_now(), jobs_in_hand=0, state=None)
        ),
        what="mark_stopped",
    )


def list_processes(conn: Connection, *, limit: int = 200) -> tuple[list[dict[str, Any]], datetime]:
    """Worker processes, most recently heard from first (each with its `state` decoded: {"state",
    "detail", "slots": [...]}), and the database's now."""

    def read(c: Connection):
        # The database's now in the same statement: one round trip, not two, on every refresh.
        rows = c.execute(
            sa.select(worker_process, db_now().label("database_now")).order_by(wp.last_heartbeat.desc()).limit(limit)
        ).all()
        out = []
        for r in rows:
            p = dict(r._mapping)
            del p["database_now"]
            p["state"] = json.loads(p["state"]) if p.get("state") else {}
            p["slots"] = p["state"].get("slots", [])
            out.append(p)
        return out, as_datetime(rows[0].database_now) if rows else database_now(c)

    return transaction(conn, read, what="list_processes")
