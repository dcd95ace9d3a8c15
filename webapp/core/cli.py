"""The `jobqueue` command.

Exit codes: 0 ok; 1 unexpected or database error (including an unreachable database); 2 bad
input; 3 the job's state does not allow the action, or the server cannot run the queue safely
(a worker refusing to start, `doctor` finding a problem; warnings alone exit 0); 4 no such job;
75 the job is locked by another transaction right now (try again).
"""

from __future__ import annotations

import json
import logging
import os
import sys
from typing import Any

import click
from sqlalchemy.exc import SQLAlchemyError

from . import doctor as doctor_mod
from . import repository
from .db import create_engine
from .errors import (InvalidState, JobBusy, JobNotFound, LeaseStillValid, TransientDatabaseError,
                     UnsupportedDatabase, ValidationError)
from .migrate import init_db
from .models import Status
from .tasks import load_task_modules
from .worker import Worker, WorkerConfig

EXIT_ERROR, EXIT_BAD_INPUT, EXIT_STATE, EXIT_NOT_FOUND, EXIT_BUSY = 1, 2, 3, 4, 75

url_option = click.option("--database-url", envvar="JOBQUEUE_DATABASE_URL", default=None,
                          help="mysql+pymysql://user:pass@host/db or sqlite:///path "
                               "[env JOBQUEUE_DATABASE_URL; default: SQLite under ./instance]")
tasks_option = click.option("--tasks", "tasks", envvar="JOBQUEUE_TASKS", default=None,
                            help="Comma-separated modules that register tasks [env JOBQUEUE_TASKS]")


def _fail(code: int, message: str) -> None:
    click.echo(f"error: {message}", err=True)
    sys.exit(code)


def _engine(ctx: click.Context, url: str | None, pool_size: int = 5):
    url = url or ctx.obj.get("database_url")
    try:
        return create_engine(url, pool_size=pool_size)
    except ValueError as exc:
        _fail(EXIT_BAD_INPUT, str(exc))


def _print_json(data: Any) -> None:
    click.echo(json.dumps(data, default=str, sort_keys=True))


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@url_option
@click.option("--log-level", envvar="JOBQUEUE_LOG_LEVEL", default="INFO", show_default=True,
              type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False))
