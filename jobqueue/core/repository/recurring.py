"""recurring_job: the schedules, and enqueueing the runs that are due (see jobqueue/core/recurring.py
for the story: one job per tick however many processes see it, at most one catch-up run)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from .. import tracing
from ..db import db_now, require_primary, transaction
from ..errors import ScheduleNotFound, ValidationError
from ..models import Enqueued
from ..recurring import check_name, latest_tick, next_tick, parse_cron, run_key
from ..schema import recurring_job
from ..tasks import TASKS, Registry
from ..validation import check_payload, new_job
from .common import as_datetime, audit, audited_once, database_now
from .enqueue import enqueue_many

rj = recurring_job.c
SOURCE_OPERATOR, SOURCE_CODE = "operator", "code"


def _row(r) -> dict[str, Any]:
    d = dict(r._mapping)
    if isinstance(d.get("payload"), (str, bytes)):
        d["payload"] = json.loads(d["payload"])
    d["enabled"] = bool(d["enabled"])
    return d


def _read(c: Connection, name: str) -> dict[str, Any]:
    """The schedule `name` as it stands in this transaction (it exists)."""
    return _row(c.execute(sa.select(recurring_job).where(rj.name == name)).one())


def _validate(name: Any, cron: Any, task: Any, payload: Any, queue: Any, registry: Registry) -> tuple:
    name = check_name(name)
    cron = parse_cron(cron)
    payload = check_payload(payload)
    # The run's job must be one enqueue would take: the task known here, the queue valid, the
    # payload within limits and carrying the task's concurrency key.
    new_job(task, run_key(name, datetime(2026, 1, 1)), payload, queue=queue, registry=registry)
    return name, cron, task, payload, queue


def upsert_recurring(
    conn: Connection,
    name: str,
    *,
    cron: str,
    task: str,
    payload: dict | None = None,
    queue: str | None = None,
    actor: str,
    registry: Registry = TASKS,
) -> tuple[dict[str, Any], bool]:
    """Add a schedule, or replace the definition of the one of that name (it stays enabled or
    disabled as it was). Everything is validated before anything is written. Returns (the row,
    created)."""
    name, cron, task, payload, queue = _validate(name, cron, task, payload, queue, registry)

    def write(c: Connection) -> tuple[dict[str, Any], bool]:
        require_primary(c)
        now = database_now(c)
        row = c.execute(sa.select(recurring_job).where(rj.name == name).with_for_update()).first()
        definition = {"cron": cron, "task_name": task, "payload": payload, "queue": queue}
        if row is None:
            c.execute(
                sa.insert(recurring_job).values(
                    name=name,
                    enabled=True,
                    source=SOURCE_OPERATOR,
                    next_run_at=next_tick(cron, now),
                    last_run_at=None,
                    last_job_id=None,
                    created_at=now,
                    updated_at=now,
                    updated_by=actor[:100],
                    **definition,
                )
            )
            audit(
                c,
                actor,
                "recurring_add",
                selection=f"recurring {name}",
                after="enabled",
                count=0,
                detail=f"{cron} {task} queue={queue or '(task default)'} payload={json.dumps(payload)}",
            )
            created = True
        else:
            old = _row(row)
            changes = {k: v for k, v in definition.items() if old[k] != v}
            if changes or old["source"] != SOURCE_OPERATOR:
                values = {**definition, "source": SOURCE_OPERATOR, "updated_at": now, "updated_by": actor[:100]}
                if "cron" in changes:
                    values["next_run_at"] = next_tick(cron, now)
                c.execute(sa.update(recurring_job).where(rj.name == name).values(**values))
                audit(
                    c,
                    actor,
                    "recurring_change",
                    selection=f"recurring {name}",
                    count=0,
                    detail=f"{cron} {task} queue={queue or '(task default)'} payload={json.dumps(payload)}",
                )
            created = False
        return _read(c, name), created

    return transaction(conn, write, what="recurring_add")


def list_recurring(conn: Connection) -> tuple[list[dict[str, Any]], datetime]:
    """Every schedule by name, and the database's now."""

    def read(c: Connection):
        return [_row(r) for r in c.execute(sa.select(recurring_job).order_by(rj.name)).all()], database_now(c)

    return transaction(conn, read, what="list_recurring")


