"""Commands that set up and run the queue: init-db, worker, reap, prune, doctor, demo, hash-password."""

from __future__ import annotations

import json
import sys

import click

from ..errors import EXIT_BAD_INPUT, EXIT_STATE
from .base import (
    FiniteRange,
    PrefetchType,
    actor,
    engine_of,
    fail,
    json_option,
    main,
    print_json,
    queue_command,
    setting_option,
    settings_of,
    tasks_option,
    with_tasks,
)
from .queues import stats


@main.command("init-db")
@queue_command
def init_db_cmd(ctx: click.Context, database_url: str | None) -> None:
    """Create or upgrade the schema (safe to run twice)."""
    from ..migrate import init_db

    before, after = init_db(engine_of(ctx, database_url))
    click.echo(f"schema at revision {after}" + ("" if before == after else f" (was {before or 'empty'})"))


@main.command()
@click.option(
    "--concurrency",
    type=click.IntRange(1, 256),
    default=4,
    show_default=True,
    help="Handlers running at once: threads, and coroutines for async def handlers",
)
@click.option("--queues", default=None, help="Comma-separated queues to take jobs from (default: all)")
@click.option("--name", default=None, help="Worker name, added to host:pid in lease owners")
@setting_option(
    "lease_seconds",
    "--lease-seconds",
    type=FiniteRange(1, 86400),
    help="How long a claimed job is leased, renewed every third of it",
)
@setting_option(
    "grace_seconds",
    "--grace-seconds",
    type=FiniteRange(0, 86400),
    help="On SIGTERM, how long running jobs may finish before they are released",
)
@click.option(
    "--idle-cap-seconds",
    type=FiniteRange(0.05, 300),
    default=2.0,
    show_default=True,
    help="Longest sleep between claims when idle",
)
@click.option(
    "--prefetch",
    type=PrefetchType(),
    default="auto",
    show_default=True,
    help="Jobs claimed ahead of a free thread (leased and renewed while they wait): a number, or "
    "auto (while handlers take under 0.1 s on average: one per thread, more for jobs of microseconds, "
    "up to 64 leases in all or two per thread)",
)
@click.option("--burst", is_flag=True, help="Exit when nothing is ready for this worker and it holds nothing")
@click.option(
    "--no-doorbell", is_flag=True, help="Do not listen for other processes' enqueues while idle (MySQL); poll only"
)
@click.option(
    "--metrics-port",
    type=click.IntRange(1, 65535),
    default=None,
    help="Serve this process's Prometheus metrics on 127.0.0.1:PORT/metrics",
)
@tasks_option
@queue_command
def worker(
    ctx: click.Context,
    concurrency: int,
    queues: str | None,
    name: str | None,
    lease_seconds: float,
    grace_seconds: float,
    idle_cap_seconds: float,
    prefetch: int | None,
    burst: bool,
    no_doorbell: bool,
    metrics_port: int | None,
    tasks: str | None,
    database_url: str | None,
) -> None:
    """Run a worker process with N threads."""
    from ..worker import Worker, WorkerConfig

    settings = with_tasks(ctx, database_url, tasks)
    if metrics_port:
        from prometheus_client import start_http_server

        start_http_server(metrics_port, addr=settings.metrics_addr or "127.0.0.1")
    queue_list = [q.strip() for q in queues.split(",") if q.strip()] if queues else None
    config = WorkerConfig(
        concurrency=concurrency,
        queues=queue_list,
        name=name,
        lease_seconds=lease_seconds,
        grace_seconds=grace_seconds,
        idle_cap_seconds=idle_cap_seconds,
        burst=burst,
        prefetch=prefetch,
        doorbell=not no_doorbell,
        # With several candidate primaries a read-only one at start is a failover
        # under way: wait for the new primary instead of refusing.
        refuse_read_only_at_start=len(settings.database_urls) <= 1,
    )
    engine = engine_of(ctx, database_url, pool_size=concurrency + 3, worker=True)
    sys.exit(Worker(engine, config).run())


@main.command()
@queue_command
def reap(ctx: click.Context, database_url: str | None) -> None:
    """Return running jobs whose lease expired to ready (or failed when out of attempts)."""
    from .. import service

    with engine_of(ctx, database_url).connect() as conn:
        result = service.reap(conn)
        promoted = service.promote_due(conn)
    print_json({"reclaimed": result.reclaimed, "failed": result.failed, "promoted": promoted})