@click.pass_context
def main(ctx: click.Context, database_url: str | None, log_level: str) -> None:
    """A job queue in a MySQL table, claimed with SELECT ... FOR UPDATE SKIP LOCKED."""
    logging.basicConfig(level=log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s %(message)s")
    logging.getLogger("alembic").setLevel(logging.WARNING)
    ctx.ensure_object(dict)
    ctx.obj["database_url"] = database_url


@main.command("init-db")
@url_option
@click.pass_context
def init_db_cmd(ctx: click.Context, database_url: str | None) -> None:
    """Create or upgrade the schema (safe to run twice)."""
    engine = _engine(ctx, database_url, pool_size=1)
    try:
        before, after = init_db(engine)
    except UnsupportedDatabase as exc:
        _fail(EXIT_STATE, str(exc))
    click.echo(f"schema at revision {after}" + ("" if before == after else f" (was {before or 'empty'})"))


@main.command()
@click.argument("task")
@click.option("--key", "task_key", required=True, help="Idempotency key (1-80 characters)")
@click.option("--payload", default="{}", show_default=True, help="A JSON object")
@click.option("--queue", default=None, help="Queue name (default: the task's queue)")
@click.option("--priority", type=int, default=0, show_default=True, help="Lower runs first")
@click.option("--delay", type=float, default=0.0, show_default=True, help="Seconds before it may run")
@click.option("--max-attempts", type=int, default=None, help="Attempts before it fails for good")
@tasks_option
@url_option
@click.pass_context
def enqueue(ctx: click.Context, task: str, task_key: str, payload: str, queue: str | None, priority: int,
            delay: float, max_attempts: int | None, tasks: str | None, database_url: str | None) -> None:
    """Add a job; prints {"id", "task_key", "duplicate", "status"}."""
    load_task_modules(tasks)
    try:
        data = json.loads(payload)
    except ValueError as exc:
        _fail(EXIT_BAD_INPUT, f"--payload is not valid JSON: {exc}")
    engine = _engine(ctx, database_url, pool_size=1)
    try:
        with engine.connect() as conn:
            res = repository.enqueue(conn, task, task_key, data, queue=queue, priority=priority, delay=delay,
                                     max_attempts=max_attempts)
            status = res.status or repository.get_job(conn, res.id).status
    except ValidationError as exc:
        _fail(EXIT_BAD_INPUT, str(exc))
    _print_json({"id": res.id, "task_key": res.task_key, "duplicate": res.duplicate, "status": str(status)})


@main.command()
@click.option("--concurrency", type=click.IntRange(1, 256), default=4, show_default=True, help="Handler threads")
@click.option("--queues", default=None, help="Comma-separated queues to take jobs from (default: all)")
@click.option("--name", default=None, help="Worker name, added to host:pid in lease owners")
@click.option("--lease-seconds", type=click.FloatRange(1, 86400), default=60.0, show_default=True)
@click.option("--grace-seconds", type=click.FloatRange(0, 86400), default=30.0, show_default=True,
              help="On SIGTERM, how long running jobs may finish before they are released")
@click.option("--idle-cap-seconds", type=click.FloatRange(0.05, 300), default=2.0, show_default=True,
              help="Longest sleep between claims when idle")
@click.option("--burst", is_flag=True, help="Exit when nothing is ready for this worker and it holds nothing")
@click.option("--metrics-port", type=click.IntRange(1, 65535), default=None,
              help="Serve this process's Prometheus metrics on 127.0.0.1:PORT/metrics")
@tasks_option
@url_option
@click.pass_context
def worker(ctx: click.Context, concurrency: int, queues: str | None, name: str | None, lease_seconds: float,
           grace_seconds: float, idle_cap_seconds: float, burst: bool, metrics_port: int | None, tasks: str | None,
           database_url: str | None) -> None:
    """Run a worker process with N threads."""
    load_task_modules(tasks)
    if metrics_port:
        from prometheus_client import start_http_server

        start_http_server(metrics_port, addr=os.environ.get("JOBQUEUE_METRICS_ADDR", "127.0.0.1"))
    queue_list = [q.strip() for q in queues.split(",") if q.strip()] if queues else None
    config = WorkerConfig(concurrency=concurrency, queues=queue_list, name=name, lease_seconds=lease_seconds,
                          grace_seconds=grace_seconds, idle_cap_seconds=idle_cap_seconds, burst=burst)
    engine = _engine(ctx, database_url, pool_size=concurrency + 3)
    sys.exit(Worker(engine, config).run())


@main.command()
@url_option
@click.pass_context
def reap(ctx: click.Context, database_url: str | None) -> None:
    """Return running jobs whose lease expired to ready (or failed when out of attempts)."""
    engine = _engine(ctx, database_url, pool_size=1)
    with engine.connect() as conn:
        result = repository.reap(conn)
        promoted = repository.promote_due(conn)
    _print_json({"reclaimed": result.reclaimed, "failed": result.failed, "promoted": promoted})


def _operator(ctx: click.Context, database_url: str | None, action) -> None:
    engine = _engine(ctx, database_url, pool_size=1)
    try:
        with engine.connect() as conn:
            result = action(conn)
    except JobNotFound as exc:
        _fail(EXIT_NOT_FOUND, str(exc))
    except LeaseStillValid as exc:
        _fail(EXIT_STATE, f"{exc} (use --force)")
    except InvalidState as exc:
        _fail(EXIT_STATE, str(exc))
    except JobBusy as exc:
        _fail(EXIT_BUSY, str(exc))
    _print_json({"id": result.job_id, "before": str(result.before), "after": str(result.after),
                 "changed": result.changed})


@main.command()
@click.argument("job_id", type=int)
@click.option("--force", is_flag=True, help="Also requeue a running job whose lease is still valid")
@url_option
@click.pass_context
def requeue(ctx: click.Context, job_id: int, force: bool, database_url: str | None) -> None:
    """Put a job back to ready (attempts kept)."""
    _operator(ctx, database_url, lambda conn: repository.requeue_job(conn, job_id, force=force, actor=_actor()))


@main.command("fail")
@click.argument("job_id", type=int)
@click.option("--reason", default=None, help="Kept as the job's last error")
@url_option
@click.pass_context
def fail_cmd(ctx: click.Context, job_id: int, reason: str | None, database_url: str | None) -> None:
    """Mark a job failed now."""
    _operator(ctx, database_url, lambda conn: repository.fail_job(conn, job_id, reason, actor=_actor()))


def _actor() -> str:
    return f"cli:{os.environ.get('USER') or os.environ.get('LOGNAME') or 'unknown'}"


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output")
@url_option
@click.pass_context
def stats(ctx: click.Context, as_json: bool, database_url: str | None) -> None:
    """Job counts by queue and status."""
    engine = _engine(ctx, database_url, pool_size=1)
    with engine.connect() as conn:
        rows = repository.count_by_status(conn)
    queues: dict[str, dict[str, int]] = {}
    for queue, status, n in rows:
        queues.setdefault(queue, {s.value: 0 for s in Status})[status] = n
    totals = {s.value: sum(q[s.value] for q in queues.values()) for s in Status}
    if as_json:
        _print_json({"queues": queues, "totals": totals})
        return
    columns = [s.value for s in Status]
    click.echo(f"{'queue':<20}" + "".join(f"{c:>11}" for c in columns))
    for queue in sorted(queues):
        click.echo(f"{queue:<20}" + "".join(f"{queues[queue][c]:>11}" for c in columns))
    click.echo(f"{'(all)':<20}" + "".join(f"{totals[c]:>11}" for c in columns))


@main.command()
@click.option("--json", "as_json", is_flag=True, help="A JSON list of {name, verdict, detail, advice}")
@click.option("--queue", default="default", show_default=True, help="Queue whose claim plan is EXPLAINed")
@url_option
@click.pass_context
def doctor(ctx: click.Context, as_json: bool, queue: str, database_url: str | None) -> None:
    """Check the database can run the queue safely; exit 3 when there is a problem."""
    engine = _engine(ctx, database_url, pool_size=1)
    try:
        checks = doctor_mod.run_checks(engine, queue=queue)
    finally:
        engine.dispose()
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
@url_option
@click.pass_context
def demo(ctx: click.Context, jobs: int, database_url: str | None) -> None:
    """Create the schema, enqueue demo jobs and process them with a burst worker (no web)."""
    load_task_modules()
    engine = _engine(ctx, database_url, pool_size=8)
    init_db(engine)
    _enqueue_demo(engine, jobs)
    Worker(engine, WorkerConfig(concurrency=4, burst=True, lease_seconds=30)).run()
    ctx.invoke(stats, as_json=False, database_url=database_url)


@main.command("hash-password")
@click.option("--password", prompt=True, hide_input=True, confirmation_prompt=True,
              help="The password (asked for when not given)")
def hash_password(password: str) -> None:
    """Print a password hash for JOBQUEUE_USERS (name:role:hash)."""
    from werkzeug.security import generate_password_hash

    if len(password) < 8:
        _fail(EXIT_BAD_INPUT, "use at least 8 characters")
    click.echo(generate_password_hash(password))


@main.command()
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", type=click.IntRange(1, 65535), default=8000, show_default=True)
@click.option("--web-workers", type=click.IntRange(1, 64), default=None,
              help="gunicorn worker processes [env JOBQUEUE_WEB_WORKERS, default 2]")
@click.option("--embedded-workers", type=click.IntRange(0, 256), default=None,
              help="Job threads inside each web process [env JOBQUEUE_EMBEDDED_WORKERS, default 2]")
@click.option("--dev", is_flag=True, help="Development mode: localhost only, a generated admin login")
@click.option("--demo", is_flag=True, help="Enqueue demo jobs first")
@tasks_option
@url_option
@click.pass_context
def serve(ctx: click.Context, host: str, port: int, web_workers: int | None, embedded_workers: int | None,
          dev: bool, demo: bool, tasks: str | None, database_url: str | None) -> None:
    """Run the dashboard under gunicorn with embedded workers and the reaper."""
    import ipaddress
    import secrets

    from ..web.config import ConfigError, load_settings

    env = os.environ
    url = database_url or ctx.obj.get("database_url")
    if url:
        env["JOBQUEUE_DATABASE_URL"] = url
    if tasks:
        env["JOBQUEUE_TASKS"] = tasks
    if web_workers is not None:
        env["JOBQUEUE_WEB_WORKERS"] = str(web_workers)
    if embedded_workers is not None:
        env["JOBQUEUE_EMBEDDED_WORKERS"] = str(embedded_workers)
    if dev:
        try:
            loopback = ipaddress.ip_address(host).is_loopback
        except ValueError:
            loopback = host == "localhost"
        if not loopback:
            _fail(EXIT_BAD_INPUT, "--dev serves localhost only; bind 127.0.0.1 or configure JOBQUEUE_USERS")
        env["JOBQUEUE_DEV"] = "1"
        env.setdefault("JOBQUEUE_SECRET_KEY", secrets.token_hex(32))
        if not env.get("JOBQUEUE_USERS"):
            # One password for every gunicorn worker process.
            env.setdefault("JOBQUEUE_DEV_PASSWORD", secrets.token_urlsafe(12))
    try:
        settings = load_settings()
    except ConfigError as exc:
        _fail(EXIT_BAD_INPUT, str(exc))
    load_task_modules(tasks)
    engine = _engine(ctx, url, pool_size=2)
    init_db(engine)
    if demo:
        _enqueue_demo(engine, 12)
    env["JOBQUEUE_BIND"] = f"{host}:{port}"
    shown = f"[{host}]" if ":" in host else host
    click.echo(f"jobqueue dashboard: http://{shown}:{port}/", err=True)
    if settings.dev_password:
        click.echo(f"login: admin / {settings.dev_password}   (development mode, localhost only)", err=True)
    else:
        click.echo(f"login: one of {', '.join(sorted(settings.users))} (from JOBQUEUE_USERS)", err=True)
    conf = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "web", "gunicorn_conf.py")
    os.execvp(sys.executable, [sys.executable, "-m", "gunicorn", "-c", conf])


def _enqueue_demo(engine, jobs: int) -> None:
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
            specs.append({"task": "fail", "task_key": f"demo-fail-{i}", "max_attempts": 2,
                          "payload": {"message": "demo failure: requeue me from the dashboard"}})
    with engine.connect() as conn:
        results = repository.enqueue_many(conn, specs)
    click.echo(f"enqueued {sum(not r.duplicate for r in results)} demo jobs "
               f"({sum(r.duplicate for r in results)} already known)", err=True)


def run() -> None:
    """Console entry point: database trouble is a one-line error and exit 1, not a traceback."""
    try:
        main(obj={})
    except UnsupportedDatabase as exc:
        _fail(EXIT_STATE, str(exc))
    except TransientDatabaseError as exc:
        _fail(EXIT_ERROR, str(exc))
    except SQLAlchemyError as exc:
        _fail(EXIT_ERROR, f"database: {getattr(exc, 'orig', None) or exc}")


if __name__ == "__main__":
    run()