def get_recurring(conn: Connection, name: str) -> dict[str, Any] | None:
    row = transaction(
        conn, lambda c: c.execute(sa.select(recurring_job).where(rj.name == name)).first(), what="get_recurring"
    )
    return _row(row) if row else None


def remove_recurring(conn: Connection, name: str, *, actor: str) -> None:
    """Delete a schedule (ScheduleNotFound when there is none). Jobs it enqueued stay."""

    def write(c: Connection) -> None:
        require_primary(c)
        if c.execute(sa.delete(recurring_job).where(rj.name == name)).rowcount != 1:
            raise ScheduleNotFound(f"no recurring job named {name!r}")
        audit(c, actor, "recurring_remove", selection=f"recurring {name}", count=0)

    transaction(conn, write, what="recurring_remove")


def set_recurring_enabled(conn: Connection, name: str, enabled: bool, *, actor: str) -> tuple[dict[str, Any], bool]:
    """Enable or disable a schedule. Enabling starts from the next tick after now: the ticks it
    spent disabled are not caught up. Returns (the row, changed)."""
    action = "recurring_enable" if enabled else "recurring_disable"

    def write(c: Connection) -> tuple[dict[str, Any], bool]:
        require_primary(c)
        row = c.execute(sa.select(recurring_job).where(rj.name == name).with_for_update()).first()
        if row is None:
            raise ScheduleNotFound(f"no recurring job named {name!r}")
        if bool(row.enabled) == enabled:
            return _row(row), False
        now = database_now(c)
        values: dict[str, Any] = {"enabled": enabled, "updated_at": now, "updated_by": actor[:100]}
        if enabled:
            values["next_run_at"] = next_tick(row.cron, now)
        c.execute(sa.update(recurring_job).where(rj.name == name).values(**values))
        audit(
            c,
            actor,
            action,
            selection=f"recurring {name}",
            before="disabled" if enabled else "enabled",
            after="enabled" if enabled else "disabled",
            count=0,
        )
        return _read(c, name), True

    return audited_once(
        conn,
        write,
        what="recurring_enable",
        action=action,
        actor=actor,
        selection=f"recurring {name}",
        answer=lambda c, _audited: (_read(c, name), True),
    )


def sync_code_schedules(conn: Connection, *, registry: Registry = TASKS, actor: str = "code") -> int:
    """Schedules declared in code (@task(..., cron=...)): add the missing ones, and follow a
    changed cron of the ones that came from code. A schedule an operator defined under the same
    name is left alone, and so is an operator's enable/disable. Returns how many rows changed."""
    specs = [registry.get(name) for name in registry.names()]
    specs = [s for s in specs if s is not None and s.cron]
    if not specs:
        return 0

    def write(c: Connection) -> int:
        require_primary(c)
        now = database_now(c)
        have = {
            r.name: r
            for r in c.execute(
                sa.select(rj.name, rj.cron, rj.source, rj.task_name).where(rj.name.in_([s.name for s in specs]))
            ).all()
        }
        changed = 0
        for spec in specs:
            cron = parse_cron(spec.cron)
            row = have.get(spec.name)
            if row is None:
                # IGNORE: another process may add it this very instant.
                changed += c.execute(
                    sa.insert(recurring_job)
                    .prefix_with("IGNORE", dialect="mysql")
                    .prefix_with("IGNORE", dialect="mariadb")
                    .prefix_with("OR IGNORE", dialect="sqlite")
                    .values(
                        name=spec.name,
                        cron=cron,
                        task_name=spec.name,
                        payload={},
                        queue=None,
                        enabled=True,
                        source=SOURCE_CODE,
                        next_run_at=next_tick(cron, now),
                        created_at=now,
                        updated_at=now,
                        updated_by=actor[:100],
                    )
                ).rowcount
            elif row.source == SOURCE_CODE and (row.cron != cron or row.task_name != spec.name):
                c.execute(
                    sa.update(recurring_job)
                    .where(rj.name == spec.name, rj.source == SOURCE_CODE)
                    .values(
                        cron=cron,
                        task_name=spec.name,
                        next_run_at=next_tick(cron, now),
                        updated_at=now,
                        updated_by=actor[:100],
                    )
                )
                changed += 1
        return changed

    return transaction(conn, write, what="recurring_sync")


