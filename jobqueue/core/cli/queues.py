"""Commands on queues: pause, resume, queues, stats, and the recurring jobs that feed them."""

from __future__ import annotations

from typing import Any

import click

from .base import (
    actor,
    engine_of,
    json_option,
    main,
    payload_of,
    print_json,
    print_table,
    queue_command,
    tasks_option,
    with_tasks,
)


def _queue_state(ctx: click.Context, database_url: str | None, queue: str, paused: bool) -> None:
    from .. import service

    with engine_of(ctx, database_url).connect() as conn:
        verb = service.pause_queue if paused else service.resume_queue
        state = verb(conn, queue, actor=actor())
    print_json({"queue": state.queue, "paused": state.paused})


@main.command()
@click.argument("queue")
@queue_command
def pause(ctx: click.Context, queue: str, database_url: str | None) -> None:
    """Stop claims from QUEUE within about a second (enqueue still works; running jobs finish)."""
    _queue_state(ctx, database_url, queue, True)


@main.command()
@click.argument("queue")
@queue_command
def resume(ctx: click.Context, queue: str, database_url: str | None) -> None:
    """Let workers claim from QUEUE again."""
    _queue_state(ctx, database_url, queue, False)


@main.command()
@json_option()
@queue_command
def queues(ctx: click.Context, as_json: bool, database_url: str | None) -> None:
    """Every known queue: paused or not (who, when) and its jobs by status."""
    from .. import repository
    from ..models import Status

    with engine_of(ctx, database_url).connect() as conn:
        rows, _ = repository.stats.list_queues(conn)
    columns = [s.value for s in Status]

    def line(r: dict[str, Any]) -> str:
        changed = f"  {r['changed_by']} at {r['changed_at']:%Y-%m-%d %H:%M:%S}" if r["changed_at"] else ""
        return (
            f"{r['queue']:<20}{'paused' if r['paused'] else 'active':<9}"
            + "".join(f"{r['counts'][c]:>11}" for c in columns)
            + changed
        )

    print_table(
        as_json,
        {"queues": [{k: r[k] for k in ("queue", "paused", "changed_at", "changed_by", "counts")} for r in rows]},
        f"{'queue':<20}{'state':<9}" + "".join(f"{c:>11}" for c in columns) + "  changed",
        map(line, rows),
    )


@main.group()
def recurring() -> None:
    """Recurring jobs: cron schedules (UTC) stored in the database, enqueued by any worker."""


def _schedule_json(row: dict[str, Any]) -> dict[str, Any]:
    return {
        "name": row["name"],
        "cron": row["cron"],
        "task": row["task_name"],
        "payload": row["payload"],
        "queue": row["queue"],
        "enabled": row["enabled"],
        "source": row["source"],
        "next_run_at": row["next_run_at"],
        "last_run_at": row["last_run_at"],
        "last_job_id": row["last_job_id"],
    }


@recurring.command("add")
@click.argument("name")
@click.option("--cron", required=True, help='Five fields, UTC, e.g. "*/5 * * * *"; or @hourly, @daily, ...')
@click.option("--task", required=True, help="The task each run enqueues")
@click.option("--payload", default="{}", show_default=True, help="A JSON object")
@click.option("--queue", default=None, help="Queue name (default: the task's queue)")
@tasks_option
@queue_command
def recurring_add(
    ctx: click.Context,
    name: str,
    cron: str,
    task: str,
    payload: str,
    queue: str | None,
    tasks: str | None,
    database_url: str | None,
) -> None:
    """Add a recurring job (or replace the definition of NAME); prints it."""
    from .. import service

    with_tasks(ctx, database_url, tasks)
    data = payload_of(payload)
    with engine_of(ctx, database_url).connect() as conn:
        row, created = service.upsert_recurring(
            conn, name, cron=cron, task=task, payload=data, queue=queue, actor=actor()
        )
    print_json({**_schedule_json(row), "created": created})


@recurring.command("list")
@json_option()
@queue_command
def recurring_list(ctx: click.Context, as_json: bool, database_url: str | None) -> None:
    """Every recurring job: schedule, next and last run, the last run's job, enabled."""
    from .. import repository

    with engine_of(ctx, database_url).connect() as conn:
        rows, _ = repository.recurring.list_recurring(conn)

    def line(r: dict[str, Any]) -> str:
        last = f"{r['last_run_at']:%Y-%m-%d %H:%M}" if r["last_run_at"] else "-"
        return (
            f"{r['name']:<24}{r['cron']:<18}{r['task_name']:<20}{'yes' if r['enabled'] else 'no':<9}"
            f"{r['next_run_at']:%Y-%m-%d %H:%M}{'':<5}{last:<21}{r['last_job_id'] or '-'}"
        )

    print_table(
        as_json,
        {"recurring": [_schedule_json(r) for r in rows]},
        f"{'name':<24}{'cron':<18}{'task':<20}{'enabled':<9}{'next run (UTC)':<21}{'last run':<21}last job",
        map(line, rows),
    )


@recurring.command("remove")
@click.argument("name")
@queue_command
def recurring_remove(ctx: click.Context, name: str, database_url: str | None) -> None:
    """Delete a recurring job (its jobs stay). Exit 4 when there is none of that name."""
    from .. import service

    with engine_of(ctx, database_url).connect() as conn:
        service.remove_recurring(conn, name, actor=actor())
    print_json({"name": name, "removed": True})


def _set_enabled(ctx: click.Context, database_url: str | None, name: str, enabled: bool) -> None:
    from .. import service

    with engine_of(ctx, database_url).connect() as conn:
        row, changed = service.set_recurring_enabled(conn, name, enabled, actor=actor())
    print_json({"name": name, "enabled": row["enabled"], "changed": changed, "next_run_at": row["next_run_at"]})


@recurring.command("disable")
@click.argument("name")
@queue_command
def recurring_disable(ctx: click.Context, name: str, database_url: str | None) -> None:
    """Stop enqueueing runs of NAME."""
    _set_enabled(ctx, database_url, name, False)


@recurring.command("enable")
@click.argument("name")
@queue_command
def recurring_enable(ctx: click.Context, name: str, database_url: str | None) -> None:
    """Enqueue runs of NAME again, from its next tick (missed ticks are not caught up)."""
    _set_enabled(ctx, database_url, name, True)


@main.command()
@json_option()
@queue_command
def stats(ctx: click.Context, as_json: bool, database_url: str | None) -> None:
    """Job counts by queue and status."""
    from .. import repository
    from ..models import Status

    with engine_of(ctx, database_url).connect() as conn:
        rows = repository.stats.count_by_status(conn)
    queues: dict[str, dict[str, int]] = {}
    for queue, status, n in rows:
        queues.setdefault(queue, {s.value: 0 for s in Status})[status] = n
    totals = {s.value: sum(q[s.value] for q in queues.values()) for s in Status}
    columns = [s.value for s in Status]
    print_table(
        as_json,
        {"queues": queues, "totals": totals},
        f"{'queue':<20}" + "".join(f"{c:>11}" for c in columns),
        [
            f"{name:<20}" + "".join(f"{counts[c]:>11}" for c in columns)
            for name, counts in [*sorted(queues.items()), ("(all)", totals)]
        ],
    )