@main.command()
@click.option(
    "--done-older-than",
    "done_days",
    type=FiniteRange(0, 36500),
    default=None,
    help="Days a done job is kept [default: JOBQUEUE_KEEP_DONE_DAYS, 7; 0 keeps them]",
)
@click.option(
    "--failed-older-than",
    "failed_days",
    type=FiniteRange(0, 36500),
    default=None,
    help="Days a failed or cancelled job is kept [default: JOBQUEUE_KEEP_FAILED_DAYS, 30; 0 keeps them]",
)
@click.option("--dry-run", is_flag=True, help="Count what would be pruned; delete nothing")
@queue_command
def prune(
    ctx: click.Context, done_days: float | None, failed_days: float | None, dry_run: bool, database_url: str | None
) -> None:
    """Delete finished jobs past their keep time, in batches of 1,000 with pauses (their task_keys
    keep answering duplicate); prints the counts as JSON."""
    from .. import service

    settings = settings_of(ctx, database_url)
    with engine_of(ctx, database_url).connect() as conn:
        counts = service.prune(
            conn,
            done_days=settings.keep_done_days if done_days is None else done_days,
            failed_days=settings.keep_failed_days if failed_days is None else failed_days,
            keys_days=settings.keep_keys_days,
            dry_run=dry_run,
            by=actor(),
        )
    print_json(counts.as_dict())


@main.command()
@json_option("A JSON list of {name, verdict, detail, advice}")
@click.option("--queue", default="default", show_default=True, help="Queue whose claim plan is EXPLAINed")
@queue_command
def doctor(ctx: click.Context, as_json: bool, queue: str, database_url: str | None) -> None:
    """Check the database can run the queue safely; exit 3 when there is a problem."""
    from .. import doctor as doctor_mod
    from ..replica_watch import ReplicaWatch

    engine = engine_of(ctx, database_url)
    replicas = ReplicaWatch.from_settings(settings_of(ctx, database_url))
    try:
        checks = doctor_mod.run_checks(engine, queue=queue, replicas=replicas)
    finally:
        engine.dispose()
        if replicas is not None:
            replicas.dispose()
    if as_json:
        click.echo(json.dumps([c.as_dict() for c in checks]))
    else:
        for c in checks:
            click.echo(f"{c.verdict.value:<8} {c.name}: {c.detail}")
            if c.advice and c.verdict is not doctor_mod.Verdict.OK:
                click.echo(f"{'':<8} -> {c.advice}")
    if doctor_mod.has_problem(checks):
        sys.exit(EXIT_STATE)


@main.command()
@click.option("--jobs", type=click.IntRange(1, 100000), default=12, show_default=True)
@queue_command
def demo(ctx: click.Context, jobs: int, database_url: str | None) -> None:
    """Create the schema, enqueue demo jobs and process them with a burst worker (no web)."""
    from ..migrate import init_db
    from ..task_modules import load_task_modules
    from ..worker import Worker, WorkerConfig

    load_task_modules()
    engine = engine_of(ctx, database_url, pool_size=8)
    init_db(engine)
    enqueue_demo(engine, jobs)
    Worker(engine, WorkerConfig(concurrency=4, burst=True, lease_seconds=30)).run()
    ctx.invoke(stats, as_json=False, database_url=database_url)


@main.command("hash-password")
@click.option(
    "--password", prompt=True, hide_input=True, confirmation_prompt=True, help="The password (asked for when not given)"
)
def hash_password(password: str) -> None:
    """Print a password hash for JOBQUEUE_USERS (name:role:hash)."""
    from werkzeug.security import generate_password_hash

    if len(password) < 8:
        fail(EXIT_BAD_INPUT, "use at least 8 characters")
    click.echo(generate_password_hash(password))


def enqueue_demo(engine, jobs: int) -> None:
    from .. import service

    specs = []
    for i in range(jobs):
        kind = i % 4
        if kind == 0:
            specs.append({"task": "export_orders", "task_key": f"demo-export-{i}", "payload": {"rows": 5}})
        elif kind == 1:
            specs.append({"task": "sleep", "task_key": f"demo-sleep-{i}", "payload": {"seconds": 2}})
        elif kind == 2:
            specs.append({"task": "noop", "task_key": f"demo-noop-{i}"})
        else:
            specs.append(
                {
                    "task": "fail",
                    "task_key": f"demo-fail-{i}",
                    "max_attempts": 2,
                    "payload": {"message": "demo failure: requeue me from the dashboard"},
                }
            )
    with engine.connect() as conn:
        results = service.enqueue_many(conn, specs)
    click.echo(
        f"enqueued {sum(not r.duplicate for r in results)} demo jobs "
        f"({sum(r.duplicate for r in results)} already known)",
        err=True,
    )