@dataclass(frozen=True)
class DueRuns:
    now: datetime | None  # the clock the ticks were judged by (None: no schedule)
    enqueued: int = 0  # jobs written (ticks nobody had enqueued yet)
    runs: tuple[Enqueued, ...] = ()  # every due run's enqueue result, new or duplicate
    names: tuple[str, ...] = ()
    next_due: datetime | None = None  # the earliest next tick of the enabled schedules
    skipped: tuple[str, ...] = field(default=())  # schedules this process could not enqueue, and why


def enqueue_due_recurring(conn: Connection, *, now: datetime | None = None, registry: Registry = TASKS) -> DueRuns:
    """Enqueue one job for each enabled schedule whose next tick has come: the latest tick at or
    before `now` (the database clock unless given), so a schedule that missed several ticks gets
    one catch-up run. Then move the schedule to its first tick after now (a guarded UPDATE: of
    several processes doing this at once, one write lands, and they all agree on the job)."""
    if now is not None and now.tzinfo is not None:
        now = now.astimezone(UTC).replace(tzinfo=None)

    def due(c: Connection):
        # One statement: every enabled schedule (a handful of rows) with the database's now; due
        # ones and the next tick come from it. An idle worker sends this once per REREAD_SECONDS.
        rows = c.execute(
            sa.select(recurring_job, db_now().label("db_now")).where(rj.enabled == sa.true()).order_by(rj.next_run_at)
        ).all()
        clock = now or (as_datetime(rows[0].db_now) if rows else None)
        return clock, [_row(r) for r in rows]

    clock, enabled = transaction(conn, due, what="recurring_due")
    if clock is None:
        return DueRuns(None)  # no enabled schedule
    rows = [r for r in enabled if r["next_run_at"] <= clock]
    upcoming = [r["next_run_at"] for r in enabled if r["next_run_at"] > clock]
    runs: list[Enqueued] = []
    names: list[str] = []
    skipped: list[str] = []
    for row in rows:
        tick = max(latest_tick(row["cron"], clock), row["next_run_at"])
        try:
            job = new_job(
                row["task_name"], run_key(row["name"], tick), row["payload"], queue=row["queue"], registry=registry
            )
        except ValidationError as exc:
            # Most often a task this process does not load: another process will enqueue it.
            skipped.append(f"recurring {row['name']}: {exc}")
            continue
        # A run starts a trace of its own, linked to the span it was enqueued in (if any).
        (res,) = enqueue_many(conn, [job], registry=registry, trace=tracing.link(tracing.current()))
        runs.append(res)
        names.append(row["name"])

        def advance(c: Connection, row=row, tick=tick, res=res) -> None:
            c.execute(
                sa.update(recurring_job)
                .where(rj.name == row["name"], rj.next_run_at == row["next_run_at"])
                .values(
                    last_run_at=tick, last_job_id=res.id, next_run_at=next_tick(row["cron"], clock), updated_at=db_now()
                )
            )

        transaction(conn, advance, what="recurring_advance")
    # Advanced schedules move past `clock`; those another process advanced meanwhile too.
    next_due = min(upcoming + [next_tick(r["cron"], clock) for r in rows], default=None)
    return DueRuns(clock, sum(1 for r in runs if not r.duplicate), tuple(runs), tuple(names), next_due, tuple(skipped))
